"""The `critic` section: the value model's folder and sharding, its optimizer, its batches
(prompts per mini-batch, as the actor's) and its loss."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.config_schema import Annotated, NonNegative, OneOf, OptionalPositiveInt, Positive, PositiveInt, derived
from workers.config.batching import MicroBatching, mini_batch_samples_per_rank
from workers.config.fields import FSDP
from workers.config.model import CheckpointConfig, HFModelConfig, OptimConfig, TrainFSDPConfig
from workers.config.profiler import ProfilerConfig
from workers.losses import AGG_LOSS_MODES


# Choices read from the registries when a config is checked (a plug-in may add names).
# Named functions, not lambdas: typing.get_type_hints evaluates annotations with the
# class's namespace as globals, where a lambda could not see this module's names.
def _loss_agg_modes() -> tuple[str, ...]:
    return tuple(AGG_LOSS_MODES)


@dataclass(frozen=True)
class CriticModelConfig(HFModelConfig):
    fsdp_config: TrainFSDPConfig
    lora_rank: Annotated[int, NonNegative(" (0: full fine-tuning)")]
    lora_alpha: Annotated[float, Positive()]
    target_modules: str | tuple[str, ...]
    exclude_modules: str | tuple[str, ...] | None

    # What workers/lora.apply_lora reads beyond these keys: the critic starts from no saved adapter.
    lora_adapter_path = None

    @property
    def is_lora(self) -> bool:
        return self.lora_rank > 0


@dataclass(frozen=True)
class CriticConfig:
    """`critic`. The last fields are derived (not yaml keys), filled once by the driver's
    config (hybrid/config/derived.py)."""

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
    loss_agg_mode: Annotated[str, OneOf(_loss_agg_modes)]
    ulysses_sequence_parallel_size: PositiveInt
    checkpoint: CheckpointConfig
    profiler: ProfilerConfig
    # ---- derived
    rollout_n: int = derived(1)  # responses per prompt: mini-batches count prompts, as the actor's
    data_parallel_size: int = derived(1)  # rank groups the batch splits over: world size / ulysses size
    share_prompts: bool = derived(False)  # prompt-once packing, one switch for every model that trains

    @property
    def mini_batch_samples_per_rank(self) -> int:
        """Samples per optimizer step on one rank (one sequence-parallel group shares its rows)."""
        return mini_batch_samples_per_rank(self.ppo_mini_batch_size, self.rollout_n, self.data_parallel_size)

    @property
    def update_batching(self) -> MicroBatching:
        return MicroBatching(self.ppo_micro_batch_size_per_gpu, self.use_dynamic_bsz, self.ppo_max_token_len_per_gpu)

    @property
    def values_batching(self) -> MicroBatching:
        """The value pass's micro-batches (verl's forward_* keys)."""
        return MicroBatching(
            self.forward_micro_batch_size_per_gpu, self.use_dynamic_bsz, self.forward_max_token_len_per_gpu
        )
