"""The profiler sections: each role's `profiler` and the top-level `global_profiler`, which
workers/profiling.py reads on each rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.config_schema import Annotated, Fixed, NonNegative, OneOf, Positive, Problems


def _profiler_tools() -> tuple[str, ...]:
    # npu: accepted so that a verl script written for Ascend NPUs runs here; it profiles nothing
    # (hybrid/config/foreign_keys.py reports it at start as having no effect on this hardware).
    return ("torch", "npu")


PROFILER_TOOL = OneOf(
    _profiler_tools,
    unsupported=(
        ("nsys", "hybrid runs no Nsight Systems workers; use tool=torch (chrome traces)"),
        (
            "torch_memory",
            "CUDA memory snapshots are not written; use tool=torch with tool_config.torch.contents=[memory]",
        ),
    ),
)


@dataclass(frozen=True)
class TorchProfilerToolConfig:
    contents: tuple[Annotated[str, OneOf(lambda: ("cpu", "cuda", "memory", "shapes", "stack"))], ...]
    discrete: Annotated[
        bool,
        Fixed(
            (False,), "hybrid writes one trace per profiled step and rank, covering every call the worker makes in it"
        ),
    ]


@dataclass(frozen=True)
class ProfilerToolConfig:
    torch: TorchProfilerToolConfig


@dataclass(frozen=True)
class ProfilerConfig:
    """A role's `profiler` section (verl's): which ranks of that role's worker write traces."""

    tool: Annotated[str | None, PROFILER_TOOL]
    enable: bool
    all_ranks: bool
    ranks: tuple[Annotated[int, NonNegative()], ...]
    save_path: str | None
    tool_config: ProfilerToolConfig

    def profiles_rank(self, rank: int) -> bool:
        """verl's rule: all_ranks, else the listed ranks, else rank 0 (when enabled)."""
        if not self.enable or self.tool != "torch":
            return False
        if self.all_ranks:
            return True
        return rank in self.ranks if self.ranks else rank == 0

    def check(self, prefix: str, problems: Problems, steps: Any) -> None:
        if self.enable is True and (self.tool is None or not steps):
            problems.add(
                f"{prefix}.profiler.enable=True profiles nothing without global_profiler.tool=torch and "
                f"global_profiler.steps (a list of steps); set them or set enable=false"
            )
        if self.enable is True and self.tool is not None and self.save_path is None:
            problems.add(
                f"{prefix}.profiler.save_path=None: set it (or global_profiler.save_path) to the folder for the traces"
            )


@dataclass(frozen=True)
class GlobalProfilerConfig:
    tool: Annotated[str | None, PROFILER_TOOL]
    steps: tuple[Annotated[int, Positive()], ...] | None
    profile_continuous_steps: bool
    save_path: str
