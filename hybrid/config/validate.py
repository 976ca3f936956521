"""From a composed config tree to a checked `HybridConfig`, every problem reported at once.

`typed_config(cfg)` is the boundary: it imports the plug-in modules named by
`actor_rollout_ref.model.external_lib`, resolves the tree (the default model and data
behind `${hybrid_default:...}` stay placeholders, so checking costs milliseconds and never
converts a model), builds the section dataclasses (which check each key's type and
range), then runs the rules that involve several keys. `validate_config` is the same
without keeping the result.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import fields, is_dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hybrid.config.registries import KL_FULL_REASON, kl_kinds
from hybrid.config.schema import ActorRolloutRefConfig, HybridConfig
from hybrid.config.typed import INVALID, Problems, build_section, fmt, section_names

ARR = "actor_rollout_ref"
DEFAULT_ASSET_PREFIX = "hybrid-default:"
_DEFAULT_ASSET = re.compile(r"^\$\{hybrid_default:(\w+)\}$")
GROUPLESS_ADV_ESTIMATORS = ("gae",)


class ConfigError(ValueError):
    """A configuration the trainer cannot run; the message says what to change."""


def _ok(*values: Any) -> bool:
    return all(v is not INVALID for v in values)


# ---------------------------------------------------------------- reading the tree


def _walk(node: Any, prefix: str = ""):
    """(dotted key, parent node, leaf name) for every leaf of an OmegaConf tree."""
    if isinstance(node, DictConfig):
        for key in node.keys():
            path = f"{prefix}.{key}" if prefix else str(key)
            child = node._get_node(key)
            if isinstance(child, (DictConfig, ListConfig)) and not OmegaConf.is_interpolation(node, key):
                yield from _walk(child, path)
            else:
                yield path, node, key
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            path = f"{prefix}.{index}"
            child = node._get_node(index)
            if isinstance(child, (DictConfig, ListConfig)) and not OmegaConf.is_interpolation(node, index):
                yield from _walk(child, path)
            else:
                yield path, node, index


def import_plugins(cfg: DictConfig, problems: Problems) -> None:
    """Import `actor_rollout_ref.model.external_lib` (a module or a list of them)."""
    key = f"{ARR}.model.external_lib"
    try:
        value = OmegaConf.select(cfg, key, default=None)
    except OmegaConfBaseException as err:
        problems.add(f"{key}: cannot be read ({err})")
        return
    names = [value] if isinstance(value, str) else list(value or [])
    for name in names:
        try:
            importlib.import_module(str(name))
        except Exception as err:  # the user's module: any failure is theirs to see
            problems.add(
                f"{key}: cannot import {name!r} ({type(err).__name__}: {err}); check the module name and PYTHONPATH"
            )


def resolved_container(cfg: DictConfig, problems: Problems) -> tuple[dict, set[str]]:
    """The tree as plain data with interpolations resolved, and the keys that were interpolations.

    `${hybrid_default:NAME}` becomes the placeholder `hybrid-default:NAME` (also in keys
    that point at it); `hybrid.defaults.resolve_default_assets` prepares the real paths
    when a run starts. A key that cannot be resolved is reported and left INVALID.
    """
    work = DictConfig(OmegaConf.to_container(cfg, resolve=False))
    interpolated = set()
    for path, parent, leaf in list(_walk(work)):
        if OmegaConf.is_interpolation(parent, leaf):
            raw = parent._get_node(leaf)._value()
            match = _DEFAULT_ASSET.match(str(raw))
            if match:
                parent[leaf] = DEFAULT_ASSET_PREFIX + match.group(1)
            else:
                interpolated.add(path)
    for path, parent, leaf in list(_walk(work)):
        try:
            value = parent[leaf]
        except OmegaConfBaseException as err:
            reason = str(err).splitlines()[0]
            problems.add(f"{path}: cannot be read ({type(err).__name__}: {reason})")
            value = INVALID
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        _assign(work, path, value)
    return _plain(work), interpolated


def _assign(work: DictConfig, path: str, value: Any) -> None:
    # Written as a plain value: later reads of this key no longer interpolate.
    parent_path, _, leaf = path.rpartition(".")
    parent = OmegaConf.select(work, parent_path) if parent_path else work
    key = int(leaf) if isinstance(parent, ListConfig) else leaf
    if value is INVALID:
        parent[key] = "__INVALID__"
    else:
        parent[key] = value


def _plain(node: Any) -> Any:
    data = OmegaConf.to_container(node, resolve=False)

    def restore(value):
        if value == "__INVALID__":
            return INVALID
        if isinstance(value, dict):
            return {k: restore(v) for k, v in value.items()}
        if isinstance(value, list):
            return [restore(v) for v in value]
        return value

    return restore(data)


# ---------------------------------------------------------------- the boundary


def typed_config(cfg: DictConfig | dict, world_size: int | None = None) -> HybridConfig:
    """The checked, frozen configuration of a composed tree; ConfigError lists every problem.

    `world_size` (training ranks) defaults to `trainer.nnodes * trainer.n_gpus_per_node`.
    """
    if isinstance(cfg, dict):
        cfg = OmegaConf.create(cfg)
    problems = Problems()
    import_plugins(cfg, problems)
    data, interpolated = resolved_container(cfg, problems)
    data.pop("hydra", None)
    config = build_section(HybridConfig, data, "", problems, interpolated)
    if world_size is not None and (not isinstance(world_size, int) or world_size <= 0):
        problems.add(f"world_size={world_size!r} must be a positive integer")
        world_size = None
    check_config(config, problems, world_size)
    if problems:
        count = len(problems)
        header = f"invalid configuration ({count} problem{'s' if count > 1 else ''}):"
        raise ConfigError("\n".join([header] + [f"  - {p}" for p in problems]))
    return config


def validate_config(cfg: DictConfig, world_size: int | None = None) -> None:
    """Raise ConfigError listing every problem in `cfg`, one line each."""
    typed_config(cfg, world_size)


# ---------------------------------------------------------------- rules across keys


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
                f"{ARR}.{name}.entropy_checkpointing=True needs the fused output layer, which recomputes the entropy in the "
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
    arr.model.check(problems)
    _check_entropy_checkpointing(arr, problems)
    _check_profilers(config, problems)
    _check_lengths(config, problems)
    _check_rollout_world(config, world, world_desc, problems)
    _check_algorithm(config, problems)
    config.algorithm.rollout_correction.check(problems, arr.actor)
    _check_actor(config, world, world_desc, problems)
    if config.critic is not INVALID and _critic_used(config, problems):
        critic = config.critic
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


def _world(config: HybridConfig, world_size: int | None) -> tuple[int | None, str]:
    if world_size is not None:
        return world_size, f"world size {world_size}"
    trainer = config.trainer
    if trainer is INVALID or not _ok(trainer.nnodes, trainer.n_gpus_per_node):
        return None, ""
    n = trainer.nnodes * trainer.n_gpus_per_node
    return n, f"world size {n} (trainer.nnodes={trainer.nnodes} x trainer.n_gpus_per_node={trainer.n_gpus_per_node})"


def _check_profilers(config: HybridConfig, problems: Problems) -> None:
    steps = config.global_profiler.steps
    arr = config.actor_rollout_ref
    for prefix, section in ((f"{ARR}.actor", arr.actor), (f"{ARR}.ref", arr.ref), ("critic", config.critic)):
        if section is not INVALID and _ok(section.profiler):
            section.profiler.check(prefix, problems, steps)


def _check_lengths(config: HybridConfig, problems: Problems) -> None:
    prompt, response = config.data.max_prompt_length, config.data.max_response_length
    max_model_len = config.actor_rollout_ref.rollout.max_model_len
    if max_model_len is not None and _ok(prompt, response, max_model_len) and prompt + response > max_model_len:
        problems.add(
            f"data.max_prompt_length={prompt} + data.max_response_length={response} = {prompt + response} "
            f"exceeds {ARR}.rollout.max_model_len={max_model_len}"
        )


def _check_rollout_world(config: HybridConfig, world: int | None, world_desc: str, problems: Problems) -> None:
    rollout = config.actor_rollout_ref.rollout
    tp, train_batch, n = rollout.tensor_model_parallel_size, config.data.train_batch_size, rollout.n
    if world is None:
        return
    if _ok(tp) and world % tp != 0:
        problems.add(f"{ARR}.rollout.tensor_model_parallel_size={tp} does not divide {world_desc}")
    if _ok(train_batch, n) and (train_batch * n) % world != 0:
        problems.add(
            f"data.train_batch_size={train_batch} x {ARR}.rollout.n={n} = {train_batch * n} "
            f"samples per step do not split evenly over {world_desc}"
        )


def _check_kl_kind(problems: Problems, key: str, value: Any) -> None:
    if not _ok(value):
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
        if algo.adv_estimator in GROUPLESS_ADV_ESTIMATORS:
            problems.add(
                f"algorithm.filter_groups.enable=True filters groups of responses per prompt, but "
                f"algorithm.adv_estimator={algo.adv_estimator!r} has no groups; use a group estimator "
                f"(e.g. grpo) or set algorithm.filter_groups.enable=false"
            )
        n = arr.rollout.n
        if _ok(n) and n < 2:
            problems.add(
                f"algorithm.filter_groups.enable=True needs groups of at least 2 responses but {ARR}.rollout.n={n}"
            )
    if arr.rollout.multi_turn.enable is True and algo.adv_estimator == "remax":
        problems.add(
            "algorithm.adv_estimator='remax' with actor_rollout_ref.rollout.multi_turn.enable=True: remax's greedy "
            "baseline rollout is single-turn; choose grpo, rloo or another group estimator"
        )
    if algo.use_pf_ppo is True and _ok(algo.adv_estimator) and algo.adv_estimator != "gae":
        problems.add(
            f"algorithm.use_pf_ppo=True resamples the batch after GAE's advantages (verl applies it with gae only), but "
            f"algorithm.adv_estimator={algo.adv_estimator!r}; set adv_estimator=gae or use_pf_ppo=false"
        )
    if arr.actor.use_kl_loss is True and algo.use_kl_in_reward is True:
        problems.add(
            f"{ARR}.actor.use_kl_loss=True and algorithm.use_kl_in_reward=True are mutually "
            f"exclusive: apply the KL penalty either in the loss or in the reward, not both"
        )


def _deprecated_micro(problems: Problems, old_key: str, old: Any, new_key: str, new: Any) -> None:
    """verl's global micro batch keys are not read; only the per-device ones are."""
    if old is None or not _ok(old, new):
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
    if _ok(actor_sp, ref_sp) and actor_sp != ref_sp:
        problems.add(
            f"{ARR}.ref.ulysses_sequence_parallel_size={ref_sp} differs from {ARR}.actor.ulysses_sequence_parallel_size="
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
                f"{prefix}.log_prob_micro_batch_size_per_gpu=None must be a positive integer unless {prefix}.log_prob_use_dynamic_bsz=true"
            )
    actor.optim.check(f"{ARR}.actor.optim", problems)
    model = arr.model
    if _ok(model.lora_rank) and model.lora_rank > 0:
        for key, value in (("target_modules", model.target_modules), ("exclude_modules", model.exclude_modules)):
            if _ok(value) and isinstance(value, tuple) and not value:
                problems.add(
                    f"{ARR}.model.{key}=[] must be a module name pattern or a list of module names (e.g. all-linear or [q_proj,v_proj])"
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
        if _ok(max_tokens, prompt, response) and max_tokens < prompt + response:
            problems.add(
                f"{prefix}.ppo_max_token_len_per_gpu={max_tokens} is smaller than one sequence "
                f"(data.max_prompt_length={prompt} + data.max_response_length={response}); "
                f"dynamic batches could not hold it"
            )
        micro = None
    elif micro is None:
        problems.add(f"{micro_key}=None must be a positive integer unless {prefix}.use_dynamic_bsz=true")
    if not _ok(mini, train_batch, n):
        return
    if train_batch % mini != 0:
        problems.add(
            f"data.train_batch_size={train_batch} x {n_key}={n} = {train_batch * n} samples is not "
            f"divisible by {mini_key}={mini} x {n_key}={n} = {mini * n} samples per mini-batch; "
            f"make data.train_batch_size a multiple of {mini_key}"
        )
    if world is None:
        return
    sp = section.ulysses_sequence_parallel_size
    if _ok(sp) and sp > 1:
        if world % sp:
            problems.add(f"{prefix}.ulysses_sequence_parallel_size={sp} does not divide {world_desc}")
            return
        # A sequence-parallel group shares its rows: the batch splits over the groups.
        world, world_desc = (
            world // sp,
            f"{world // sp} data-parallel groups ({world_desc} / {prefix}.ulysses_sequence_parallel_size={sp})",
        )
    if (mini * n) % world != 0:
        problems.add(
            f"{mini_key}={mini} x {n_key}={n} = {mini * n} samples per mini-batch do not split evenly over {world_desc}"
        )
        return
    per_rank = mini * n // world
    if micro is not None and _ok(micro) and per_rank % micro != 0:
        problems.add(
            f"{mini_key}={mini} x {n_key}={n} / {world_desc} = {per_rank} samples per device per "
            f"mini-batch is not divisible by {micro_key}={micro}"
        )


def _critic_used(config: HybridConfig, problems: Problems) -> bool:
    enable, estimator = config.critic.enable, config.algorithm.adv_estimator
    if enable is False and estimator == "gae":
        problems.add(
            "algorithm.adv_estimator='gae' needs a value function but critic.enable=False; "
            "set critic.enable=true (or null) or choose another estimator"
        )
    return config.use_critic if _ok(enable, estimator) else False


def _check_trainer(config: HybridConfig, problems: Problems) -> None:
    trainer = config.trainer
    if trainer.total_training_steps is None and _ok(trainer.total_epochs) and trainer.total_epochs < 1:
        problems.add(
            f"trainer.total_epochs={trainer.total_epochs} with trainer.total_training_steps=null trains nothing; "
            f"set trainer.total_epochs >= 1 or trainer.total_training_steps"
        )
    if trainer.resume_mode == "resume_path":
        if trainer.resume_from_path is None:
            problems.add("trainer.resume_mode='resume_path' needs trainer.resume_from_path (a global_step_* folder)")
        elif _ok(trainer.resume_from_path):
            # Checked here, before any model loads; the trainer checks again when it resumes.
            from hybrid.checkpointing import resume_path_problem

            critic_used = config.critic is not INVALID and _ok(config.critic.enable) and config.use_critic
            problem = resume_path_problem(os.path.abspath(trainer.resume_from_path), need_critic=critic_used)
            if problem:
                problems.add(problem)


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


__all__ = ["ConfigError", "DEFAULT_ASSET_PREFIX", "check_config", "typed_config", "validate_config"]
