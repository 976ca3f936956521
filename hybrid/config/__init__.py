"""The driver's configuration: composing `ppo_trainer.yaml` with overrides (loading.py),
the typed sections (schema.py, composing the workers' own in workers/config), the checks
(validate.py, rules.py) and the values derived once from several sections (derived.py).

`build_config(overrides)` is the Python API (notebooks, tests): it composes the yaml with
the overrides and returns the frozen, checked `HybridConfig`; change it with
`dataclasses.replace` and train it with `hybrid.run.run_ppo`.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybrid.config.loading import (
    CONFIG_DIR,
    CONFIG_NAME,
    ConfigError,
    check_override_keys,
    config_paths,
    default_config,
    load_config,
    normalize_overrides,
    suggest_keys,
)
from hybrid.config.schema import HybridConfig
from hybrid.config.validate import typed_config, validate_config


def build_config(overrides: Sequence[str] = (), world_size: int | None = None) -> HybridConfig:
    """The checked, frozen configuration for these Hydra-style overrides.

    Raises ConfigError listing every problem. The default model and data stay placeholders
    (`hybrid-default:model`, ...) until a run prepares them.
    """
    return typed_config(load_config(overrides), world_size=world_size)


__all__ = [
    "CONFIG_DIR",
    "CONFIG_NAME",
    "ConfigError",
    "HybridConfig",
    "build_config",
    "check_override_keys",
    "config_paths",
    "default_config",
    "load_config",
    "normalize_overrides",
    "suggest_keys",
    "typed_config",
    "validate_config",
]
