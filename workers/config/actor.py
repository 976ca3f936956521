"""The actor's and the reference policy's sections (`actor_rollout_ref.actor`, `.ref`): the
PPO update's batches, loss and optimizer, and the reference's log-prob pass. Choices come
from the registries that implement them (workers/losses.py)."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.config_schema import (
    Annotated,
    AtLeast,
    NonNegative,
    OneOf,
    OptionalPositiveInt,
    Positive,
    PositiveInt,
    derived,
)
from workers.config.batching import LogProbBatching, MicroBatching, mini_batch_samples_per_rank
from workers.config.fields import FSDP
from workers.config.model import ActorOptimConfig, CheckpointConfig, FSDPConfig, TrainFSDPConfig
from workers.config.profiler import ProfilerConfig
from workers.losses import AGG_LOSS_MODES, POLICY_LOSS_REGISTRY
from workers.rollout_correction_settings import CorrectionSettings


# Choices read from the registries when a config is checked (a plug-in may add names).
# Named functions, not lambdas: typing.get_type_hints evaluates annotations with the
# class's namespace as globals, where a lambda could not see this module's names.
def _policy_losses() -> tuple[str, ...]:
    return tuple(POLICY_LOSS_REGISTRY)


def _loss_agg_modes() -> tuple[str, ...]:
    return tuple(AGG_LOSS_MODES)


@dataclass(frozen=True)
class PolicyLossConfig:
    loss_mode: Annotated[str, OneOf(_policy_losses)]
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    ppo_kl_coef: float
    sapo_tau_pos: float
    sapo_tau_neg: float


@dataclass(frozen=True)
class ActorConfig:
    """`actor_rollout_ref.actor`: the policy's update. The last fields are derived (not yaml
    keys): the driver's config fills them once from other sections (hybrid/config/derived.py)."""

    strategy: Annotated[str, FSDP]
    ppo_mini_batch_size: Annotated[int, Positive()]
    ppo_micro_batch_size: int | None
    ppo_micro_batch_size_per_gpu: OptionalPositiveInt
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: PositiveInt
    grad_clip: Annotated[float, Positive()]
    clip_ratio: Annotated[float, NonNegative()]
    clip_ratio_low: float | None  # null: clip_ratio (verl)
    clip_ratio_high: float | None
    clip_ratio_c: Annotated[float, AtLeast(1, strict=True, note=" (the dual-clip bound)")]
    loss_agg_mode: Annotated[str, OneOf(_loss_agg_modes)]
    loss_scale_factor: OptionalPositiveInt  # seq-mean-token-sum-norm's divisor (verl's); null: the response horizon
    policy_loss: PolicyLossConfig
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: Annotated[float, NonNegative()]
    kl_loss_type: str
    ppo_epochs: PositiveInt
    shuffle: bool
    data_loader_seed: int | None
    use_torch_compile: bool  # the entropy through torch.compile, as verl's (workers/compiled_entropy.py)
    tis_imp_ratio_cap: float
    skip_old_log_prob_on_policy: bool
    entropy_from_logits_with_chunking: bool  # both values: entropy is always chunked
    entropy_checkpointing: bool  # true needs the fused output layer (model.use_fused_kernels not false)
    freeze_vision_tower: bool  # the vision tower keeps its weights (workers/freeze.py)
    freeze_module_prefix: str | tuple[str, ...] | None  # parameters named so keep their weights (ROLL's key)
    use_prefix_grouper: bool | None  # null: on when rollout.n > 1 and rows are packed (workers/shared_prefix.py)
    ulysses_sequence_parallel_size: PositiveInt  # ranks that split each sequence (workers/ulysses.py)
    optim: ActorOptimConfig
    fsdp_config: TrainFSDPConfig
    checkpoint: CheckpointConfig
    profiler: ProfilerConfig
    # ---- derived
    rollout_n: int = derived(1)  # responses per prompt (actor_rollout_ref.rollout.n)
    data_parallel_size: int = derived(1)  # rank groups the batch splits over: world size / ulysses size
    share_prompts: bool = derived(False)  # prompt-once packing (use_prefix_grouper resolved)
    # One optimizer step over the whole batch with nothing reading old log-probs first: the
    # driver skips the old log-prob pass and the update's own forward, detached, is pi_old.
    on_policy_update: bool = derived(False)
    correction: CorrectionSettings | None = derived(None)  # algorithm.rollout_correction resolved

    @property
    def mini_batch_samples(self) -> int:
        """Samples per optimizer step over all ranks: verl's ppo_mini_batch_size counts prompts."""
        return self.ppo_mini_batch_size * self.rollout_n

    @property
    def mini_batch_samples_per_rank(self) -> int:
        """Samples per optimizer step on one rank (one sequence-parallel group shares its rows)."""
        return mini_batch_samples_per_rank(self.ppo_mini_batch_size, self.rollout_n, self.data_parallel_size)

    @property
    def update_batching(self) -> MicroBatching:
        """The update's micro-batches: samples per device, or a token budget."""
        return MicroBatching(self.ppo_micro_batch_size_per_gpu, self.use_dynamic_bsz, self.ppo_max_token_len_per_gpu)


@dataclass(frozen=True)
class RefModelConfig:
    """`actor_rollout_ref.ref.model` (verl's legacy FSDP worker reads it as `+actor_rollout_ref.ref.model.path`)."""

    # null: the reference is the initial policy (actor_rollout_ref.model.path); a folder: another
    # model, e.g. the teacher of on-policy distillation (hybrid/distillation.py)
    path: str | None


@dataclass(frozen=True)
class RefConfig(LogProbBatching):
    """`actor_rollout_ref.ref`: the frozen reference policy's log-prob pass."""

    model: RefModelConfig
    strategy: Annotated[str, FSDP]
    log_prob_micro_batch_size: int | None
    log_prob_micro_batch_size_per_gpu: OptionalPositiveInt
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: PositiveInt
    use_torch_compile: bool  # the entropy through torch.compile, as verl's (workers/compiled_entropy.py)
    entropy_from_logits_with_chunking: bool
    entropy_checkpointing: bool
    ulysses_sequence_parallel_size: PositiveInt  # the actor's (one worker holds both)
    fsdp_config: FSDPConfig
    profiler: ProfilerConfig
