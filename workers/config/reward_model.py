"""The `reward_model` section: the reward model worker's model, sharding and batches, and
which reward manager turns scores into token-level rewards (reward/manager.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.config_schema import Annotated, Fixed, OneOf, OptionalPositiveInt, PositiveInt, Problems
from reward.config import fold_overlong_spellings
from reward.manager import REWARD_MANAGER_REGISTRY
from workers.config.batching import MicroBatching
from workers.config.fields import FSDP
from workers.config.model import FSDPConfig


# Choices read from the registries when a config is checked (a plug-in may add names).
# Named functions, not lambdas: typing.get_type_hints evaluates annotations with the
# class's namespace as globals, where a lambda could not see this module's names.
def _reward_managers() -> tuple[str, ...]:
    return tuple(REWARD_MANAGER_REGISTRY)


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
    reward_manager: Annotated[str, OneOf(_reward_managers)]
    launch_reward_fn_async: Annotated[
        bool, Fixed((False,), "rewards are computed on the driver between generation and the update")
    ]
    use_reward_loop: Annotated[
        bool,
        Fixed(
            (False,),
            "hybrid builds no reward-loop workers: rewards are scored on the driver between generation and the "
            "update (the same scores; the prime manager scores in a process pool of reward_kwargs.num_processes)",
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

    @property
    def batching(self) -> MicroBatching:
        return MicroBatching(self.micro_batch_size_per_gpu, self.use_dynamic_bsz, self.forward_max_token_len_per_gpu)

    @property
    def manager_kwargs(self) -> dict[str, Any]:
        """`reward_kwargs` as the reward manager takes them (fold_overlong_spellings)."""
        return fold_overlong_spellings(self.reward_kwargs)
