"""The ROLL dialect's rules for the worker sections of a pipeline YAML (actor_train,
actor_infer, reference, critic) and validation: the models they load, their strategies, the
engine's generation and the data they read; then the rewards section (roll_rewards.py), the
keys every worker section shares (roll_workers.py) and the agentic keys (roll_agentic.py).
roll_rules.py puts these after the top-level pipeline keys, in this order (the first pattern
that matches a key decides, and docs/config_dialects.md lists the rules as they come).
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.roll_agentic import AGENTIC_RULES, _max_new_tokens
from hybrid.dialects.roll_convert import (
    ACTOR,
    ARR,
    DEEPSPEED,
    MEGATRON,
    REF,
    ROLLOUT,
    _eval_steps,
    _interleave,
    _lists,
    _model_path,
    _ref_model_path,
    _template,
    _unread_template,
)
from hybrid.dialects.roll_rewards import REWARD_RULES
from hybrid.dialects.roll_strategy import _dtype_train, strategy_config_rule
from hybrid.dialects.roll_workers import _engine_config, _worker_rules
from hybrid.dialects.table import Context, Refusal, Rule, choice, custom, ignore, refuse, same, show, via


def _infer_lora(value: Any, ctx: Context) -> dict[str, Any]:
    train = ctx.key.replace("actor_infer.", "actor_train.", 1)
    if value is None or (ctx.has(train) and ctx.get(train) == value):
        return {}
    given = show(ctx.get(train)) if ctx.has(train) else "not given"
    raise Refusal(f"must equal {train} ({given}): the engine serves the adapter actor_train trains")


def _freeze(value: Any, ctx: Context) -> dict[str, Any]:
    """ROLL freezes by prefix only without LoRA (model_providers.load_model: lora_target None)."""
    if value is None or ctx.get("actor_train.model_args.lora_target", None) is not None:
        return {}
    prefixes = value.split(",") if isinstance(value, str) else list(value)
    return {f"{ARR}.actor.freeze_module_prefix": [p.strip() for p in prefixes if p.strip()]}


_LORA_KEYS = (f"{ARR}.model.lora_rank", f"{ARR}.model.lora_alpha", f"{ARR}.model.target_modules")


def _lora(value: Any, ctx: Context) -> dict[str, Any]:
    """actor_train's LoRA as ROLL reads it (ModelArguments.__post_init__, model_providers.setup_lora_training)."""
    target = ctx.get("actor_train.model_args.lora_target", None)
    if target is None:
        return {}  # ROLL's LoRA switch is lora_target; a rank alone trains the full model
    rank = ctx.get("actor_train.model_args.lora_rank", 8)
    alpha = ctx.get("actor_train.model_args.lora_alpha", None) or rank * 2
    if isinstance(target, str) and not any(c in target for c in "*$|("):
        target = [name.strip() for name in target.split(",")]  # not a regex: ROLL splits it at commas
    if isinstance(target, list):
        if {"all-embedding", "all-router"} & set(target):
            raise Refusal("ROLL's all-embedding / all-router targets have no counterpart in hybrid's LoRA", shared=True)
        if "all-linear" in target:
            if len(target) > 1:
                raise Refusal("all-linear together with other module names: give all-linear alone", shared=True)
            target = "all-linear"
    return dict(zip(_LORA_KEYS, (rank, alpha, target)))


SECTION_RULES: tuple[Rule, ...] = (
    # ---- models
    custom("actor_train.model_args.model_name_or_path", (f"{ARR}.model.path",), _model_path, "same value"),
    custom(
        "actor_infer.model_args.model_name_or_path",
        (f"{ARR}.model.path",),
        _model_path,
        "must equal the actor's",
        "the engine serves the policy being trained",
    ),
    custom("reference.model_args.model_name_or_path", (), _ref_model_path, "must equal the actor's"),
    custom(
        "critic.model_args.model_name_or_path",
        ("critic.model.path",),
        lambda v, c: {} if v is None else {"critic.model.path": v},
        "same value",
    ),
    custom(
        "actor_train.model_args.dtype",
        (f"{ACTOR}.fsdp_config.mixed_precision",),
        _dtype_train(f"{ACTOR}.fsdp_config"),
        "bf16, fp32",
    ),
    custom(
        "reference.model_args.dtype",
        (f"{REF}.fsdp_config.mixed_precision",),
        _dtype_train(f"{REF}.fsdp_config"),
        "bf16, fp32",
    ),
    custom(
        "critic.model_args.dtype",
        ("critic.model.fsdp_config.mixed_precision",),
        _dtype_train("critic.model.fsdp_config"),
        "bf16, fp32",
    ),
    choice(
        "actor_infer.model_args.dtype",
        f"{ROLLOUT}.dtype",
        {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"},
    ),
    *(
        custom(
            f"actor_train.model_args.{name}",
            _LORA_KEYS,
            _lora,
            "read together: lora_target given -> lora_rank (ROLL's default 8), lora_alpha (null: 2 x rank), "
            "target_modules (a comma list split into module names, a regex kept whole, all-linear as is); "
            "lora_target null -> nothing (full fine-tuning)",
            "ROLL trains LoRA only when lora_target is given (rlvr_pipeline.is_lora_training)",
        )
        for name in ("lora_rank", "lora_alpha", "lora_target")
    ),
    custom(
        "actor_train.model_args.freeze_module_prefix",
        (f"{ARR}.actor.freeze_module_prefix",),
        _freeze,
        "the prefixes (a comma string as ROLL splits it) -> actor.freeze_module_prefix (workers/freeze.py); "
        "nothing with lora_target given",
        "ROLL's model_providers.freeze_model: parameters whose names start with a prefix get no gradient; with "
        "LoRA (lora_target) ROLL never reads it",
    ),
    refuse("actor_train.model_args.lora_dropout", "hybrid's LoRA has no dropout key", accept=(None, 0, 0.0)),
    *(
        custom(
            f"actor_infer.model_args.{name}",
            (),
            _infer_lora,
            "must equal actor_train's",
            "ROLL's vLLM engine serves actor_train's adapter (enable_lora with this rank and targets); hybrid's "
            "engine samples from the trained adapter too, merged into its weights at every sync (workers/lora.py)",
        )
        for name in ("lora_rank", "lora_alpha", "lora_target")
    ),
    refuse(
        "actor_train.pg_variant",
        "ROLL's policy-gradient variants other than ppo have no mapping; hybrid's losses are "
        "actor_rollout_ref.actor.policy_loss.loss_mode",
        accept=(None, "ppo"),
    ),
    ignore("actor_train.topr_positive_weight", "read only with use_topr_loss, which is refused"),
    ignore("actor_train.topr_negative_weight", "read only with use_topr_loss, which is refused"),
    # ---- strategies
    choice(
        "actor_train.strategy_args.strategy_name",
        f"{ACTOR}.strategy",
        {"fsdp2_train": "fsdp2"},
        refused={"megatron_train": MEGATRON, "deepspeed_train": DEEPSPEED, "diffusion_deepspeed_train": DEEPSPEED},
    ),
    choice(
        "critic.strategy_args.strategy_name",
        "critic.strategy",
        {"fsdp2_train": "fsdp2"},
        refused={"megatron_train": MEGATRON, "deepspeed_train": DEEPSPEED},
    ),
    choice(
        "reference.strategy_args.strategy_name",
        f"{REF}.strategy",
        {"fsdp2_infer": "fsdp2", "fsdp2_train": "fsdp2", "hf_infer": "fsdp2", "megatron_infer": "fsdp2"},
        refused={
            "megatron_train": MEGATRON,
            "deepspeed_infer": DEEPSPEED,
            "deepspeed_train": DEEPSPEED,
        },
        note="the reference runs FSDP2 forward passes inside hybrid's actor worker; a reference only runs forward "
        "passes of the initial weights, so ROLL's forward-only backends (hf_infer, megatron_infer) give the same "
        "log-probs up to the rounding of their kernels",
    ),
    strategy_config_rule("reference"),
    choice(
        "actor_infer.strategy_args.strategy_name",
        f"{ROLLOUT}.name",
        {"vllm": "vllm", "hf_infer": "hf"},
        refused={"sglang": "hybrid's engines are in-process vLLM and Hugging Face generate"},
    ),
    custom(
        "actor_infer.strategy_args.strategy_config.*",
        (f"{ROLLOUT}.<key>", f"{ROLLOUT}.engine_kwargs.vllm.<key>"),
        _engine_config,
        "gpu_memory_utilization, max_model_len, tensor_parallel_size, load_format, enforce_eager, "
        "max_num_batched_tokens, max_num_seqs, enable_chunked_prefill -> rollout keys (max_model_len also "
        "max_model_len_caps_response=true: a response stops at max_model_len - its prompt, as in ROLL's vLLM, "
        "even when prompt_length + response_length exceed it); sleep_level (1, 2) -> "
        "free_cache_engine=true (2 also drops the weights between generations: memory only); VLLM_USE_V1 1 only; "
        "others -> engine_kwargs.vllm",
    ),
    # ---- generation
    custom(
        "actor_infer.generating_args.max_new_tokens",
        ("actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn",),
        _max_new_tokens,
        "RLVR: nothing (ROLL replaces it with sequence_length - prompt_length, RLVRConfig.__post_init__: the response "
        "budget is response_length / sequence_length); with custom_envs (the agentic pipeline) a cap on each turn, "
        "read with custom_envs.<tag>.max_tokens_per_step",
        "ROLL's agentic env manager generates min(max_tokens_per_step, max_new_tokens, what is left) per turn",
    ),
    same("actor_infer.generating_args.temperature", f"{ROLLOUT}.temperature"),
    same("actor_infer.generating_args.top_p", f"{ROLLOUT}.top_p"),
    same("actor_infer.generating_args.top_k", f"{ROLLOUT}.top_k"),
    same("actor_infer.generating_args.repetition_penalty", f"{ROLLOUT}.repetition_penalty"),
    same("actor_infer.generating_args.do_sample", f"{ROLLOUT}.do_sample"),
    same("actor_infer.generating_args.stop_strings", f"{ROLLOUT}.stop"),
    refuse("actor_infer.generating_args.num_beams", "hybrid samples; no beam search", accept=(1,)),
    ignore(
        "actor_infer.generating_args.num_return_sequences",
        "ROLL's RLVR pipeline overwrites it with num_return_sequences_in_group",
    ),
    # ---- data
    via(
        "actor_train.data_args.file_name",
        "data.train_files",
        _lists,
        "list of files",
        "files in verl's columns (prompt, data_source, reward_model.ground_truth): parquet, JSON or JSON-lines",
    ),
    same("actor_train.data_args.prompt", "data.prompt_key"),
    same("actor_train.data_args.messages", "data.prompt_key", note="a chat-list column"),
    custom(
        "actor_train.data_args.template",
        ("data.apply_chat_template_kwargs.enable_thinking",),
        _template,
        "native, qwen2_5 -> the tokenizer's own template; qwen3 -> the same with enable_thinking=true (unless "
        "global_template is given)",
        "ROLL's qwen2_5 is its native template (tokenizer.apply_chat_template); its qwen3 passes enable_thinking=True; "
        "ROLL encodes training and validation prompts with this one",
    ),
    ignore("actor_train.data_args.dataset_dir", "file_name is read as given"),
    ignore("actor_train.data_args.preprocessing_num_workers", "hybrid tokenises prompts as batches are drawn"),
    custom(
        "actor_train.data_args.domain_interleave_probs.*",
        ("data.domain_quotas.<domain>", "data.reward_fn_key", "data.default_domain", "algorithm.advantages_per_domain"),
        _interleave,
        "a {domain: probability} mapping; one domain: nothing written (every row is drawn); several: "
        "data.domain_quotas (same mapping, same order), data.reward_fn_key=domain, data.default_domain=math_rule, "
        "algorithm.advantages_per_domain=true; refused with add_token_level_kl and an adaptive KL (target_kl)",
        "several domains: every batch holds int(p x rollout_batch_size) prompts of each domain but the last, the "
        "rest of the last, each domain's rows drawn as ROLL's schedulers draw them (hybrid/domains.py), and each "
        "domain's advantages (its whitening included) computed over its own rows, as ROLL's pipeline does",
    ),
    ignore(
        "actor_train.data_args.interleave_probs",
        "not a field of ROLL's DataArguments (roll/configs/data_args.py): read by no ROLL pipeline",
    ),
    custom("actor_infer.data_args.template", (), _unread_template, "accepted (ROLL's known templates)"),
    custom("reference.data_args.template", (), _unread_template, "accepted (ROLL's known templates)"),
    custom("critic.data_args.template", (), _unread_template, "accepted (ROLL's known templates)"),
    # ---- validation
    via("validation.data_args.file_name", "data.val_files", _lists, "list of files"),
    custom("validation.data_args.template", (), _unread_template, "accepted (ROLL's known templates)"),
    ignore("validation.data_args.dataset_dir", "file_name is read as given"),
    ignore("validation.data_args.preprocessing_num_workers", "hybrid tokenises prompts as batches are drawn"),
    *(
        ignore(
            f"validation.data_args.{name}",
            "ROLL encodes the validation prompts with actor_train's data_args (rlvr_pipeline.py: preprocess_dataset "
            "of val_dataset with actor_train.data_args), whose prompt / messages column is data.prompt_key here too",
        )
        for name in ("prompt", "messages")
    ),
    same("validation.generating_args.temperature", f"{ROLLOUT}.val_kwargs.temperature"),
    same("validation.generating_args.top_p", f"{ROLLOUT}.val_kwargs.top_p"),
    same("validation.generating_args.top_k", f"{ROLLOUT}.val_kwargs.top_k"),
    same("validation.generating_args.do_sample", f"{ROLLOUT}.val_kwargs.do_sample"),
    same("validation.generating_args.num_return_sequences", f"{ROLLOUT}.val_kwargs.n"),
    ignore(
        "validation.generating_args.max_new_tokens",
        "ROLL replaces it with val_sequence_length - val_prompt_length (RLVRConfig.__post_init__), which must equal "
        "the training lengths here (hybrid validates with data.max_response_length)",
    ),
    refuse("validation.generating_args.num_beams", "hybrid samples; no beam search", accept=(1,)),
    custom("validation.eval_steps", ("trainer.test_freq", "trainer.val_before_train"), _eval_steps, "as eval_steps"),
    *REWARD_RULES,
    refuse("critic.generating_args.*", "the critic generates nothing"),
    *(rule for role in ("actor_train", "actor_infer", "reference", "critic") for rule in _worker_rules(role)),
    *AGENTIC_RULES,
)

__all__ = ["SECTION_RULES"]
