"""The typed configuration: one frozen dataclass per section of `ppo_trainer.yaml`.

Field names are verl's key names, so `config.actor_rollout_ref.actor.ppo_mini_batch_size`
reads the same in a run script and in code. Types and value rules sit on the fields
(hybrid/config/typed.py); rules that involve several keys are each section's `check`;
choices come from the registries (advantage estimators, policy losses, KL kinds, reward
managers, loggers), so a name registered by a plug-in (`actor_rollout_ref.model.external_lib`)
is valid on the command line. The yaml holds every default; nothing here repeats one.
Derived values are properties (`HybridConfig.world_size`, `ActorRolloutRefConfig.
mini_batch_samples`, ...), never keys written back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hybrid.config.registries import (
    adv_estimators,
    checkpoint_contents,
    kl_kinds,
    loggers,
    loss_agg_modes,
    policy_losses,
    reward_managers,
)
from hybrid.config.typed import INVALID, Annotated, AsList, AtLeast, Fixed, Fraction, NonNegative, OneOf, Positive, Problems, fmt

PositiveInt = Annotated[int, Positive()]
OptionalPositiveInt = Annotated[int | None, Positive()]
Paths = str | tuple[str, ...]

FSDP = OneOf(lambda: ("fsdp", "fsdp2"), unsupported=(("megatron", "hybrid trains with FSDP only"),))
MIXED_PRECISION = OneOf(lambda: ("auto", "bf16", "fp32"))
NO_COMPILE = Fixed((False,), "hybrid does not torch.compile its models")


def _ok(*values: Any) -> bool:
    """True when none of `values` failed its own check (cross-key rules skip those)."""
    return all(v is not INVALID for v in values)


# ---------------------------------------------------------------- data


@dataclass(frozen=True)
class CustomClsConfig:
    path: str | None
    name: str | None


@dataclass(frozen=True)
class DataConfig:
    tokenizer: Annotated[str | None, Fixed((None,), "the prompts are tokenized with actor_rollout_ref.model.tokenizer_path (or model.path)")]
    train_files: Paths
    val_files: Paths | None
    prompt_key: str
    reward_fn_key: str
    max_prompt_length: PositiveInt
    max_response_length: PositiveInt
    train_batch_size: PositiveInt
    val_batch_size: OptionalPositiveInt
    return_raw_input_ids: Annotated[bool, Fixed((False,), "a reward model re-templates the decoded text itself (reward_model.model.input_tokenizer)")]
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
            problems.add(f"data.custom_cls.path={fmt(self.custom_cls.path)} needs data.custom_cls.name (the dataset class)")


# ---------------------------------------------------------------- actor, rollout, reference


@dataclass(frozen=True)
class WrapPolicyConfig:
    min_num_params: Annotated[int, Fixed((0,), "hybrid shards every decoder layer as its own FSDP unit")]


@dataclass(frozen=True)
class FSDPConfig:
    """A frozen model's sharding (reference policy, reward model)."""

    param_offload: bool
    reshard_after_forward: bool
    mixed_precision: Annotated[str, MIXED_PRECISION]
    forward_prefetch: bool  # FSDP2 explicit forward prefetch, layer i -> i+1 (workers/fsdp_utils.apply_fsdp2)
    wrap_policy: WrapPolicyConfig


@dataclass(frozen=True)
class TrainFSDPConfig(FSDPConfig):
    """A trained model's sharding: also its optimizer state."""

    optimizer_offload: bool
    offload_policy: bool
    fsdp_size: Annotated[int, Fixed((-1,), "hybrid shards over all ranks (no hybrid-sharded groups)")]


@dataclass(frozen=True)
class OptimConfig:
    lr: Annotated[float, NonNegative()]
    lr_warmup_steps: int
    lr_warmup_steps_ratio: Annotated[float, Fraction()]
    min_lr_ratio: Annotated[float, Fraction()]
    warmup_style: Annotated[str, OneOf(lambda: ("constant", "cosine", "linear"))]
    lr_scheduler_type: Annotated[str | None, OneOf(lambda: ("constant", "cosine", "linear"))]
    total_training_steps: int
    weight_decay: Annotated[float, NonNegative()]
    betas: tuple[float, ...]

    @property
    def schedule(self) -> str:
        """verl's newer `lr_scheduler_type` wins over `warmup_style` when set."""
        return self.lr_scheduler_type or self.warmup_style

    def check(self, prefix: str, problems: Problems) -> None:
        if _ok(self.betas) and (len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas)):
            problems.add(f"{prefix}.betas={fmt(self.betas)} must be two numbers in [0, 1): [beta1, beta2]")


@dataclass(frozen=True)
class ActorOptimConfig(OptimConfig):
    clip_grad: Annotated[float | None, Fixed((None,), "the actor's gradient clipping is actor_rollout_ref.actor.grad_clip")]


@dataclass(frozen=True)
class CheckpointConfig:
    save_contents: tuple[Annotated[str, OneOf(checkpoint_contents)], ...]
    load_contents: tuple[Annotated[str, OneOf(checkpoint_contents)], ...]


@dataclass(frozen=True)
class HFModelConfig:
    """A Hugging Face model folder a trained role loads (the actor's, the critic's)."""

    path: str
    tokenizer_path: str | None
    override_config: dict[str, Any]
    enable_gradient_checkpointing: bool
    use_remove_padding: bool
    trust_remote_code: bool

    @property
    def tokenizer(self) -> str:
        return self.tokenizer_path or self.path


@dataclass(frozen=True)
class FusedKernelOptions:
    impl_backend: Annotated[str, OneOf(lambda: ("torch",), unsupported=(
        ("triton", "the fused output layer (workers/response_head.py) is written in torch; use impl_backend=torch"),
    ))]


@dataclass(frozen=True)
class ModelConfig(HFModelConfig):
    external_lib: str | tuple[str, ...] | None
    use_liger: bool
    lora_rank: Annotated[int, NonNegative(" (0: full fine-tuning)")]
    lora_alpha: Annotated[float, Positive()]
    target_modules: str | tuple[str, ...]
    exclude_modules: str | tuple[str, ...] | None
    lora_adapter_path: str | None
    use_shm: bool
    use_fused_kernels: bool | None  # null: the fused output layer where the model allows it
    fused_kernel_options: FusedKernelOptions

    @property
    def is_lora(self) -> bool:
        """LoRA from scratch (lora_rank > 0) or from a saved adapter (verl: either one)."""
        return self.lora_rank > 0 or self.lora_adapter_path is not None

    def check(self, problems: Problems) -> None:
        """A saved adapter must be a peft LoRA folder whose rank agrees with lora_rank (0: take the adapter's)."""
        if self.lora_adapter_path is None or not _ok(self.lora_adapter_path, self.lora_rank):
            return
        from workers.lora import adapter_folder_problem

        problem = adapter_folder_problem(self.lora_adapter_path, self.lora_rank)
        if problem:
            problems.add(f"actor_rollout_ref.model.lora_adapter_path={fmt(self.lora_adapter_path)}: {problem}")


# ---------------------------------------------------------------- profiling


def _profiler_tools() -> tuple[str, ...]:
    return ("torch",)


PROFILER_TOOL = OneOf(_profiler_tools, unsupported=(
    ("nsys", "hybrid runs no Nsight Systems workers; use tool=torch (chrome traces)"),
    ("npu", "hybrid does not run on Ascend NPUs"),
    ("torch_memory", "CUDA memory snapshots are not written; use tool=torch with tool_config.torch.contents=[memory]"),
))


@dataclass(frozen=True)
class TorchProfilerToolConfig:
    contents: tuple[Annotated[str, OneOf(lambda: ("cpu", "cuda", "memory", "shapes", "stack"))], ...]
    discrete: Annotated[bool, Fixed((False,), "hybrid writes one trace per profiled step and rank, covering every call the worker makes in it")]


@dataclass(frozen=True)
class ProfilerToolConfig:
    torch: TorchProfilerToolConfig


@dataclass(frozen=True)
class ProfilerConfig:
    """A role's `profiler` section (verl's): which ranks of that role's worker write traces."""

    tool: Annotated[str | None, PROFILER_TOOL]
    enable: bool
    all_ranks: bool
    ranks: tuple[Annotated[int, NonNegative()], ...]
    save_path: str | None
    tool_config: ProfilerToolConfig

    def profiles_rank(self, rank: int) -> bool:
        """verl's rule: all_ranks, else the listed ranks, else rank 0 (when enabled)."""
        if not self.enable or self.tool is None:
            return False
        if self.all_ranks:
            return True
        return rank in self.ranks if self.ranks else rank == 0

    def check(self, prefix: str, problems: Problems, steps: Any) -> None:
        if self.enable is True and (self.tool is None or not steps):
            problems.add(
                f"{prefix}.profiler.enable=True profiles nothing without global_profiler.tool=torch and "
                f"global_profiler.steps (a list of steps); set them or set enable=false"
            )
        if self.enable is True and self.tool is not None and self.save_path is None:
            problems.add(f"{prefix}.profiler.save_path=None: set it (or global_profiler.save_path) to the folder for the traces")


@dataclass(frozen=True)
class GlobalProfilerConfig:
    tool: Annotated[str | None, PROFILER_TOOL]
    steps: tuple[Annotated[int, Positive()], ...] | None
    profile_continuous_steps: bool
    save_path: str


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
    name: Annotated[str, OneOf(lambda: ("vllm", "hf"), unsupported=(("sglang", "hybrid's rollout engines are in-process vLLM and Hugging Face generate"),))]
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
    load_format: Annotated[str, OneOf(
        lambda: ("dummy_dtensor", "dummy_hf", "dummy", "dtensor", "hf", "auto", "safetensors"),
        unsupported=(("dummy_megatron", "hybrid trains with FSDP only"), ("megatron", "hybrid trains with FSDP only")),
    )]
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
    calculate_log_probs: Annotated[bool, Fixed((True,), "the engine's log-probs are always kept as rollout_log_probs (the engine/trainer gap is logged from them)")]
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


# ---------------------------------------------------------------- critic and reward


@dataclass(frozen=True)
class CriticModelConfig(HFModelConfig):
    fsdp_config: TrainFSDPConfig


@dataclass(frozen=True)
class CriticConfig:
    enable: bool | None
    strategy: Annotated[str, FSDP]
    optim: OptimConfig
    model: CriticModelConfig
    ppo_mini_batch_size: PositiveInt
    ppo_micro_batch_size: int | None
    ppo_micro_batch_size_per_gpu: OptionalPositiveInt
    forward_micro_batch_size: int | None
    forward_micro_batch_size_per_gpu: OptionalPositiveInt
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: PositiveInt
    forward_max_token_len_per_gpu: PositiveInt
    ppo_epochs: PositiveInt
    shuffle: bool
    grad_clip: Annotated[float, Positive()]
    cliprange_value: Annotated[float, NonNegative()]
    loss_agg_mode: Annotated[str, OneOf(loss_agg_modes)]
    ulysses_sequence_parallel_size: PositiveInt
    checkpoint: CheckpointConfig
    profiler: ProfilerConfig


@dataclass(frozen=True)
class RewardModelModelConfig:
    input_tokenizer: str | None
    path: str | None
    trust_remote_code: bool
    use_remove_padding: Annotated[bool, Fixed((False,), "the reward model scores padded rows (packed rows are the actor's and critic's path)")]
    fsdp_config: FSDPConfig


@dataclass(frozen=True)
class RewardModelConfig:
    enable: bool
    strategy: Annotated[str, FSDP]
    model: RewardModelModelConfig
    micro_batch_size: int | None
    micro_batch_size_per_gpu: OptionalPositiveInt
    max_length: OptionalPositiveInt
    use_dynamic_bsz: bool
    forward_max_token_len_per_gpu: PositiveInt
    reward_manager: Annotated[str, OneOf(reward_managers)]
    launch_reward_fn_async: Annotated[bool, Fixed((False,), "rewards are computed on the driver between generation and the update")]
    use_reward_loop: Annotated[bool, Fixed((False,), "hybrid builds no reward-loop workers: rewards are scored on the driver between generation and the update (the same scores; the prime manager scores in a process pool of reward_kwargs.num_processes)")]
    num_workers: PositiveInt  # verl's reward-loop workers: read only with use_reward_loop=true
    combine: Annotated[str, OneOf(lambda: ("sum", "rm_only"))]
    sandbox_fusion: Annotated[Any, Fixed((None,), "hybrid has no sandbox code execution; score code in a custom reward function")]
    reward_kwargs: dict[str, Any]

    def check(self, problems: Problems) -> None:
        if self.enable and self.model.path is None:
            problems.add("reward_model.enable=True needs reward_model.model.path (a reward model folder)")
        if _ok(self.reward_kwargs):
            _check_overlong_spellings(self.reward_kwargs, problems)

    @property
    def manager_kwargs(self) -> dict[str, Any]:
        """`reward_kwargs` as the reward manager takes them (fold_overlong_spellings)."""
        return fold_overlong_spellings(self.reward_kwargs)


OVERLONG, OVERLONG_VERL = "overlong_buffer", "overlong_buffer_cfg"
OVERLONG_KEYS = ("enable", "len", "penalty_factor", "log")


def fold_overlong_spellings(reward_kwargs: dict[str, Any]) -> dict[str, Any]:
    """verl's `overlong_buffer_cfg` folded into hybrid's `overlong_buffer`: one setting, two
    spellings (the check below refuses them set differently); verl's entries win over the
    yaml's defaults."""
    kwargs = dict(reward_kwargs)
    cfg = kwargs.pop(OVERLONG_VERL, None)
    if cfg is not None:
        kwargs[OVERLONG] = {**dict(kwargs.get(OVERLONG) or {}), **dict(cfg)}
    return kwargs


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
            problems.add(f"{prefix}.{OVERLONG_VERL}.{key}: no such key (the overlong buffer has {', '.join(OVERLONG_KEYS)})")
    # The yaml's defaults tell a value the user wrote from one they left alone.
    from hybrid.config import default_config

    default = dict(default_config().reward_model.reward_kwargs[OVERLONG])
    ours = dict(reward_kwargs.get(OVERLONG) or {})
    for key, value in cfg.items():
        if key in ours and ours[key] != default.get(key) and ours[key] != value:
            problems.add(
                f"{prefix}.{OVERLONG}.{key}={fmt(ours[key])} and {prefix}.{OVERLONG_VERL}.{key}={fmt(value)} are the same "
                f"setting (verl's spelling and hybrid's) with different values; write only one of them"
            )


@dataclass(frozen=True)
class CustomRewardFunctionConfig:
    path: str | None
    name: str
    reward_kwargs: dict[str, Any]


# ---------------------------------------------------------------- algorithm and trainer


@dataclass(frozen=True)
class KLControlConfig:
    type: Annotated[str, OneOf(lambda: ("fixed", "adaptive"))]
    kl_coef: Annotated[float, NonNegative()]
    horizon: PositiveInt
    target_kl: Annotated[float, Positive()]


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

    rollout_is: Annotated[str | None, OneOf(
        _is_levels,
        unsupported=(("geometric", "verl 0.9 has no geometric weights; reject by the geometric mean ratio with rollout_rs=seq_mean_k1"),),
    )]
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
            problems.add(f"{key}.rollout_is={fmt(self.rollout_is)} needs rollout_is_threshold (a number: TIS; 'lower_upper': IcePop)")
        elif self.rollout_is is not None and _ok(self.rollout_is, self.rollout_is_threshold):
            try:
                parse_is_threshold(self.rollout_is_threshold)
            except ValueError as err:
                problems.add(f"{key}.rollout_is_threshold={fmt(self.rollout_is_threshold)}: {err}")
        if self.rollout_rs is not None and _ok(self.rollout_rs, self.rollout_rs_threshold):
            try:
                parse_rejection(self.rollout_rs, self.rollout_rs_threshold)
            except ValueError as err:
                problems.add(f"{key}.rollout_rs={fmt(self.rollout_rs)} with rollout_rs_threshold={fmt(self.rollout_rs_threshold)}: {err}")
        if self.rollout_is_batch_normalize is True and self.rollout_is is None:
            problems.add(f"{key}.rollout_is_batch_normalize=True normalises importance weights, but rollout_is=null computes none; set rollout_is=token or sequence")
        if self.loss_type == "reinforce" and self.bypass_mode is False:
            problems.add(f"{key}.loss_type='reinforce' is the loss of bypass mode (verl ignores it otherwise); set bypass_mode=true or loss_type=ppo_clip")
        if self.loss_type == "reinforce" and self.bypass_mode is True and _ok(actor.policy_loss.loss_mode) and actor.policy_loss.loss_mode != "vanilla":
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
    default_hdfs_dir: Annotated[str | None, Fixed((None,), "hybrid writes checkpoints to trainer.default_local_dir only")]
    max_actor_ckpt_to_keep: int | None
    max_critic_ckpt_to_keep: int | None
    merge_on_finish: bool
    plot_on_finish: bool
    ray_wait_register_center_timeout: PositiveInt
    seed: int

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node


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
