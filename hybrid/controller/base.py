"""What every worker group shares: turning a worker class's `@register`ed methods into
group methods that split the input across ranks, run every rank, and collect the results.

A concrete group supplies `world_size` and `_execute(method_name, per_rank_calls)` (which
runs rank i with per_rank_calls[i] and returns the outputs in rank order).
"""

from __future__ import annotations

import functools

from protocol.dispatch import collect_from_ranks, dispatch_to_ranks, get_registration


def registered_methods(worker_cls) -> dict[str, dict]:
    methods = {}
    for name in dir(worker_cls):
        if name.startswith("_"):
            continue
        attr = getattr(worker_cls, name, None)
        registration = get_registration(attr) if callable(attr) else None
        if registration is not None:
            methods[name] = registration
    return methods


class WorkerGroup:
    world_size: int

    def _bind_worker_methods(self, worker_cls) -> None:
        for name, registration in registered_methods(worker_cls).items():
            if hasattr(self, name):
                raise AttributeError(
                    f"{type(self).__name__} already has an attribute {name!r}; rename the worker method"
                )
            setattr(self, name, functools.partial(self._call, name, registration["dispatch_mode"]))

    def _call(self, method_name: str, mode, *args, **kwargs):
        per_rank, context = dispatch_to_ranks(mode, self.world_size, args, kwargs)
        outputs = self._execute(method_name, per_rank)
        return collect_from_ranks(mode, outputs, context)

    def _execute(self, method_name: str, per_rank_calls):  # pragma: no cover - abstract
        raise NotImplementedError
