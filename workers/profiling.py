"""torch.profiler traces for verl's `profiler` (per role) and `global_profiler` keys.

The driver wraps each training step in `profiled_step`, which tells the worker groups when
a step in `global_profiler.steps` starts and ends (consecutive steps share one trace with
`profile_continuous_steps`). Each worker holds a `StepProfiler` built from its role's
`profiler` section, which decides whether this rank records (enable, all_ranks, ranks;
rank 0 when no ranks are listed, as verl) and writes one chrome trace per profiled step to
`<save_path>/<role>/step<N>_rank<R>.json` (open it in chrome://tracing or Perfetto).
torch allows one profiler per process: where workers share a process (the in-process
worker group), the first one started records for all of them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from protocol.dispatch import Dispatch, register

if TYPE_CHECKING:  # annotations only: the config package imports worker modules
    from workers.config import ProfilerConfig

_running: list[torch.profiler.profile] = []  # this process's profiler, while one records


def _activities(contents: set[str]) -> list:
    """verl's mapping: no contents means CPU and CUDA; CUDA only where a GPU is visible."""
    activities = []
    if not contents or "cpu" in contents:
        activities.append(torch.profiler.ProfilerActivity.CPU)
    if (not contents or "cuda" in contents) and torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities or [torch.profiler.ProfilerActivity.CPU]


class StepProfiler:
    """One rank's profiler for one role; `section` is that role's `profiler` config."""

    def __init__(self, section: ProfilerConfig, role: str, rank: int):
        self.section, self.role, self.rank = section, role, rank
        self.enabled = section.profiles_rank(rank)
        self.prof: torch.profiler.profile | None = None
        self.first_step: int | None = None

    def start(self, step: int) -> None:
        if not self.enabled or self.prof is not None or _running:
            return
        contents = set(self.section.tool_config.torch.contents)
        self.prof = torch.profiler.profile(
            activities=_activities(contents),
            record_shapes="shapes" in contents,
            profile_memory="memory" in contents,
            with_stack="stack" in contents,
        )
        self.prof.start()
        _running.append(self.prof)
        self.first_step = step

    def stop(self, step: int) -> str | None:
        """Stop recording and write the trace; returns its path (None when not recording)."""
        if self.prof is None:
            return None
        self.prof.stop()
        _running.remove(self.prof)
        steps = f"step{self.first_step}" if self.first_step == step else f"step{self.first_step}-{step}"
        folder = os.path.join(self.section.save_path, self.role)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{steps}_rank{self.rank}.json")
        self.prof.export_chrome_trace(path)
        self.prof = None
        print(f"profiler: wrote {path}", flush=True)
        return path


class ProfiledWorker:
    """Mixin for workers: the two calls the driver makes around a profiled step."""

    profiler: StepProfiler | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, step: int) -> bool:
        if self.profiler is not None:
            self.profiler.start(step)
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_profile(self, step: int) -> str | None:
        return self.profiler.stop(step) if self.profiler is not None else None


def profile_plan(global_profiler, step: int) -> tuple[bool, bool]:
    """(start recording before `step`, stop after it) for the `global_profiler` section."""
    steps = set(global_profiler.steps or ())
    if global_profiler.tool != "torch" or step not in steps:  # npu: no effect here
        return False, False
    continuous = global_profiler.profile_continuous_steps
    return not (continuous and step - 1 in steps), not (continuous and step + 1 in steps)


@contextmanager
def profiled_step(global_profiler, step: int, groups: Iterable) -> Iterator[None]:
    """Run one training step with the worker groups (None entries skipped) recording as planned."""
    start, stop = profile_plan(global_profiler, step)
    groups = [group for group in groups if group is not None]
    if start:
        for group in groups:
            group.start_profile(step)
    # Not in a `finally`: a step that raised ends the run, and a collective call into the
    # workers then would only hide its error.
    yield
    if stop:
        for group in groups:
            group.stop_profile(step)
