"""Loading the PPO configuration and checking command-line overrides against it.

`load_config` composes `ppo_trainer.yaml` with Hydra's compose API (for tests and tools);
`python -m hybrid.main_ppo` composes the same file through `@hydra.main`. Both check
override keys first with `check_override_keys`, because Hydra's own error for a typo
("Key ... is not in struct") suggests nothing, and both pass overrides through
`normalize_overrides` so free-form dicts accept new keys without `+`.

Nothing here resolves interpolations: `${hybrid_default:...}` prepares the default model
and data when resolved, which only a run should do.
"""

from __future__ import annotations

import copy
import difflib
import functools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """A configuration the trainer cannot run; the message says what to change."""


CONFIG_DIR = str(Path(__file__).resolve().parent)
CONFIG_NAME = "ppo_trainer"

# Dicts passed through to a library or a user function as keyword arguments: any subkey is
# legal, so new ones are accepted without `+` (keys end with one of these dotted suffixes).
FREE_FORM_SUFFIXES = (
    "engine_kwargs.vllm",
    "override_config",
    "reward_kwargs",
    "apply_chat_template_kwargs",
    "env_kwargs",
    "worker_env_vars",
    "domain_quotas",
    "domain_tags",
    "domain_scorers",
    "domain_scorer_kwargs",
)

# verl sections for what hybrid does not have: any key inside is refused with the reason
# (rather than "unknown key"), so a verl script's user learns what is missing.
_SANDBOX = "hybrid has no sandbox code execution; score code in a custom reward function (custom_reward_function.path)"
_ENGINES = "hybrid's rollout engines are vllm and hf (transformers' generate); remove these keys"
REFUSED_SECTIONS = {
    "reward_model.sandbox_fusion": _SANDBOX,
    "sandbox_fusion": _SANDBOX,
    "actor_rollout_ref.rollout.engine_kwargs.sglang": _ENGINES,
    "actor_rollout_ref.rollout.engine_kwargs.trtllm": _ENGINES,
}


def refused_section_reason(key: str) -> str | None:
    """The reason a key inside one of REFUSED_SECTIONS is refused, or None."""
    for section, reason in REFUSED_SECTIONS.items():
        if key == section or key.startswith(section + "."):
            return reason
    return None


def _parse(overrides: Sequence[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        return OverridesParser.create().parse_overrides(overrides=list(overrides))
    except OverrideParseException as err:
        raise ConfigError(f"cannot parse override: {err}") from err


def _is_hydra_key(key: str) -> bool:
    # `hydra.run.dir=...`, `hydra/job_logging=...`: Hydra's own config, checked by Hydra.
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def config_paths(cfg: DictConfig) -> tuple[set[str], set[str]]:
    """All dotted paths of `cfg` (dicts, leaves and list items) and the subset that are dicts.

    Read through `to_container(resolve=False)` so no interpolation is resolved.
    """
    paths: set[str] = set()
    dicts: set[str] = set()

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            if prefix:
                dicts.add(prefix)
            for key, child in value.items():
                path = f"{prefix}.{key}" if prefix else str(key)
                paths.add(path)
                walk(path, child)
        elif isinstance(value, list):
            for index, child in enumerate(value):
                path = f"{prefix}.{index}"
                paths.add(path)
                walk(path, child)

    walk("", OmegaConf.to_container(cfg, resolve=False))
    return paths, dicts


def _is_free_form(key: str, dicts: set[str]) -> bool:
    """True when `key` lies inside one of the free-form dicts of the config."""
    parts = key.split(".")
    for end in range(1, len(parts)):
        prefix = ".".join(parts[:end])
        if prefix in dicts and any(prefix == s or prefix.endswith("." + s) for s in FREE_FORM_SUFFIXES):
            return True
    return False


def suggest_keys(key: str, paths: Iterable[str], limit: int = 3) -> list[str]:
    """Existing keys nearest to `key`: same last name under another parent first, then difflib."""
    paths = sorted(paths)
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [p for p in paths if p.rsplit(".", 1)[-1] == leaf]
    close = difflib.get_close_matches(key, paths, n=limit, cutoff=0.6)
    ordered = close[:1] + same_leaf + close[1:] if close else same_leaf
    seen: list[str] = []
    for path in ordered:
        if path not in seen:
            seen.append(path)
    return seen[:limit]


def check_override_keys(overrides: Sequence[str], cfg: DictConfig) -> None:
    """Raise ConfigError naming every `key=value` override whose key is not in `cfg`.

    `+key=value` and `++key=value` add keys and are not checked; `~key` must name an existing
    key; keys inside free-form dicts (FREE_FORM_SUFFIXES) are accepted; `hydra...` overrides
    are Hydra's business.
    """
    paths, dicts = config_paths(cfg)
    problems = []
    refused: dict[str, list[str]] = {}
    for override in _parse(overrides):
        key = override.key_or_group
        if _is_hydra_key(key):
            continue
        reason = refused_section_reason(key)
        if reason is not None and not override.is_delete():
            refused.setdefault(reason, []).append(key)
            continue
        if override.is_add() or override.is_force_add():
            continue
        if key in paths or _is_free_form(key, dicts):
            continue
        suggestions = suggest_keys(key, paths)
        if suggestions:
            hint = f"did you mean {suggestions[0]}?"
            if len(suggestions) > 1:
                hint += f" (other near keys: {', '.join(suggestions[1:])})"
        else:
            hint = "no similar key exists; `--cfg job` lists all keys"
        what = "cannot delete" if override.is_delete() else "unknown config key"
        problems.append(f"{what} {key!r} in override {override.input_line!r}: {hint}")
    problems += [f"{', '.join(keys)}: {reason}" for reason, keys in refused.items()]
    if problems:
        unknown = any(p.startswith(("unknown config key", "cannot delete")) for p in problems)
        lines = problems + (["to add a new key on purpose, write +key=value"] if unknown else [])
        raise ConfigError("\n".join(lines))


def normalize_overrides(overrides: Sequence[str], cfg: DictConfig) -> list[str]:
    """Rewrite overrides that Hydra would refuse but that mean something clear.

    - a new key inside a free-form dict (`...engine_kwargs.vllm.swap_space=1`), or the whole
      dict given at once (`...engine_kwargs.vllm={swap_space:1}`, merged into it), becomes
      `++key=value`, since Hydra's struct mode would otherwise demand a `+`;
    - `+key=value` for a key that already exists becomes `++key=value`: verl run scripts add
      with `+` keys that this config already declares, and Hydra's `+` refuses existing keys.
    Everything else is returned unchanged, in order.
    """
    paths, dicts = config_paths(cfg)
    result = []
    for raw, override in zip(overrides, _parse(overrides), strict=True):
        key = override.key_or_group
        if not _is_hydra_key(key) and override.package is None:
            if override.is_add() and key in paths:
                raw = "+" + raw
            elif not (override.is_add() or override.is_force_add() or override.is_delete()):
                # A new key inside a free-form dict, or the whole dict at once (`vllm={swap_space:4}`).
                whole = key in dicts and any(key == f or key.endswith("." + f) for f in FREE_FORM_SUFFIXES)
                if (key not in paths and _is_free_form(key, dicts)) or whole:
                    raw = "++" + raw
        result.append(raw)
    return result


def rewrite_foreign_overrides(overrides: Sequence[str]) -> tuple[list[str], str | None]:
    """verl keys spelled elsewhere or meaning nothing on this hardware (hybrid/config/foreign_keys.py):
    (the overrides rewritten, the one line naming the keys with no effect here, or None)."""
    from hybrid.config import verl_keys
    from hybrid.config.foreign_keys import rewrite_overrides

    # verl's newer keys first (hybrid/config/verl_keys.py), then the moved and hardware ones.
    overrides, verl_note, verl_problems = verl_keys.rewrite_overrides(
        overrides, config_paths(_cached_default(CONFIG_NAME))[0]
    )
    rewritten, note, problems = rewrite_overrides(overrides)
    if problems or verl_problems:
        raise ConfigError("\n".join(verl_problems + problems))
    notes = [n for n in (note, verl_note) if n]
    return rewritten, ("\nhybrid: ".join(notes) if notes else None)  # one line each, as main_ppo prints them


def default_config(config_name: str = CONFIG_NAME) -> DictConfig:
    """The composed configuration without overrides (unresolved); a fresh copy each call."""
    return copy.deepcopy(_cached_default(config_name))


@functools.cache
def _cached_default(config_name: str) -> DictConfig:
    # Composing takes ~0.15 s; the yaml does not change within a process. Callers only
    # read it (check_override_keys, normalize_overrides) or get a copy (default_config).
    return _compose(config_name, [])


def _compose(config_name: str, overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=config_name, overrides=overrides)


def compose_checked(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """Compose `config_name` with Hydra-style overrides whose keys are checked first
    (ConfigError for unknown keys, with suggestions); shared by the PPO and SFT configs."""
    from hybrid.defaults import register_resolvers

    register_resolvers()
    overrides = list(overrides)
    defaults = _cached_default(config_name)
    check_override_keys(overrides, defaults)
    return _compose(config_name, normalize_overrides(overrides, defaults))


def load_config(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose the PPO configuration with Hydra-style overrides, as `main_ppo` would.

    Raises ConfigError for unknown keys (with suggestions). Does not validate: call
    `validate_config` for that. Does not resolve interpolations.
    """
    overrides, _ = rewrite_foreign_overrides(overrides)
    return compose_checked(CONFIG_NAME, overrides)


__all__ = [
    "CONFIG_DIR",
    "CONFIG_NAME",
    "ConfigError",
    "check_override_keys",
    "compose_checked",
    "config_paths",
    "default_config",
    "load_config",
    "normalize_overrides",
    "rewrite_foreign_overrides",
    "suggest_keys",
]
