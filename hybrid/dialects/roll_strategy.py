"""The strategy settings of a ROLL worker section (strategy_args.strategy_config of the FSDP2
strategy, the Megatron strategy's layout keys, the training dtype) read onto verl's FSDP keys:
what changes only how the same computation is laid out over devices is mapped or reported as
such, what changes the computation is refused (roll_workers.py applies these rules per role).
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.roll_placement import ACTOR, REF, parse_devices
from hybrid.dialects.table import (
    Context,
    Refusal,
    Rule,
    custom,
)


def _dtype_train(prefix: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        names = {"bf16": "bf16", "fp32": "fp32"}
        if value not in names:
            raise Refusal("supported: bf16, fp32 (hybrid trains fp16 nowhere)")
        return {f"{prefix}.mixed_precision": names[value]}

    return convert


# The FSDP section of each FSDP2 role, and its key for ROLL's offload_policy (CPUOffloadPolicy).
_FSDP = {
    "actor_train": (f"{ACTOR}.fsdp_config", "offload_policy"),
    "critic": ("critic.model.fsdp_config", "offload_policy"),
    "reference": (f"{REF}.fsdp_config", "param_offload"),
}
_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32"}
# ROLL FSDP2 settings that tune memory, speed or the layout of the shards only: what is computed is
# the same (up to rounding) whatever their values (roll/distributed/strategy/fsdp2_strategy.py,
# roll/utils/fsdp_utils.py apply_fsdp2).
_LAYOUT = "changes how the same computation is laid out over the devices, not what is computed"
_FSDP2_MACHINERY = {
    "reduce_dtype": "hybrid reduces gradients in fp32, at least as exact as ROLL's bf16 reduction (a speed setting)",
    "use_batched_model_update": "hybrid's weight sync gathers in buckets of rollout.update_weights_bucket_megabytes",
    "reduce_scatter_during_grad_accumulation": "a communication schedule: the gradients are the same",
    "async_save_ckpt": "hybrid saves checkpoints synchronously",
    "tiled_num_shards": "read only with apply_tiled_mlp (a memory setting)",
    "model_type": "read only with apply_tiled_mlp (a memory setting)",
    "wrap_policy": "which modules are FSDP units (transformer_layer_cls_to_wrap, wrap_embeddings, wrap_lm_output, "
    "moe_experts): the granularity of sharding and gathering, a memory and communication setting; hybrid "
    "wraps every decoder layer",
    "apply_tiled_mlp": "the MLP computed in chunks of the sequence to save activation memory; hybrid computes it "
    "whole: the same values",
    "apply_expert_patch": "ROLL's MoE block forward rewritten so that its experts can be FSDP units; " + _LAYOUT,
    "ep_size": f"expert parallelism: {_LAYOUT}; hybrid shards the experts with FSDP like every weight",
    "efsdp_size": f"the FSDP group of the experts under expert parallelism: {_LAYOUT}",
    "moe_use_grouped_mm": "a grouped-GEMM kernel for the experts: the same products, computed in one call",
}
# A reference on megatron_infer only runs forward passes of the same weights: its Megatron
# settings choose how that forward is split over devices and which kernels run it, not its
# values (up to rounding), so hybrid's FSDP2 forward in actor_train's workers stands for it.
_MEGATRON_FORWARD_LAYOUT = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "context_parallel_size",
    "sequence_parallel",
    "moe_token_dispatcher_type",
    "moe_grouped_gemm",
    "moe_shared_expert_overlap",
    "bias_activation_fusion",
    "account_for_loss_in_pipeline_split",
    "account_for_embedding_in_pipeline_split",
    "use_distributed_optimizer",  # no optimizer in a forward-only worker
)
# Accepted at the value hybrid behaves like; any other is refused with the reason.
_FSDP2_FIXED = {
    "save_only_model": (
        lambda v: not v,
        "hybrid's checkpoints are resumable (optimizer included); choose their contents with "
        "actor_rollout_ref.actor.checkpoint.save_contents in verl keys",
    ),
}


def _shard_group(value: Any, ctx: Context) -> int:
    """ROLL's fsdp_size as the layout its FSDP2 strategy builds (create_device_mesh_with_ep): at most
    1 or at least the training devices shard over all of them (-1 in verl keys), a size between
    shards within groups of that many ranks replicated across the groups (hybrid sharding)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise Refusal("an integer number of ranks per shard group")
    devices = len(parse_devices(ctx.get("actor_train.device_mapping"))) if ctx.has("actor_train.device_mapping") else 0
    if value <= 1 or not devices or value >= devices:
        return -1
    if devices % value:
        raise Refusal(
            f"does not divide actor_train's {devices} devices into shard groups (ROLL's device mesh "
            f"world_size // fsdp_size x fsdp_size could not be built either)"
        )
    return value


def _strategy_config(role: str):
    """`<role>.strategy_args.strategy_config.*` of ROLL's FSDP2 strategy onto hybrid's FSDP section."""
    refused_strategies = (
        "megatron_train",
        "megatron_infer",
        "deepspeed_train",
        "deepspeed_infer",
        "diffusion_deepspeed_train",
    )
    prefix, offload = _FSDP[role]
    start = len(f"{role}.strategy_args.strategy_config.")

    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        strategy = ctx.get(f"{role}.strategy_args.strategy_name")
        name = ctx.key[start:].split(".", 1)[0]
        if role == "reference" and strategy == "megatron_infer":
            if not name or name in _MEGATRON_FORWARD_LAYOUT:
                return {}  # the layout of a forward pass whose log-probs hybrid computes with FSDP2
            raise Refusal(
                "not a layout setting of a forward-only Megatron reference that hybrid knows; known: "
                + ", ".join(_MEGATRON_FORWARD_LAYOUT)
            )
        if strategy in refused_strategies:
            return {}  # the strategy itself is refused, with its reason
        if not name:
            if value in (None, {}):
                return {}  # strategy_config: null (ROLL's defaults)
            raise Refusal("a mapping of FSDP2 settings")
        if name == "param_dtype":
            if str(value) not in _DTYPES:
                raise Refusal("supported: bf16, fp32 (hybrid computes in neither fp16 nor fp8)")
            return {f"{prefix}.mixed_precision": _DTYPES[str(value)]}
        if name == "reshard_after_forward":
            return {} if value is None else {f"{prefix}.reshard_after_forward": bool(value)}
        if name == "offload_policy":
            return {f"{prefix}.{offload}": bool(value)}
        if name == "fsdp_size":
            group = _shard_group(value, ctx)
            if role != "reference":
                return {f"{prefix}.fsdp_size": group}
            actor_key = "actor_train.strategy_args.strategy_config.fsdp_size"
            actor = ctx.get(actor_key, 1)
            if group != _shard_group(actor, ctx):
                raise Refusal(
                    f"hybrid's reference runs in actor_train's workers, sharded over its shard groups "
                    f"({actor_key}={actor}); give the reference the same layout"
                )
            return {}
        if name in _FSDP2_MACHINERY:
            if name == "reduce_dtype" and str(value) not in _DTYPES:
                raise Refusal("supported: float32, bf16 (hybrid reduces in fp32)")
            return {}
        if name in _FSDP2_FIXED:
            accepted, reason = _FSDP2_FIXED[name]
            if accepted(value):
                return {}
            raise Refusal(reason)
        raise Refusal(
            "not a setting of ROLL's FSDP2 strategy that hybrid knows; known: param_dtype, reduce_dtype, "
            "reshard_after_forward, offload_policy, fsdp_size, wrap_policy (and its MoE, tiled-MLP and "
            "checkpoint switches at their defaults)"
        )

    return convert


def strategy_config_rule(role: str) -> Rule:
    prefix, offload = _FSDP[role]
    sizes = () if role == "reference" else (f"{prefix}.fsdp_size",)
    shard = (
        "fsdp_size: accepted when it gives actor_train's layout (the reference runs in its workers)"
        if role == "reference"
        else "fsdp_size -> fsdp_size (at most 1 or at least actor_train's devices: -1, full sharding; a size "
        "between that divides them: shard groups of that many ranks, replicated: hybrid sharding, as ROLL's mesh)"
    )
    return custom(
        f"{role}.strategy_args.strategy_config.*",
        (f"{prefix}.mixed_precision", f"{prefix}.reshard_after_forward", f"{prefix}.{offload}", *sizes),
        _strategy_config(role),
        "FSDP2's param_dtype (bf16, fp32) -> mixed_precision, reshard_after_forward -> reshard_after_forward, "
        f"offload_policy -> {offload}; {shard}; reduce_dtype (fp32 or bf16), use_batched_model_update, "
        "reduce_scatter_during_grad_accumulation, async_save_ckpt, wrap_policy.*, apply_tiled_mlp, apply_expert_patch, "
        "ep_size, efsdp_size, moe_use_grouped_mm: memory, speed or shard layout, no effect on what is computed "
        "(hybrid wraps every decoder layer and reduces in fp32); save_only_model false only"
        + (
            "; with megatron_infer, its forward's layout (" + ", ".join(_MEGATRON_FORWARD_LAYOUT) + "): accepted, "
            "nothing written"
            if role == "reference"
            else ""
        ),
    )
