"""The keyword arguments the installed vLLM's engine takes, for checking `engine_kwargs.vllm`
(the policy's rollout and the reward model's engine) before any model loads: the engines pass
that dict to `vllm.LLM`, which hands what it does not name itself to
`vllm.engine.arg_utils.EngineArgs`, a dataclass; a name neither knows fails only when the
engine starts, minutes into a run.

Importing vLLM costs seconds (about 4 s over torch's import on two CPU cores, 6 s in all), so
the fields are read only when a config gives engine_kwargs.vllm keys, once per process.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import inspect
from typing import Any

from protocol.config_schema import Problems


@functools.lru_cache(maxsize=1)
def engine_args_fields() -> tuple[str, frozenset[str]] | None:
    """(vLLM's version, the names of EngineArgs' fields), or None where vLLM is not installed."""
    if importlib.util.find_spec("vllm") is None:
        return None
    import vllm
    from vllm.engine.arg_utils import EngineArgs

    return vllm.__version__, frozenset(f.name for f in dataclasses.fields(EngineArgs) if f.init)


@functools.lru_cache(maxsize=1)
def llm_parameters() -> frozenset[str]:
    """The arguments vllm.LLM names itself (a few, such as chat_template, are no EngineArgs field);
    read only for a key EngineArgs lacks (importing vllm.LLM costs another second or two)."""
    from vllm import LLM

    skip = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    params = inspect.signature(LLM.__init__).parameters.values()
    return frozenset(p.name for p in params if p.kind not in skip and p.name != "self")


def check_engine_kwargs(key: str, kwargs: dict[str, Any], problems: Problems) -> None:
    """One problem per name in `kwargs` (the dict at config key `key`) that the installed vLLM's
    engine does not take, naming the nearest one it does. Nothing to check without vLLM (the
    engine could not start either) or without keys."""
    if not kwargs:
        return
    known = engine_args_fields()
    if known is None:
        return
    version, fields = known
    unknown = [str(name) for name in kwargs if str(name) not in fields]
    if not unknown:
        return
    names = fields | llm_parameters()
    for name in unknown:
        if name in names:
            continue
        nearest = _nearest(name, sorted(n for n in names if not n.startswith("_")))  # vLLM's own, not for users
        problems.add(
            f"{key}.{name}: vLLM {version} has no such engine argument (vllm.LLM, "
            f"vllm.engine.arg_utils.EngineArgs); did you mean {key}.{nearest}?"
        )


def _nearest(name: str, names: list[str]) -> str:
    """A misspelling's likely intent: a close spelling first, then the shortest name that starts
    with it or holds it (a shortened name: gpu_mem), then the closest by difflib's ratio."""
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    if close:
        return close[0]
    for holds in (lambda n: n.startswith(name), lambda n: name in n):
        matches = sorted((n for n in names if holds(n)), key=len)
        if matches:
            return matches[0]
    return difflib.get_close_matches(name, names, n=1, cutoff=0.0)[0]


__all__ = ["check_engine_kwargs", "engine_args_fields", "llm_parameters"]
