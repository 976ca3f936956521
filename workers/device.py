"""The one place that decides which device and collective backend this process uses.

Everything else asks here; no other module names `cuda`, `cpu`, `nccl` or `gloo`.
"""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def is_cuda_available() -> bool:
    if os.environ.get("HYBRID_DEVICE") == "cpu":
        return False
    return torch.cuda.is_available()


def select_device(name: str) -> None:
    """Apply `trainer.device`: `cpu` hides GPUs from hybrid (as HYBRID_DEVICE=cpu does, and
    Ray workers inherit it), `cuda` insists on one, `auto` takes a GPU when there is one."""
    if name == "cpu":
        os.environ["HYBRID_DEVICE"] = "cpu"
    elif name == "cuda":
        os.environ.pop("HYBRID_DEVICE", None)
    elif name != "auto":
        raise ValueError(f"trainer.device={name!r} is not one of auto, cuda, cpu")
    is_cuda_available.cache_clear()
    if name == "cuda":
        require_cuda("trainer.device=cuda")


def get_device_name() -> str:
    """`cuda` when a GPU is visible (and not disabled with HYBRID_DEVICE=cpu), else `cpu`."""
    return "cuda" if is_cuda_available() else "cpu"


def get_dist_backend() -> str:
    return "nccl" if is_cuda_available() else "gloo"


def get_torch_device():
    """The torch device module (`torch.cuda`) or None on CPU."""
    return torch.cuda if is_cuda_available() else None


def current_device() -> torch.device:
    if is_cuda_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def accelerator_name() -> str | None:
    """The GPU's name ('NVIDIA H200'), or None on the CPU."""
    return torch.cuda.get_device_name() if is_cuda_available() else None


def set_device_for_local_rank(local_rank: int) -> None:
    if is_cuda_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())


def supports_bf16() -> bool:
    """bf16 matmuls are fast here: any CUDA GPU with bf16, or a CPU with AVX-512 bf16 / AMX."""
    if is_cuda_available():
        return torch.cuda.is_bf16_supported()
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype_name(name: str) -> str:
    """`auto` -> `bfloat16` where bf16 matmuls are fast (see `supports_bf16`), else `float32`.

    On a CPU without AVX-512 bf16 a bf16 matmul runs several hundred times slower than
    fp32 (measured: 0.3 vs 175 GFLOPS on an AVX2 EPYC), so `auto` must not pick bf16 there."""
    if name == "auto":
        return "bfloat16" if supports_bf16() else "float32"
    return name


def empty_cache() -> None:
    if is_cuda_available():
        torch.cuda.empty_cache()


def memory_info() -> tuple[int, int] | None:
    """(free, total) bytes of this process's GPU, or None on the CPU."""
    if not is_cuda_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return int(free), int(total)


def require_cuda(feature: str) -> None:
    """GPU-only switches call this so a CPU run fails with a message naming the switch."""
    if not is_cuda_available():
        raise RuntimeError(f"{feature} needs a CUDA GPU and none is visible; set it to false on this machine")


def host_device() -> torch.device:
    """Where offloaded state lives between phases."""
    return torch.device("cpu")


# ---------------------------------------------------------------- placement and collectives

# What a process whose rank was placed without a GPU gets in its environment: hybrid's own
# switch, and CUDA's, since Ray (2.60 on) no longer blanks CUDA_VISIBLE_DEVICES for an actor
# that asked for no GPU; without it such a process would see every GPU of its node.
CPU_ONLY_ENV = {"HYBRID_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}


def cuda_forced_off() -> bool:
    """True when this run is held to the CPU (`trainer.device=cpu`, or HYBRID_DEVICE=cpu)."""
    return os.environ.get("HYBRID_DEVICE") == "cpu"


def cpu_only_env() -> dict[str, str]:
    """The environment that keeps a worker process off every GPU (see CPU_ONLY_ENV)."""
    return dict(CPU_ONLY_ENV)


def device_report() -> dict:
    """This process's device, as a rank reports it at start: {'device': 'cuda' | 'cpu',
    'device_index': the CUDA index (None on the CPU), 'device_uuid': the GPU's uuid (None on
    the CPU), 'visible_devices': CUDA_VISIBLE_DEVICES as set (None when unset)}. The uuid
    names the physical GPU whatever CUDA_VISIBLE_DEVICES renumbers."""
    report = {
        "device": get_device_name(),
        "device_index": None,
        "device_uuid": None,
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    if is_cuda_available():
        index = torch.cuda.current_device()
        report["device_index"] = index
        report["device_uuid"] = str(torch.cuda.get_device_properties(index).uuid)
    return report


def collective_target(tensor_device: str, backend: str) -> str | None:
    """Where a tensor on `tensor_device` ('cpu', 'cuda') must go before a collective of
    `backend` ('nccl', 'gloo'): NCCL takes device tensors only, so a host-resident tensor
    (FSDP2's CPUOffloadPolicy, offloaded parameters) goes to the rank's GPU ('cuda'); gloo
    takes what it is given (None: it stays)."""
    if backend == "nccl" and tensor_device != "cuda":
        return "cuda"
    return None


def for_collective(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` where this process group's collectives take it: on a GPU a host-resident
    tensor (a DTensor whose local shard was offloaded) is copied to this rank's device; on
    the CPU (gloo) it is returned as it is."""
    if collective_target(tensor.device.type, get_dist_backend()) is None:
        return tensor
    return tensor.to(current_device(), non_blocking=True)
