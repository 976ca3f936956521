"""What the SkyRL and ROLL dialects share for multi-turn rollouts: the verl section they
write (`actor_rollout_ref.rollout.multi_turn`) and the check that an environment name is one
hybrid can build (reward/environments/registry.py: its registered names, skyrl-gym's when
that package is installed, `path/to/env.py:ClassName`, or `package.module:ClassName`, the
entry point a SkyRL example's own entry module registers its environment under).

The check runs while the dialect translates, so a name hybrid does not know stops the run
before anything loads, with every known name in the reason.
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.table import Refusal

MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"
ENV_KWARGS = f"{MULTI_TURN}.env_kwargs"
FILE_SPEC = "path/to/env.py:ClassName"
MODULE_SPEC = "package.module:ClassName"


def is_file_spec(name: str) -> bool:
    """`path/to/env.py:ClassName`: a user's class, loaded from the file when the run starts."""
    path, sep, class_name = name.rpartition(":")
    return bool(sep) and path.endswith(".py") and bool(class_name)


def is_module_spec(name: str) -> bool:
    """`package.module:ClassName`: imported when the run starts (from the working directory, as
    `python -m` finds modules), the way skyrl-gym loads a registered entry point."""
    module, sep, class_name = name.partition(":")
    return bool(sep) and all(part.isidentifier() for part in module.split(".")) and class_name.isidentifier()


def known_environments() -> tuple[list[str], bool]:
    """(every registered environment name, whether skyrl-gym's registry was readable)."""
    # Importing the package registers the built-ins (arithmetic_retry); imported here, not at
    # the top, because reading skyrl-gym's registry takes about a second.
    import reward.environments  # noqa: F401
    from reward.environments.registry import known_env_names, skyrl_registry

    return known_env_names(), skyrl_registry() is not None


def check_environment(name: Any, hint: str = "") -> str:
    """`name` when hybrid can build that environment, else Refusal naming the known ones."""
    if not isinstance(name, str) or not name.strip():
        raise Refusal(f"an environment name (a registered name or {FILE_SPEC})")
    if is_file_spec(name) or is_module_spec(name):
        return name
    known, has_skyrl_gym = known_environments()
    if name in known:
        return name
    missing = "" if has_skyrl_gym else " (skyrl-gym's environments need the package: pip install 'hybrid[env]')"
    reason = (
        f"no environment of that name in hybrid{missing}; known: {', '.join(known) or 'none'}; "
        f"a user environment (skyrl-gym's BaseTextEnv contract: init, step, close) is given as {FILE_SPEC} "
        f"or {MODULE_SPEC}"
    )
    raise Refusal(f"{hint}; {reason}" if hint else reason)


__all__ = [
    "ENV_KWARGS",
    "FILE_SPEC",
    "MODULE_SPEC",
    "MULTI_TURN",
    "check_environment",
    "is_file_spec",
    "is_module_spec",
    "known_environments",
]
