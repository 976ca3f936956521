"""The driver's configuration: one frozen dataclass per section of `ppo_trainer.yaml`.

Field names are verl's key names, so `config.actor_rollout_ref.actor.ppo_mini_batch_size`
reads the same in a run script and in code. The driver's own sections are here (`data`,
`algorithm`, `trainer`); each worker's section is declared by its worker (workers/config:
actor, ref, rollout, critic, reward model, profilers), the reward function's by the reward
package (reward/config.py), and `HybridConfig` composes them. Types and value rules sit on
the fields (protocol/config_schema.py); rules that involve several keys are each section's
`check` and hybrid/config/validate.py; choices come from the registries that implement them
(advantage estimators here, loggers in hybrid/tracking.py, losses in workers/losses.py,
reward managers in reward/manager.py), so a name registered by a plug-in
(`actor_rollout_ref.model.external_lib`) is valid on the command line. The yaml holds every
default; nothing here repeats one. Values derived from several sections are computed once
(hybrid/config/derived.py) into the worker sections' derived fields, never written back
as keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from hybrid.batch_ops import BATCH_ADJUST_MODES
from hybrid.core_algos import ADV_ESTIMATOR_REGISTRY, estimator_spec
from hybrid.tracking import SUPPORTED_BACKENDS
from protocol.config_schema import (
    Annotated,
    AsList,
    Fixed,
    Fraction,
    NonNegative,
    OneOf,
    OptionalPositiveInt,
    Paths,
    Positive,
    PositiveInt,
    Problems,
    fmt,
    valid,
)
from reward.config import CustomRewardFunctionConfig
from workers.config import (
    ActorRolloutRefConfig,
    CriticConfig,
    GlobalProfilerConfig,
    RewardModelConfig,
    RolloutCorrectionConfig,
)


# Choices read from the registries when a config is checked (a plug-in may add names).
# Named functions, not lambdas: typing.get_type_hints evaluates annotations with the
# class's namespace as globals, where a lambda could not see this module's names.
def _adv_estimators() -> tuple[str, ...]:
    return tuple(ADV_ESTIMATOR_REGISTRY)


def _loggers() -> tuple[str, ...]:
    return tuple(SUPPORTED_BACKENDS)


def _batch_adjust_modes() -> tuple[str, ...]:
    return BATCH_ADJUST_MODES


# Keys of the `trainer` section that the SFT trainer's (hybrid/config/sft_schema.py) has too,
# typed once for both.
Loggers = Annotated[tuple[Annotated[str, OneOf(_loggers)], ...], AsList()]
ResumeMode = Annotated[str, OneOf(lambda: ("auto", "disable", "resume_path"))]
Device = Annotated[str, OneOf(lambda: ("auto", "cuda", "cpu"))]


# ---------------------------------------------------------------- data


@dataclass(frozen=True)
class CustomClsConfig:
    path: str | None
    name: str | None


@dataclass(frozen=True)
class DataConfig:
    tokenizer: Annotated[
        str | None,
        Fixed((None,), "the prompts are tokenized with actor_rollout_ref.model.tokenizer_path (or model.path)"),
    ]
    train_files: Paths
    val_files: Paths | None
    prompt_key: str
    reward_fn_key: str
    image_key: str  # hybrid/preflight.py refuses data files with values in this column (text only)
    video_key: str
    max_prompt_length: PositiveInt
    max_response_length: PositiveInt
    train_batch_size: PositiveInt
    val_batch_size: OptionalPositiveInt
    return_raw_input_ids: Annotated[
        bool,
        Fixed((False,), "a reward model re-templates the decoded text itself (reward_model.model.input_tokenizer)"),
    ]
    return_raw_chat: bool
    return_full_prompt: bool
    shuffle: bool
    # null (verl's default): the shuffle is torch's unseeded generator's, the same each run
    # (hybrid/data_loader.py shuffle_seed); max_samples rows are drawn from fresh entropy (hybrid/data.py)
    seed: int | None
    dataloader_num_workers: Annotated[int, NonNegative()]
    filter_overlong_prompts: bool
    filter_overlong_prompts_workers: PositiveInt
    truncation: Annotated[str, OneOf(lambda: ("error", "left", "right", "middle"))]
    trust_remote_code: bool
    apply_chat_template_kwargs: dict[str, Any]
    custom_cls: CustomClsConfig
    # Multi-domain batches and per-domain scorers (ROLL's RLVR pipeline): hybrid/domains.py.
    domain_quotas: dict[str, Any]
    domain_tags: dict[str, Any]
    default_domain: str | None
    domain_scorers: dict[str, Any]
    domain_scorer_kwargs: dict[str, Any]
    # verl's: > 0 keeps that many rows of the files (data.shuffle: drawn with data.seed); hybrid/data.py
    train_max_samples: int
    val_max_samples: int

    def check(self, problems: Problems) -> None:
        # data.domain_* rules: hybrid/domains.py check_judge_domains (they read reward_model.judge too).
        if self.custom_cls.path and not self.custom_cls.name:
            problems.add(
                f"data.custom_cls.path={fmt(self.custom_cls.path)} needs data.custom_cls.name (the dataset class)"
            )


# ---------------------------------------------------------------- algorithm and trainer


@dataclass(frozen=True)
class KLControlConfig:
    type: Annotated[str, OneOf(lambda: ("fixed", "adaptive"))]
    kl_coef: Annotated[float, NonNegative()]
    horizon: PositiveInt
    target_kl: Annotated[float, Positive()]


@dataclass(frozen=True)
class PFPPOConfig:
    """verl's PF-PPO: after GAE, the batch is resampled by weights of the sequence scores."""

    reweight_method: Annotated[str, OneOf(lambda: ("pow", "max_min", "max_random"))]
    weight_pow: float


@dataclass(frozen=True)
class FilterGroupsConfig:
    enable: bool
    metric: str
    max_num_gen_batches: Annotated[int, NonNegative(" (0: no limit)")]


@dataclass(frozen=True)
class DifficultyMaskConfig:
    """hybrid's (ROLL's difficulty_mask): prompt groups whose mean score is not strictly inside
    (low, high) leave the losses."""

    enable: bool
    low: float
    high: float

    def check(self, problems: Problems) -> None:
        if self.enable and not self.low < self.high:
            problems.add(
                f"algorithm.difficulty_mask.low={fmt(self.low)} must be below algorithm.difficulty_mask.high="
                f"{fmt(self.high)} (groups are kept when low < mean score < high)"
            )


@dataclass(frozen=True)
class BatchAdjustConfig:
    """hybrid's (ROLL's agentic adjust_batch, hybrid/batch_ops.py): the scored batch brought to a
    multiple of `multiple` samples by copying or dropping random samples."""

    multiple: OptionalPositiveInt  # null: off
    mode: Annotated[str, OneOf(_batch_adjust_modes)]


@dataclass(frozen=True)
class AlgorithmConfig:
    gamma: Annotated[float, Fraction()]
    lam: Annotated[float, Fraction()]
    adv_estimator: Annotated[str, OneOf(_adv_estimators)]
    norm_adv_by_std_in_grpo: bool
    use_kl_in_reward: bool
    on_policy_distillation: bool  # hybrid's: the reward is the reverse KL to the teacher (hybrid/distillation.py)
    kl_penalty: str
    kl_ctrl: KLControlConfig
    filter_groups: FilterGroupsConfig
    use_pf_ppo: bool
    pf_ppo: PFPPOConfig
    rollout_correction: RolloutCorrectionConfig
    mask_truncated_responses: bool  # hybrid's: SkyRL's apply_overlong_filtering, ROLL's max_len_mask
    difficulty_mask: DifficultyMaskConfig
    batch_adjust: BatchAdjustConfig
    reward_clip: Annotated[float | None, Positive()]  # ROLL's: token-level rewards clamped to [-x, x]
    advantage_clip: Annotated[float | None, Positive()]  # ROLL's: advantages clamped to [-x, x]
    whiten_advantages: bool  # ROLL's: advantages whitened over the batch after the estimator
    advantages_per_domain: bool  # ROLL's multi-domain pipeline: each domain's advantages apart (hybrid/batch_ops.py)


@dataclass(frozen=True)
class TrainerConfig:
    balance_batch: bool
    pad_mini_batches: bool  # SkyRL's: mini-batches padded to the ranks with zero-mask dummy rows
    total_epochs: int
    total_training_steps: OptionalPositiveInt
    max_training_steps: OptionalPositiveInt  # a cap on the steps either of the two above gives
    project_name: str
    experiment_name: str
    logger: Loggers
    wandb_tags: tuple[str, ...] | None  # SkyRL's trainer.tags: the W&B run's tags
    log_val_generations: Annotated[int, NonNegative()]
    nnodes: PositiveInt
    n_gpus_per_node: PositiveInt
    worker_group: Annotated[str, OneOf(lambda: ("auto", "ray", "local"))]
    device: Device
    save_freq: int
    save_on_stop: bool  # a stop (SIGTERM, Ctrl-C) saves the finished step whatever save_freq says
    test_freq: int
    val_before_train: bool
    val_only: bool
    critic_warmup: Annotated[int, NonNegative()]
    resume_mode: ResumeMode
    resume_from_path: str | None
    default_local_dir: str
    default_hdfs_dir: Annotated[
        str | None, Fixed((None,), "hybrid writes checkpoints to trainer.default_local_dir only")
    ]
    max_actor_ckpt_to_keep: int | None
    max_critic_ckpt_to_keep: int | None
    merge_on_finish: bool | None
    hf_save_freq: int  # SkyRL's hf_save_interval: a Hugging Face export every N steps (<= 0: never)
    hf_export_dir: str | None  # null: <default_local_dir>/hf_exports
    plot_on_finish: bool
    dump_data_batch: bool  # SkyRL's: the training batch of every step written for debugging
    num_dummy_steps: Annotated[int, NonNegative()]  # SkyRL's: N steps on random max-length batches, then the end
    worker_env_vars: dict[str, Any]  # ROLL's system_envs: set before the driver and the workers start
    ray_wait_register_center_timeout: PositiveInt
    use_legacy_worker_impl: Annotated[
        str, Fixed(("auto",), "hybrid has one worker implementation (verl chooses between two)")
    ]
    rollout_data_dir: str | None  # verl's: each step's generations to <dir>/<step>.jsonl (hybrid/generation_dump.py)
    validation_data_dir: str | None  # verl's: each validation's generations, the same way
    seed: int

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node


# ---------------------------------------------------------------- asynchronous training


@dataclass(frozen=True)
class RolloutPlacementConfig:
    """verl's top-level `rollout` (its one-step-off and fully async recipes): the devices of
    rollout engines that live in their own actors (actor_rollout_ref.hybrid_engine=false)."""

    nnodes: PositiveInt
    n_gpus_per_node: Annotated[int, NonNegative(" (0: no engines of their own)")]

    @property
    def devices(self) -> int:
        return self.nnodes * self.n_gpus_per_node


_PUSH = (
    "hybrid pushes the weights to the engines through Ray's object store in one piece (shared memory on a node), "
    "not by verl's bucketed NCCL broadcast; leave async_training.checkpoint_engine at verl's defaults"
)


@dataclass(frozen=True)
class CheckpointEngineConfig:
    """verl's NCCL bucketed broadcast of the weights to the engines. hybrid pushes them through
    Ray's object store in one piece (shared memory on one node), so only verl's defaults are
    accepted: another value would tune a transport hybrid does not have."""

    enable: Annotated[bool, Fixed((True,), _PUSH)]
    device_buffer_size_M: Annotated[int, Fixed((4096,), _PUSH)]
    overlap_broadcast_and_consume: Annotated[bool, Fixed((False,), _PUSH)]


def _async_modes() -> tuple[str, ...]:
    return ("one_step_off", "fully_async")


@dataclass(frozen=True)
class AsyncTrainingConfig:
    """`async_training` (verl's fully async recipe, plus `mode` and SkyRL's max_staleness_steps)."""

    mode: Annotated[str | None, OneOf(_async_modes)]
    staleness_threshold: Annotated[float, NonNegative()]
    max_staleness_steps: Annotated[int | None, NonNegative()]
    trigger_parameter_sync_step: PositiveInt
    require_batches: PositiveInt
    partial_rollout: bool
    use_rollout_log_probs: bool
    compute_prox_log_prob: bool
    max_groups_in_flight: OptionalPositiveInt
    use_trainer_do_validate: Annotated[
        bool, Fixed((False,), "hybrid validates on the rollout engines, which hold the latest weights after a push")
    ]
    checkpoint_engine: CheckpointEngineConfig
    # SkyRL's simulated trainer (hybrid/async_sim.py): generation for real, each step a sleep.
    simulate_training: bool
    simulate_training_step_seconds: Annotated[float, NonNegative()]
    simulate_weight_sync_seconds: Annotated[float, NonNegative()]

    @property
    def staleness_bound(self) -> int:
        """Weight versions a trained group may lag at most: max_staleness_steps, or ceil(staleness_threshold)."""
        if self.max_staleness_steps is not None:
            return int(self.max_staleness_steps)
        return int(math.ceil(self.staleness_threshold))


# ---------------------------------------------------------------- the whole configuration


@dataclass(frozen=True)
class HybridConfig:
    data: DataConfig
    actor_rollout_ref: ActorRolloutRefConfig
    critic: CriticConfig
    reward_model: RewardModelConfig
    custom_reward_function: CustomRewardFunctionConfig
    algorithm: AlgorithmConfig
    trainer: TrainerConfig
    global_profiler: GlobalProfilerConfig
    rollout: RolloutPlacementConfig
    async_training: AsyncTrainingConfig

    @property
    def use_critic(self) -> bool:
        """critic.enable=null means: a critic when the estimator takes values (gae: its spec's needs_critic)."""
        if self.critic.enable is None:
            name = self.algorithm.adv_estimator  # INVALID (reported already) or unknown: no critic
            return valid(name) and name in ADV_ESTIMATOR_REGISTRY and estimator_spec(name).needs_critic
        return bool(self.critic.enable)

    @property
    def use_reference_policy(self) -> bool:
        """A KL term, or on-policy distillation (whose teacher is loaded as the reference)."""
        algorithm = self.algorithm
        return bool(
            algorithm.use_kl_in_reward or self.actor_rollout_ref.actor.use_kl_loss or algorithm.on_policy_distillation
        )

    @property
    def world_size(self) -> int:
        return self.trainer.world_size

    @property
    def async_mode(self) -> str | None:
        """None (the fused worker generates and trains in turn), one_step_off or fully_async."""
        if self.actor_rollout_ref.hybrid_engine:
            return None
        return self.async_training.mode or "one_step_off"

    def with_schedule_steps(self, total_steps: int) -> HybridConfig:
        """A copy whose optimizers' `total_training_steps=-1` (the run's length) reads `total_steps`.

        The run's length is known only once the training data is loaded (epochs x batches),
        so the trainer derives this copy for the workers instead of writing into the config.
        """

        def fill(optim):
            return optim if optim.total_training_steps > 0 else replace(optim, total_training_steps=total_steps)

        arr = self.actor_rollout_ref
        actor = replace(arr.actor, optim=fill(arr.actor.optim))
        critic = replace(self.critic, optim=fill(self.critic.optim))
        return replace(self, actor_rollout_ref=replace(arr, actor=actor), critic=critic)
