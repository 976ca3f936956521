"""Each worker's own config sections, as frozen dataclasses (verl's workers/config habit):
the fused worker's `actor_rollout_ref` (model, actor, ref, rollout), the `critic`, the
`reward_model`, and the blocks they share (sharding, optimizer, checkpoint, profiler,
micro-batching). The driver's config (hybrid/config/schema.py) composes them and fills
their derived fields; workers take the typed object and read units from it."""

from workers.config.actor import ActorConfig, PolicyLossConfig, RefConfig, RefModelConfig
from workers.config.actor_rollout_ref import ActorRolloutRefConfig
from workers.config.batching import LogProbBatching, MicroBatching, mini_batch_samples_per_rank, shares_prompts
from workers.config.critic import CriticConfig, CriticModelConfig
from workers.config.model import (
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
from workers.config.profiler import (
    GlobalProfilerConfig,
    ProfilerConfig,
    ProfilerToolConfig,
    TorchProfilerToolConfig,
)
from workers.config.reward_model import RewardModelConfig, RewardModelModelConfig
from workers.config.rollout import EngineKwargsConfig, MultiTurnConfig, RolloutConfig, ValKwargsConfig
from workers.config.rollout_correction import RolloutCorrectionConfig

__all__ = [
    "ActorConfig",
    "ActorOptimConfig",
    "ActorRolloutRefConfig",
    "CheckpointConfig",
    "CriticConfig",
    "CriticModelConfig",
    "EngineKwargsConfig",
    "FSDPConfig",
    "FusedKernelOptions",
    "GlobalProfilerConfig",
    "HFModelConfig",
    "LogProbBatching",
    "MicroBatching",
    "ModelConfig",
    "MultiTurnConfig",
    "OptimConfig",
    "PolicyLossConfig",
    "ProfilerConfig",
    "ProfilerToolConfig",
    "RefConfig",
    "RefModelConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "TorchProfilerToolConfig",
    "TrainFSDPConfig",
    "ValKwargsConfig",
    "WrapPolicyConfig",
    "mini_batch_samples_per_rank",
    "shares_prompts",
]
