"""The typed configuration: one frozen dataclass per section of `ppo_trainer.yaml`.

Field names are verl's key names, so `config.actor_rollout_ref.actor.ppo_mini_batch_size`
reads the same in a run script and in code. Types and value rules sit on the fields
(hybrid/config/typed.py); rules that involve several keys are each section's `check`;
choices come from the registries (advantage estimators, policy losses, KL kinds, reward
managers, loggers), so a name registered by a plug-in (`actor_rollout_ref.model.external_lib`)
is valid on the command line. The yaml holds every default; nothing here repeats one.
Derived values are properties (`HybridConfig.world_size`, `ActorRolloutRefConfig.
mini_batch_samples`, ...), never keys written back.

This module holds the data and actor/rollout/reference sections and HybridConfig, and
re-exports every name of the others: schema_fields.py (shared field types), schema_models.py
(sharding, optimizer, checkpoint and model blocks), schema_profiling.py, schema_critic_reward.py
and schema_algorithm.py (algorithm and trainer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hybrid.config.registries import loss_agg_modes, policy_losses
from hybrid.config.schema_algorithm import (
    AlgorithmConfig,
    FilterGroupsConfig,
    KLControlConfig,
    RolloutCorrectionConfig,
    TrainerConfig,
)
from hybrid.config.schema_critic_reward import (
    OVERLONG,
    OVERLONG_KEYS,
    OVERLONG_VERL,
    CriticConfig,
    CriticModelConfig,
    CustomRewardFunctionConfig,
    RewardModelConfig,
    RewardModelModelConfig,
    fold_overlong_spellings,
)
from hybrid.config.schema_fields import FSDP, MIXED_PRECISION, NO_COMPILE, OptionalPositiveInt, Paths, PositiveInt, _ok
from hybrid.config.schema_models import (
    ActorOptimConfig,
    CheckpointConfig,
    FSDPConfig,
    FusedKernelOptions,
    HFModelConfig,
    ModelConfig,
    OptimConfig,
    TrainFSDPConfig,
    WrapPolicyConfig,
)
from hybrid.config.schema_profiling import (
    PROFILER_TOOL,
    GlobalProfilerConfig,
    ProfilerConfig,
    ProfilerToolConfig,
    TorchProfilerToolConfig,
)
from hybrid.config.typed import Annotated, AsList, AtLeast, Fixed, Fraction, NonNegative, OneOf, Positive, Problems, fmt

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
    seed: int
    dataloader_num_workers: Annotated[int, NonNegative()]
    filter_overlong_prompts: bool
    filter_overlong_prompts_workers: PositiveInt
    truncation: Annotated[str, OneOf(lambda: ("error", "left", "right", "middle"))]
    trust_remote_code: bool
    apply_chat_template_kwargs: dict[str, Any]
    custom_cls: CustomClsConfig

    def check(self, problems: Problems) -> None:
        if self.custom_cls.path and not self.custom_cls.name:
            problems.add(
                f"data.custom_cls.path={fmt(self.custom_cls.path)} needs data.custom_cls.name (the dataset class)"
            )


# ---------------------------------------------------------------- actor, rollout, reference


@dataclass(frozen=True)
class PolicyLossConfig:
    loss_mode: Annotated[str, OneOf(policy_losses)]
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    ppo_kl_coef: float
    sapo_tau_pos: float
    sapo_tau_neg: float


@dataclass(frozen=True)
class ActorConfig:
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
    loss_agg_mode: Annotated[str, OneOf(loss_agg_modes)]
    policy_loss: PolicyLossConfig
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: Annotated[float, NonNegative()]
    kl_loss_type: str
    ppo_epochs: PositiveInt
    shuffle: bool
    data_loader_seed: int | None
    use_torch_compile: Annotated[bool, NO_COMPILE]
    tis_imp_ratio_cap: float
    skip_old_log_prob_on_policy: bool
    entropy_from_logits_with_chunking: bool  # both values: entropy is always chunked
    entropy_checkpointing: bool  # true needs the fused output layer (model.use_fused_kernels not false)
    freeze_vision_tower: Annotated[bool, Fixed((False,), "hybrid trains text-only models, which have no vision tower")]
    use_prefix_grouper: bool | None  # null: on when rollout.n > 1 and rows are packed (workers/shared_prefix.py)
    ulysses_sequence_parallel_size: PositiveInt  # ranks that split each sequence (workers/ulysses.py)
    optim: ActorOptimConfig
    fsdp_config: TrainFSDPConfig
    checkpoint: CheckpointConfig
    profiler: ProfilerConfig


@dataclass(frozen=True)
class RefConfig:
    strategy: Annotated[str, FSDP]
    log_prob_micro_batch_size: int | None
    log_prob_micro_batch_size_per_gpu: OptionalPositiveInt
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: PositiveInt
    use_torch_compile: Annotated[bool, NO_COMPILE]
    entropy_from_logits_with_chunking: bool
    entropy_checkpointing: bool
    ulysses_sequence_parallel_size: PositiveInt  # the actor's (one worker holds both)
    fsdp_config: FSDPConfig
    profiler: ProfilerConfig


@dataclass(frozen=True)
class ValKwargsConfig:
    top_k: Annotated[int, AtLeast(-1, note=" (-1: no top-k filter)")]
    top_p: Annotated[float, Fraction(open_low=True)]
    temperature: Annotated[float, NonNegative()]
    n: PositiveInt
    do_sample: bool


@dataclass(frozen=True)
class EngineKwargsConfig:
    vllm: dict[str, Any]


@dataclass(frozen=True)
class MultiTurnConfig:
    enable: bool
    max_assistant_turns: OptionalPositiveInt
    max_user_turns: OptionalPositiveInt
    max_tokens_per_turn: OptionalPositiveInt
    interaction_config_path: str | None
    tool_config_path: str | None
    max_tool_response_length: PositiveInt
    tool_response_truncate_side: Annotated[str, OneOf(lambda: ("left", "middle", "right"))]
    format: Annotated[str, OneOf(lambda: ("hermes",))]
    env_class: str | None
    env_kwargs: dict[str, Any]
    use_conversation_multi_turn: bool
    reward_placement: Annotated[str, OneOf(lambda: ("final", "turn"))]
    env_workers: PositiveInt
    env_step_timeout_s: Annotated[float, Positive()]
    tolerate_env_errors: bool


@dataclass(frozen=True)
class RolloutConfig:
    name: Annotated[
        str,
        OneOf(
            lambda: ("vllm", "hf"),
            unsupported=(("sglang", "hybrid's rollout engines are in-process vLLM and Hugging Face generate"),),
        ),
    ]
    mode: Annotated[str, Fixed(("sync",), "hybrid generates in-process, one batch at a time (no async server mode)")]
    temperature: Annotated[float, NonNegative()]
    top_k: Annotated[int, AtLeast(-1, note=" (-1: no top-k filter)")]
    top_p: Annotated[float, Fraction(open_low=True)]
    do_sample: bool
    min_p: Annotated[float, Fraction()]
    repetition_penalty: Annotated[float, Positive()]
    presence_penalty: Annotated[float, Fraction(low=-2.0, high=2.0)]
    frequency_penalty: Annotated[float, Fraction(low=-2.0, high=2.0)]
    stop: Annotated[tuple[str, ...] | None, AsList()]
    stop_token_ids: tuple[Annotated[int, NonNegative()], ...] | None
    prompt_length: PositiveInt
    response_length: PositiveInt
    dtype: Annotated[str, OneOf(lambda: ("auto", "bfloat16", "float16", "float32"))]
    gpu_memory_utilization: Annotated[float, Fraction(open_low=True)]
    cpu_kvcache_space_gb: PositiveInt  # vLLM's CPU backend takes whole GiB
    ignore_eos: bool
    enforce_eager: bool
    free_cache_engine: bool
    load_format: Annotated[
        str,
        OneOf(
            lambda: ("dummy_dtensor", "dummy_hf", "dummy", "dtensor", "hf", "auto", "safetensors"),
            unsupported=(
                ("dummy_megatron", "hybrid trains with FSDP only"),
                ("megatron", "hybrid trains with FSDP only"),
            ),
        ),
    ]
    tensor_model_parallel_size: PositiveInt
    max_num_batched_tokens: PositiveInt
    max_model_len: OptionalPositiveInt
    max_num_seqs: PositiveInt
    enable_chunked_prefill: bool
    seed: int
    log_prob_micro_batch_size: int | None
    log_prob_micro_batch_size_per_gpu: OptionalPositiveInt
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: PositiveInt
    n: Annotated[int, Positive()]
    calculate_log_probs: Annotated[
        bool,
        Fixed(
            (True,),
            "the engine's log-probs are always kept as rollout_log_probs (the engine/trainer gap is logged from them)",
        ),
    ]
    update_weights_bucket_megabytes: PositiveInt
    # verl: gather the FSDP parameters layer by layer for the sync instead of all at once.
    # Our sync always streams (workers/weight_sync.py), so both values mean the same here.
    layered_summon: bool
    engine_kwargs: EngineKwargsConfig
    multi_turn: MultiTurnConfig
    val_kwargs: ValKwargsConfig

    def check(self, problems: Problems) -> None:
        if self.name == "hf":
            for key in ("presence_penalty", "frequency_penalty"):
                if _ok(getattr(self, key)) and getattr(self, key) != 0:
                    problems.add(
                        f"actor_rollout_ref.rollout.{key}={getattr(self, key)} has no equivalent in transformers' "
                        f"generate (rollout.name='hf'); use rollout.name=vllm or set it to 0"
                    )


@dataclass(frozen=True)
class ActorRolloutRefConfig:
    hybrid_engine: Annotated[bool, Fixed((True,), "hybrid always fuses actor, rollout and reference in one worker")]
    model: ModelConfig
    actor: ActorConfig
    ref: RefConfig
    rollout: RolloutConfig

    @property
    def mini_batch_samples(self) -> int:
        """Samples per actor mini-batch: verl's ppo_mini_batch_size counts prompts."""
        return self.actor.ppo_mini_batch_size * self.rollout.n


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

    @property
    def use_critic(self) -> bool:
        """critic.enable=null means: a critic when the estimator needs values (gae)."""
        if self.critic.enable is None:
            return self.algorithm.adv_estimator == "gae"
        return bool(self.critic.enable)

    @property
    def use_reference_policy(self) -> bool:
        return bool(self.algorithm.use_kl_in_reward or self.actor_rollout_ref.actor.use_kl_loss)

    @property
    def world_size(self) -> int:
        return self.trainer.world_size

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


__all__ = [name for name in dir() if name.endswith("Config")]
