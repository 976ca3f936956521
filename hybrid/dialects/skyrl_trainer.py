"""SkyRL's `data.*` and `trainer.*` keys (models, optimizers, FSDP, placement, batches,
checkpoints, logging) as rules of the SkyRL dialect (skyrl.py), which appends the algorithm's
(skyrl_algorithm.py), the generator's and the environment's.
"""

from __future__ import annotations

from hybrid.dialects.skyrl_batches import _policy_mini_batch
from hybrid.dialects.skyrl_convert import (
    ACTOR,
    ARR,
    DEEPSPEED,
    MEGATRON,
    REF,
    ROLLOUT,
    _colocate_all,
    _critic_path,
    _epochs,
    _fsdp_mixed_precision,
    _fully_async,
    _fully_async_enabled,
    _lists,
    _logger,
    _lora_init,
    _max_ckpts,
    _max_training_steps,
    _offload_after_step,
    _ref_fsdp_size,
    _ref_path,
    _ref_sequence_parallel,
    _resume_mode,
    _same_as_policy,
    _simulate_training,
    _warmup,
    free_form,
)
from hybrid.dialects.table import Context, Refusal, choice, custom, ignore, refuse, same, via


def _dummy_steps(value, ctx: Context) -> dict:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        # SkyRL's FullCtxTrainer runs range(num_dummy_steps) dummy steps and never trains for real.
        raise Refusal("SkyRL's full-context trainer with no dummy step runs nothing at all; give N >= 1")
    return {"trainer.num_dummy_steps": value}


# What SkyRL's fully async keys write (both of their rules).
FULLY_ASYNC_TARGETS = (
    "async_training.mode",
    "async_training.staleness_threshold",
    "async_training.max_staleness_steps",
    "async_training.trigger_parameter_sync_step",
    "async_training.require_batches",
    "async_training.partial_rollout",
    "async_training.use_rollout_log_probs",
)

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
    same(
        "trainer.critic.model.lora.rank",
        "critic.model.lora_rank",
        note="SkyRL wraps its value model with peft and no task type, and so does hybrid: under all-linear the "
        "value head gets an adapter too, its own weights frozen (tests/integration/test_critic_lora.py)",
    ),
    same("trainer.critic.model.lora.alpha", "critic.model.lora_alpha"),
    same("trainer.critic.model.lora.target_modules", "critic.model.target_modules"),
    same("trainer.critic.model.lora.exclude_modules", "critic.model.exclude_modules"),
    refuse("trainer.critic.model.lora.dropout", "hybrid's LoRA has no dropout key", accept=(0, 0.0)),
    ignore(
        "trainer.critic.model.lora.init_method",
        "SkyRL's critic does not read it (peft's default init: Kaiming-uniform A, zero B, as hybrid's)",
    ),
    ignore("trainer.critic.model.lora.lora_sync_path", "SkyRL's critic does not read it (no engine gets its weights)"),
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
    custom(
        "trainer.ref.model.path",
        (f"{ARR}.ref.model.path",),
        _ref_path,
        "null or the policy's path: nothing; another model: the same value",
        note="the reference model (a distillation teacher), loaded when a KL term or algorithm.on_policy_distillation "
        "reads it",
    ),
    custom("trainer.critic.model.path", ("critic.model.path",), _critic_path, "same value"),
    free_form("trainer.policy.model_config_kwargs.*", f"{ARR}.model.override_config"),
    free_form("trainer.critic.model_config_kwargs.*", "critic.model.override_config"),
    refuse(
        "trainer.ref.model_config_kwargs.*",
        "the reference model is built like the policy (trainer.policy.model_config_kwargs)",
        accept=({}, None),
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
    same(
        "trainer.policy.fsdp_config.fsdp_size",
        f"{ACTOR}.fsdp_config.fsdp_size",
        note="ranks in one shard group: -1 (or at least the policy's ranks) shards over all; a smaller size "
        "shards within groups of that many ranks, replicated across the groups (HSDP, as SkyRL's create_device_mesh); "
        "it must divide the ranks",
    ),
    custom(
        "trainer.policy.fsdp_config.mixed_precision.*",
        (f"{ACTOR}.fsdp_config.mixed_precision",),
        _fsdp_mixed_precision(f"{ACTOR}.fsdp_config"),
        "param_dtype bf16|fp32; reduce/buffer fp32 accepted",
    ),
    refuse(
        "trainer.policy.fsdp_config.wrap_policy.*",
        "hybrid wraps every decoder layer; its only wrap key is fsdp_config.wrap_policy.min_num_params",
        accept=({}, None),  # SkyRL's default: each decoder layer (the model's _no_split_modules), as hybrid
    ),
    same(
        "trainer.ref.fsdp_config.cpu_offload",
        f"{REF}.fsdp_config.param_offload",
        note="the reference's parameters stay on the CPU between uses",
    ),
    same("trainer.ref.fsdp_config.reshard_after_forward", f"{REF}.fsdp_config.reshard_after_forward"),
    custom(
        "trainer.ref.fsdp_config.fsdp_size",
        (),
        _ref_fsdp_size,
        "accepted when it gives the policy's layout (the reference sits on the policy's device mesh)",
    ),
    custom(
        "trainer.ref.fsdp_config.mixed_precision.*",
        (f"{REF}.fsdp_config.mixed_precision",),
        _fsdp_mixed_precision(f"{REF}.fsdp_config"),
        "param_dtype bf16|fp32",
    ),
    refuse("trainer.ref.fsdp_config.wrap_policy.*", "hybrid wraps every decoder layer", accept=({}, None)),
    same("trainer.critic.fsdp_config.cpu_offload", "critic.model.fsdp_config.offload_policy"),
    same("trainer.critic.fsdp_config.reshard_after_forward", "critic.model.fsdp_config.reshard_after_forward"),
    same("trainer.critic.fsdp_config.fsdp_size", "critic.model.fsdp_config.fsdp_size", note="as the policy's"),
    custom(
        "trainer.critic.fsdp_config.mixed_precision.*",
        ("critic.model.fsdp_config.mixed_precision",),
        _fsdp_mixed_precision("critic.model.fsdp_config"),
        "param_dtype bf16|fp32",
    ),
    refuse("trainer.critic.fsdp_config.wrap_policy.*", "hybrid wraps every decoder layer", accept=({}, None)),
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
    *(
        ignore(f"trainer.{role}.megatron_config.*", f"read only with trainer.strategy=megatron ({MEGATRON})")
        for role in ("policy", "ref")
    ),
    refuse("trainer.policy.deepspeed_config.*", DEEPSPEED),
    refuse("trainer.ref.deepspeed_config.*", DEEPSPEED),
    refuse("trainer.critic.deepspeed_config.*", DEEPSPEED),
    refuse("deepspeed_config.*", DEEPSPEED),
    # SkyRL's HFModelWrapper compiles its chunked entropy for the policy only (its ref wrapper
    # is built without the flag), as hybrid's actor.use_torch_compile does (workers/compiled_entropy.py).
    custom(
        "trainer.policy.use_torch_compile",
        (f"{ARR}.actor.use_torch_compile", f"{ARR}.ref.use_torch_compile"),
        lambda value, ctx: {f"{ARR}.actor.use_torch_compile": value, f"{ARR}.ref.use_torch_compile": False},
        "same value for the actor; the reference false",
        "the policy's entropy through torch.compile",
    ),
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
    custom(
        "trainer.num_dummy_steps",
        ("trainer.num_dummy_steps",),
        _dummy_steps,
        "N >= 1 -> same value; 0 refused",
        "SkyRL's full-context trainer (examples/train_scripts/full_context, the key stands for its entry point): "
        "N steps on random batches of train_batch_size x n_samples_per_prompt sequences of max_input_length + "
        "max_generate_length tokens (policy, ref and critic forwards, advantages, critic and policy updates), "
        "logged, then the run ends without real training, eval or checkpoint; hybrid's also pushes the weights "
        "to the engine as its real step does (hybrid/dummy_steps.py)",
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
    custom(
        "trainer.policy_mini_batch_size",
        (f"{ACTOR}.ppo_mini_batch_size", "trainer.pad_mini_batches"),
        _policy_mini_batch,
        "same value; pad_mini_batches=true where x n_samples_per_prompt does not split over the ranks",
        "prompts per optimizer step, in both; SkyRL pads a mini batch that does not split with dummy rows "
        "(loss mask 0), and so does hybrid with trainer.pad_mini_batches, which the convert turns on for sizes "
        "SkyRL's validate_batch_sizes accepts (skyrl_batches.py)",
    ),
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
    same(
        "trainer.hf_save_interval",
        "trainer.hf_save_freq",
        note="every N steps and at the last step the policy as a Hugging Face folder (LoRA merged), "
        "independent of trainer.ckpt_interval; SkyRL also exports at each epoch's end",
    ),
    same(
        "trainer.export_path",
        "trainer.hf_export_dir",
        note="the Hugging Face exports go to export_path/global_step_N (SkyRL: global_step_N/policy); "
        "dumped batches go under trainer.ckpt_path",
    ),
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
        FULLY_ASYNC_TARGETS,
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
        "trainer.fully_async.enabled",
        FULLY_ASYNC_TARGETS,
        _fully_async_enabled,
        "true -> as trainer.fully_async.max_staleness_steps (SkyRL's default 4 when not given); false -> nothing "
        "(refused with other trainer.fully_async.* keys)",
        "SkyRL's fully async entry points require it",
    ),
    ignore(
        "trainer.fully_async.clear_kv_cache_on_weight_sync",
        "both values: hybrid never continues a turn across a weight push (it aborts the turn in flight and samples "
        "it again on the new weights, KV cache built anew), so neither SkyRL's reuse of the older weights' KV cache "
        "(false, its default, which hybrid's fully async mapping already stands for) nor its recomputed prefix "
        "(true) happens; each turn trained comes from one weight version",
    ),
    custom(
        "trainer.max_training_steps",
        ("trainer.max_training_steps", "trainer.total_training_steps", "trainer.total_epochs"),
        _max_training_steps,
        "N -> trainer.max_training_steps=N with total_epochs = trainer.epochs (SkyRL's 1 when not given) and "
        "total_training_steps=null; null -> nothing",
        "both stop at the smaller of epochs x steps per epoch and N, the learning-rate schedule spanning that",
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
    custom(
        "trainer.fully_async.simulate_training",
        ("async_training.simulate_training",),
        _simulate_training,
        "same value; true needs the fully async trainer (trainer.fully_async.enabled=true)",
        "SkyRL's simulated trainer (examples/train/fully_async/main_fully_async_sim): generation for real, no "
        "trainer model, each step a sleep, each weight sync a pause of the engines with the same weights under "
        "the next version, so staleness advances as in training (hybrid/async_sim.py); eval, checkpoints, HF "
        "exports and resume must be off, as SkyRL asserts",
    ),
    same(
        "trainer.fully_async.simulate_training_step_seconds",
        "async_training.simulate_training_step_seconds",
        note="the seconds each simulated step sleeps (timing_s/simulated_step)",
    ),
    same(
        "trainer.fully_async.simulate_weight_sync_seconds",
        "async_training.simulate_weight_sync_seconds",
        note="the seconds each simulated sync keeps the engines paused (within timing_s/update_weights)",
    ),
)


__all__ = ["TRAINER_RULES"]
