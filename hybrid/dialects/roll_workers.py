"""The rules every ROLL worker section has (actor_train, actor_infer, reference, critic:
device_mapping, worker_cls, model_args, strategy_args, training_args and the batching keys),
with the converters they call, as rules of the ROLL dialect (roll.py).
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.asynchronous import ENGINE_KEYS, SCHEDULE_KEYS
from hybrid.dialects.roll_batches import _warmup
from hybrid.dialects.roll_placement import ACTOR, ARR, REF, ROLLOUT, _batches, _betas, _device_mapping
from hybrid.dialects.roll_strategy import strategy_config_rule
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
