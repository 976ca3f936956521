"""The schema's `algorithm` section (KL control, group filtering, rollout correction) and
`trainer` section (hybrid/config/schema.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybrid.config.registries import adv_estimators, loggers
from hybrid.config.schema_fields import OptionalPositiveInt, PositiveInt, _ok
from hybrid.config.typed import Annotated, AsList, Fixed, Fraction, NonNegative, OneOf, Positive, Problems, fmt

if TYPE_CHECKING:
    from hybrid.config.schema import ActorConfig


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


def _is_levels() -> tuple[str, ...]:
    from workers.rollout_correction import IS_LEVELS

    return IS_LEVELS


def _loss_types() -> tuple[str, ...]:
    from workers.rollout_correction import LOSS_TYPES

    return LOSS_TYPES


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """`algorithm.rollout_correction`, verl 0.9's off-policy correction (workers/rollout_correction.py)."""

    rollout_is: Annotated[
        str | None,
        OneOf(
            _is_levels,
            unsupported=(
                (
                    "geometric",
                    "verl 0.9 has no geometric weights; reject by the geometric mean ratio with rollout_rs=seq_mean_k1",
                ),
            ),
        ),
    ]
    rollout_is_threshold: float | str | None
    rollout_is_batch_normalize: bool
    rollout_rs: str | None
    rollout_rs_threshold: float | str | None
    bypass_mode: bool
    loss_type: Annotated[str, OneOf(_loss_types)]

    @property
    def reads_old_log_probs_first(self) -> bool:
        """Decoupled rejection or batch normalisation needs pi_old of the whole batch before
        the update, so the old log-prob pass runs even for an on-policy update."""
        return not self.bypass_mode and (
            self.rollout_rs is not None or (self.rollout_is is not None and self.rollout_is_batch_normalize is True)
        )

    def check(self, problems: Problems, actor: ActorConfig) -> None:
        """Threshold syntax and the rules between keys (and with the actor's older TIS key)."""
        from workers.rollout_correction import parse_is_threshold, parse_rejection

        key = "algorithm.rollout_correction"
        if self.rollout_is is not None and self.rollout_is_threshold is None:
            problems.add(
                f"{key}.rollout_is={fmt(self.rollout_is)} needs rollout_is_threshold (a number: TIS; 'lower_upper': IcePop)"
            )
        elif self.rollout_is is not None and _ok(self.rollout_is, self.rollout_is_threshold):
            try:
                parse_is_threshold(self.rollout_is_threshold)
            except ValueError as err:
                problems.add(f"{key}.rollout_is_threshold={fmt(self.rollout_is_threshold)}: {err}")
        if self.rollout_rs is not None and _ok(self.rollout_rs, self.rollout_rs_threshold):
            try:
                parse_rejection(self.rollout_rs, self.rollout_rs_threshold)
            except ValueError as err:
                problems.add(
                    f"{key}.rollout_rs={fmt(self.rollout_rs)} with rollout_rs_threshold={fmt(self.rollout_rs_threshold)}: {err}"
                )
        if self.rollout_is_batch_normalize is True and self.rollout_is is None:
            problems.add(
                f"{key}.rollout_is_batch_normalize=True normalises importance weights, but rollout_is=null computes none; set rollout_is=token or sequence"
            )
        if self.loss_type == "reinforce" and self.bypass_mode is False:
            problems.add(
                f"{key}.loss_type='reinforce' is the loss of bypass mode (verl ignores it otherwise); set bypass_mode=true or loss_type=ppo_clip"
            )
        if (
            self.loss_type == "reinforce"
            and self.bypass_mode is True
            and _ok(actor.policy_loss.loss_mode)
            and actor.policy_loss.loss_mode != "vanilla"
        ):
            problems.add(
                f"{key}.loss_type='reinforce' replaces the policy loss, so actor_rollout_ref.actor.policy_loss.loss_mode="
                f"{actor.policy_loss.loss_mode!r} would be ignored; set loss_mode=vanilla or loss_type=ppo_clip"
            )
        on = self.rollout_is is not None or self.rollout_rs is not None or self.bypass_mode is True
        cap = actor.tis_imp_ratio_cap
        if on and _ok(cap) and cap > 0:
            problems.add(
                f"actor_rollout_ref.actor.tis_imp_ratio_cap={cap} is verl's older spelling of {key}.rollout_is=token "
                f"rollout_is_threshold={cap}; with {key} also set, write only {key} (and tis_imp_ratio_cap=-1)"
            )


@dataclass(frozen=True)
class AlgorithmConfig:
    gamma: Annotated[float, Fraction()]
    lam: Annotated[float, Fraction()]
    adv_estimator: Annotated[str, OneOf(adv_estimators)]
    norm_adv_by_std_in_grpo: bool
    use_kl_in_reward: bool
    kl_penalty: str
    kl_ctrl: KLControlConfig
    filter_groups: FilterGroupsConfig
    use_pf_ppo: bool
    pf_ppo: PFPPOConfig
    rollout_correction: RolloutCorrectionConfig


@dataclass(frozen=True)
class TrainerConfig:
    balance_batch: bool
    total_epochs: int
    total_training_steps: OptionalPositiveInt
    project_name: str
    experiment_name: str
    logger: Annotated[tuple[Annotated[str, OneOf(loggers)], ...], AsList()]
    log_val_generations: Annotated[int, NonNegative()]
    nnodes: PositiveInt
    n_gpus_per_node: PositiveInt
    worker_group: Annotated[str, OneOf(lambda: ("auto", "ray", "local"))]
    device: Annotated[str, OneOf(lambda: ("auto", "cuda", "cpu"))]
    save_freq: int
    test_freq: int
    val_before_train: bool
    val_only: bool
    critic_warmup: Annotated[int, NonNegative()]
    resume_mode: Annotated[str, OneOf(lambda: ("auto", "disable", "resume_path"))]
    resume_from_path: str | None
    default_local_dir: str
    default_hdfs_dir: Annotated[
        str | None, Fixed((None,), "hybrid writes checkpoints to trainer.default_local_dir only")
    ]
    max_actor_ckpt_to_keep: int | None
    max_critic_ckpt_to_keep: int | None
    merge_on_finish: bool
    plot_on_finish: bool
    ray_wait_register_center_timeout: PositiveInt
    use_legacy_worker_impl: Annotated[
        str, Fixed(("auto",), "hybrid has one worker implementation (verl chooses between two)")
    ]
    seed: int

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node
