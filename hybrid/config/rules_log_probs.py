"""The engine's log-probs of the sampled tokens (`actor_rollout_ref.rollout.calculate_log_probs`)
and what reads them; hybrid/config/rules.py runs the check, hybrid/rollouts.py drops them.

verl (rollout.calculate_log_probs, default false there) asks the engine for each sampled token's
log-prob only when true, and keeps them as `rollout_log_probs`; its asynchronous trainers assert
true. hybrid's default is true (ppo_trainer.yaml): the engine/trainer gap metric
(`rollout/logp_abs_diff_mean` / `_max`) is logged from them, and changing
that default would drop the metric from every existing run. With false (a verl script that sets
it, SkyRL's `generator.sampling_params.logprobs=null`) the batch carries no rollout_log_probs,
the gap metric is not logged, and everything that reads them is refused at start, one line each:
rollout correction (algorithm.rollout_correction rollout_is / rollout_rs / bypass_mode, the
actor's older tis_imp_ratio_cap) and asynchronous training anchored on them
(async_training.use_rollout_log_probs=true without compute_prox_log_prob: verl's bypass).
Rollouts.complete drops them from every generated batch the trainers train on (hybrid/rollouts.py).
"""

from __future__ import annotations

from hybrid.config.schema import HybridConfig
from protocol.config_schema import Problems, fmt, valid
from protocol.data_proto import DataProto

ROLLOUT = "actor_rollout_ref.rollout"
KEY = "rollout_log_probs"


def log_prob_readers(config: HybridConfig) -> list[str]:
    """The settings of `config` that read the engine's log-probs, as `key=value`."""
    readers = []
    correction = config.algorithm.rollout_correction
    if valid(correction):
        for name in ("rollout_is", "rollout_rs"):
            if getattr(correction, name) is not None:
                readers.append(f"algorithm.rollout_correction.{name}={fmt(getattr(correction, name))}")
        if correction.bypass_mode is True:
            readers.append("algorithm.rollout_correction.bypass_mode=true")
    actor = config.actor_rollout_ref.actor
    if valid(actor) and valid(actor.tis_imp_ratio_cap) and actor.tis_imp_ratio_cap > 0:
        readers.append(f"actor_rollout_ref.actor.tis_imp_ratio_cap={fmt(actor.tis_imp_ratio_cap)}")
    at = config.async_training
    if valid(at) and at.mode is not None and at.use_rollout_log_probs is True and at.compute_prox_log_prob is False:
        readers.append(
            f"async_training.mode={at.mode} and use_rollout_log_probs=true (the loss's anchor; "
            "use_rollout_log_probs=false computes old log-probs instead)"
        )
    return readers


def check_rollout_log_probs(config: HybridConfig, problems: Problems) -> None:
    rollout = config.actor_rollout_ref.rollout
    if not valid(rollout) or rollout.calculate_log_probs is not False:
        return
    for reader in log_prob_readers(config):
        problems.add(
            f"{ROLLOUT}.calculate_log_probs=false with {reader}: that reads the engine's log-probs "
            f"(rollout_log_probs), which are then not kept; set calculate_log_probs=true"
        )


def drop_unrequested(output: DataProto, config: HybridConfig) -> DataProto:
    """The generated batch without the engine's log-probs when calculate_log_probs is false."""
    if config.actor_rollout_ref.rollout.calculate_log_probs is False and KEY in output.batch.keys():
        output.pop(batch_keys=[KEY])
    return output


__all__ = ["check_rollout_log_probs", "drop_unrequested", "log_prob_readers"]
