"""Building FSDP2-sharded models, optimizers and LR schedules, and moving state on and off
the device between phases.

Every model is loaded in fp32 on the CPU (the master weights), sharded with `fully_shard`
per decoder layer and then at the root, over a 1-D device mesh of all ranks. Mixed
precision computes in bf16 where the hardware has fast bf16 (GPUs, and CPUs with
AVX-512 bf16 or AMX) and reduces gradients in fp32.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from workers.device import get_device_name, host_device, is_cuda_available, supports_bf16


def resolve_mixed_precision(mode: str) -> torch.dtype:
    """The compute dtype for `fsdp_config.mixed_precision` (auto | bf16 | fp32)."""
    if mode == "fp32":
        return torch.float32
    if mode == "bf16":
        return torch.bfloat16
    if mode == "auto":
        return torch.bfloat16 if supports_bf16() else torch.float32
    raise ValueError(f"fsdp_config.mixed_precision={mode!r} is not one of auto, bf16, fp32")


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks, found by the model's own `_no_split_modules`."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        for attr in ("model.layers", "base_model.model.model.layers", "transformer.h"):
            obj = model
            try:
                for part in attr.split("."):
                    obj = getattr(obj, part)
            except AttributeError:
                continue
            return list(obj)
    return layers


def apply_fsdp2(model: torch.nn.Module, fsdp_config, param_dtype: torch.dtype) -> torch.nn.Module:
    world_size = dist.get_world_size()
    mesh = init_device_mesh(get_device_name(), (world_size,), mesh_dim_names=("fsdp",))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=True)
    offload = None
    if fsdp_config.get("offload_policy", False) and is_cuda_available():
        offload = CPUOffloadPolicy(pin_memory=True)
    kwargs = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": fsdp_config.get("reshard_after_forward", True)}
    if offload is not None:
        kwargs["offload_policy"] = offload
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def full_state_items(model: torch.nn.Module):
    """(name, full tensor) for every parameter and buffer, gathered one at a time."""
    for name, tensor in model.state_dict().items():
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        yield name, tensor


def load_full_state_dict(model: torch.nn.Module, full_sd: dict[str, torch.Tensor]) -> None:
    """Copy full tensors into a sharded model: each rank keeps its own shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, full_sd, options=StateDictOptions(full_state_dict=True, strict=False))


def build_optimizer(params, optim_config) -> torch.optim.Optimizer:
    betas = tuple(optim_config.get("betas", (0.9, 0.999)))
    return torch.optim.AdamW(
        params, lr=optim_config.lr, betas=betas, weight_decay=optim_config.get("weight_decay", 0.01)
    )


def build_lr_scheduler(optimizer, optim_config, total_steps: int):
    """transformers' schedules: constant / linear / cosine with warmup (and a floor)."""
    from transformers import get_scheduler
    from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

    total_steps = max(int(total_steps), 1)
    warmup = int(optim_config.get("lr_warmup_steps", -1))
    if warmup < 0:
        warmup = int(float(optim_config.get("lr_warmup_steps_ratio", 0.0)) * total_steps)
    style = optim_config.get("lr_scheduler_type") or optim_config.get("warmup_style", "constant")
    min_lr_ratio = float(optim_config.get("min_lr_ratio", 0.0) or 0.0)
    if style == "cosine":
        return get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, num_warmup_steps=warmup, num_training_steps=total_steps, min_lr_rate=min_lr_ratio
        )
    if style == "constant":
        return get_scheduler("constant_with_warmup", optimizer, num_warmup_steps=warmup)
    if style == "linear":
        return get_scheduler("linear", optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)
    raise ValueError(f"optim.warmup_style / lr_scheduler_type={style!r}: supported are constant, linear, cosine")


@torch.no_grad()
def offload_params(model: torch.nn.Module) -> None:
    """Move sharded parameters to host memory between phases (GPU only; a no-op on CPU)."""
    if is_cuda_available():
        model.to(host_device())
        torch.cuda.empty_cache()


@torch.no_grad()
def load_params(model: torch.nn.Module) -> None:
    if is_cuda_available():
        model.to(get_device_name())


@torch.no_grad()
def offload_optimizer(optimizer: torch.optim.Optimizer) -> None:
    if not is_cuda_available() or not optimizer.state:
        return
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.to(host_device(), non_blocking=True)
    torch.cuda.empty_cache()


@torch.no_grad()
def load_optimizer(optimizer: torch.optim.Optimizer) -> None:
    if not is_cuda_available() or not optimizer.state:
        return
    device = get_device_name()
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.to(device, non_blocking=True)
