"""From a composed config tree to a checked `HybridConfig`, every problem reported at once.

`typed_config(cfg)` is the boundary: it imports the plug-in modules named by
`actor_rollout_ref.model.external_lib`, resolves the tree (the default model and data
behind `${hybrid_default:...}` stay placeholders, so checking costs milliseconds and never
converts a model), builds the section dataclasses (which check each key's type and
range), then runs the rules that involve several keys. `validate_config` is the same
without keeping the result.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hybrid.config.derived import with_derived_values
from hybrid.config.loading import ConfigError
from hybrid.config.rules import check_config
from hybrid.config.schema import HybridConfig
from hybrid.defaults import DEFAULT_ASSET_PREFIX
from protocol.config_schema import INVALID, Problems, build_section

ARR = "actor_rollout_ref"
_DEFAULT_ASSET = re.compile(r"^\$\{hybrid_default:(\w+)\}$")


# ---------------------------------------------------------------- reading the tree


def _walk(node: Any, prefix: str = ""):
    """(dotted key, parent node, leaf name) for every leaf of an OmegaConf tree."""
    if isinstance(node, DictConfig):
        for key in node.keys():
            path = f"{prefix}.{key}" if prefix else str(key)
            child = node._get_node(key)
            if isinstance(child, (DictConfig, ListConfig)) and not OmegaConf.is_interpolation(node, key):
                yield from _walk(child, path)
            else:
                yield path, node, key
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            path = f"{prefix}.{index}"
            child = node._get_node(index)
            if isinstance(child, (DictConfig, ListConfig)) and not OmegaConf.is_interpolation(node, index):
                yield from _walk(child, path)
            else:
                yield path, node, index


def import_plugins(cfg: DictConfig, problems: Problems) -> None:
    """Import `actor_rollout_ref.model.external_lib` (a module or a list of them)."""
    key = f"{ARR}.model.external_lib"
    try:
        value = OmegaConf.select(cfg, key, default=None)
    except OmegaConfBaseException as err:
        problems.add(f"{key}: cannot be read ({err})")
        return
    names = [value] if isinstance(value, str) else list(value or [])
    for name in names:
        try:
            importlib.import_module(str(name))
        except Exception as err:  # the user's module: any failure is theirs to see
            problems.add(
                f"{key}: cannot import {name!r} ({type(err).__name__}: {err}); check the module name and PYTHONPATH"
            )


def resolved_container(cfg: DictConfig, problems: Problems) -> tuple[dict, set[str]]:
    """The tree as plain data with interpolations resolved, and the keys that were interpolations.

    `${hybrid_default:NAME}` becomes the placeholder `hybrid-default:NAME` (also in keys
    that point at it); `hybrid.defaults.resolve_default_assets` prepares the real paths
    when a run starts. A key that cannot be resolved is reported and left INVALID.
    """
    work = DictConfig(OmegaConf.to_container(cfg, resolve=False))
    interpolated = set()
    for path, parent, leaf in list(_walk(work)):
        if OmegaConf.is_interpolation(parent, leaf):
            raw = parent._get_node(leaf)._value()
            match = _DEFAULT_ASSET.match(str(raw))
            if match:
                parent[leaf] = DEFAULT_ASSET_PREFIX + match.group(1)
            else:
                interpolated.add(path)
    for path, parent, leaf in list(_walk(work)):
        try:
            value = parent[leaf]
        except OmegaConfBaseException as err:
            reason = str(err).splitlines()[0]
            problems.add(f"{path}: cannot be read ({type(err).__name__}: {reason})")
            value = INVALID
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        _assign(work, path, value)
    return _plain(work), interpolated


def _assign(work: DictConfig, path: str, value: Any) -> None:
    # Written as a plain value: later reads of this key no longer interpolate.
    parent_path, _, leaf = path.rpartition(".")
    parent = OmegaConf.select(work, parent_path) if parent_path else work
    key = int(leaf) if isinstance(parent, ListConfig) else leaf
    if value is INVALID:
        parent[key] = "__INVALID__"
    else:
        parent[key] = value


def _plain(node: Any) -> Any:
    data = OmegaConf.to_container(node, resolve=False)

    def restore(value):
        if value == "__INVALID__":
            return INVALID
        if isinstance(value, dict):
            return {k: restore(v) for k, v in value.items()}
        if isinstance(value, list):
            return [restore(v) for v in value]
        return value

    return restore(data)


# ---------------------------------------------------------------- the boundary


def typed_config(cfg: DictConfig | dict, world_size: int | None = None) -> HybridConfig:
    """The checked, frozen configuration of a composed tree; ConfigError lists every problem.

    `world_size` (training ranks) defaults to `trainer.nnodes * trainer.n_gpus_per_node`.
    """
    if isinstance(cfg, dict):
        cfg = OmegaConf.create(cfg)
    problems = Problems()
    import_plugins(cfg, problems)
    data, interpolated = resolved_container(cfg, problems)
    data.pop("hydra", None)
    config = build_section(HybridConfig, data, "", problems, interpolated)
    if world_size is not None and (not isinstance(world_size, int) or world_size <= 0):
        problems.add(f"world_size={world_size!r} must be a positive integer")
        world_size = None
    check_config(config, problems, world_size)
    raise_problems(problems, "configuration")
    return with_derived_values(config, world_size)


def raise_problems(problems: Problems, what: str) -> None:
    """ConfigError listing every problem, one line each, when there is any."""
    if problems:
        count = len(problems)
        header = f"invalid {what} ({count} problem{'s' if count > 1 else ''}):"
        raise ConfigError("\n".join([header] + [f"  - {p}" for p in problems]))


def validate_config(cfg: DictConfig, world_size: int | None = None) -> None:
    """Raise ConfigError listing every problem in `cfg`, one line each."""
    typed_config(cfg, world_size)


__all__ = ["ConfigError", "raise_problems", "typed_config", "validate_config"]
