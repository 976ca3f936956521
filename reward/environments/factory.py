"""One environment per trajectory, from the multi-turn config and the dataset row.

Which environment: `multi_turn.env_class` for the whole run, else the row's `env_class`
column (SkyRL's datasets), else the verl interaction of `interaction_config_path`. With
`tool_config_path` set, a `ToolEnv` answers the model's tool calls and hands turns
without a call to that environment (or, with none, ends the episode on them).

What an environment is built with, as skyrl-gym builds its own:
- `env_config`: `multi_turn.env_kwargs` as an OmegaConf mapping (key and attribute access,
  which skyrl-gym's `search` and `text2sql` need). A key named after an environment with
  a mapping value is that environment's own section (SkyRL's
  `environment.skyrl_gym.<env_class>`): it is merged over the other keys for that
  environment and left out for the rest.
- `extras`: the row (its columns, numpy values made plain), plus `reward_spec` taken from
  verl's `reward_model` column when the row has none (skyrl-gym's gsm8k reads
  `reward_spec`, its aime `reward_model`: both are there), plus `max_turns` =
  `max_assistant_turns` when that is set and the row has no `max_turns` (SkyRL sets it).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from reward.environments.registry import MULTI_TURN, get_env_cls, known_env_names

# Dataset columns that are the prompt itself, not something an environment reads.
_PROMPT_COLUMNS = ("raw_prompt", "raw_prompt_ids", "full_prompts", "multi_modal_data")


def plain(value):
    """Rows come from parquet through numpy: arrays and numpy scalars become lists and
    Python numbers, mappings (also frozen config ones) dicts, at every depth."""
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def env_extras(row: Mapping[str, Any], max_turns: int | None) -> dict[str, Any]:
    extras = {k: plain(v) for k, v in row.items() if k not in _PROMPT_COLUMNS}
    if "reward_spec" not in extras and isinstance(extras.get("reward_model"), Mapping):
        extras["reward_spec"] = dict(extras["reward_model"])
    if max_turns is not None and "max_turns" not in extras:
        extras["max_turns"] = int(max_turns)
    return extras


class EnvFactory:
    """Built once per rollout engine from `actor_rollout_ref.rollout.multi_turn`; loads the
    tool and interaction files and checks a run-wide env_class at once, so a mistake
    stops the run before any generation."""

    def __init__(self, multi_turn, tool_role: bool = False):
        self.config = multi_turn
        self.tool_role = tool_role
        self.env_kwargs = plain(multi_turn.env_kwargs or {})
        self.interactions = None
        self.tools = None
        if multi_turn.interaction_config_path:
            from reward.environments.interaction import load_interactions

            self.interactions = load_interactions(multi_turn.interaction_config_path)
        if multi_turn.tool_config_path:
            from reward.environments.tools import load_tools

            self.tools = load_tools(multi_turn.tool_config_path)
        if multi_turn.env_class:
            get_env_cls(multi_turn.env_class)

    @property
    def tool_schemas(self) -> list[dict] | None:
        return [tool.schema for tool in self.tools.values()] if self.tools else None

    def env_config(self, name: str):
        names = set(known_env_names()) | {name}
        shared = {k: v for k, v in self.env_kwargs.items() if not (k in names and isinstance(v, Mapping))}
        own = self.env_kwargs.get(name)
        merged = {**shared, **(own if isinstance(own, Mapping) else {})}
        return OmegaConf.create(copy.deepcopy(merged))

    def env_name(self, row: Mapping[str, Any]) -> str | None:
        name = self.config.env_class or row.get("env_class")
        # A missing cell of a mixed dataset reads as None or NaN.
        if name is None or (isinstance(name, float) and name != name) or not str(name):
            return None
        return str(name)

    def make(self, row: Mapping[str, Any]):
        """A fresh environment for one trajectory of `row`."""
        extras = env_extras(row, self.config.max_assistant_turns)
        name = self.env_name(row)
        inner = None
        if name is not None:
            inner = get_env_cls(name)(env_config=self.env_config(name), extras=extras)
        elif self.interactions is not None:
            from reward.environments.interaction import InteractionEnv

            inner = InteractionEnv(self.interactions, extras)
        if self.tools is not None:
            from reward.environments.tools import ToolEnv

            return ToolEnv(
                self.tools,
                inner,
                extras,
                int(self.config.max_tool_response_length),
                self.config.tool_response_truncate_side,
                self.tool_role,
                self.config.max_parallel_calls,
            )
        if inner is None:
            raise ValueError(
                f"no environment for this row: set {MULTI_TURN}.env_class (known: {', '.join(known_env_names())}), "
                f"give the data an env_class column, or set {MULTI_TURN}.interaction_config_path / tool_config_path"
            )
        return inner
