"""The reward package's own config: `custom_reward_function` (a user's file and function)
and the folding of verl's `overlong_buffer_cfg` spelling of the DAPO overlong penalty
into hybrid's `overlong_buffer` (both under `reward_model.reward_kwargs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OVERLONG, OVERLONG_VERL = "overlong_buffer", "overlong_buffer_cfg"
OVERLONG_KEYS = ("enable", "len", "penalty_factor", "log")


def fold_overlong_spellings(reward_kwargs: dict[str, Any]) -> dict[str, Any]:
    """verl's `overlong_buffer_cfg` folded into hybrid's `overlong_buffer`: one setting, two
    spellings (hybrid/config/validate.py refuses them set differently); verl's entries win over the
    yaml's defaults."""
    kwargs = dict(reward_kwargs)
    cfg = kwargs.pop(OVERLONG_VERL, None)
    if cfg is not None:
        kwargs[OVERLONG] = {**dict(kwargs.get(OVERLONG) or {}), **dict(cfg)}
    return kwargs


@dataclass(frozen=True)
class CustomRewardFunctionConfig:
    path: str | None
    name: str
    reward_kwargs: dict[str, Any]
