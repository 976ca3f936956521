"""Loading a user's Python file (reward function, environment, dataset class) as a module,
and naming a user's callable in messages (`describe_callable`).

One module per file, named after a hash of its path, so two files with the same base name
(`env.py`, `reward.py`) do not replace each other in sys.modules; registered there so the
classes and functions it defines pickle (process pools, DataLoader workers, Ray actors).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from types import ModuleType


def load_user_file(path: str, key: str, what: str, prefix: str) -> tuple[ModuleType, str]:
    """(module, absolute path) of the file at `path`; errors name the config `key`."""
    resolved = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(resolved):
        raise FileNotFoundError(
            f"{key}: {what} file {path!r} not found (resolved to {resolved}, working directory {os.getcwd()})"
        )
    module_name = f"{prefix}_{hashlib.sha1(resolved.encode()).hexdigest()[:12]}"
    module = sys.modules.get(module_name)
    if module is not None and getattr(module, "__file__", None) == resolved:
        return module, resolved
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise ImportError(f"{key}: cannot load {resolved} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[module_name]
        raise ImportError(f"{key}: importing {resolved} failed: {type(e).__name__}: {e}") from e
    return module, resolved


def describe_callable(fn: Callable) -> str:
    """A name and a file for messages about `fn`."""
    if hasattr(fn, "describe"):
        return fn.describe()
    inner = fn
    while isinstance(inner, functools.partial):
        inner = inner.func
    name = getattr(inner, "__qualname__", None) or repr(inner)
    source = inspect.getsourcefile(inner) if inspect.isfunction(inner) else None
    return f"{name} in {source}" if source else f"{getattr(inner, '__module__', '?')}.{name}"
