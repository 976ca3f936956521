"""Calling plug-in code that may be async (verl's tools and interactions are coroutines),
from the rollout's environment threads, optionally under a time limit."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import threading


def resolve(value):
    """`value`, or what it resolves to when it is awaitable (run on a fresh event loop:
    each environment thread has none of its own)."""
    if not inspect.isawaitable(value):
        return value

    async def wait():
        return await value

    return asyncio.run(wait())


def call(fn, *args, **kwargs):
    return resolve(fn(*args, **kwargs))


class CallTimeout(Exception):
    pass


def call_with_limit(limit_s: float, fn, *args, **kwargs):
    """`call(fn, ...)` in a daemon thread; CallTimeout when it has not returned after
    `limit_s` seconds. A thread cannot be killed: one past its limit is left to finish on
    its own (daemon, so it never holds the process open), and its result is dropped."""
    box: dict = {}

    def target():
        try:
            box["value"] = call(fn, *args, **kwargs)
        except BaseException as e:  # handed to the caller, raised there
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True, name="env-call")
    thread.start()
    thread.join(limit_s)
    if thread.is_alive():
        raise CallTimeout(f"no answer after {limit_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def import_class(dotted: str, what: str):
    """`package.module.ClassName` -> the class; ImportError naming `what` and the name."""
    module_name, _, class_name = dotted.rpartition(".")
    if not module_name:
        raise ImportError(f"{what}: class_name {dotted!r} must be a dotted path, e.g. my_pkg.my_module.MyClass")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"{what}: cannot import {module_name!r} for class_name {dotted!r}: {e}") from e
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ImportError(f"{what}: {module_name} has no {class_name!r} (class_name {dotted!r})")
    return cls
