"""SkyRL keys around the training step rather than in it, as rules of the SkyRL dialect: data
loader workers, token-budget micro-batches, memory knobs (allocator, chunk sizes), serving
extras of the engines (speculative decoding, adapter slots, the prefix-cache salt, the
router), what is shown or logged (examples, sample tables, W&B tags, the GPU monitor), and the
Megatron-only features (fake-INT4 QAT, MTP heads, the fused LM head, routing replay).

A key is mapped where hybrid has the behaviour, accepted with its SkyRL default (and the values
that do the same) and refused otherwise, or ignored only where no value changes what hybrid
computes: the reason says why, in the generated table (docs/config_dialects.md).
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.skyrl_convert import ACTOR, FULLY_ASYNC_KEYS, ROLLOUT, _colocated, free_form
from hybrid.dialects.skyrl_off_policy import _policy_loss_is
from hybrid.dialects.table import Context, Refusal, custom, ignore, refuse, same

IE = "generator.inference_engine"
MEGATRON_ONLY = "SkyRL runs it on its Megatron backend only; hybrid trains with FSDP2"
DISPLAY = "what is shown or logged about samples, not what is trained"


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _num_workers(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None:  # SkyRL: 8 worker processes; the batches are the same with hybrid's in-process loading
        return {}
    if not (_count(value) and value >= 0):
        raise Refusal("null or a whole number >= 0 (SkyRL's check)")
    return {"data.dataloader_num_workers": value}


def _persistent_workers(value: Any, ctx: Context) -> dict[str, Any]:
    if not isinstance(value, bool):
        raise Refusal("true or false")
    if value and ctx.get("data.dataloader.num_workers", None) == 0:
        raise Refusal("needs data.dataloader.num_workers > 0 (SkyRL's and torch's DataLoader's rule)")
    return {}


def _token_budget(value: Any, ctx: Context) -> dict[str, Any]:
    """SkyRL's per-micro-batch token cap (a soft one: a longer sequence gets a micro-batch of its
    own, as in hybrid's split_by_token_budget), for the forward and training passes of every
    model. The cap is on a data-parallel rank's micro-batch, which a Ulysses group splits:
    hybrid's budget is per device of that group, so it is the cap / sequence_parallel_size."""
    if value == -1:
        return {}
    if not (_count(value) and value > 0):
        raise Refusal("-1 (sample counts) or a positive number of tokens")
    out: dict[str, Any] = {f"{ACTOR}.use_dynamic_bsz": True}
    for model, sp_key, verl in (
        ("policy", "trainer.policy.sequence_parallel_size", f"{ACTOR}.ppo_max_token_len_per_gpu"),
        ("critic", "trainer.critic.sequence_parallel_size", "critic.ppo_max_token_len_per_gpu"),
    ):
        sp = ctx.get(sp_key, 1)
        if not (_count(sp) and sp >= 1 and value % sp == 0):
            raise Refusal(
                f"hybrid's budget is per device of a sequence-parallel group: {value} tokens must divide by the "
                f"{model}'s sequence_parallel_size ({sp})"
            )
        out[verl] = value // sp
    return out


def _logprobs_chunk(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None:
        raise Refusal("null (no chunking) is for SkyRL's Megatron backend only; with FSDP SkyRL needs a positive size")
    if not (_count(value) and value > 0):
        raise Refusal("a positive whole number (SkyRL's check)")
    return {}


def _fully_async(ctx: Context) -> bool:
    return ctx.get("trainer.fully_async.enabled", False) is True or any(ctx.has(k) for k in FULLY_ASYNC_KEYS)


def _cache_salt(value: Any, ctx: Context) -> dict[str, Any]:
    if not isinstance(value, bool):
        raise Refusal("true or false")
    if value is False and _fully_async(ctx):
        raise Refusal(
            "hybrid empties the engines' prefix cache at every weight push, so no request reuses blocks computed "
            "by older weights (SkyRL's use_cache_salt=true); false lets SkyRL's fully async engines share them"
        )
    return {}


def _kv_offload(value: Any, ctx: Context) -> dict[str, Any]:
    if not isinstance(value, bool):
        raise Refusal("true or false")
    if value and _colocated(ctx):
        raise Refusal("for engines apart only (SkyRL refuses it with trainer.placement.colocate_all=true)")
    if value and ctx.get("trainer.policy.model.lora.rank", 0):
        raise Refusal("SkyRL refuses it with LoRA weight sync (trainer.policy.model.lora.rank > 0)")
    return {}


def _speculative(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None:
        return {}
    return _SPECULATIVE.convert(value, ctx)


_SPECULATIVE = free_form(f"{IE}.speculative_config.*", f"{ROLLOUT}.engine_kwargs.vllm.speculative_config")


def _cispo_anchor(value: Any, ctx: Context) -> dict[str, Any]:
    """CISPO's importance ratio against the recomputed old log-probs (hybrid's cispo loss) or
    against the engine's (hybrid's bypass mode, where the engine's log-probs are the loss's old
    ones). SkyRL's rollout anchor never reads the recomputed ones, so what would read them
    besides the loss is refused, as for policy_loss_type=rollout_is."""
    if value not in ("old", "rollout"):
        raise Refusal("old or rollout (SkyRL's check)")
    if value == "old" or not _policy_loss_is(ctx, "cispo"):  # only SkyRL's cispo reads it
        return {}
    if ctx.get("trainer.algorithm.use_kl_in_reward", False) is True:
        raise Refusal(
            "with use_kl_in_reward=true SkyRL's reward KL reads its recomputed old log-probs; hybrid's rollout "
            "anchor (bypass mode) computes none; use use_kl_loss instead"
        )
    if ctx.get("trainer.algorithm.off_policy_correction.tis_ratio_type", None) is not None:
        raise Refusal("SkyRL refuses TIS (off_policy_correction.tis_ratio_type) with the rollout anchor")
    return {"algorithm.rollout_correction.bypass_mode": True, "algorithm.rollout_correction.loss_type": "ppo_clip"}


def _eval_samples(value: Any, ctx: Context) -> dict[str, Any]:
    if not _count(value):
        raise Refusal("a whole number (-1 or 0: none)")
    return {"trainer.log_val_generations": max(value, 0)}


TUNING_RULES = (
    # ---- data loading
    custom(
        "data.dataloader.num_workers",
        ("data.dataloader_num_workers",),
        _num_workers,
        "N -> same value; null -> nothing (hybrid's in-process loading)",
        "worker processes that load the prompts; the batches and their order are the same with any count",
    ),
    custom(
        "data.dataloader.persistent_workers",
        (),
        _persistent_workers,
        "accepted (true needs num_workers > 0)",
        "whether loader processes outlive an epoch; hybrid starts its loader anew each epoch, the batches are the "
        "same either way",
    ),
    # ---- micro-batches and memory
    custom(
        "trainer.max_tokens_per_microbatch",
        (f"{ACTOR}.use_dynamic_bsz", f"{ACTOR}.ppo_max_token_len_per_gpu", "critic.ppo_max_token_len_per_gpu"),
        _token_budget,
        "-1 -> nothing; N -> use_dynamic_bsz=true, ppo_max_token_len_per_gpu = N / sequence_parallel_size for the "
        "actor and the critic (the log-prob, reference and critic forward passes follow them)",
        "micro-batches packed up to N real tokens instead of micro_*_batch_size_per_gpu samples, for every forward "
        "and training pass; a longer sequence is a micro-batch of its own in both",
    ),
    ignore(
        "trainer.recompute_old_logprobs_per_minibatch",
        "both values compute the same old log-probs (and values) with the weights before the update; they differ "
        "only in which rows share a forward pass, i.e. in floating-point rounding. hybrid skips that pass where "
        "the update is one optimizer step (the update's own forward is the anchor, the ratio exactly 1) and "
        "otherwise runs it over the batch in log-prob micro-batches",
    ),
    ignore(
        "trainer.use_expandable_segments",
        "a CUDA caching-allocator mode for the training processes (memory fragmentation); the numbers computed "
        "are the same",
    ),
    ignore(f"{IE}.use_expandable_segments", "the same allocator mode for the engines' processes; same numbers"),
    custom(
        "trainer.logprobs_chunk_size",
        (),
        _logprobs_chunk,
        "a positive size accepted; null refused (Megatron only)",
        "SkyRL computes log-probs from logits in chunks of this many positions to bound memory, the values the "
        "same; hybrid bounds that memory its own way (actor_rollout_ref.model.use_fused_kernels)",
    ),
    ignore(
        "trainer.vocab_entropy_chunk_size",
        "Megatron's vocabulary-parallel entropy in chunks (memory only; hybrid trains with FSDP2)",
    ),
    ignore("trainer.vocab_entropy_chunk_memory_mb", "read with vocab_entropy_chunk_size (see there)"),
    refuse("trainer.fused_lm_head_logprob", MEGATRON_ONLY + " (SkyRL refuses it with fsdp)", accept=(False,)),
    refuse(
        "trainer.fused_lm_head_logprob_backend",
        "torch or triton (SkyRL's check); read only with fused_lm_head_logprob=true",
        accept=("torch", "triton"),
    ),
    refuse(
        "trainer.policy.inference_only_init",
        "SkyRL's inference-only workers (no optimizer, bf16 weights) are not valid for training",
        accept=(False,),
    ),
    # ---- engines
    custom(
        f"{IE}.speculative_config.*",
        (f"{ROLLOUT}.engine_kwargs.vllm.speculative_config",),
        _speculative,
        "null -> nothing; a dict -> engine_kwargs.vllm.speculative_config, same entries",
        "vLLM's speculative decoding, passed through as SkyRL does (the sampled distribution is the target "
        "model's; hybrid trains no MTP drafter: trainer.mtp.enabled is refused)",
    ),
    refuse(
        f"{IE}.enable_return_routed_experts",
        "rollout routing replay (R3) needs SkyRL's Megatron router replay (moe_enable_routing_replay); hybrid "
        "trains with FSDP2 and replays no expert routing",
        accept=(False,),
    ),
    custom(
        f"{IE}.offload_kv_for_weight_sync",
        (),
        _kv_offload,
        "accepted with colocate_all=false and no LoRA (SkyRL's rules)",
        "where an engine's KV cache waits during a weight sync (SkyRL: freed or copied to the CPU and restored "
        "exactly); the tokens sampled are the same either way",
    ),
    ignore(
        f"{IE}.router_init_kwargs.*",
        "vllm-router settings (its balancing policy, timeouts) of SkyRL's inference layer: which server takes "
        "a request; every server holds the same weights and sampling settings",
    ),
    custom(
        "generator.use_cache_salt",
        (),
        _cache_salt,
        "true accepted; false accepted except in fully async training",
        "SkyRL salts the prefix cache with the weight version so no request reuses blocks of older weights "
        "(a no-op in its synchronous trainer, which resets the cache at each sync); hybrid's engines empty the "
        "cache at every weight push",
    ),
    ignore(
        "trainer.policy.model.lora.max_loras",
        "vLLM's adapter slots for serving several adapters at once (SkyRL's multi-tenant serving); training "
        "uses the policy's one adapter, which hybrid merges into the engine's weights",
    ),
    ignore("trainer.policy.model.lora.max_cpu_loras", "vLLM's CPU cache of adapters: as max_loras"),
    ignore("trainer.critic.model.lora.max_loras", "engine adapter slots; no engine serves the critic"),
    ignore("trainer.critic.model.lora.max_cpu_loras", "engine adapter slots; no engine serves the critic"),
    ignore(
        "trainer.ref.model.lora.*",
        "SkyRL's reference model takes no adapter: it is loaded from trainer.ref.model.path alone and nothing "
        "reads ref.model.lora",
    ),
    # ---- Megatron-only features
    refuse(
        "trainer.policy.model.fake_int4_qat.enabled",
        f"fake-INT4 quantization-aware training of MoE experts: {MEGATRON_ONLY}",
        accept=(False,),
    ),
    ignore("trainer.policy.model.fake_int4_qat.group_size", "read only with fake_int4_qat.enabled=true (refused)"),
    ignore("trainer.policy.model.fake_int4_qat.symmetric", "read only with fake_int4_qat.enabled=true (refused)"),
    ignore("trainer.policy.model.fake_int4_qat.scale_divisor", "read only with fake_int4_qat.enabled=true (refused)"),
    ignore("trainer.policy.model.fake_int4_qat.q_min", "read only with fake_int4_qat.enabled=true (refused)"),
    ignore("trainer.policy.model.fake_int4_qat.bf16_base_path", "read only with fake_int4_qat.enabled=true (refused)"),
    ignore(
        "trainer.ref.model.fake_int4_qat.*",
        "SkyRL reads the policy's fake_int4_qat only (its Megatron reference worker too)",
    ),
    ignore("trainer.critic.model.fake_int4_qat.*", "SkyRL reads the policy's fake_int4_qat only"),
    refuse(
        "trainer.mtp.enabled",
        f"training multi-token-prediction draft heads (and drafting with them): {MEGATRON_ONLY}",
        accept=(False,),
    ),
    ignore("trainer.mtp.num_speculative_tokens", "read only with mtp.enabled=true (refused)"),
    ignore("trainer.mtp.loss_weight", "read only with mtp.enabled=true (refused)"),
    # ---- algorithm settings read only by what hybrid refuses
    ignore(
        "trainer.algorithm.zero_variance_filter_tol",
        "read only with trainer.algorithm.zero_variance_filter=true (refused)",
    ),
    refuse(
        "trainer.fully_async.sample_full_batch",
        "needs trainer.algorithm.zero_variance_filter=true (SkyRL asserts so), which hybrid refuses",
        accept=(False,),
    ),
    custom(
        "trainer.algorithm.cispo.cispo_anchor",
        ("algorithm.rollout_correction.bypass_mode", "algorithm.rollout_correction.loss_type"),
        _cispo_anchor,
        "old: nothing (hybrid's cispo ratio is pi / pi_old); rollout with policy_loss_type=cispo -> "
        "rollout_correction.bypass_mode=true, loss_type=ppo_clip (the ratio pi / pi_rollout)",
        "refused with use_kl_in_reward or TIS, which would read the recomputed old log-probs",
    ),
    ignore("trainer.algorithm.dppo.*", "read only with policy_loss_type=dppo (refused: hybrid has no DPPO loss)"),
    # ---- shown or logged
    custom(
        "trainer.num_logger_eval_samples",
        ("trainer.log_val_generations",),
        _eval_samples,
        "-1 or 0 -> 0; N -> N",
        "the first N validation samples (prompt, response, score) of each validation: SkyRL uploads them as a "
        "W&B table, hybrid shows them on the console and writes them to val_generations.jsonl",
    ),
    ignore(
        "trainer.num_logger_train_samples",
        f"a W&B table of the first N training samples of each step: {DISPLAY}",
    ),
    ignore(
        "trainer.print_example_interval",
        f"prints one prompt, response and reward every N steps to the console: {DISPLAY}",
    ),
    ignore("trainer.log_example_interval", f"the older name of print_example_interval: {DISPLAY}"),
    same("trainer.tags", "trainer.wandb_tags", note="the W&B run's tags (no effect on other loggers, in both)"),
    ignore("trainer.enable_ray_gpu_monitor", "a background monitor of GPU and memory use: nothing trained"),
)


__all__ = ["TUNING_RULES"]
