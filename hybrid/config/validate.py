"""Checks a composed PPO configuration before anything is loaded.

`validate_config` reads only the keys it checks, one at a time, so the interpolations that
prepare the default model and data (`${hybrid_default:...}` behind `data.train_files`,
`data.val_files`, `actor_rollout_ref.model.path` and the keys that point at them) are never
resolved here: validation costs milliseconds and never converts a model. Every problem is
collected and reported together, one line each, naming the keys and values involved.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A configuration the trainer cannot run; the message says what to change."""


# Literal lists of names whose implementations live in registries elsewhere (core_algos,
# reward managers, loggers). They are repeated here so validation needs no heavy import.
FSDP_STRATEGIES = ("fsdp", "fsdp2")
ROLLOUT_NAMES = ("vllm", "hf")
ADV_ESTIMATORS = (
    "gae",
    "grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "gpg",
)
# Estimators without groups of responses per prompt: group filtering has nothing to filter.
GROUPLESS_ADV_ESTIMATORS = ("gae",)
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
POLICY_LOSS_MODES = ("vanilla", "gspo", "clip_cov", "kl_cov", "cispo", "sapo", "gpg")
KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")
KL_CTRL_TYPES = ("fixed", "adaptive")
RESUME_MODES = ("auto", "disable", "resume_path")
LOGGERS = ("console", "file", "tensorboard", "wandb", "mlflow")
TRUNCATIONS = ("error", "left", "right", "middle")
REWARD_MANAGERS = ("naive", "prime", "batch", "dapo")
REWARD_COMBINES = ("sum", "rm_only")
MIXED_PRECISIONS = ("auto", "bf16", "fp32")
ENGINE_DTYPES = ("auto", "bfloat16", "float16", "float32")
LR_SCHEDULES = ("constant", "cosine", "linear")
WORKER_GROUPS = ("auto", "ray", "local")
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")  # workers/checkpoint.py CONTENTS
DEVICES = ("auto", "cuda", "cpu")

# Options verl has that this trainer deliberately does not implement, with the reason.
UNSUPPORTED_STRATEGIES = {"megatron": "hybrid trains with FSDP only"}
UNSUPPORTED_ROLLOUTS = {"sglang": "hybrid's rollout engines are in-process vLLM and Hugging Face generate"}

ARR = "actor_rollout_ref"

_ABSENT = object()


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (DictConfig, ListConfig)):
        return str(OmegaConf.to_container(value, resolve=False))
    return str(value)


def _is_int(value: Any) -> bool:
    # bool is an int subclass; `true` is never a batch size.
    return isinstance(value, int) and not isinstance(value, bool)


class _Checker:
    """Reads keys one by one and collects problems instead of stopping at the first."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.problems: list[str] = []

    def fail(self, message: str) -> None:
        if message not in self.problems:
            self.problems.append(message)

    def get(self, key: str) -> Any:
        """The value at `key` (resolving only that key), or _ABSENT after recording why."""
        try:
            value = OmegaConf.select(self.cfg, key, default=_ABSENT, throw_on_missing=True)
        except OmegaConfBaseException as err:
            self.fail(f"{key}: cannot be read ({type(err).__name__}: {err})".replace("\n", " "))
            return _ABSENT
        if value is _ABSENT:
            self.fail(f"{key} is missing from the configuration; restore it (see `--cfg job`)")
        return value

    def is_interpolation(self, key: str) -> bool:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(self.cfg, parent, default=None) if parent else self.cfg
        return isinstance(node, DictConfig) and leaf in node and OmegaConf.is_interpolation(node, leaf)

    def raw(self, key: str) -> Any:
        """The unresolved value at `key`: for path keys whose resolution would load assets."""
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(self.cfg, parent, default=None) if parent else self.cfg
        if not isinstance(node, DictConfig) or leaf not in node:
            self.fail(f"{key} is missing from the configuration; restore it (see `--cfg job`)")
            return _ABSENT
        return OmegaConf.to_container(node, resolve=False)[leaf]

    def positive_int(self, key: str, allow_none: bool = False, why: str = "") -> Any:
        """The value when it is a positive int (or None when allowed), else _ABSENT."""
        value = self.get(key)
        if value is _ABSENT:
            return _ABSENT
        if value is None and allow_none:
            return None
        if not _is_int(value) or value <= 0:
            expected = "a positive integer or null" if allow_none else "a positive integer"
            self.fail(f"{key}={_fmt(value)} must be {expected}{why}")
            return _ABSENT
        return value

    def boolean(self, key: str, allow_none: bool = False) -> Any:
        value = self.get(key)
        if value is _ABSENT or (value is None and allow_none):
            return value
        if not isinstance(value, bool):
            expected = "true, false or null" if allow_none else "true or false"
            self.fail(f"{key}={_fmt(value)} must be {expected}")
            return _ABSENT
        return value

    def choice(
        self,
        key: str,
        allowed: Iterable[str],
        allow_none: bool = False,
        unsupported: dict[str, str] | None = None,
    ) -> Any:
        value = self.get(key)
        if value is _ABSENT or (value is None and allow_none):
            return value
        allowed = tuple(allowed)
        if value not in allowed:
            supported = ", ".join(allowed)
            if unsupported and value in unsupported:
                self.fail(f"{key}={_fmt(value)} is not supported ({unsupported[value]}); supported: {supported}")
            else:
                self.fail(f"{key}={_fmt(value)} is not supported; supported: {supported}")
            return _ABSENT
        return value


def _world_size(c: _Checker, world_size: int | None) -> tuple[int | None, str]:
    """The world size and how to name it in messages."""
    if world_size is not None:
        if not _is_int(world_size) or world_size <= 0:
            c.fail(f"world_size={world_size!r} must be a positive integer")
            return None, ""
        return world_size, f"world size {world_size}"
    nnodes = c.positive_int("trainer.nnodes")
    per_node = c.positive_int("trainer.n_gpus_per_node")
    if nnodes is _ABSENT or per_node is _ABSENT:
        return None, ""
    return nnodes * per_node, (
        f"world size {nnodes * per_node} (trainer.nnodes={nnodes} x trainer.n_gpus_per_node={per_node})"
    )


def _check_deprecated_micro(c: _Checker, old_key: str, new_key: str) -> None:
    """verl's global micro batch keys are not read; only the per-device ones are."""
    old = c.get(old_key)
    if old is _ABSENT or old is None:
        return
    new = c.get(new_key)
    if new is _ABSENT:
        return
    if new is not None:
        c.fail(
            f"{old_key}={_fmt(old)} and {new_key}={_fmt(new)} are both set; use only {new_key} "
            f"(the *_per_gpu key, samples per device) and set {old_key}=null"
        )
    else:
        c.fail(f"{old_key}={_fmt(old)} is deprecated and not read; set {new_key} (samples per device) instead")


def _check_ppo_batches(
    c: _Checker,
    role: str,
    prefix: str,
    train_batch: Any,
    n: Any,
    world: int | None,
    world_desc: str,
) -> None:
    """verl's batch arithmetic for one trained role (actor or critic)."""
    mini_key = f"{prefix}.ppo_mini_batch_size"
    micro_key = f"{prefix}.ppo_micro_batch_size_per_gpu"
    n_key = f"{ARR}.rollout.n"
    mini = c.positive_int(mini_key, why=f" (the {role}'s mini-batch, in prompts)")
    c.positive_int(f"{prefix}.ppo_epochs")
    dynamic = c.boolean(f"{prefix}.use_dynamic_bsz")
    if dynamic is True:
        max_tokens = c.positive_int(f"{prefix}.ppo_max_token_len_per_gpu")
        prompt_len = c.get("data.max_prompt_length")
        response_len = c.get("data.max_response_length")
        if max_tokens is not _ABSENT and _is_int(prompt_len) and _is_int(response_len):
            if max_tokens < prompt_len + response_len:
                c.fail(
                    f"{prefix}.ppo_max_token_len_per_gpu={max_tokens} is smaller than one sequence "
                    f"(data.max_prompt_length={prompt_len} + data.max_response_length={response_len}); "
                    f"dynamic batches could not hold it"
                )
        micro = None
    else:
        micro = c.positive_int(micro_key, why=f" unless {prefix}.use_dynamic_bsz=true")
    if mini is _ABSENT or train_batch is _ABSENT or n is _ABSENT:
        return
    if train_batch % mini != 0:
        c.fail(
            f"data.train_batch_size={train_batch} x {n_key}={n} = {train_batch * n} samples is not "
            f"divisible by {mini_key}={mini} x {n_key}={n} = {mini * n} samples per mini-batch; "
            f"make data.train_batch_size a multiple of {mini_key}"
        )
    if world is None:
        return
    mini_samples = mini * n
    if mini_samples % world != 0:
        c.fail(
            f"{mini_key}={mini} x {n_key}={n} = {mini_samples} samples per mini-batch do not split "
            f"evenly over {world_desc}"
        )
        return
    per_rank = mini_samples // world
    if micro is None or micro is _ABSENT:
        return
    if per_rank % micro != 0:
        c.fail(
            f"{mini_key}={mini} x {n_key}={n} / {world_desc} = {per_rank} samples per device per "
            f"mini-batch is not divisible by {micro_key}={micro}"
        )


def _critic_used(c: _Checker, adv_estimator: Any) -> bool:
    enable = c.boolean("critic.enable", allow_none=True)
    if enable is None:
        return adv_estimator == "gae"
    if enable is False and adv_estimator == "gae":
        c.fail("algorithm.adv_estimator='gae' needs a value function but critic.enable=False; "
               "set critic.enable=true (or null) or choose another estimator")
    return enable is True


def _check_device_switches(c: _Checker) -> None:
    device = c.choice("trainer.device", DEVICES)
    use_liger = c.boolean(f"{ARR}.model.use_liger")
    if device != "cuda" and use_liger is not True:
        return
    # workers.device is the one place that decides cpu/cuda; imported only here because it
    # imports torch, which most configurations never need at validation time.
    from workers import device as device_helper

    cuda = device_helper.is_cuda_available()
    if device == "cuda" and not cuda:
        c.fail("trainer.device='cuda' needs a CUDA GPU and none is visible; use trainer.device=auto or cpu")
    if use_liger is True and (not cuda or device == "cpu"):
        where = "trainer.device='cpu'" if cuda else "none is visible"
        c.fail(f"{ARR}.model.use_liger=True needs a CUDA GPU ({where}); set {ARR}.model.use_liger=false")


def validate_config(cfg: DictConfig, world_size: int | None = None) -> None:
    """Raise ConfigError listing every problem in `cfg`, one line each.

    `world_size` is the number of training ranks; by default
    `trainer.nnodes * trainer.n_gpus_per_node`.
    """
    c = _Checker(cfg)
    world, world_desc = _world_size(c, world_size)

    # Data and sequence lengths.
    train_batch = c.positive_int("data.train_batch_size", why=" (prompts per step)")
    c.positive_int("data.val_batch_size", allow_none=True)
    prompt_len = c.positive_int("data.max_prompt_length")
    response_len = c.positive_int("data.max_response_length")
    c.choice("data.truncation", TRUNCATIONS)
    max_model_len = c.positive_int(f"{ARR}.rollout.max_model_len", allow_none=True)
    if max_model_len not in (None, _ABSENT) and prompt_len is not _ABSENT and response_len is not _ABSENT:
        if prompt_len + response_len > max_model_len:
            c.fail(
                f"data.max_prompt_length={prompt_len} + data.max_response_length={response_len} = "
                f"{prompt_len + response_len} exceeds {ARR}.rollout.max_model_len={max_model_len}"
            )

    # Rollout.
    n = c.positive_int(f"{ARR}.rollout.n", why=" (responses per prompt)")
    c.positive_int(f"{ARR}.rollout.val_kwargs.n")
    c.choice(f"{ARR}.rollout.name", ROLLOUT_NAMES, unsupported=UNSUPPORTED_ROLLOUTS)
    c.choice(f"{ARR}.rollout.dtype", ENGINE_DTYPES)
    tp = c.positive_int(f"{ARR}.rollout.tensor_model_parallel_size")
    if tp is not _ABSENT and world is not None and world % tp != 0:
        c.fail(f"{ARR}.rollout.tensor_model_parallel_size={tp} does not divide {world_desc}")
    if world is not None and train_batch is not _ABSENT and n is not _ABSENT:
        if (train_batch * n) % world != 0:
            c.fail(
                f"data.train_batch_size={train_batch} x {ARR}.rollout.n={n} = {train_batch * n} "
                f"samples per step do not split evenly over {world_desc}"
            )

    # Algorithm.
    adv_estimator = c.choice("algorithm.adv_estimator", ADV_ESTIMATORS)
    _check_kl_kind(c, "algorithm.kl_penalty")
    c.choice("algorithm.kl_ctrl.type", KL_CTRL_TYPES)
    use_kl_in_reward = c.boolean("algorithm.use_kl_in_reward")
    filter_groups = c.boolean("algorithm.filter_groups.enable")
    if filter_groups is True:
        if adv_estimator in GROUPLESS_ADV_ESTIMATORS:
            c.fail(
                f"algorithm.filter_groups.enable=True filters groups of responses per prompt, but "
                f"algorithm.adv_estimator={adv_estimator!r} has no groups; use a group estimator "
                f"(e.g. grpo) or set algorithm.filter_groups.enable=false"
            )
        if n is not _ABSENT and n < 2:
            c.fail(
                f"algorithm.filter_groups.enable=True needs groups of at least 2 responses but "
                f"{ARR}.rollout.n={n}"
            )

    # Actor.
    for role in ("actor", "ref"):
        c.choice(f"{ARR}.{role}.strategy", FSDP_STRATEGIES, unsupported=UNSUPPORTED_STRATEGIES)
    c.choice(f"{ARR}.actor.loss_agg_mode", LOSS_AGG_MODES)
    c.choice(f"{ARR}.actor.policy_loss.loss_mode", POLICY_LOSS_MODES)
    _check_kl_kind(c, f"{ARR}.actor.kl_loss_type")
    use_kl_loss = c.boolean(f"{ARR}.actor.use_kl_loss")
    if use_kl_loss is True and use_kl_in_reward is True:
        c.fail(
            f"{ARR}.actor.use_kl_loss=True and algorithm.use_kl_in_reward=True are mutually "
            f"exclusive: apply the KL penalty either in the loss or in the reward, not both"
        )
    _check_ppo_batches(c, "actor", f"{ARR}.actor", train_batch, n, world, world_desc)
    _check_deprecated_micro(c, f"{ARR}.actor.ppo_micro_batch_size", f"{ARR}.actor.ppo_micro_batch_size_per_gpu")
    for role in ("rollout", "ref"):
        prefix = f"{ARR}.{role}"
        _check_deprecated_micro(
            c, f"{prefix}.log_prob_micro_batch_size", f"{prefix}.log_prob_micro_batch_size_per_gpu"
        )
        if c.boolean(f"{prefix}.log_prob_use_dynamic_bsz") is True:
            c.positive_int(f"{prefix}.log_prob_max_token_len_per_gpu")
        else:
            c.positive_int(
                f"{prefix}.log_prob_micro_batch_size_per_gpu",
                why=f" unless {prefix}.log_prob_use_dynamic_bsz=true",
            )
    lora_rank = c.get(f"{ARR}.model.lora_rank")
    if lora_rank is not _ABSENT and (not _is_int(lora_rank) or lora_rank < 0):
        c.fail(f"{ARR}.model.lora_rank={_fmt(lora_rank)} must be an integer >= 0 (0: full fine-tuning)")
    elif lora_rank is not _ABSENT and lora_rank > 0:
        _check_lora(c)
    _check_checkpoint_contents(c, f"{ARR}.actor.checkpoint")
    _check_optim(c, f"{ARR}.actor.optim")
    _check_mixed_precision(c, f"{ARR}.actor.fsdp_config.mixed_precision")
    _check_mixed_precision(c, f"{ARR}.ref.fsdp_config.mixed_precision")

    # Critic, only when one is trained.
    # The strategy is checked even when the critic is off: a script that sets it expects it used.
    c.choice("critic.strategy", FSDP_STRATEGIES, unsupported=UNSUPPORTED_STRATEGIES)
    critic_used = _critic_used(c, adv_estimator)
    if critic_used:
        _check_checkpoint_contents(c, "critic.checkpoint")
        _check_ppo_batches(c, "critic", "critic", train_batch, n, world, world_desc)
        _check_deprecated_micro(c, "critic.ppo_micro_batch_size", "critic.ppo_micro_batch_size_per_gpu")
        # The default forward keys follow the ppo keys checked just above.
        if not c.is_interpolation("critic.forward_micro_batch_size"):
            _check_deprecated_micro(
                c, "critic.forward_micro_batch_size", "critic.forward_micro_batch_size_per_gpu"
            )
        _check_optim(c, "critic.optim")
        _check_mixed_precision(c, "critic.model.fsdp_config.mixed_precision")

    # Reward.
    c.choice("reward_model.reward_manager", REWARD_MANAGERS)
    c.choice("reward_model.combine", REWARD_COMBINES)
    if c.boolean("reward_model.enable") is True:
        c.choice("reward_model.strategy", FSDP_STRATEGIES, unsupported=UNSUPPORTED_STRATEGIES)
        if c.raw("reward_model.model.path") is None:
            c.fail("reward_model.enable=True needs reward_model.model.path (a reward model folder)")
        _check_deprecated_micro(c, "reward_model.micro_batch_size", "reward_model.micro_batch_size_per_gpu")
        if c.boolean("reward_model.use_dynamic_bsz") is not True:
            c.positive_int("reward_model.micro_batch_size_per_gpu")
        _check_mixed_precision(c, "reward_model.model.fsdp_config.mixed_precision")

    # Trainer.
    total_steps = c.positive_int("trainer.total_training_steps", allow_none=True)
    epochs = c.get("trainer.total_epochs")
    if epochs is not _ABSENT and not _is_int(epochs):
        c.fail(f"trainer.total_epochs={_fmt(epochs)} must be an integer")
    elif total_steps is None and epochs is not _ABSENT and epochs < 1:
        c.fail(
            f"trainer.total_epochs={epochs} with trainer.total_training_steps=null trains nothing; "
            f"set trainer.total_epochs >= 1 or trainer.total_training_steps"
        )
    resume_mode = c.choice("trainer.resume_mode", RESUME_MODES)
    if resume_mode == "resume_path":
        resume_from = c.get("trainer.resume_from_path")
        if resume_from is None:
            c.fail("trainer.resume_mode='resume_path' needs trainer.resume_from_path (a global_step_* folder)")
        elif resume_from is not _ABSENT:
            # Checked here, before any model loads; the trainer checks again when it resumes.
            from hybrid.checkpointing import resume_path_problem

            problem = resume_path_problem(os.path.abspath(str(resume_from)), need_critic=critic_used)
            if problem:
                c.fail(problem)
    save_freq = c.get("trainer.save_freq")
    if save_freq is not _ABSENT and not _is_int(save_freq):
        c.fail(f"trainer.save_freq={_fmt(save_freq)} must be an integer (<= 0: never save)")
    for key in ("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"):
        keep = c.get(key)
        if keep is not _ABSENT and keep is not None and not _is_int(keep):
            c.fail(f"{key}={_fmt(keep)} must be an integer or null (null or <= 0: keep every checkpoint)")
    _check_loggers(c)
    c.choice("trainer.worker_group", WORKER_GROUPS)
    _check_device_switches(c)

    if c.problems:
        count = len(c.problems)
        header = f"invalid configuration ({count} problem{'s' if count > 1 else ''}):"
        raise ConfigError("\n".join([header] + [f"  - {p}" for p in c.problems]))


def _check_lora(c: _Checker) -> None:
    alpha = c.get(f"{ARR}.model.lora_alpha")
    if alpha is not _ABSENT and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0):
        c.fail(f"{ARR}.model.lora_alpha={_fmt(alpha)} must be a positive number")
    for key, allow_none in ((f"{ARR}.model.target_modules", False), (f"{ARR}.model.exclude_modules", True)):
        value = c.get(key)
        if value is _ABSENT or (value is None and allow_none):
            continue
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, (list, ListConfig)) or not names or not all(isinstance(n, str) for n in names):
            expected = "a module name pattern or a list of module names" + (", or null" if allow_none else "")
            c.fail(f"{key}={_fmt(value)} must be {expected} (e.g. all-linear or [q_proj,v_proj])")


def _check_checkpoint_contents(c: _Checker, prefix: str) -> None:
    for leaf in ("save_contents", "load_contents"):
        key = f"{prefix}.{leaf}"
        value = c.get(key)
        if value is _ABSENT:
            continue
        if not isinstance(value, (list, ListConfig)):
            c.fail(f"{key}={_fmt(value)} must be a list drawn from {', '.join(CHECKPOINT_CONTENTS)}")
            continue
        unknown = [v for v in value if v not in CHECKPOINT_CONTENTS]
        if unknown:
            c.fail(f"{key}={_fmt(value)}: {', '.join(map(repr, unknown))} not supported; supported: {', '.join(CHECKPOINT_CONTENTS)}")


def _check_optim(c: _Checker, prefix: str) -> None:
    c.choice(f"{prefix}.warmup_style", LR_SCHEDULES)
    c.choice(f"{prefix}.lr_scheduler_type", LR_SCHEDULES, allow_none=True)


def _check_kl_kind(c: _Checker, key: str) -> None:
    value = c.get(key)
    if value is _ABSENT:
        return
    # `<kind>+` (as in verl and workers/losses.py) uses a straight-through gradient estimator.
    base = value[:-1] if isinstance(value, str) and value.endswith("+") and value != "full+" else value
    if base not in KL_KINDS:
        c.fail(
            f"{key}={_fmt(value)} is not supported; supported: {', '.join(KL_KINDS)} "
            f"(and <kind>+ for a straight-through gradient, except full)"
        )


def _check_mixed_precision(c: _Checker, key: str) -> None:
    # Keys that interpolate the actor's setting are checked through the actor's key.
    if not c.is_interpolation(key):
        c.choice(key, MIXED_PRECISIONS)


def _check_loggers(c: _Checker) -> None:
    value = c.get("trainer.logger")
    if value is _ABSENT:
        return
    # verl scripts pass either a list (`['console','wandb']`) or one name.
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, ListConfig)):
        c.fail(f"trainer.logger={_fmt(value)} must be a list of logger names; supported: {', '.join(LOGGERS)}")
        return
    unknown = [name for name in names if name not in LOGGERS]
    if unknown:
        c.fail(
            f"trainer.logger={_fmt(value)}: {', '.join(map(repr, unknown))} not supported; "
            f"supported: {', '.join(LOGGERS)}"
        )


__all__ = ["ConfigError", "validate_config"]
