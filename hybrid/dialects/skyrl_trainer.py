"""SkyRL's `data.*` and `trainer.*` keys (models, optimizers, FSDP, placement, batches,
checkpoints, the algorithm) as rules of the SkyRL dialect (skyrl.py), which appends the
generator's and the environment's.
"""

from __future__ import annotations

from hybrid.dialects.skyrl_convert import (
    ACTOR,
    ARR,
    DEEPSPEED,
    MEGATRON,
    REF,
    ROLLOUT,
    _cispo_bound,
    _clip_ratio_c,
    _colocate_all,
    _critic_lora,
    _critic_path,
    _dynamic_sampling,
    _entropy,
    _epochs,
    _eps_clip,
    _fsdp_mixed_precision,
    _fully_async,
    _hf_save_interval,
    _kl_estimator,
    _legacy_kl_flag,
    _lists,
    _logger,
    _lora_init,
    _max_ckpts,
    _max_sample_batches,
    _normalize_values,
    _offload_after_step,
    _overlong_buffer,
    _policy_loss,
    _ref_path,
    _ref_sequence_parallel,
    _resume_mode,
    _same_as_policy,
    _temperature,
    _tis_cap,
    _tis_ratio_type,
    _token_tis_clip,
    _use_tis,
    _warmup,
    free_form,
)
from hybrid.dialects.table import NO_DUAL_CLIP, choice, custom, ignore, refuse, same, via

TRAINER_RULES = (
    # ---- data
    via(
        "data.train_data",
        "data.train_files",
        _lists,
        "list of files",
        "parquet (or JSON-lines) files in verl's columns: prompt, data_source, reward_model.ground_truth; "
        "single-turn scorers read reward_model (SkyRL's reward_spec when a row has none), environments "
        "reward_spec (or reward_model)",
    ),
    via("data.val_data", "data.val_files", _lists, "list of files"),
    # ---- models
    same("trainer.policy.model.path", f"{ARR}.model.path"),
    custom(
        "trainer.critic.model.lora.*",
        (),
        _critic_lora,
        "accepted with rank 0 (SkyRL's default: no LoRA); any other rank refused",
    ),
    same("trainer.policy.model.lora.rank", f"{ARR}.model.lora_rank"),
    same("trainer.policy.model.lora.alpha", f"{ARR}.model.lora_alpha"),
    same("trainer.policy.model.lora.target_modules", f"{ARR}.model.target_modules"),
    same("trainer.policy.model.lora.exclude_modules", f"{ARR}.model.exclude_modules"),
    refuse("trainer.policy.model.lora.dropout", "hybrid's LoRA has no dropout key", accept=(0, 0.0)),
    custom("trainer.policy.model.lora.init_method", (), _lora_init, "kaiming accepted"),
    ignore(
        "trainer.policy.model.lora.lora_sync_path",
        "hybrid hands LoRA weights to its engines directly (in memory, or through Ray's object store), "
        "not through a folder",
    ),
    custom("trainer.ref.model.path", (), _ref_path, "null or the policy's path accepted"),
    custom("trainer.critic.model.path", ("critic.model.path",), _critic_path, "same value"),
    free_form("trainer.policy.model_config_kwargs.*", f"{ARR}.model.override_config"),
    free_form("trainer.critic.model_config_kwargs.*", "critic.model.override_config"),
    refuse(
        "trainer.ref.model_config_kwargs.*",
        "the reference model is built like the policy (trainer.policy.model_config_kwargs)",
    ),
    same("trainer.rope_scaling", f"{ARR}.model.override_config.rope_scaling", note="a Hugging Face model-config field"),
    same("trainer.rope_theta", f"{ARR}.model.override_config.rope_theta", note="a Hugging Face model-config field"),
    # ---- optimizers
    same("trainer.policy.optimizer_config.lr", f"{ACTOR}.optim.lr"),
    same("trainer.policy.optimizer_config.adam_betas", f"{ACTOR}.optim.betas"),
    same("trainer.policy.optimizer_config.weight_decay", f"{ACTOR}.optim.weight_decay"),
    same("trainer.policy.optimizer_config.max_grad_norm", f"{ACTOR}.grad_clip"),
    via(
        "trainer.policy.optimizer_config.num_warmup_steps",
        f"{ACTOR}.optim.lr_warmup_steps",
        _warmup,
        "optimizer steps / (train_batch_size / policy_mini_batch_size x update_epochs_per_batch)",
        "hybrid steps the learning-rate schedule once per training step",
    ),
    choice(
        "trainer.policy.optimizer_config.scheduler",
        f"{ACTOR}.optim.warmup_style",
        {"constant_with_warmup": "constant", "constant": "constant", "linear": "linear", "cosine": "cosine"},
    ),
    custom(
        "trainer.policy.optimizer_config.offload_after_step",
        (f"{ACTOR}.fsdp_config.optimizer_offload",),
        _offload_after_step(f"{ACTOR}.fsdp_config.optimizer_offload"),
        "same value with colocate_all=true; nothing with colocate_all=false",
        "the optimizer state leaves the device between updates; SkyRL reads it only when colocated",
    ),
    same("trainer.critic.optimizer_config.lr", "critic.optim.lr"),
    same("trainer.critic.optimizer_config.adam_betas", "critic.optim.betas"),
    same("trainer.critic.optimizer_config.weight_decay", "critic.optim.weight_decay"),
    same("trainer.critic.optimizer_config.max_grad_norm", "critic.grad_clip"),
    via(
        "trainer.critic.optimizer_config.num_warmup_steps",
        "critic.optim.lr_warmup_steps",
        _warmup,
        "optimizer steps / (train_batch_size / policy_mini_batch_size x update_epochs_per_batch)",
    ),
    choice(
        "trainer.critic.optimizer_config.scheduler",
        "critic.optim.warmup_style",
        {"constant_with_warmup": "constant", "constant": "constant", "linear": "linear", "cosine": "cosine"},
    ),
    custom(
        "trainer.critic.optimizer_config.offload_after_step",
        ("critic.model.fsdp_config.optimizer_offload",),
        _offload_after_step("critic.model.fsdp_config.optimizer_offload"),
        "same value with colocate_all=true; nothing with colocate_all=false",
    ),
    # ---- FSDP
    choice(
        "trainer.strategy",
        (f"{ACTOR}.strategy", f"{REF}.strategy", "critic.strategy"),
        {"fsdp2": "fsdp2", "fsdp": "fsdp"},
        refused={"megatron": MEGATRON, "deepspeed": DEEPSPEED},
    ),
    same(
        "trainer.policy.fsdp_config.cpu_offload",
        f"{ACTOR}.fsdp_config.offload_policy",
        note="FSDP2's CPUOffloadPolicy",
    ),
    same("trainer.policy.fsdp_config.reshard_after_forward", f"{ACTOR}.fsdp_config.reshard_after_forward"),
    same("trainer.policy.fsdp_config.fsdp_size", f"{ACTOR}.fsdp_config.fsdp_size"),
    custom(
        "trainer.policy.fsdp_config.mixed_precision.*",
        (f"{ACTOR}.fsdp_config.mixed_precision",),
        _fsdp_mixed_precision(f"{ACTOR}.fsdp_config"),
        "param_dtype bf16|fp32; reduce/buffer fp32 accepted",
    ),
    refuse(
        "trainer.policy.fsdp_config.wrap_policy.*",
        "hybrid wraps every decoder layer; its only wrap key is fsdp_config.wrap_policy.min_num_params",
    ),
    same(
        "trainer.ref.fsdp_config.cpu_offload",
        f"{REF}.fsdp_config.param_offload",
        note="the reference's parameters stay on the CPU between uses",
    ),
    same("trainer.ref.fsdp_config.reshard_after_forward", f"{REF}.fsdp_config.reshard_after_forward"),
    refuse("trainer.ref.fsdp_config.fsdp_size", "the reference is sharded like the policy", accept=(-1,)),
    custom(
        "trainer.ref.fsdp_config.mixed_precision.*",
        (f"{REF}.fsdp_config.mixed_precision",),
        _fsdp_mixed_precision(f"{REF}.fsdp_config"),
        "param_dtype bf16|fp32",
    ),
    refuse("trainer.ref.fsdp_config.wrap_policy.*", "hybrid wraps every decoder layer"),
    same("trainer.critic.fsdp_config.cpu_offload", "critic.model.fsdp_config.offload_policy"),
    same("trainer.critic.fsdp_config.reshard_after_forward", "critic.model.fsdp_config.reshard_after_forward"),
    same("trainer.critic.fsdp_config.fsdp_size", "critic.model.fsdp_config.fsdp_size"),
    custom(
        "trainer.critic.fsdp_config.mixed_precision.*",
        ("critic.model.fsdp_config.mixed_precision",),
        _fsdp_mixed_precision("critic.model.fsdp_config"),
        "param_dtype bf16|fp32",
    ),
    refuse("trainer.critic.fsdp_config.wrap_policy.*", "hybrid wraps every decoder layer"),
    via(
        "trainer.bf16",
        f"{ACTOR}.fsdp_config.mixed_precision",
        lambda v, c: "bf16" if v else "fp32",
        "true -> bf16, false -> fp32",
    ),
    same(
        "trainer.policy.sequence_parallel_size",
        f"{ACTOR}.ulysses_sequence_parallel_size",
        note="Ulysses: ranks that split each sequence; data-parallel ranks = devices / this",
    ),
    custom(
        "trainer.ref.sequence_parallel_size",
        (f"{REF}.ulysses_sequence_parallel_size",),
        _ref_sequence_parallel,
        "same value; must equal the policy's",
        "the reference runs in the policy's worker",
    ),
    same("trainer.critic.sequence_parallel_size", "critic.ulysses_sequence_parallel_size"),
    choice(
        "trainer.sequence_parallel_backend",
        (),
        {"ulysses": "ulysses"},
        note="hybrid's sequence parallelism is Ulysses (all-to-all around attention)",
    ),
    refuse("trainer.policy.megatron_config.*", MEGATRON),
    refuse("trainer.ref.megatron_config.*", MEGATRON),
    refuse("trainer.policy.deepspeed_config.*", DEEPSPEED),
    refuse("trainer.ref.deepspeed_config.*", DEEPSPEED),
    refuse("trainer.critic.deepspeed_config.*", DEEPSPEED),
    refuse("deepspeed_config.*", DEEPSPEED),
    refuse("trainer.policy.use_torch_compile", "hybrid does not torch.compile its models", accept=(False,)),
    refuse("trainer.policy.record_memory", "no memory-snapshot switch in hybrid", accept=(False,)),
    same(
        "trainer.gradient_checkpointing",
        f"{ARR}.model.enable_gradient_checkpointing",
        "critic.model.enable_gradient_checkpointing",
    ),
    refuse(
        "trainer.gradient_checkpointing_use_reentrant",
        "hybrid checkpoints activations non-reentrantly",
        accept=(False,),
    ),
    same(
        "trainer.remove_microbatch_padding",
        f"{ARR}.model.use_remove_padding",
        note="hybrid packs the valid tokens of a micro batch (SkyRL's older name: trainer.use_sample_packing)",
    ),
    refuse(
        "trainer.num_dummy_steps",
        "SkyRL's full-context example trainer (examples/train_scripts/full_context) runs this many steps on "
        "random max-length sequences to find memory limits; hybrid has no such trainer: train a few steps "
        "with data.max_prompt_length and data.max_response_length at their limits instead",
    ),
    ignore("trainer.flash_attn", "hybrid picks the attention kernel itself (packed varlen attention where available)"),
    refuse("trainer.disable_fast_tokenizer", "hybrid loads the tokenizer with transformers' defaults", accept=(False,)),
    # ---- placement
    custom(
        "trainer.placement.colocate_all",
        (
            "actor_rollout_ref.hybrid_engine",
            "rollout.nnodes",
            "rollout.n_gpus_per_node",
            "async_training.mode",
            "async_training.max_staleness_steps",
            "async_training.use_rollout_log_probs",
        ),
        _colocate_all,
        "true: nothing (hybrid's fused engine); false -> hybrid_engine=false, rollout.nnodes=1, "
        "rollout.n_gpus_per_node = num_engines x tensor_parallel_size; without trainer.fully_async.* also "
        "mode=one_step_off, max_staleness_steps=0, use_rollout_log_probs=false (refused then with "
        "dynamic_sampling.type=filter, which that schedule cannot resample for)",
        "false: the engines run on devices of their own beside the policy's (trainer.placement.policy_num_*, "
        "the training group; SkyRL's critic gets devices of its own too, hybrid's stays with the policy). "
        "SkyRL's synchronous trainer then generates with the current weights and trains in turn: hybrid's "
        "one-step-off at lag 0, anchored on the trainer's recomputed log-probs as SkyRL's. Engines are Ray "
        "actors that Ray places; only their count of devices is kept",
    ),
    refuse(
        "trainer.placement.colocate_policy_ref",
        "the reference model lives in hybrid's actor worker, on the policy's devices",
        accept=(True,),
    ),
    refuse(
        "trainer.placement.colocate_critic_reward",
        "hybrid has no separate reward-model placement",
        accept=(False,),
    ),
    same("trainer.placement.policy_num_nodes", "trainer.nnodes"),
    same("trainer.placement.policy_num_gpus_per_node", "trainer.n_gpus_per_node"),
    *(
        custom(
            f"trainer.placement.{role}_num_{what}",
            (),
            _same_as_policy(f"trainer.placement.policy_num_{what}", verl),
            f"must equal policy_num_{what}",
        )
        for role in ("ref", "critic", "reward")
        for what, verl in (("nodes", "trainer.nnodes"), ("gpus_per_node", "trainer.n_gpus_per_node"))
    ),
    # ---- batches and schedule
    same("trainer.train_batch_size", "data.train_batch_size", note="prompts per step"),
    same("trainer.policy_mini_batch_size", f"{ACTOR}.ppo_mini_batch_size", note="prompts per optimizer step, in both"),
    same("trainer.critic_mini_batch_size", "critic.ppo_mini_batch_size"),
    same(
        "trainer.micro_train_batch_size_per_gpu",
        f"{ACTOR}.ppo_micro_batch_size_per_gpu",
        note="samples per device; the critic follows",
    ),
    same(
        "trainer.micro_forward_batch_size_per_gpu",
        f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",
        f"{REF}.log_prob_micro_batch_size_per_gpu",
        "critic.forward_micro_batch_size_per_gpu",
    ),
    same("trainer.update_epochs_per_batch", f"{ACTOR}.ppo_epochs", note="the critic follows"),
    custom(
        "trainer.epochs",
        ("trainer.total_epochs", "trainer.total_training_steps"),
        _epochs,
        "total_epochs = value, total_training_steps = null",
        "SkyRL has no step limit: the run covers whole epochs",
    ),
    refuse("trainer.update_ref_every_epoch", "hybrid's reference stays the initial policy", accept=(False,)),
    same("trainer.max_prompt_length", "data.max_prompt_length"),
    same("trainer.eval_batch_size", "data.val_batch_size"),
    same("trainer.eval_before_train", "trainer.val_before_train"),
    same("trainer.eval_interval", "trainer.test_freq", note="-1 disables in both"),
    via(
        "trainer.seed",
        ("trainer.seed", "data.seed"),
        lambda v, c: v,
        "same value",
        "SkyRL seeds the data order with it too",
    ),
    # ---- checkpoints and logging
    via(
        "trainer.resume_mode",
        "trainer.resume_mode",
        _resume_mode,
        "none -> disable, latest -> auto, from_path -> resume_path",
    ),
    same("trainer.resume_path", "trainer.resume_from_path"),
    same("trainer.ckpt_path", "trainer.default_local_dir", note="hybrid also writes metrics.jsonl there"),
    same("trainer.ckpt_interval", "trainer.save_freq"),
    custom(
        "trainer.max_ckpts_to_keep",
        ("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"),
        _max_ckpts,
        "-1 -> null (keep all), N -> N",
    ),
    custom(
        "trainer.hf_save_interval",
        (f"{ACTOR}.checkpoint.save_contents",),
        _hf_save_interval,
        "-1: nothing; = ckpt_interval: save_contents + hf_model",
    ),
    ignore("trainer.export_path", "hybrid writes everything under trainer.default_local_dir (trainer.ckpt_path)"),
    ignore("trainer.log_path", "hybrid's logs go to stdout"),
    same("trainer.project_name", "trainer.project_name"),
    same("trainer.run_name", "trainer.experiment_name"),
    via(
        "trainer.logger",
        "trainer.logger",
        _logger,
        "[value, file]",
        "`file` (metrics.jsonl) is hybrid's run record and is always kept",
    ),
    same(
        "trainer.dump_data_batch",
        "trainer.dump_data_batch",
        note="written to trainer.ckpt_path/dumped_data/global_step_N_training_input.pt (DataProto.load_from_disk "
        "reads it); SkyRL writes a pickle under trainer.export_path",
    ),
    ignore(
        "trainer.dump_eval_results",
        "hybrid writes validation samples to val_generations.jsonl (trainer.log_val_generations)",
    ),
    custom(
        "trainer.fully_async.max_staleness_steps",
        (
            "async_training.mode",
            "async_training.staleness_threshold",
            "async_training.max_staleness_steps",
            "async_training.trigger_parameter_sync_step",
            "async_training.require_batches",
            "async_training.partial_rollout",
            "async_training.use_rollout_log_probs",
        ),
        _fully_async,
        "S -> mode=fully_async, max_staleness_steps=S, staleness_threshold=S, trigger_parameter_sync_step=1, "
        "require_batches=1, partial_rollout=true, use_rollout_log_probs=false; needs colocate_all=false",
        "a trainer.fully_async.* key stands for SkyRL's fully async entry point (SkyRL picks its trainer by "
        "entry point, not by a key); S steps = S weight pushes (SkyRL syncs after every step); SkyRL's "
        "capacity (S + step) x policy_mini_batch_size groups is verl's staleness_threshold=S windows of one "
        "step; a step takes policy_mini_batch_size groups (train_batch_size must equal it, as SkyRL asserts). "
        "SkyRL continues a turn paused by a weight sync from its partial tokens, hybrid samples the aborted "
        "turn again on the new weights. Not given with the other key: SkyRL's default 4",
    ),
    custom(
        "trainer.fully_async.num_parallel_generation_workers",
        ("async_training.max_groups_in_flight", "async_training.mode"),
        _fully_async,
        "same value -> max_groups_in_flight, with the schedule of max_staleness_steps; must lie in "
        "policy_mini_batch_size .. policy_mini_batch_size x (max_staleness_steps + 1)",
        "groups generating at once (one SkyRL worker generates one group); not given: hybrid's default, a "
        "sync window's worth (policy_mini_batch_size groups), where SkyRL's is 768 workers",
    ),
    # ---- algorithm
    choice(
        "trainer.algorithm.advantage_estimator",
        "algorithm.adv_estimator",
        {
            "grpo": "grpo",
            "gae": "gae",
            "rloo": "rloo",
            "reinforce++": "reinforce_plus_plus",
            "maxrl": "maxrl",
            "simple_baseline": "simple_baseline",
        },
        note="simple_baseline: the estimator SkyRL's custom-estimator example registers in its entry point "
        "(the response reward minus the batch mean), built into hybrid",
    ),
    same("trainer.algorithm.grpo_norm_by_std", "algorithm.norm_adv_by_std_in_grpo"),
    same("trainer.algorithm.lambd", "algorithm.lam"),
    same("trainer.algorithm.gamma", "algorithm.gamma"),
    same("trainer.algorithm.use_kl_loss", f"{ACTOR}.use_kl_loss"),
    same("trainer.algorithm.use_kl_in_reward", "algorithm.use_kl_in_reward"),
    same(
        "trainer.algorithm.kl_loss_coef",
        f"{ACTOR}.kl_loss_coef",
        "algorithm.kl_ctrl.kl_coef",
        note="SkyRL's in-reward KL starts from the same coefficient",
    ),
    custom(
        "trainer.algorithm.kl_estimator_type",
        (f"{ACTOR}.kl_loss_type", "algorithm.kl_penalty"),
        _kl_estimator,
        "k1 -> kl, k2 -> mse, k3 -> low_var_kl, abs -> abs",
    ),
    custom(
        "trainer.algorithm.use_kl_estimator_k3",
        (f"{ACTOR}.kl_loss_type", "algorithm.kl_penalty"),
        _legacy_kl_flag("k3"),
        "true -> low_var_kl",
    ),
    custom(
        "trainer.algorithm.use_abs_kl",
        (f"{ACTOR}.kl_loss_type", "algorithm.kl_penalty"),
        _legacy_kl_flag("abs"),
        "true -> abs",
    ),
    same("trainer.algorithm.kl_ctrl.type", "algorithm.kl_ctrl.type"),
    same("trainer.algorithm.kl_ctrl.kl_target", "algorithm.kl_ctrl.target_kl"),
    same("trainer.algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.horizon"),
    custom(
        "trainer.algorithm.use_entropy_loss",
        (f"{ACTOR}.entropy_coeff",),
        _entropy,
        "true -> entropy_loss_coef, false -> 0",
    ),
    custom(
        "trainer.algorithm.entropy_loss_coef",
        (f"{ACTOR}.entropy_coeff",),
        _entropy,
        "read with use_entropy_loss=true",
    ),
    custom("trainer.algorithm.temperature", (), _temperature, "null or the sampling temperature accepted"),
    custom(
        "trainer.algorithm.policy_loss_type",
        (f"{ACTOR}.policy_loss.loss_mode", f"{ACTOR}.clip_ratio_c"),
        _policy_loss,
        f"regular -> vanilla with clip_ratio_c={NO_DUAL_CLIP:g} (never binds), dual_clip -> vanilla, cispo -> cispo "
        "with clip_ratio_low/high from trainer.algorithm.cispo.*, gspo, clip_cov, kl_cov, sapo, importance_sampling "
        f"-> vanilla with clip_ratio_low/high/c={NO_DUAL_CLIP:g} (unclipped -ratio x A), reinforce -> gpg "
        "(-log pi x A); refused: rollout_is, dppo, cross_entropy",
        "reinforce is the loss SkyRL's custom-loss example registers in its entry point; it averages over "
        "every position of the padded batch, hybrid aggregates by loss_reduction",
    ),
    choice(
        "trainer.algorithm.loss_reduction",
        f"{ACTOR}.loss_agg_mode",
        {
            "token_mean": "token-mean",
            "token_mean_legacy": "token-mean",
            "sequence_mean": "seq-mean-token-mean",
            "seq_mean_token_sum_norm": "seq-mean-token-sum-norm",
        },
        note="token_mean and token_mean_legacy (SkyRL's older token_mean) are both the mean over the "
        "mini-batch's valid tokens in hybrid, whose micro-batches weigh by their tokens; "
        "seq-mean-token-sum-norm divides by trainer.algorithm.max_seq_len (loss_scale_factor), else by the "
        "response horizon (data.max_response_length), where SkyRL takes max_input_length + max_generate_length",
    ),
    custom(
        "trainer.algorithm.overlong_buffer_len",
        (
            "reward_model.reward_manager",
            "reward_model.reward_kwargs.overlong_buffer.enable",
            "reward_model.reward_kwargs.overlong_buffer.len",
            "reward_model.reward_kwargs.overlong_buffer.penalty_factor",
        ),
        _overlong_buffer,
        "reward_manager=dapo, overlong_buffer.enable=true, len = value (512 when only the factor is given)",
        "the DAPO keys of SkyRL's DAPO entry point (examples/train/algorithms/dapo): the soft overlong penalty on "
        "training rewards; hybrid's dapo manager applies it to validation rewards too",
    ),
    custom(
        "trainer.algorithm.overlong_buffer_penalty_factor",
        (
            "reward_model.reward_manager",
            "reward_model.reward_kwargs.overlong_buffer.enable",
            "reward_model.reward_kwargs.overlong_buffer.len",
            "reward_model.reward_kwargs.overlong_buffer.penalty_factor",
        ),
        _overlong_buffer,
        "overlong_buffer.penalty_factor = value (1.0 when only the length is given), as above",
    ),
    custom(
        "trainer.algorithm.eps_clip_low",
        (f"{ACTOR}.clip_ratio_low",),
        _eps_clip(f"{ACTOR}.clip_ratio_low"),
        "same value (not read by cispo)",
    ),
    custom(
        "trainer.algorithm.eps_clip_high",
        (f"{ACTOR}.clip_ratio_high",),
        _eps_clip(f"{ACTOR}.clip_ratio_high"),
        "same value (not read by cispo)",
    ),
    custom("trainer.algorithm.clip_ratio_c", (f"{ACTOR}.clip_ratio_c",), _clip_ratio_c, "same value (dual clip)"),
    custom(
        "trainer.algorithm.cispo.cispo_eps_clip_low",
        (f"{ACTOR}.clip_ratio_low",),
        _cispo_bound(f"{ACTOR}.clip_ratio_low"),
        "with policy_loss_type=cispo",
    ),
    custom(
        "trainer.algorithm.cispo.cispo_eps_clip_high",
        (f"{ACTOR}.clip_ratio_high",),
        _cispo_bound(f"{ACTOR}.clip_ratio_high"),
        "with policy_loss_type=cispo",
    ),
    same("trainer.algorithm.sapo.tau_pos", f"{ACTOR}.policy_loss.sapo_tau_pos"),
    same("trainer.algorithm.sapo.tau_neg", f"{ACTOR}.policy_loss.sapo_tau_neg"),
    same("trainer.algorithm.clip_cov.clip_ratio", f"{ACTOR}.policy_loss.clip_cov_ratio"),
    same("trainer.algorithm.clip_cov.clip_cov_lb", f"{ACTOR}.policy_loss.clip_cov_lb"),
    same("trainer.algorithm.clip_cov.clip_cov_ub", f"{ACTOR}.policy_loss.clip_cov_ub"),
    same(
        "trainer.algorithm.kl_cov.kl_cov_frac",
        f"{ACTOR}.policy_loss.kl_cov_ratio",
        note="a fraction of the valid tokens in both",
    ),
    same("trainer.algorithm.kl_cov.ppo_kl_coef", f"{ACTOR}.policy_loss.ppo_kl_coef"),
    same("trainer.algorithm.value_clip", "critic.cliprange_value"),
    refuse(
        "trainer.algorithm.value_head_prefix",
        "hybrid's critic names its value head itself",
        accept=("value_head",),
    ),
    refuse(
        "trainer.algorithm.advantage_batch_normalize",
        "no key to normalise advantages over the batch",
        accept=(False,),
    ),
    refuse(
        "trainer.algorithm.zero_variance_filter",
        "no key to mask zero-variance groups; algorithm.filter_groups "
        "(trainer.algorithm.dynamic_sampling.type=filter) drops and resamples them instead",
        accept=(False,),
    ),
    custom(
        "trainer.algorithm.normalize_reward",
        (),
        _normalize_values,
        "accepted without a critic; true refused with gae",
    ),
    same(
        "trainer.algorithm.max_seq_len",
        f"{ACTOR}.loss_scale_factor",
        note="Dr. GRPO's constant: seq_mean_token_sum_norm divides each sequence's token sum by it (verl's "
        "loss_scale_factor); null: the response horizon",
    ),
    custom(
        "trainer.algorithm.use_tis",
        (f"{ACTOR}.tis_imp_ratio_cap",),
        _use_tis,
        "true -> tis_imp_ratio_cap, false -> -1",
    ),
    custom("trainer.algorithm.tis_imp_ratio_cap", (f"{ACTOR}.tis_imp_ratio_cap",), _tis_cap, "read with use_tis=true"),
    custom(
        "trainer.algorithm.off_policy_correction.tis_ratio_type",
        (f"{ACTOR}.tis_imp_ratio_cap",),
        _tis_ratio_type,
        "token -> tis_imp_ratio_cap = token_tis_ratio_clip_high; null: nothing",
    ),
    custom(
        "trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high",
        (f"{ACTOR}.tis_imp_ratio_cap",),
        _token_tis_clip,
        "read with tis_ratio_type=token",
    ),
    ignore(
        "trainer.algorithm.off_policy_correction.sequence_tis_ratio_clip_high",
        "read only with tis_ratio_type=sequence, which is refused",
    ),
    refuse(
        "trainer.algorithm.off_policy_correction.sequence_mask_metric",
        "no sequence masking by importance ratio in hybrid",
        accept=(None,),
    ),
    ignore(
        "trainer.algorithm.off_policy_correction.geo_mask_high",
        "read only with sequence_mask_metric, which is refused",
    ),
    ignore(
        "trainer.algorithm.off_policy_correction.geo_mask_low",
        "read only with sequence_mask_metric, which is refused",
    ),
    ignore(
        "trainer.algorithm.off_policy_correction.product_mask_high",
        "read only with sequence_mask_metric, which is refused",
    ),
    ignore(
        "trainer.algorithm.off_policy_correction.product_mask_low",
        "read only with sequence_mask_metric, which is refused",
    ),
    refuse(
        "trainer.algorithm.off_policy_correction.outlier_token_is_threshold_low",
        "no outlier masking by importance ratio in hybrid",
        accept=(None,),
    ),
    refuse(
        "trainer.algorithm.off_policy_correction.outlier_token_is_threshold_high",
        "no outlier masking by importance ratio in hybrid",
        accept=(None,),
    ),
    refuse(
        "trainer.algorithm.off_policy_correction.token_mask_is_threshold_low",
        "no token masking by importance ratio in hybrid",
        accept=(None,),
    ),
    refuse(
        "trainer.algorithm.off_policy_correction.token_mask_is_threshold_high",
        "no token masking by importance ratio in hybrid",
        accept=(None,),
    ),
    custom(
        "trainer.algorithm.dynamic_sampling.type",
        (
            "algorithm.filter_groups.enable",
            "algorithm.filter_groups.metric",
            "algorithm.filter_groups.max_num_gen_batches",
        ),
        _dynamic_sampling,
        "filter -> filter_groups on seq_reward; null -> off",
    ),
    custom(
        "trainer.algorithm.dynamic_sampling.max_sample_batches",
        ("algorithm.filter_groups.max_num_gen_batches",),
        _max_sample_batches,
        "-1 -> 0 (no limit), N -> N",
    ),
    ignore("trainer.algorithm.dynamic_sampling.min_replace_ratio", "read only with type=replace, which is refused"),
)


__all__ = ["TRAINER_RULES"]
