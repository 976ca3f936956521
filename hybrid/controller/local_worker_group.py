"""One rank in the driver's own process, with the same interface as the Ray worker group.

For single-device machines, for GPU boxes without Ray, and for debugging a worker with
breakpoints. The worker is constructed here, so it joins a world of size 1.
"""

from __future__ import annotations

import os

from hybrid.controller.base import WorkerGroup


class LocalWorkerGroup(WorkerGroup):
    def __init__(self, worker_cls, *args, name: str = "local", **kwargs):
        self.world_size = 1
        self.name = name
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
        # workers/base.py's Worker picks its own free port for a world of one.
        self.worker = worker_cls(*args, **kwargs)
        self._bind_worker_methods(worker_cls)

    def _execute(self, method_name: str, per_rank_calls):
        args, kwargs = per_rank_calls[0]
        return [getattr(self.worker, method_name)(*args, **kwargs)]

    def shutdown(self) -> None:
        self.worker = None
