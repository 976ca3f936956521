"""Base class of every device-side worker: its rank in the group and the process group.

A worker group (Ray actors or in-process) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
and MASTER_PORT in the environment before constructing the worker; the worker joins the
torch.distributed group with the backend the device helper chooses (gloo on CPU, nccl on
GPU). World size 1 still forms a group so FSDP2 runs the same code on one rank.

Every worker also says where it runs (`process_info`: pid, node, device; the Ray worker
group records it so a dead rank's message can name its node, and refuses two ranks on one
GPU) and what it holds
(`memory_stats`: resident memory, file descriptors, threads, the GPU's peak allocation).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch.distributed as dist

from protocol.dispatch import Dispatch, register
from workers.device import device_report, get_dist_backend, get_torch_device, set_device_for_local_rank
from workers.host_memory import keep_freed_host_memory, process_stats


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_id() -> str:
    """Ray's id of this process's node ('' outside Ray): on one machine with several raylets
    (a test cluster) the ip is the same for every node, the id is not."""
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id() or ""
    except ImportError:
        pass
    return ""


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
        if self.world_size == 1 and not dist.is_initialized() and "TORCHELASTIC_RUN_ID" not in os.environ:
            # A world of one needs no agreed port; an inherited MASTER_PORT may belong to a parent
            # process that still listens on it (a test runner, a launcher). Under torchrun the
            # port is the launcher's store, which the rank must use.
            os.environ["MASTER_PORT"] = str(find_free_port())
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

    def process_info(self) -> dict:
        """Where this rank runs: {'pid', 'node_ip', 'node_id', 'hostname'} and its device
        (workers/device.device_report: 'device', 'device_index', 'device_uuid',
        'visible_devices'), which the driver checks for two ranks on one GPU
        (hybrid/placement.py)."""
        return {
            "pid": os.getpid(),
            "node_ip": node_ip_address(),
            "node_id": node_id(),
            "hostname": socket.gethostname(),
            **device_report(),
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def memory_stats(self) -> dict:
        """This rank's host memory, fds and threads (workers/host_memory.py), and on a GPU
        its peak allocated and reserved device memory since the process started, in GB."""
        stats = process_stats()
        device = get_torch_device()
        if device is not None:
            stats["max_memory_allocated_gb"] = device.max_memory_allocated() / 1e9
            stats["max_memory_reserved_gb"] = device.max_memory_reserved() / 1e9
        return stats
