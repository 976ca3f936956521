"""The sections of a model a worker loads: its FSDP sharding, optimizer, checkpoint contents
and Hugging Face model folder (the actor's `actor_rollout_ref.model`, with its LoRA and
fused-kernel keys; the critic's model extends the plain folder)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.config_schema import Annotated, Fixed, Fraction, NonNegative, OneOf, Positive, Problems, fmt, valid
from workers.config.fields import MIXED_PRECISION


def checkpoint_contents() -> tuple[str, ...]:
    from workers.checkpoint import CONTENTS

    return tuple(CONTENTS)


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
    use_orig_params: bool  # FSDP1 only (flat parameters); FSDP2 always keeps the original ones, as verl's fsdp2 path
    wrap_policy: WrapPolicyConfig


@dataclass(frozen=True)
class TrainFSDPConfig(FSDPConfig):
    """A trained model's sharding: also its optimizer state."""

    optimizer_offload: bool
    offload_policy: bool
    # Ranks in one shard group: -1 (or >= the world size) all of them; fewer make hybrid-sharded
    # groups replicated across each other (workers/fsdp_utils.fsdp_mesh; rules check it tiles the world).
    fsdp_size: int


@dataclass(frozen=True)
class OptimConfig:
    lr: Annotated[float, NonNegative()]
    lr_warmup_steps: int
    lr_warmup_steps_ratio: Annotated[float, Fraction()]
    min_lr_ratio: Annotated[float, Fraction()]
    num_cycles: Annotated[float, NonNegative()]  # verl's: cosine periods over the run (0.5: down once)
    # null: verl's deprecation of warmup_style (its default now): lr_scheduler_type, else constant
    warmup_style: Annotated[str | None, OneOf(lambda: ("constant", "cosine", "linear"))]
    lr_scheduler_type: Annotated[str | None, OneOf(lambda: ("constant", "cosine", "linear"))]
    total_training_steps: int
    weight_decay: Annotated[float, NonNegative()]
    betas: tuple[float, ...]

    @property
    def schedule(self) -> str:
        """verl's newer `lr_scheduler_type` wins over `warmup_style` when set; neither: constant (verl's default)."""
        return self.lr_scheduler_type or self.warmup_style or "constant"

    def check(self, prefix: str, problems: Problems) -> None:
        if valid(self.betas) and (len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas)):
            problems.add(f"{prefix}.betas={fmt(self.betas)} must be two numbers in [0, 1): [beta1, beta2]")


@dataclass(frozen=True)
class ActorOptimConfig(OptimConfig):
    """The actor's optim section: the critic's keys. verl's optim.clip_grad is read only by its engine
    workers (hybrid/config/verl_keys.py); the actor clips by actor_rollout_ref.actor.grad_clip."""


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
    # The language model of a multimodal checkpoint alone (workers/language_model.py; SkyRL's
    # trainer.policy.language_model_only). hybrid's own key: verl has none.
    language_model_only: bool

    @property
    def tokenizer(self) -> str:
        return self.tokenizer_path or self.path


@dataclass(frozen=True)
class FusedKernelOptions:
    impl_backend: Annotated[
        str,
        OneOf(
            lambda: ("torch",),
            unsupported=(
                (
                    "triton",
                    "the fused output layer (workers/response_head.py) is written in torch; use impl_backend=torch",
                ),
            ),
        ),
    ]


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
        if self.lora_adapter_path is None or not valid(self.lora_adapter_path, self.lora_rank):
            return
        from workers.lora import adapter_folder_problem

        problem = adapter_folder_problem(self.lora_adapter_path, self.lora_rank)
        if problem:
            problems.add(f"actor_rollout_ref.model.lora_adapter_path={fmt(self.lora_adapter_path)}: {problem}")
