"""The schema's `critic`, `reward_model` and `custom_reward_function` sections
(hybrid/config/schema.py), with the folding of verl's `overlong_buffer_cfg` spelling
into hybrid's `overlong_buffer`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybrid.config.registries import loss_agg_modes, reward_managers
from hybrid.config.schema_fields import FSDP, OptionalPositiveInt, PositiveInt, _ok
from hybrid.config.schema_models import CheckpointConfig, FSDPConfig, HFModelConfig, OptimConfig, TrainFSDPConfig
from hybrid.config.schema_profiling import ProfilerConfig
from hybrid.config.typed import Annotated, Fixed, NonNegative, OneOf, Positive, Problems, fmt

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
    use_remove_padding: Annotated[
        bool, Fixed((False,), "the reward model scores padded rows (packed rows are the actor's and critic's path)")
    ]
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
    launch_reward_fn_async: Annotated[
        bool, Fixed((False,), "rewards are computed on the driver between generation and the update")
    ]
    use_reward_loop: Annotated[
        bool,
        Fixed(
            (False,),
            "hybrid builds no reward-loop workers: rewards are scored on the driver between generation and the update (the same scores; the prime manager scores in a process pool of reward_kwargs.num_processes)",
        ),
    ]
    num_workers: PositiveInt  # verl's reward-loop workers: read only with use_reward_loop=true
    combine: Annotated[str, OneOf(lambda: ("sum", "rm_only"))]
    sandbox_fusion: Annotated[
        Any, Fixed((None,), "hybrid has no sandbox code execution; score code in a custom reward function")
    ]
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
            problems.add(
                f"{prefix}.{OVERLONG_VERL}.{key}: no such key (the overlong buffer has {', '.join(OVERLONG_KEYS)})"
            )
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
