"""The ROLL dialect's rule table: for each top-level key of a ROLL pipeline YAML (the run,
scheduling, sizes, the algorithm, the models), the verl keys it sets, or why it is ignored
or refused, followed by the worker sections' rules (roll_sections.py: actor_train,
actor_infer, reference, critic, validation; with the rewards section's from roll_rewards.py,
the keys every worker shares from roll_workers.py, the agentic keys from roll_agentic.py), then
every other field of ROLL's worker and pipeline config classes (roll_worker_keys.py);
and ROLL's own defaults for keys that a rule reads together with the one given. roll.py
reads the file and applies this table; the converters are in roll_convert.py.
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.asynchronous import SCHEDULE_KEYS
from hybrid.dialects.roll_batches import BATCH_RULES
from hybrid.dialects.roll_convert import (
    ACTOR,
    ARR,
    ROLLOUT,
    _advantage,
    _clip,
    _difficulty,
    _dual_clip,
    _eval_steps,
    _is_weight,
    _keep,
    _kl_penalty,
    _logger,
    _max_steps,
    _model_path,
    _recompute,
    _response_length,
    _resume,
    _save_steps,
    _sequence_length,
    _target_kl,
    _template,
    _tracker,
    _val_greedy,
    _val_lengths,
    _value_clip,
)
from hybrid.dialects.roll_placement import _async_generation_ratio
from hybrid.dialects.roll_sections import SECTION_RULES
from hybrid.dialects.roll_worker_keys import WORKER_KEY_RULES
from hybrid.dialects.roll_workers import system_envs_rule
from hybrid.dialects.table import (
    NO_DUAL_CLIP,
    Rule,
    choice,
    custom,
    ignore,
    refuse,
    same,
    via,
)

# ROLL's defaults (roll/configs, and Hugging Face TrainingArguments under training_args) for
# keys that a rule reads together with the one given, where hybrid has no key of its own.
ROLL_DEFAULTS: dict[str, Any] = {
    "adv_estimator": "gae",
    "norm_mean_type": None,
    "norm_std_type": None,
    "whiten_advantages": False,
    "pg_clip": 0.2,
    "use_pg_clip_range": False,
    "pg_clip_low": 0.2,
    "pg_clip_high": 0.2,
    "num_gpus_per_node": 8,
    "actor_train.training_args.per_device_train_batch_size": 8,
    "actor_train.training_args.gradient_accumulation_steps": 1,
    "critic.training_args.per_device_train_batch_size": 8,
    "critic.training_args.gradient_accumulation_steps": 1,
    "actor_train.training_args.adam_beta1": 0.9,
    "actor_train.training_args.adam_beta2": 0.999,
    "critic.training_args.adam_beta1": 0.9,
    "critic.training_args.adam_beta2": 0.999,
    "actor_train.strategy_args.strategy_name": "deepspeed_train",
    "reference.strategy_args.strategy_name": "deepspeed_train",
    "critic.strategy_args.strategy_name": "deepspeed_train",
    "async_generation_ratio": 0,
}


RULES: tuple[Rule, ...] = (
    # ---- run
    same("exp_name", "trainer.experiment_name"),
    via("seed", ("trainer.seed", "data.seed"), lambda v, c: v, "same value", "ROLL seeds everything from it"),
    same("output_dir", "trainer.default_local_dir", note="hybrid also writes metrics.jsonl there"),
    ignore("base_dir", "hybrid writes everything under trainer.default_local_dir (output_dir)"),
    ignore("logging_dir", "hybrid's logs go to stdout"),
    ignore("rpc_timeout", "no RPC timeout in hybrid"),
    ignore("local_rank", "set by the launcher"),
    ignore("num_nodes", "ROLL computes it from device_mapping; so does hybrid"),
    custom("num_gpus_per_node", (), lambda v, c: {}, "read with device_mapping to count nodes"),
    via(
        "track_with",
        "trainer.logger",
        _logger,
        "tensorboard, wandb, stdout -> console; plus file",
        "`file` (metrics.jsonl) is hybrid's run record and is always kept",
    ),
    same("tracker_kwargs.project", "trainer.project_name"),
    same("tracker_kwargs.name", "trainer.experiment_name"),
    custom(
        "tracker_kwargs.log_dir",
        ("trainer.worker_env_vars.TENSORBOARD_DIR", "trainer.worker_env_vars.WANDB_DIR"),
        _tracker,
        "track_with tensorboard -> TENSORBOARD_DIR, wandb -> WANDB_DIR; stdout: not read",
        "the folder ROLL's tracker writes to; hybrid's TensorBoard logger and wandb read these variables",
    ),
    custom(
        "tracker_kwargs.api_key",
        ("trainer.worker_env_vars.WANDB_API_KEY",),
        _tracker,
        "track_with wandb -> WANDB_API_KEY (${oc.env:WANDB_API_KEY} unset: left to wandb, which reads that variable "
        "itself); other trackers: not read",
        "ROLL logs in to wandb with it",
    ),
    custom(
        "tracker_kwargs.notes",
        ("trainer.worker_env_vars.WANDB_NOTES",),
        _tracker,
        "track_with wandb -> WANDB_NOTES; other trackers: not read",
    ),
    custom(
        "tracker_kwargs.tags",
        ("trainer.worker_env_vars.WANDB_TAGS",),
        _tracker,
        "track_with wandb -> WANDB_TAGS (comma-separated); other trackers: not read",
    ),
    custom(
        "max_steps",
        ("trainer.total_training_steps", "trainer.total_epochs"),
        _max_steps,
        "total_training_steps = value, total_epochs = value",
        "ROLL starts the data over until max_steps; hybrid's run ends with total_epochs (as verl's), so it gets "
        "that many passes, enough for any data size",
    ),
    custom(
        "save_steps",
        ("trainer.save_freq", f"{ACTOR}.checkpoint.save_contents"),
        _save_steps,
        "save_freq = value (<= 0: only the last step); save_contents + hf_model",
        "ROLL's checkpoints hold the Hugging Face model; both save the last step",
    ),
    custom(
        "max_ckpt_to_keep",
        ("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"),
        _keep,
        "0 -> null (keep all), N -> N",
    ),
    refuse("logging_steps", "hybrid logs every step", accept=(1,)),
    custom(
        "eval_steps",
        ("trainer.test_freq", "trainer.val_before_train"),
        _eval_steps,
        "N > 0 -> test_freq N, val_before_train true; <= 0 -> test_freq -1, val_before_train false",
        "ROLL validates at step 0 too whenever eval_steps > 0",
    ),
    custom(
        "resume_from_checkpoint",
        ("trainer.resume_mode", "trainer.resume_from_path"),
        _resume,
        "false -> disable, true -> auto, a path -> resume_path + resume_from_path",
    ),
    ignore("checkpoint_config.*", "hybrid writes checkpoints under trainer.default_local_dir (output_dir); no upload"),
    refuse("rollout_dump_dir", "no rollout dump in hybrid", accept=(None,)),
    ignore("save_logging_board_dir", "hybrid writes metrics.jsonl under trainer.default_local_dir"),
    refuse("profiler_timeline", "no profiler switch in hybrid", accept=(False,)),
    refuse("profiler_memory", "no profiler switch in hybrid", accept=(False,)),
    ignore("profiler_output_dir", "read only with the profilers, which are refused"),
    ignore("length_profiler_dir", "read only with report_length_and_rewards, which is refused"),
    refuse("report_length_and_rewards", "no such report in hybrid", accept=(False,)),
    system_envs_rule("system_envs.*"),
    refuse("model_download_type", "hybrid loads local folders or Hugging Face hub ids", accept=(None,)),
    refuse("rollout_mock", "no rollout dump/mock in hybrid", accept=(None,)),
    refuse("rollout_mock.*", "no rollout dump/mock in hybrid"),
    custom(
        "global_template",
        ("data.apply_chat_template_kwargs.enable_thinking",),
        _template,
        "as actor_train.data_args.template, which it replaces",
        "ROLL's RLVR pipeline encodes its prompts with global_template, else actor_train.data_args.template",
    ),
    refuse(
        "tag_to_template.*",
        "one template for every prompt in hybrid (ROLL's per-tag templates have no key)",
        accept=lambda v: not v,
        accepts="{}",
    ),
    refuse("dataset_filter.source", "no data-set filtering by source or difficulty in hybrid", accept=(None,)),
    refuse("dataset_filter.min_difficulty", "no data-set filtering by difficulty in hybrid", accept=(None,)),
    refuse("dataset_filter.max_difficulty", "no data-set filtering by difficulty in hybrid", accept=(None,)),
    refuse("dataset_filter.num_samples", "no data-set subsampling in hybrid", accept=(0,)),
    ignore(
        "<role>.use_remove_padding",
        "not a field of ROLL's worker config: ROLL's launcher (dacite, not strict) drops it unread",
    ),
    ignore("pg_variant", "a YAML variable in ROLL's examples; actor_train.pg_variant is the one read"),
    # ---- scheduling
    custom(
        "async_generation_ratio",
        SCHEDULE_KEYS,
        _async_generation_ratio,
        "0: synchronous (with actor_infer apart: mode=one_step_off, max_staleness_steps=0, "
        "use_rollout_log_probs=false); r >= 1 -> mode=fully_async, staleness_threshold=r, max_staleness_steps=ceil(r), "
        "trigger_parameter_sync_step=1, require_batches=rollout_batch_size / ppo_mini_batch_size, "
        "max_groups_in_flight=ceil((1 + r) x rollout_batch_size), partial_rollout=true, use_rollout_log_probs=false; "
        "needs actor_infer's device_mapping disjoint from actor_train's",
        "ROLL's scheduler starts prompts one at a time while started-and-unused prompts stay within r "
        "rollout_batch_size batches ahead of training (its ReplayBuffer budget), takes each step's batch from "
        "whatever finished, oldest first, drops prompts started more than ceil(r) steps ago, and updates the "
        "engines' weights before every step, aborting requests in flight: verl's fully async schedule with "
        "staleness_threshold=r in sync windows of one step (rollout_batch_size groups) and the bound ceil(r), "
        "not one-step-off's whole batches generated ahead, so a whole and a fractional r map alike. "
        "Differences: ROLL continues an aborted request from its partial output, hybrid samples the turn again "
        "on the new weights; with a fractional r ROLL also caps the share of a batch taken from the oldest "
        "admissible step at the fraction, hybrid has only the budget and the bound. Both recompute the PPO "
        "anchor with the trainer's weights",
    ),
    ignore("generate_opt_level", "ROLL's request scheduler; hybrid sends the whole batch to vLLM"),
    ignore("is_num_return_sequences_expand", "ROLL's request scheduler; hybrid sends the whole batch to vLLM"),
    same("max_running_requests", f"{ROLLOUT}.max_num_seqs", note="the engine's limit on concurrent sequences"),
    refuse(
        "is_use_additional_prompts",
        "no over-sampling of prompts (dynamic sampling) in hybrid's scheduler",
        accept=(False,),
    ),
    ignore("max_additional_running_prompts", "read only with is_use_additional_prompts, which is refused"),
    ignore("user_defined_rollout_loop_cls", "ROLL's agentic rollout loop"),
    same(
        "model_update_buffer_size_mb",
        f"{ROLLOUT}.update_weights_bucket_megabytes",
        note="the bucket of hybrid's in-memory weight sync",
    ),
    custom(
        "is_offload_states",
        (f"{ACTOR}.fsdp_config.param_offload", f"{ACTOR}.fsdp_config.optimizer_offload"),
        lambda v, c: {f"{ACTOR}.fsdp_config.param_offload": v, f"{ACTOR}.fsdp_config.optimizer_offload": v},
        "same value into both",
    ),
    refuse(
        "is_offload_optimizer_states_in_train_step",
        "hybrid keeps the optimizer state on the device during an update",
        accept=(False,),
    ),
    # ---- sizes
    *BATCH_RULES,
    same("num_return_sequences_in_group", f"{ROLLOUT}.n"),
    same("prompt_length", "data.max_prompt_length"),
    custom(
        "response_length",
        ("data.max_response_length",),
        _response_length,
        "same value (ROLL reads sequence_length instead when both are given)",
    ),
    via("sequence_length", "data.max_response_length", _sequence_length, "value - prompt_length"),
    custom("val_prompt_length", (), _val_lengths, "must equal prompt_length"),
    custom("val_sequence_length", (), _val_lengths, "must equal the training sequence length"),
    # ---- algorithm
    custom(
        "adv_estimator",
        ("algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo", "algorithm.whiten_advantages"),
        _advantage,
        "grpo -> grpo; gae (whiten_advantages: true) -> gae; reinforce + group norm -> grpo; "
        "reinforce + whiten_advantages -> reinforce_plus_plus",
        "read with norm_mean_type, norm_std_type and whiten_advantages",
    ),
    custom("norm_mean_type", ("algorithm.adv_estimator",), _advantage, "read with adv_estimator"),
    custom(
        "norm_std_type",
        ("algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo"),
        _advantage,
        "read with adv_estimator",
    ),
    custom(
        "whiten_advantages",
        ("algorithm.adv_estimator", "algorithm.whiten_advantages"),
        _advantage,
        "read with adv_estimator; agentic: group-normalised scores whitened after -> algorithm.whiten_advantages",
    ),
    same("ppo_epochs", f"{ACTOR}.ppo_epochs", note="the critic follows"),
    same("max_grad_norm", f"{ACTOR}.grad_clip"),
    refuse("l2", "no L2 term besides weight decay (training_args.weight_decay)", accept=(0, 0.0)),
    same("lambd", "algorithm.lam"),
    same("gamma", "algorithm.gamma"),
    custom(
        "pg_clip",
        (f"{ACTOR}.clip_ratio", f"{ACTOR}.clip_ratio_low", f"{ACTOR}.clip_ratio_high"),
        _clip,
        "clip_ratio, clip_ratio_low and clip_ratio_high = pg_clip (or pg_clip_low/high with use_pg_clip_range)",
    ),
    custom("use_pg_clip_range", (f"{ACTOR}.clip_ratio_low", f"{ACTOR}.clip_ratio_high"), _clip, "read with pg_clip"),
    custom("pg_clip_low", (f"{ACTOR}.clip_ratio_low",), _clip, "read with use_pg_clip_range"),
    custom("pg_clip_high", (f"{ACTOR}.clip_ratio_high",), _clip, "read with use_pg_clip_range"),
    custom(
        "dual_clip_loss",
        (f"{ACTOR}.clip_ratio_c",),
        _dual_clip,
        f"true -> 3, false -> {NO_DUAL_CLIP:g} (a bound that never binds)",
    ),
    custom("value_clip", ("critic.cliprange_value",), _value_clip, "same value; null only without a critic"),
    via("kl_penalty", "algorithm.kl_penalty", _kl_penalty, "kl, abs, mse, full; k3 -> low_var_kl"),
    custom(
        "target_kl",
        ("algorithm.kl_ctrl.type", "algorithm.kl_ctrl.target_kl"),
        _target_kl,
        "null -> fixed; a value -> adaptive with that target",
    ),
    same(
        "init_kl_coef",
        "algorithm.kl_ctrl.kl_coef",
        note="the in-reward KL coefficient (used with add_token_level_kl)",
    ),
    same("kl_horizon", "algorithm.kl_ctrl.horizon"),
    same("add_token_level_kl", "algorithm.use_kl_in_reward"),
    same("use_kl_loss", f"{ACTOR}.use_kl_loss"),
    same("kl_loss_coef", f"{ACTOR}.kl_loss_coef"),
    same("entropy_loss_coef", f"{ACTOR}.entropy_coeff"),
    choice(
        "loss_agg_mode",
        f"{ACTOR}.loss_agg_mode",
        {m: m for m in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")},
        note="ROLL's default is seq-mean-token-mean, hybrid's token-mean",
    ),
    same("critic_warmup", "trainer.critic_warmup"),
    ignore("enable_reference", "hybrid builds the reference whenever a KL term needs it"),
    custom("enable_old_logprobs_recompute", (f"{ACTOR}.skip_old_log_prob_on_policy",), _recompute, "negated"),
    custom(
        "force_disable_old_logprobs_recompute",
        (f"{ACTOR}.skip_old_log_prob_on_policy",),
        _recompute,
        "true -> skip",
    ),
    refuse("use_reward_scaling", "no reward scaling key in hybrid", accept=(False,)),
    refuse("use_reward_norm", "no reward normalisation key besides the estimator's own", accept=(False,)),
    refuse(
        "add_len_reward",
        "no length reward in hybrid (reward_model.reward_manager=dapo has an overlong penalty)",
        accept=(False,),
    ),
    via(
        "reward_clip",
        "algorithm.reward_clip",
        lambda value, ctx: value or None,
        "same value (0 or null: off)",
        "the token-level rewards (after any KL in the reward) clamped to [-x, x] before the advantages, as ROLL's "
        "compute_token_reward; ROLL also clamps the response rewards after its reward normalisation, which "
        "hybrid's estimators do inside",
    ),
    refuse("whiten_rewards", "no reward whitening key in hybrid", accept=(False,)),
    same("advantage_clip", "algorithm.advantage_clip", note="the advantages clamped to [-x, x] after the estimator"),
    choice(
        "use_policy_loss_type",
        f"{ACTOR}.policy_loss.loss_mode",
        {"PPO": "vanilla", "PG": "gpg"},
        note="PG: the plain policy gradient -A log p",
    ),
    refuse("use_topr_loss", "no TOPR loss in hybrid", accept=(False,)),
    refuse("use_topr_neg_loss_coef", "no TOPR loss in hybrid", accept=(0, 0.0)),
    refuse("postive_loss_coef", "no SFT term on positive samples in hybrid", accept=(0, 0.0)),
    refuse("rl_loss_coef", "hybrid's policy loss has no coefficient", accept=(1, 1.0)),
    refuse(
        "importance_sampling",
        "hybrid's PPO ratio is per token (policy_loss.loss_mode=gspo is GSPO's sequence ratio)",
        accept=("token",),
    ),
    refuse("difficulty_loss_weight", "no difficulty loss weight in hybrid", accept=(False,)),
    refuse("length_loss_weight", "no length loss weight in hybrid", accept=(False,)),
    same(
        "max_len_mask",
        "algorithm.mask_truncated_responses",
        note="responses that fill response_length leave the loss; ROLL masks every full-length response, hybrid "
        "those of them that do not end in EOS",
    ),
    custom(
        "difficulty_mask",
        ("algorithm.difficulty_mask.enable", "algorithm.difficulty_mask.low", "algorithm.difficulty_mask.high"),
        _difficulty,
        "same value into enable; low/high from difficulty_low_threshold / difficulty_high_threshold (ROLL's defaults "
        "0.0 and 1.0 where not given)",
        "every response of a prompt group whose mean score is not strictly between the bounds leaves the losses, "
        "as ROLL's sample mask (its advantages and whitening see only the responses kept; a step where no response "
        "is kept trains nothing, as ROLL skips it)",
    ),
    custom("difficulty_low_threshold", ("algorithm.difficulty_mask.low",), _difficulty, "read with difficulty_mask"),
    custom("difficulty_high_threshold", ("algorithm.difficulty_mask.high",), _difficulty, "read with difficulty_mask"),
    refuse("error_max_len_clip", "no such mask in hybrid", accept=(False,)),
    ignore("error_max_len_threshold", "read only with error_max_len_clip, which is refused"),
    refuse(
        "balance_length",
        "no length balancing in hybrid (trainer.balance_batch balances tokens across devices)",
        accept=(False,),
    ),
    refuse("minibatch_data_iter_num", "one pass per mini batch (ppo_epochs repeats the whole batch)", accept=(1,)),
    ignore("mask_type", "read only with the masks above, which are refused"),
    custom(
        "train_infer_correction.is_weight.enabled",
        (f"{ACTOR}.tis_imp_ratio_cap",),
        _is_weight,
        "true -> tis_imp_ratio_cap = upper_bound (token weights); false -> -1",
    ),
    custom(
        "train_infer_correction.is_weight.upper_bound",
        (f"{ACTOR}.tis_imp_ratio_cap",),
        _is_weight,
        "read with enabled=true",
    ),
    custom("train_infer_correction.is_weight.weight_type", (f"{ACTOR}.tis_imp_ratio_cap",), _is_weight, "token only"),
    refuse(
        "train_infer_correction.is_weight.detach",
        "hybrid's importance weights are always detached",
        accept=(True,),
    ),
    refuse(
        "train_infer_correction.filters",
        "no train/inference mismatch filters in hybrid",
        accept=lambda v: not v,
        accepts="[]",
    ),
    custom(
        "val_greedy",
        (f"{ROLLOUT}.val_kwargs.do_sample", f"{ROLLOUT}.val_kwargs.temperature"),
        _val_greedy,
        "true -> greedy (do_sample false, temperature 0); false -> do_sample true",
    ),
    same("val_n_sample", f"{ROLLOUT}.val_kwargs.n"),
    # ---- models (the worker sections' model_args: roll_sections.py)
    custom("pretrain", (f"{ARR}.model.path",), _model_path, "same value"),
    custom(
        "reward_pretrain",
        ("critic.model.path",),
        lambda v, c: {} if v is None else {"critic.model.path": v},
        "same value",
        "ROLL starts the critic from it",
    ),
    *SECTION_RULES,
    *WORKER_KEY_RULES,
)

__all__ = ["ROLL_DEFAULTS", "RULES"]
