"""The verl keys of asynchronous training that the SkyRL and ROLL dialects write: rollout
engines on devices of their own (`actor_rollout_ref.hybrid_engine=false`, the top-level
`rollout.nnodes x rollout.n_gpus_per_node`) and the schedule between them and the training
group (`async_training.*`; hybrid/config/ppo_trainer.yaml explains each key).

Both dialects describe the same three schedules, which these helpers write:

- generation and training in turn with the engines apart (SkyRL's `colocate_all=false` under
  its synchronous trainer, ROLL's disjoint `device_mapping` with `async_generation_ratio: 0`):
  `one_step_off` with a lag of 0, hybrid's synchronous training on separate engines;
- prompt groups streamed through the engines while the trainer trains, the weights pushed
  after every trainer step (SkyRL's fully async trainer, ROLL's `async_generation_ratio > 0`):
  `fully_async` with `trigger_parameter_sync_step=1`.

In both systems the trainer recomputes the log-probs of the data it trains on with its own
weights before the update (SkyRL's forward pass before training, ROLL's
`actor_train.compute_log_probs`), and the engine's log-probs only weigh the samples (their
truncated importance sampling); so `use_rollout_log_probs=false` (hybrid's default anchors
PPO on the engine's log-probs, verl's bypass mode).
"""

from __future__ import annotations

import math
from typing import Any

ENGINE = "actor_rollout_ref.hybrid_engine"
AT = "async_training"
ENGINE_KEYS = (ENGINE, "rollout.nnodes", "rollout.n_gpus_per_node")
SCHEDULE_KEYS = (
    f"{AT}.mode",
    f"{AT}.staleness_threshold",
    f"{AT}.max_staleness_steps",
    f"{AT}.trigger_parameter_sync_step",
    f"{AT}.require_batches",
    f"{AT}.partial_rollout",
    f"{AT}.use_rollout_log_probs",
    f"{AT}.max_groups_in_flight",
)


def engines_apart(nnodes: int, n_gpus_per_node: int) -> dict[str, Any]:
    """The rollout engines in Ray actors of their own, on nnodes x n_gpus_per_node devices."""
    return {ENGINE: False, "rollout.nnodes": int(nnodes), "rollout.n_gpus_per_node": int(n_gpus_per_node)}


def in_turn_apart() -> dict[str, Any]:
    """Generation and training in turn, the engines apart: each step's batch is generated with
    the weights the trainer holds at that step (one_step_off at lag 0, the synchronous
    trainer's batches)."""
    return {f"{AT}.mode": "one_step_off", f"{AT}.max_staleness_steps": 0, f"{AT}.use_rollout_log_probs": False}


def streamed(ahead: float, bound: int, require_batches: int = 1, in_flight: int | None = None) -> dict[str, Any]:
    """Prompt groups streamed through the engines; a trainer step takes `require_batches x
    ppo_mini_batch_size` groups; weights pushed after every step (a sync window is one step);
    generation at most `ahead` steps' worth of groups ahead of training (verl's
    staleness_threshold) and no group trained more than `bound` pushes old; a push aborts the
    turns in flight, which are sampled again on the new weights."""
    out: dict[str, Any] = {
        f"{AT}.mode": "fully_async",
        f"{AT}.staleness_threshold": float(ahead),
        f"{AT}.max_staleness_steps": int(bound),
        f"{AT}.trigger_parameter_sync_step": 1,
        f"{AT}.require_batches": int(require_batches),
        f"{AT}.partial_rollout": True,
        f"{AT}.use_rollout_log_probs": False,
    }
    if in_flight is not None:
        out[f"{AT}.max_groups_in_flight"] = int(in_flight)
    return out


def whole(value: Any) -> bool:
    """A whole number (not a bool): 2, or 2.0."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer()


def ceil(value: float) -> int:
    return int(math.ceil(value))


__all__ = [
    "AT",
    "ENGINE",
    "ENGINE_KEYS",
    "SCHEDULE_KEYS",
    "ceil",
    "engines_apart",
    "in_turn_apart",
    "streamed",
    "whole",
]
