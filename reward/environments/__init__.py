"""Environments for multi-turn rollouts: they judge each model turn and answer it.

- base.py: the contract (skyrl-gym's BaseTextEnv: init / step / close / get_metrics) and
  the check of a step's output;
- registry.py: names -> classes (`register_env`, `get_env_cls`, `ENV_REGISTRY`; user
  classes as `path/to/file.py:ClassName`; skyrl-gym's environments when installed);
- factory.py: one environment per trajectory from the config and the dataset row;
- arithmetic_retry.py: the built-in offline environment (`arithmetic_retry`);
- sokoban.py, frozen_lake.py (on grid_game.py): ROLL's grid games (`sokoban`, `frozen_lake`),
  each board made from the row's seed;
- interaction.py: verl interactions through the contract;
- tools.py, python_tool.py: verl tools (hermes tool calls) and the built-in Python tool.
"""

from reward.environments import arithmetic_retry, frozen_lake, sokoban  # noqa: F401  (register themselves)
from reward.environments.base import BaseTextEnv, EnvironmentFailed, EnvTimeout, StepOutput, check_step_output
from reward.environments.factory import EnvFactory, env_extras
from reward.environments.registry import ENV_REGISTRY, get_env_cls, known_env_names, register_env

__all__ = [
    "BaseTextEnv",
    "ENV_REGISTRY",
    "EnvFactory",
    "EnvTimeout",
    "StepOutput",
    "check_step_output",
    "EnvironmentFailed",
    "env_extras",
    "get_env_cls",
    "known_env_names",
    "register_env",
]
