"""SkyRL's `trainer.policy.torch_profiler_config.*` (torch.profiler traces of the policy
worker) as rules of the SkyRL dialect, onto hybrid's verl profiler keys (`global_profiler.*`
and the actor's `profiler` section, workers/profiling.py).

SkyRL starts one torch.profiler on each listed policy rank when training starts and steps it
once per training step under `torch.profiler.schedule(skip_first, wait, warmup, active,
repeat)`; each window of `active` recorded steps becomes one trace. hybrid lists the steps it
records (`global_profiler.steps`), so the schedule is unrolled here into those steps, counted
from the first step of a fresh run (SkyRL's step 1), with `profile_continuous_steps` keeping a
window of several steps in one trace. The `enable` rule writes everything; the other keys'
rules check their own values (SkyRL's `TorchProfilerConfig.validate`, plus what hybrid's
traces cannot record) and write nothing.
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.skyrl_convert import ACTOR
from hybrid.dialects.table import Context, Refusal, custom

KEY = "trainer.policy.torch_profiler_config"
SCHEDULE = ("skip_first", "wait", "warmup", "active", "repeat")
# SkyRL's defaults (TorchProfilerConfig), read when a key is not given.
DEFAULTS: dict[str, Any] = {
    "enable": False,
    "ranks": [0],
    "save_path": None,
    "skip_first": 10,
    "wait": 0,
    "warmup": 1,
    "active": 1,
    "repeat": 1,
    "activities": ["cpu", "cuda"],
    "record_shapes": True,
    "profile_memory": False,
    "with_stack": True,
    "with_flops": False,
    "with_modules": False,
    "export_type": "chrome_trace",
}
# SkyRL's switch -> the entry of hybrid's tool_config.torch.contents it turns on.
CONTENTS = {"record_shapes": "shapes", "profile_memory": "memory", "with_stack": "stack"}
TARGETS = (
    "global_profiler.tool",
    "global_profiler.steps",
    "global_profiler.profile_continuous_steps",
    f"{ACTOR}.profiler.enable",
    f"{ACTOR}.profiler.ranks",
    f"{ACTOR}.profiler.save_path",
    f"{ACTOR}.profiler.tool_config.torch.contents",
)


def _get(ctx: Context, name: str) -> Any:
    return ctx.get(f"{KEY}.{name}", DEFAULTS[name])


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def profiled_steps(skip_first: int, wait: int, warmup: int, active: int, repeat: int) -> list[int]:
    """The training steps (1 = the first) torch.profiler.schedule records: after `skip_first`
    steps, `repeat` cycles of `wait` idle, `warmup` warming and `active` recorded steps."""
    cycle = wait + warmup + active
    return [1 + skip_first + k * cycle + wait + warmup + i for k in range(repeat) for i in range(active)]


def _enable(value: Any, ctx: Context) -> dict[str, Any]:
    if not isinstance(value, bool):
        raise Refusal("true or false")
    if not value:
        return {}
    ranks, save_path = _get(ctx, "ranks"), _get(ctx, "save_path")
    if not save_path:
        raise Refusal(f"{KEY}.save_path must name the folder for the traces (SkyRL requires it when enabled)")
    schedule = {name: _get(ctx, name) for name in SCHEDULE}
    if not all(_schedule_value(name, v) for name, v in schedule.items()) or not ranks:
        return {}  # the key's own rule refuses the value
    contents = [a.lower() for a in _get(ctx, "activities")]
    contents += [entry for name, entry in CONTENTS.items() if _get(ctx, name) is True]
    return {
        "global_profiler.tool": "torch",
        "global_profiler.steps": profiled_steps(**schedule),
        # One trace per window of `active` steps, as SkyRL's; windows with no idle or warm-up
        # step between them (wait + warmup = 0) run together into one trace.
        "global_profiler.profile_continuous_steps": schedule["active"] > 1,
        f"{ACTOR}.profiler.enable": True,
        f"{ACTOR}.profiler.ranks": list(ranks),
        f"{ACTOR}.profiler.save_path": save_path,
        f"{ACTOR}.profiler.tool_config.torch.contents": contents,
    }


def _schedule_value(name: str, value: Any) -> bool:
    return _count(value) and value >= (1 if name in ("active", "repeat") else 0)


def _checked(name: str):
    """A key the enable rule reads: its value is checked here (where SkyRL reads it, with
    enable=true), and nothing is written."""

    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        if _get(ctx, "enable") is not True:
            return {}
        if name in SCHEDULE and not _schedule_value(name, value):
            if name == "repeat" and value == 0:
                raise Refusal(
                    "0 cycles forever: hybrid profiles the steps listed in global_profiler.steps; give a count"
                )
            raise Refusal(f"a whole number >= {1 if name == 'active' else 0} (SkyRL's check)")
        if name == "ranks" and not (isinstance(value, list) and value):
            raise Refusal("the policy ranks to profile, a non-empty list (SkyRL's check)")
        if name == "save_path" and isinstance(value, str) and "://" in value:
            raise Refusal("a local folder: torch.profiler writes no cloud storage (SkyRL refuses it too)")
        if name == "activities":
            if not isinstance(value, list) or not value or any(str(a).lower() not in ("cpu", "cuda") for a in value):
                raise Refusal("a non-empty list of cpu, cuda (SkyRL's check)")
        elif name == "export_type":
            if value != "chrome_trace":
                raise Refusal("hybrid writes chrome traces (chrome_trace); it exports no stacks files")
        elif name in ("with_flops", "with_modules"):
            if value is not False:
                raise Refusal(
                    "hybrid's traces record CPU/CUDA activity, shapes, memory and stacks "
                    "(tool_config.torch.contents); no FLOPs or module hierarchy"
                )
        elif not isinstance(value, bool) and name in CONTENTS:
            raise Refusal("true or false")
        return {}

    return convert


PROFILER_RULES = (
    custom(
        f"{KEY}.enable",
        TARGETS,
        _enable,
        "true -> global_profiler.tool=torch, global_profiler.steps = the steps the schedule records, "
        "profile_continuous_steps = active > 1, and the actor's profiler: enable, ranks, save_path, "
        "tool_config.torch.contents from activities, record_shapes, profile_memory, with_stack",
        "SkyRL's schedule (skip_first, wait, warmup, active, repeat; repeat=0, forever, refused) unrolled into "
        "the steps it records, counted from step 1 of a fresh run; the defaults record step 12. hybrid writes "
        "<save_path>/actor/step<N>_rank<R>.json; on the fused worker the trace also covers the step's "
        "generation, which SkyRL's engines run elsewhere. SkyRL refuses profiling under colocation without "
        "fsdp_config.cpu_offload (its offload swaps the parameters the profiler holds); hybrid's does not",
    ),
    *(
        custom(f"{KEY}.{name}", (), _checked(name), "read by enable (see there)")
        for name in DEFAULTS
        if name not in ("enable", "with_flops", "with_modules", "export_type", "activities")
    ),
    custom(f"{KEY}.activities", (), _checked("activities"), "read by enable: cpu, cuda"),
    custom(f"{KEY}.export_type", (), _checked("export_type"), "chrome_trace accepted; stacks refused"),
    custom(f"{KEY}.with_flops", (), _checked("with_flops"), "false accepted (true refused with enable=true)"),
    custom(f"{KEY}.with_modules", (), _checked("with_modules"), "false accepted (true refused with enable=true)"),
)


__all__ = ["PROFILER_RULES", "profiled_steps"]
