"""Which environment class a name means.

Three sources, looked up in this order:

1. `ENV_REGISTRY`: classes registered with `@register_env("name")` (the built-ins, and
   whatever a module named in `actor_rollout_ref.model.external_lib` registers);
2. a file path and a class name, `path/to/my_env.py:MyEnv` (relative to the working
   directory), loaded the way reward functions are, or a module and a class name,
   `package.module:MyEnv`, imported with the working directory on the path (as `python -m`
   and skyrl-gym's registered entry points do);
3. skyrl-gym's registry, when the `skyrl-gym` package is installed (the `env` extra):
   `gsm8k`, `gsm8k_multi_turn`, `aime`, `lcb`, `searchcode`, `text2sql`, `search`, and
   anything registered with `skyrl_gym.register`. Their classes are used unchanged.

An unknown name fails with every known name in the message.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys

from reward.user_code import load_user_file

ENV_REGISTRY: dict[str, type] = {}

MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"


def register_env(name: str):
    """Class decorator: make the class available as `env_class=name`."""

    def decorator(cls: type) -> type:
        existing = ENV_REGISTRY.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(
                f"environment name {name!r} is already registered to {existing.__module__}.{existing.__qualname__}"
            )
        ENV_REGISTRY[name] = cls
        return cls

    return decorator


def skyrl_registry() -> dict | None:
    """skyrl-gym's registry (id -> EnvSpec), or None when the package is not installed."""
    try:
        from skyrl_gym.envs.registration import registry
    except ImportError:
        return None
    return registry


def known_env_names() -> list[str]:
    return sorted(set(ENV_REGISTRY) | set(skyrl_registry() or {}))


def _load_module(path: str):
    return load_user_file(path, f"{MULTI_TURN}.env_class", "environment", "custom_env")


def load_env_from_file(spec: str) -> type:
    """The class named by `path/to/file.py:ClassName`."""
    path, _, class_name = spec.rpartition(":")
    module, resolved = _load_module(path)
    cls = getattr(module, class_name, None)
    if not inspect.isclass(cls):
        defined = sorted(k for k, v in vars(module).items() if inspect.isclass(v) and v.__module__ == module.__name__)
        what = "not found" if cls is None else f"is a {type(cls).__name__}, not a class"
        raise AttributeError(
            f"{MULTI_TURN}.env_class: environment class {class_name!r} {what} in {resolved}; "
            f"classes defined there: {defined or 'none'}"
        )
    if not callable(getattr(cls, "step", None)):
        raise TypeError(f"{MULTI_TURN}.env_class: {class_name} in {resolved} has no step(action) method")
    return cls


def _is_file_spec(name: str) -> bool:
    path, sep, class_name = name.rpartition(":")
    return bool(sep) and path.endswith(".py") and bool(class_name)


def _is_module_spec(name: str) -> bool:
    module, sep, class_name = name.partition(":")
    return bool(sep) and all(part.isidentifier() for part in module.split(".")) and class_name.isidentifier()


def load_env_from_module(spec: str) -> type:
    """The class named by `package.module:ClassName`."""
    module_name, _, class_name = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # where `python -m` finds modules; a Ray worker has not
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        missing = getattr(err, "name", None)
        if missing and not (module_name == missing or module_name.startswith(missing + ".")):
            # The module is there; a package it imports is not (VisGym's gymnasium fork, say).
            raise ImportError(
                f"{MULTI_TURN}.env_class: module {module_name!r} imports {missing!r}, which is not installed; "
                f"install it ({type(err).__name__}: {err})"
            ) from err
        raise ImportError(
            f"{MULTI_TURN}.env_class: cannot import module {module_name!r} ({type(err).__name__}: {err}); "
            f"run from the folder that holds it (working directory {os.getcwd()}) or add it to PYTHONPATH"
        ) from err
    cls = getattr(module, class_name, None)
    if not inspect.isclass(cls) or not callable(getattr(cls, "step", None)):
        raise TypeError(f"{MULTI_TURN}.env_class: {module_name} has no environment class {class_name!r} with step()")
    return cls


def get_env_cls(name: str) -> type:
    """The environment class for `name` (see the module docstring for the lookup order)."""
    if name in ENV_REGISTRY:
        return ENV_REGISTRY[name]
    if _is_file_spec(name):
        return load_env_from_file(name)
    if _is_module_spec(name):
        return load_env_from_module(name)
    registry = skyrl_registry()
    if registry is not None and name in registry:
        from skyrl_gym.envs.registration import load_env_creator

        entry_point = registry[name].entry_point
        return entry_point if callable(entry_point) else load_env_creator(entry_point)
    hint = "" if registry is not None else " (skyrl-gym's environments need the package: pip install 'hybrid[env]')"
    raise ValueError(
        f"unknown environment {name!r}; known: {', '.join(known_env_names()) or 'none'}{hint}. "
        f"A user environment is given as path/to/file.py:ClassName"
    )
