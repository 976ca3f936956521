"""The fused worker's section, `actor_rollout_ref`: the model folder, the actor, the
reference policy and the rollout, which one worker per device holds together."""

from __future__ import annotations

from dataclasses import dataclass

from workers.config.actor import ActorConfig, RefConfig
from workers.config.model import ModelConfig
from workers.config.rollout import RolloutConfig


@dataclass(frozen=True)
class ActorRolloutRefConfig:
    """`actor_rollout_ref`: what the fused worker (workers/actor_rollout_ref_worker.py) gets."""

    # false: the rollout engines live in their own actors (top-level `rollout`, async_training)
    hybrid_engine: bool
    model: ModelConfig
    actor: ActorConfig
    ref: RefConfig
    rollout: RolloutConfig
