"""Base class of every device-side worker: its rank in the group and the process group.

A worker group (Ray actors or in-process) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
and MASTER_PORT in the environment before constructing the worker; the worker joins the
torch.distributed group with the backend the device helper chooses (gloo on CPU, nccl on
GPU). World size 1 still forms a group so FSDP2 runs the same code on one rank.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch.distributed as dist

from workers.device import get_dist_backend, set_device_for_local_rank
from workers.host_memory import keep_freed_host_memory


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_ip_address() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


class Worker:
    """Holds rank/world size from the environment and owns the default process group."""

    def __init__(self) -> None:
        keep_freed_host_memory()
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            if self.world_size > 1:
                raise RuntimeError("MASTER_PORT must be set for a worker group of more than one rank")
            os.environ["MASTER_PORT"] = str(find_free_port())
        set_device_for_local_rank(self.local_rank)
        if not dist.is_initialized():
            dist.init_process_group(
                backend=get_dist_backend(),
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=int(os.environ.get("HYBRID_DIST_TIMEOUT_S", "1800"))),
            )

    def ping(self) -> int:
        return self.rank
