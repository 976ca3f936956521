"""The rules that involve several keys, run on the built sections (hybrid/config/validate.py
builds them): batch arithmetic against the world size, lengths, the algorithm's
combinations, the actor's and critic's batches, deprecated micro-batch keys, trainer and
device switches. Each adds one line per problem, naming the keys and what to change.
"""

from __future__ import annotations

import os
from dataclasses import fields, is_dataclass
from typing import Any

from hybrid.config.rules_async import check_async
from hybrid.config.rules_estimator import check_estimator
from hybrid.config.rules_log_probs import check_rollout_log_probs
from hybrid.config.rules_parallel import check_tensor_parallel
from hybrid.config.rules_step_wise import check_step_wise
from hybrid.config.schema import HybridConfig
from hybrid.distillation import check_distillation
from hybrid.domains import check_judge_domains
from protocol.config_schema import INVALID, Problems, fmt, section_names, valid
from reward.config import OVERLONG, OVERLONG_KEYS, OVERLONG_VERL
from workers.config import ActorRolloutRefConfig
from workers.losses import KL_PENALTY_KINDS, policy_loss_spec
from workers.rollout.engine import engines_with

ARR = "actor_rollout_ref"
# `full` needs log-probs over the whole vocabulary; the workers keep only the sampled
# tokens' (as verl does), so it cannot run from the config.
KL_FULL_REASON = (
    "the 'full' KL needs log-probs over the whole vocabulary for every token, and the workers keep only the "
    "sampled tokens' log-probs (as verl's FSDP workers do); use low_var_kl (k3), kl (k1), mse (k2) or abs"
)


def kl_kinds() -> tuple[str, ...]:
    """KL estimators a config may name (`<kind>+` adds a straight-through gradient)."""
    return tuple(kind for kind in KL_PENALTY_KINDS if kind != "full")


def _sections_whole(section: Any) -> bool:
    """True when no section inside `section` failed to build (rules across keys need them)."""
    if section is INVALID:
        return False
    if not is_dataclass(section):
        return True
    return all(
        _sections_whole(getattr(section, f.name))
        for f in fields(section)
        if is_dataclass(getattr(section, f.name))
        or (getattr(section, f.name) is INVALID and f.name in section_names(type(section)))
    )


def _check_entropy_checkpointing(arr, problems: Problems) -> None:
    """verl's entropy_checkpointing recomputes the entropy in the backward pass; here that is
    what the fused output layer does, so turning the layer off cannot honour it."""
    if arr.model.use_fused_kernels is not False:
        return
    for name in ("actor", "ref"):
        section = getattr(arr, name)
        if section is not INVALID and section.entropy_checkpointing is True:
            problems.add(
                f"{ARR}.{name}.entropy_checkpointing=True needs the fused output layer, which recomputes the "
                "entropy in the "
                f"backward pass, but {ARR}.model.use_fused_kernels=False; set use_fused_kernels to null (or true), or "
                f"entropy_checkpointing=false"
            )


def check_config(config: HybridConfig, problems: Problems, world_size: int | None = None) -> None:
    if not _sections_whole(config):
        return  # a missing or malformed section is reported already; its rules cannot run
    world, world_desc = _world(config, world_size)
    arr = config.actor_rollout_ref
    data = config.data
    for section in (data, arr.rollout, config.reward_model):
        if hasattr(section, "check") and section is not INVALID:
            section.check(problems)
    check_judge_domains(config, problems)
    if valid(config.reward_model.reward_kwargs):
        _check_overlong_spellings(config.reward_model.reward_kwargs, problems)
    arr.model.check(problems)
    _check_entropy_checkpointing(arr, problems)
    _check_profilers(config, problems)
    _check_lengths(config, problems)
    _check_rollout_world(config, world, world_desc, problems)
    check_tensor_parallel(config, problems)
    _check_algorithm(config, problems)
    check_estimator(config, problems)
    check_distillation(config, problems)
    config.algorithm.rollout_correction.check(problems, arr.actor)
    check_rollout_log_probs(config, problems)
    config.algorithm.difficulty_mask.check(problems)
    _check_actor(config, world, world_desc, problems)
    _check_fsdp_size(problems, f"{ARR}.actor.fsdp_config.fsdp_size", arr.actor.fsdp_config, world, world_desc)
    if config.critic is not INVALID and _critic_used(config):
        critic = config.critic
        _check_fsdp_size(problems, "critic.model.fsdp_config.fsdp_size", critic.model.fsdp_config, world, world_desc)
        _check_ppo_batches(problems, "critic", "critic", critic, config, world, world_desc)
        _deprecated_micro(
            problems,
            "critic.ppo_micro_batch_size",
            critic.ppo_micro_batch_size,
            "critic.ppo_micro_batch_size_per_gpu",
            critic.ppo_micro_batch_size_per_gpu,
        )
        if critic.forward_micro_batch_size != critic.ppo_micro_batch_size:
            _deprecated_micro(
                problems,
                "critic.forward_micro_batch_size",
                critic.forward_micro_batch_size,
                "critic.forward_micro_batch_size_per_gpu",
                critic.forward_micro_batch_size_per_gpu,
            )
        critic.optim.check("critic.optim", problems)
    rm = config.reward_model
    if rm is not INVALID and rm.enable is True:
        _deprecated_micro(
            problems,
            "reward_model.micro_batch_size",
            rm.micro_batch_size,
            "reward_model.micro_batch_size_per_gpu",
            rm.micro_batch_size_per_gpu,
        )
        if rm.use_dynamic_bsz is not True and rm.micro_batch_size_per_gpu is None:
            problems.add("reward_model.micro_batch_size_per_gpu=None must be a positive integer")
    _check_trainer(config, problems)
    _check_device_switches(config, problems)
    check_async(config, problems)
    check_step_wise(config, problems)


def _world(config: HybridConfig, world_size: int | None) -> tuple[int | None, str]:
    if world_size is not None:
        return world_size, f"world size {world_size}"
    trainer = config.trainer
    if trainer is INVALID or not valid(trainer.nnodes, trainer.n_gpus_per_node):
        return None, ""
    n = trainer.nnodes * trainer.n_gpus_per_node
    return n, f"world size {n} (trainer.nnodes={trainer.nnodes} x trainer.n_gpus_per_node={trainer.n_gpus_per_node})"


def _check_fsdp_size(problems: Problems, key: str, fsdp_config: Any, world: int | None, world_desc: str) -> None:
    """verl's rule (create_device_mesh): -1 or at least the world size shards over all ranks;
    a smaller size makes hybrid-sharded groups of that many ranks, which must tile the world."""
    size = fsdp_config.fsdp_size if fsdp_config is not INVALID else INVALID
    if not valid(size):
        return
    if size == 0 or size < -1:
        problems.add(f"{key}={size} must be -1 (shard over all ranks) or a positive group size")
    elif world is not None and 0 < size < world and world % size:
        problems.add(
            f"{key}={size} does not divide {world_desc}: hybrid-sharded groups of {size} ranks must tile the "
            f"ranks (-1 shards over all of them)"
        )


def _check_profilers(config: HybridConfig, problems: Problems) -> None:
    steps = config.global_profiler.steps
    arr = config.actor_rollout_ref
    for prefix, section in ((f"{ARR}.actor", arr.actor), (f"{ARR}.ref", arr.ref), ("critic", config.critic)):
        if section is not INVALID and valid(section.profiler):
            section.profiler.check(prefix, problems, steps)


def _check_lengths(config: HybridConfig, problems: Problems) -> None:
    prompt, response = config.data.max_prompt_length, config.data.max_response_length
    rollout = config.actor_rollout_ref.rollout
    max_model_len = rollout.max_model_len
    if rollout.max_model_len_caps_response is True and valid(prompt, max_model_len):
        # vLLM stops a sequence at max_model_len (ROLL's engine runs so); a prompt must leave room for a token
        if rollout.name not in engines_with(stops_at_max_model_len=True):
            problems.add(
                f"{ARR}.rollout.max_model_len_caps_response=true needs {ARR}.rollout.name="
                f"{'/'.join(engines_with(stops_at_max_model_len=True))} (the engine that stops a sequence at "
                f"max_model_len), not {fmt(rollout.name)}"
            )
        elif max_model_len is None or prompt >= max_model_len:
            problems.add(
                f"{ARR}.rollout.max_model_len_caps_response=true needs {ARR}.rollout.max_model_len above "
                f"data.max_prompt_length={prompt} (got {fmt(max_model_len)})"
            )
        return
    if max_model_len is not None and valid(prompt, response, max_model_len) and prompt + response > max_model_len:
        problems.add(
            f"data.max_prompt_length={prompt} + data.max_response_length={response} = {prompt + response} "
            f"exceeds {ARR}.rollout.max_model_len={max_model_len}"
        )


def _check_rollout_world(config: HybridConfig, world: int | None, world_desc: str, problems: Problems) -> None:
    rollout = config.actor_rollout_ref.rollout
    tp, train_batch, n = rollout.tensor_model_parallel_size, config.data.train_batch_size, rollout.n
    if world is None:
        return
    # The fused worker's engines are shards over its ranks; engines in actors of their own (or
    # behind servers) have their devices checked against rollout.* (rules_async.py).
    fused = config.actor_rollout_ref.hybrid_engine is True and not (valid(rollout.remote) and rollout.remote.enabled)
    if valid(tp) and fused and world % tp != 0:
        problems.add(f"{ARR}.rollout.tensor_model_parallel_size={tp} does not divide {world_desc}")
    if valid(train_batch, n) and (train_batch * n) % world != 0:
        problems.add(
            f"data.train_batch_size={train_batch} x {ARR}.rollout.n={n} = {train_batch * n} "
            f"samples per step do not split evenly over {world_desc}"
        )


def _check_kl_kind(problems: Problems, key: str, value: Any) -> None:
    if not valid(value):
        return
    base = value[:-1] if isinstance(value, str) and value.endswith("+") else value
    if base == "full":
        problems.add(f"{key}={fmt(value)} is not supported: {KL_FULL_REASON}")
    elif base not in kl_kinds():
        problems.add(
            f"{key}={fmt(value)} is not supported; supported: {', '.join(kl_kinds())} "
            f"(and <kind>+ for a straight-through gradient)"
        )


def _check_algorithm(config: HybridConfig, problems: Problems) -> None:
    algo, arr = config.algorithm, config.actor_rollout_ref
    _check_kl_kind(problems, "algorithm.kl_penalty", algo.kl_penalty)
    _check_kl_kind(problems, f"{ARR}.actor.kl_loss_type", arr.actor.kl_loss_type)
    if algo.filter_groups.enable is True:
        n = arr.rollout.n
        if valid(n) and n < 2:
            problems.add(
                f"algorithm.filter_groups.enable=True needs groups of at least 2 responses but {ARR}.rollout.n={n}"
            )
    if arr.actor.use_kl_loss is True and algo.use_kl_in_reward is True:
        problems.add(
            f"{ARR}.actor.use_kl_loss=True and algorithm.use_kl_in_reward=True are mutually "
            f"exclusive: apply the KL penalty either in the loss or in the reward, not both"
        )
    if algo.advantages_per_domain is True and not config.data.domain_quotas:
        problems.add(
            "algorithm.advantages_per_domain=True groups the batch by each row's domain, which data.domain_quotas "
            "gives; set data.domain_quotas or advantages_per_domain=false"
        )


def _deprecated_micro(problems: Problems, old_key: str, old: Any, new_key: str, new: Any) -> None:
    """verl's global micro batch keys are not read; only the per-device ones are."""
    if old is None or not valid(old, new):
        return
    if new is not None:
        problems.add(
            f"{old_key}={fmt(old)} and {new_key}={fmt(new)} are both set; use only {new_key} "
            f"(the *_per_gpu key, samples per device) and set {old_key}=null"
        )
    else:
        problems.add(f"{old_key}={fmt(old)} is deprecated and not read; set {new_key} (samples per device) instead")


def _check_actor(config: HybridConfig, world: int | None, world_desc: str, problems: Problems) -> None:
    arr: ActorRolloutRefConfig = config.actor_rollout_ref
    actor = arr.actor
    _check_ppo_batches(problems, "actor", f"{ARR}.actor", actor, config, world, world_desc)
    actor_sp, ref_sp = actor.ulysses_sequence_parallel_size, arr.ref.ulysses_sequence_parallel_size
    if valid(actor_sp, ref_sp) and actor_sp != ref_sp:
        problems.add(
            f"{ARR}.ref.ulysses_sequence_parallel_size={ref_sp} differs from "
            f"{ARR}.actor.ulysses_sequence_parallel_size="
            f"{actor_sp}; the reference policy runs in the actor's workers, which split sequences one way: set them "
            f"equal (ref's default is the actor's)"
        )
    _deprecated_micro(
        problems,
        f"{ARR}.actor.ppo_micro_batch_size",
        actor.ppo_micro_batch_size,
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu",
        actor.ppo_micro_batch_size_per_gpu,
    )
    for role in ("rollout", "ref"):
        section = getattr(arr, role)
        prefix = f"{ARR}.{role}"
        _deprecated_micro(
            problems,
            f"{prefix}.log_prob_micro_batch_size",
            section.log_prob_micro_batch_size,
            f"{prefix}.log_prob_micro_batch_size_per_gpu",
            section.log_prob_micro_batch_size_per_gpu,
        )
        if section.log_prob_use_dynamic_bsz is not True and section.log_prob_micro_batch_size_per_gpu is None:
            problems.add(
                f"{prefix}.log_prob_micro_batch_size_per_gpu=None must be a positive integer unless "
                f"{prefix}.log_prob_use_dynamic_bsz=true"
            )
    actor.optim.check(f"{ARR}.actor.optim", problems)
    model = arr.model
    if valid(model.lora_rank) and model.lora_rank > 0:
        for key, value in (("target_modules", model.target_modules), ("exclude_modules", model.exclude_modules)):
            if valid(value) and isinstance(value, tuple) and not value:
                problems.add(
                    f"{ARR}.model.{key}=[] must be a module name pattern or a list of module names (e.g. "
                    "all-linear or [q_proj,v_proj])"
                )


def _check_ppo_batches(
    problems: Problems, role: str, prefix: str, section: Any, config: HybridConfig, world: int | None, world_desc: str
) -> None:
    """verl's batch arithmetic for one trained role (actor or critic)."""
    mini_key, micro_key, n_key = (
        f"{prefix}.ppo_mini_batch_size",
        f"{prefix}.ppo_micro_batch_size_per_gpu",
        f"{ARR}.rollout.n",
    )
    mini, micro = section.ppo_mini_batch_size, section.ppo_micro_batch_size_per_gpu
    train_batch, n = config.data.train_batch_size, config.actor_rollout_ref.rollout.n
    if section.use_dynamic_bsz is True:
        max_tokens = section.ppo_max_token_len_per_gpu
        prompt, response = config.data.max_prompt_length, config.data.max_response_length
        if valid(max_tokens, prompt, response) and max_tokens < prompt + response:
            problems.add(
                f"{prefix}.ppo_max_token_len_per_gpu={max_tokens} is smaller than one sequence "
                f"(data.max_prompt_length={prompt} + data.max_response_length={response}); "
                f"dynamic batches could not hold it"
            )
        micro = None
    elif micro is None:
        problems.add(f"{micro_key}=None must be a positive integer unless {prefix}.use_dynamic_bsz=true")
    if not valid(mini, train_batch, n):
        return
    multiple = config.algorithm.batch_adjust.multiple  # the batch is brought to a multiple of it (batch_adjust)
    if valid(multiple) and multiple is not None:
        if multiple % (mini * n):
            problems.add(
                f"algorithm.batch_adjust.multiple={multiple} samples is not divisible by {mini_key}={mini} x "
                f"{n_key}={n} = {mini * n} samples per mini-batch; make it a multiple of {mini * n}"
            )
    elif train_batch % mini != 0:
        problems.add(
            f"data.train_batch_size={train_batch} x {n_key}={n} = {train_batch * n} samples is not "
            f"divisible by {mini_key}={mini} x {n_key}={n} = {mini * n} samples per mini-batch; "
            f"make data.train_batch_size a multiple of {mini_key}"
        )
    if world is None:
        return
    sp = section.ulysses_sequence_parallel_size
    if valid(sp) and sp > 1:
        if world % sp:
            problems.add(f"{prefix}.ulysses_sequence_parallel_size={sp} does not divide {world_desc}")
            return
        # A sequence-parallel group shares its rows: the batch splits over the groups.
        world, world_desc = (
            world // sp,
            f"{world // sp} data-parallel groups ({world_desc} / {prefix}.ulysses_sequence_parallel_size={sp})",
        )
    if (mini * n) % world != 0:
        if config.trainer.pad_mini_batches is not True:
            problems.add(
                f"{mini_key}={mini} x {n_key}={n} = {mini * n} samples per mini-batch do not split evenly over "
                f"{world_desc}; set trainer.pad_mini_batches=true to pad each with dummy rows (loss mask 0)"
            )
        else:
            _check_padding(problems, role, prefix, section, config)
        return  # padded: a rank's last micro-batch may be smaller, which changes no loss (token-share weights)
    per_rank = mini * n // world
    if micro is not None and valid(micro) and per_rank % micro != 0:
        problems.add(
            f"{mini_key}={mini} x {n_key}={n} / {world_desc} = {per_rank} samples per device per "
            f"mini-batch is not divisible by {micro_key}={micro}"
        )


def _check_padding(problems: Problems, role: str, prefix: str, section: Any, config: HybridConfig) -> None:
    """What trainer.pad_mini_batches cannot pad: the dummy rows must reach every loss and metric
    through the response mask alone."""
    sp = section.ulysses_sequence_parallel_size
    if valid(sp) and sp > 1:
        problems.add(
            f"trainer.pad_mini_batches=true pads mini-batches for ranks that each hold whole rows; with "
            f"{prefix}.ulysses_sequence_parallel_size={sp} give a mini-batch that splits over the data-parallel groups"
        )
    if role != "actor":
        return
    loss_mode = section.policy_loss.loss_mode if valid(section.policy_loss) else INVALID
    spec = policy_loss_spec(loss_mode) if valid(loss_mode) else None
    if spec is not None and spec.rows_whatever_mask:
        problems.add(
            f"trainer.pad_mini_batches=true with {prefix}.policy_loss.loss_mode={loss_mode}: {spec.row_mean_by} "
            f"averages its loss over a micro-batch's rows whatever their mask, so dummy rows would count; give a "
            f"mini-batch that splits evenly"
        )
    correction = config.algorithm.rollout_correction
    cap = section.tis_imp_ratio_cap  # verl's older key for token TIS
    on = correction.rollout_is is not None or correction.rollout_rs is not None or correction.bypass_mode is True
    if on or (valid(cap) and cap > 0):
        problems.add(
            "trainer.pad_mini_batches=true with rollout correction (algorithm.rollout_correction or "
            "actor.tis_imp_ratio_cap): its metrics count rows whatever their mask, so dummy rows would count; "
            "give a mini-batch that splits evenly"
        )


def _critic_used(config: HybridConfig) -> bool:
    """Whether a critic is built (critic.enable=False with an estimator that takes values: rules_estimator)."""
    enable, estimator = config.critic.enable, config.algorithm.adv_estimator
    return config.use_critic if valid(enable, estimator) else False


def _check_trainer(config: HybridConfig, problems: Problems) -> None:
    trainer = config.trainer
    if valid(trainer.total_epochs) and trainer.total_epochs < 1:
        # As verl's loop over range(total_epochs): total_training_steps only shortens a run.
        problems.add(
            f"trainer.total_epochs={trainer.total_epochs} trains nothing: a run is at most total_epochs passes "
            f"over the training data, whatever trainer.total_training_steps says; set trainer.total_epochs >= 1"
        )
    if valid(trainer.num_dummy_steps, trainer.val_only) and trainer.num_dummy_steps > 0:
        _check_dummy_steps(config, problems)
    if trainer.resume_mode == "resume_path":
        if trainer.resume_from_path is None:
            problems.add("trainer.resume_mode='resume_path' needs trainer.resume_from_path (a global_step_* folder)")
        elif valid(trainer.resume_from_path):
            # Checked here, before any model loads; the trainer checks again when it resumes.
            from hybrid.checkpoint_folders import resume_path_problem

            critic_used = config.critic is not INVALID and valid(config.critic.enable) and config.use_critic
            problem = resume_path_problem(os.path.abspath(trainer.resume_from_path), need_critic=critic_used)
            if problem:
                problems.add(problem)


def _check_dummy_steps(config: HybridConfig, problems: Problems) -> None:
    """trainer.num_dummy_steps (hybrid/dummy_steps.py) runs on the fused trainer, instead of training."""
    steps = config.trainer.num_dummy_steps
    if config.trainer.val_only is True:
        problems.add(
            f"trainer.num_dummy_steps={steps} with trainer.val_only=true: one runs only dummy steps, the other only "
            f"validation; set trainer.num_dummy_steps=0 or trainer.val_only=false"
        )
    if config.actor_rollout_ref.hybrid_engine is False:
        problems.add(
            f"trainer.num_dummy_steps={steps} runs on the fused trainer only: set actor_rollout_ref.hybrid_engine=true "
            f"(SkyRL: trainer.placement.colocate_all=true) for the dummy run"
        )


def _check_device_switches(config: HybridConfig, problems: Problems) -> None:
    device, use_liger = config.trainer.device, config.actor_rollout_ref.model.use_liger
    if device != "cuda" and use_liger is not True:
        return
    # workers.device is the one place that decides cpu/cuda; imported only here because it
    # imports torch, which most configurations never need at validation time.
    from workers import device as device_helper

    cuda = device_helper.is_cuda_available()
    if device == "cuda" and not cuda:
        problems.add("trainer.device='cuda' needs a CUDA GPU and none is visible; use trainer.device=auto or cpu")
    if use_liger is True and (not cuda or device == "cpu"):
        where = "trainer.device='cpu'" if cuda else "none is visible"
        problems.add(f"{ARR}.model.use_liger=True needs a CUDA GPU ({where}); set {ARR}.model.use_liger=false")


def _check_overlong_spellings(reward_kwargs: dict[str, Any], problems: Problems) -> None:
    """verl's `overlong_buffer_cfg.X` sets hybrid's `overlong_buffer.X`; refused only when
    both spellings set X (hybrid's away from its default) to different values."""
    cfg = reward_kwargs.get(OVERLONG_VERL)
    if cfg is None:
        return
    prefix = "reward_model.reward_kwargs"
    if not isinstance(cfg, dict):
        problems.add(f"{prefix}.{OVERLONG_VERL}={fmt(cfg)} must be a mapping of {', '.join(OVERLONG_KEYS)}")
        return
    for key in cfg:
        if key not in OVERLONG_KEYS:
            problems.add(
                f"{prefix}.{OVERLONG_VERL}.{key}: no such key (the overlong buffer has {', '.join(OVERLONG_KEYS)})"
            )
    # The yaml's defaults tell a value the user wrote from one they left alone.
    from hybrid.config.loading import default_config

    default = dict(default_config().reward_model.reward_kwargs[OVERLONG])
    ours = dict(reward_kwargs.get(OVERLONG) or {})
    for key, value in cfg.items():
        if key in ours and ours[key] != default.get(key) and ours[key] != value:
            problems.add(
                f"{prefix}.{OVERLONG}.{key}={fmt(ours[key])} and {prefix}.{OVERLONG_VERL}.{key}={fmt(value)} are "
                "the same "
                f"setting (verl's spelling and hybrid's) with different values; write only one of them"
            )


__all__ = ["KL_FULL_REASON", "check_config", "kl_kinds"]
