"""The rules every ROLL worker section has (actor_train, actor_infer, reference, critic:
device_mapping, worker_cls, model_args, strategy_args, training_args and the batching keys),
with the converters they call, as rules of the ROLL dialect (roll.py).
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.asynchronous import ENGINE_KEYS, SCHEDULE_KEYS
from hybrid.dialects.roll_batches import _warmup
from hybrid.dialects.roll_convert import ACTOR, ARR, REF, ROLLOUT, _batches, _betas, _device_mapping, parse_devices
from hybrid.dialects.table import (
    Context,
    Refusal,
    Rule,
    choice,
    custom,
    hybrid_default,
    ignore,
    refuse,
    same,
    via,
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


def _system_envs(value: Any, ctx: Context) -> dict[str, Any]:
    name = ctx.key.split("system_envs", 1)[1].lstrip(".")
    if not name:
        return {}  # system_envs: {} (or null)
    return {f"trainer.worker_env_vars.{name}": str(value)}


def system_envs_rule(key: str) -> Rule:
    """ROLL's `system_envs` (the pipeline's and each worker's): environment variables ROLL sets for
    its workers. hybrid's workers are one fused group, so they all get every one; two sections
    giving one variable different values are refused."""
    return custom(
        key,
        ("trainer.worker_env_vars.<name>",),
        _system_envs,
        "same name, value as a string",
        "set in the driver and every worker before they start (hybrid's roles share one worker group)",
    )


# vLLM arguments ROLL passes through strategy_config that hybrid has its own key for.
_ENGINE_KEYS = {
    "gpu_memory_utilization": f"{ROLLOUT}.gpu_memory_utilization",
    "max_model_len": f"{ROLLOUT}.max_model_len",
    "tensor_parallel_size": f"{ROLLOUT}.tensor_model_parallel_size",
    "load_format": f"{ROLLOUT}.load_format",
    "enforce_eager": f"{ROLLOUT}.enforce_eager",
    "max_num_batched_tokens": f"{ROLLOUT}.max_num_batched_tokens",
    "max_num_seqs": f"{ROLLOUT}.max_num_seqs",
    "enable_chunked_prefill": f"{ROLLOUT}.enable_chunked_prefill",
}


def _engine_config(value: Any, ctx: Context) -> dict[str, Any]:
    name = ctx.key[len("actor_infer.strategy_args.strategy_config.") :]
    if ctx.get("actor_infer.strategy_args.strategy_name", "vllm") != "vllm":
        return {}
    if name in ("pipeline_parallel_size",) and value != 1:
        raise Refusal("hybrid's engine shards by tensor parallelism only")
    if name == "sleep_level":
        # ROLL's own (vllm_strategy pops it): what the engine frees after generating, 1 the KV cache,
        # 2 the weights too (the weight sync brings them back): memory only, as free_cache_engine.
        if value not in (1, 2):
            raise Refusal("ROLL's sleep levels are 1 and 2")
        return {f"{ROLLOUT}.free_cache_engine": True}
    if name == "VLLM_USE_V1":
        if str(value) != "1":
            raise Refusal("hybrid's vLLM engine is V1")
        return {}  # ROLL's own switch (vllm_strategy pops it): V1, the only engine hybrid runs
    if name == "max_model_len":
        # ROLL asks for max_new_tokens whatever the prompt; vLLM stops a sequence at max_model_len, so a
        # response there ends at max_model_len - its prompt (even when prompt + response do not fit)
        return {_ENGINE_KEYS[name]: value, f"{ROLLOUT}.max_model_len_caps_response": True}
    if name in _ENGINE_KEYS:
        return {_ENGINE_KEYS[name]: value}
    return {f"{ROLLOUT}.engine_kwargs.vllm.{name}": value}


def _num_gpus_per_worker(value: Any, ctx: Context) -> dict[str, Any]:
    tp = ctx.get("actor_infer.strategy_args.strategy_config.tensor_parallel_size", None)
    tp = tp if tp is not None else hybrid_default(f"{ROLLOUT}.tensor_model_parallel_size")
    if value != tp:
        raise Refusal(f"an engine uses tensor_parallel_size={tp} devices in hybrid")
    return {}


DEFAULT_WORKERS = {
    "actor_train": ("roll.pipeline.rlvr.actor_worker.ActorWorker", "roll.pipeline.rlvr.actor_pg_worker.ActorPGWorker"),
    "actor_infer": ("roll.pipeline.base_worker.InferWorker",),
    "reference": ("roll.pipeline.rlvr.actor_worker.ActorWorker",),
    "critic": ("roll.pipeline.base_worker.CriticWorker",),
}


def _training_rules(role: str) -> list[Rule]:
    """The keys of a trained role (actor_train, critic): batches, optimizer, packing."""
    prefix = ACTOR if role == "actor_train" else "critic"
    micro = f"{ACTOR}.ppo_micro_batch_size_per_gpu" if role == "actor_train" else "critic.ppo_micro_batch_size_per_gpu"
    mini = f"{ACTOR}.ppo_mini_batch_size" if role == "actor_train" else "critic.ppo_mini_batch_size"
    optim = f"{prefix}.optim"
    return [
        custom(
            f"{role}.training_args.per_device_train_batch_size",
            (micro, mini),
            _batches(role, mini, micro),
            "micro = value; mini = value x gradient_accumulation_steps x devices / num_return_sequences_in_group",
            "samples per device per micro batch; the mini batch is counted in prompts",
        ),
        custom(
            f"{role}.training_args.gradient_accumulation_steps",
            (mini,),
            _batches(role, mini, micro),
            "mini = per_device_train_batch_size x value x devices / num_return_sequences_in_group",
        ),
        same(f"{role}.training_args.learning_rate", f"{optim}.lr"),
        same(f"{role}.training_args.weight_decay", f"{optim}.weight_decay"),
        custom(
            f"{role}.training_args.warmup_steps",
            (f"{optim}.lr_warmup_steps",),
            _warmup(role, f"{optim}.lr_warmup_steps"),
            "optimizer steps / optimizer steps per training step",
            "hybrid steps the learning-rate schedule once per training step",
        ),
        same(
            f"{role}.training_args.warmup_ratio",
            f"{optim}.lr_warmup_steps_ratio",
            note="a share of the whole run in both",
        ),
        choice(
            f"{role}.training_args.lr_scheduler_type",
            f"{optim}.warmup_style",
            {"constant": "constant", "constant_with_warmup": "constant", "linear": "linear", "cosine": "cosine"},
        ),
        custom(
            f"{role}.training_args.adam_beta1",
            (f"{optim}.betas",),
            _betas(role, f"{optim}.betas"),
            "[adam_beta1, adam_beta2]",
        ),
        custom(
            f"{role}.training_args.adam_beta2",
            (f"{optim}.betas",),
            _betas(role, f"{optim}.betas"),
            "[adam_beta1, adam_beta2]",
        ),
        same(f"{role}.training_args.max_grad_norm", f"{prefix}.grad_clip"),
        ignore(
            f"{role}.training_args.num_train_epochs",
            "ROLL's runs are bounded by max_steps; the trainer's epoch count is bookkeeping",
        ),
        ignore(f"{role}.training_args.max_steps", "set by ROLL from the pipeline's max_steps"),
        ignore(f"{role}.training_args.seed", "ROLL replaces it with the pipeline's seed"),
        ignore(f"{role}.training_args.output_dir", "ROLL replaces it with the pipeline's output_dir"),
        same(f"{role}.use_dynamic_batching_in_train", f"{prefix}.use_dynamic_bsz"),
        same(f"{role}.max_tokens_per_microbatch_in_train", f"{prefix}.ppo_max_token_len_per_gpu"),
        ignore(f"{role}.sequence_length_round_in_train", "hybrid packs tokens without rounding"),
        same(
            f"{role}.use_sequence_packing",
            f"{ARR}.model.use_remove_padding" if role == "actor_train" else "critic.model.use_remove_padding",
        ),
        ignore(f"{role}.sequence_packing_args.*", "hybrid packs each micro batch's valid tokens itself"),
        strategy_config_rule(role),
    ]


# The verl key each trained role's `model_args.ulysses_size` sets (Ulysses sequence parallelism).
ULYSSES_KEYS = {
    "actor_train": f"{ACTOR}.ulysses_sequence_parallel_size",
    "reference": f"{REF}.ulysses_sequence_parallel_size",
    "critic": "critic.ulysses_sequence_parallel_size",
}


def _ulysses(role: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        if value is None:
            return {}  # ROLL's null is no sequence parallelism: hybrid's default (1)
        if role == "reference":
            # hybrid's reference runs in the actor's worker and splits sequences as the actor does;
            # the split changes where the forward runs, not the log-probs it gives.
            actor = ctx.get("actor_train.model_args.ulysses_size", None)
            return {ULYSSES_KEYS[role]: 1 if actor is None else actor}
        return {ULYSSES_KEYS[role]: value}

    return convert


def _ulysses_rule(role: str) -> Rule:
    key = f"{role}.model_args.ulysses_size"
    if role not in ULYSSES_KEYS:
        return refuse(
            key,
            "hybrid's engine shards by tensor parallelism only; sequence parallelism is for the "
            "trained roles (actor_train, reference, critic)",
            accept=(None, 1),
        )
    how = (
        "accepted; the reference splits sequences as actor_train does (the log-probs are the same)"
        if role == "reference"
        else "same value (null: 1)"
    )
    note = (
        "Ulysses: ranks that split each sequence; data-parallel ranks = devices / this" if role == "actor_train" else ""
    )
    return custom(key, (ULYSSES_KEYS[role],), _ulysses(role), how, note)


def _device_rule(role: str) -> Rule:
    key = f"{role}.device_mapping"
    if role == "actor_train":
        return custom(
            key,
            ("trainer.nnodes", "trainer.n_gpus_per_node"),
            _device_mapping,
            "len -> devices; nodes: the nodes of num_gpus_per_node devices the ids fall on",
            "the training group; device ids are not pinned: hybrid uses that many devices (choose them with "
            "CUDA_VISIBLE_DEVICES)",
        )
    if role == "actor_infer":
        return custom(
            key,
            ("trainer.nnodes", "trainer.n_gpus_per_node", *ENGINE_KEYS, *SCHEDULE_KEYS),
            _device_mapping,
            "actor_train's: colocated (nothing more); a part of actor_train's with async_generation_ratio=0: "
            "colocated on all of actor_train's (a console note; the same generation on more engines, only the "
            "speed differs); disjoint from it -> hybrid_engine=false, rollout.nnodes x rollout.n_gpus_per_node = "
            "its devices, with the schedule of async_generation_ratio; other overlaps: refused",
            "disjoint: the engines (len / tensor_parallel_size of them) run in Ray actors on devices of their own "
            "beside the training group, as ROLL's disaggregated mode",
        )
    if role == "reference":
        return custom(
            key,
            ("trainer.nnodes", "trainer.n_gpus_per_node"),
            _device_mapping,
            "actor_train's: the training group; another: accepted, nothing written",
            "hybrid computes the reference's log-probs in the training group, on actor_train's devices (the same "
            "values); devices given to the reference alone stay unused",
        )
    return custom(
        key,
        ("trainer.nnodes", "trainer.n_gpus_per_node"),
        _device_mapping,
        "must equal actor_train's",
        "the training group",
    )


def _worker_rules(role: str) -> list[Rule]:
    """The keys every ROLL worker section has."""
    infer_batch = {
        "actor_train": (f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",),
        "reference": (f"{REF}.log_prob_micro_batch_size_per_gpu",),
        "critic": ("critic.forward_micro_batch_size_per_gpu",),
    }
    rules = [
        _device_rule(role),
        refuse(
            f"{role}.worker_cls",
            f"a custom {role} worker class has no counterpart in hybrid",
            accept=DEFAULT_WORKERS[role] + (None,),
        ),
        ignore(f"{role}.model_args.flash_attn", "hybrid picks the attention kernel itself"),
        ignore(f"{role}.model_args.attn_implementation", "hybrid picks the attention kernel itself"),
        refuse(
            f"{role}.model_args.model_type",
            "hybrid loads causal language models (and a value head for the critic) by itself",
            accept=(None,),
        ),
        _ulysses_rule(role),
        ignore(f"{role}.model_args.disable_gradient_checkpointing", "no training in this role")
        if role in ("actor_infer", "reference")
        else via(
            f"{role}.model_args.disable_gradient_checkpointing",
            f"{ARR}.model.enable_gradient_checkpointing"
            if role == "actor_train"
            else "critic.model.enable_gradient_checkpointing",
            lambda v, c: not v,
            "negated",
        ),
        system_envs_rule(f"{role}.system_envs.*"),
        ignore(f"{role}.offload_nccl", "hybrid's weight sync uses no NCCL buffers it could offload"),
        refuse(f"{role}.logits_in_fp32", "hybrid computes log-probs from fp32 logits", accept=(True,)),
        refuse(f"{role}.apply_loss_scale", "hybrid always scales the loss to the global batch", accept=(True,)),
        ignore(f"{role}.backend_timeout", "hybrid uses torch.distributed's default timeout"),
        ignore(f"{role}.max_concurrency", "no Ray actor concurrency setting in hybrid"),
        refuse(
            "actor_train.model_update_frequency",
            "ROLL hands actor_train's weights to actor_infer every N steps; hybrid's fused engine gets them before "
            "every generation, and ROLL's asynchronous schedule (async_generation_ratio) maps to a push after every "
            "step, its budget counted in steps; no mapping for N > 1 is kept",
            accept=(1,),
        )
        if role == "actor_train"
        else ignore(f"{role}.model_update_frequency", "ROLL reads actor_train's only"),
        ignore(f"{role}.name", "set by ROLL itself"),
    ]
    if role in infer_batch:
        rules.append(same(f"{role}.infer_batch_size", *infer_batch[role], note="samples per device per forward pass"))
    else:
        rules.append(ignore(f"{role}.infer_batch_size", "vLLM batches its requests itself"))
    if role == "actor_infer":
        rules.append(
            custom("actor_infer.num_gpus_per_worker", (), _num_gpus_per_worker, "must equal tensor_parallel_size")
        )
    else:
        rules.append(refuse(f"{role}.num_gpus_per_worker", "one device per training worker", accept=(1,)))
    if role in ("actor_train", "critic"):
        rules += _training_rules(role)
    forward = {
        "actor_train": (f"{ROLLOUT}.log_prob_use_dynamic_bsz", f"{ROLLOUT}.log_prob_max_token_len_per_gpu"),
        "reference": (f"{REF}.log_prob_use_dynamic_bsz", f"{REF}.log_prob_max_token_len_per_gpu"),
        "critic": ("critic.use_dynamic_bsz", "critic.forward_max_token_len_per_gpu"),
    }
    if role in forward:
        dynamic, max_tokens = forward[role]
        rules += [
            same(f"{role}.use_dynamic_batching_in_infer", dynamic),
            same(f"{role}.max_tokens_per_microbatch_in_infer", max_tokens),
            ignore(f"{role}.sequence_length_round_in_infer", "hybrid packs tokens without rounding"),
        ]
    return rules


__all__ = ["DEFAULT_WORKERS", "ULYSSES_KEYS"]
