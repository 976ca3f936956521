"""Values derived from several sections, computed once on the checked config and stored in
the worker sections' derived fields (protocol/config_schema.derived), so every reader takes
them from there and none recomputes them:

- `rollout_n`, `data_parallel_size` (world size / ulysses size) of the actor and critic,
  from which their `mini_batch_samples_per_rank` follows (verl counts prompts per mini-batch);
- `share_prompts`: prompt-once packing, `use_prefix_grouper` resolved for each model;
- the actor's `correction`: `algorithm.rollout_correction` (or the older
  `actor.tis_imp_ratio_cap`) parsed into the settings the update applies;
- the actor's `on_policy_update`: whether the driver skips the old log-prob pass.
"""

from __future__ import annotations

from dataclasses import replace

from hybrid.config.schema import HybridConfig
from workers.config import shares_prompts
from workers.rollout_correction_settings import CorrectionSettings


def with_derived_values(config: HybridConfig, world_size: int | None = None) -> HybridConfig:
    """`config` with the derived fields filled; `world_size` (training ranks) defaults to
    trainer.nnodes x trainer.n_gpus_per_node."""
    world = world_size or config.world_size
    arr = config.actor_rollout_ref
    n = arr.rollout.n
    actor = arr.actor
    correction = CorrectionSettings.from_config(config.algorithm.rollout_correction, actor.tis_imp_ratio_cap)
    actor = replace(
        actor,
        rollout_n=n,
        data_parallel_size=max(world // actor.ulysses_sequence_parallel_size, 1),
        share_prompts=shares_prompts(actor.use_prefix_grouper, n, arr.model.use_remove_padding),
        correction=correction,
        on_policy_update=_on_policy_update(config, correction),
    )
    critic = replace(
        config.critic,
        rollout_n=n,
        data_parallel_size=max(world // config.critic.ulysses_sequence_parallel_size, 1),
        # One switch for every model that trains (the actor's key), each with its own packing.
        share_prompts=shares_prompts(actor.use_prefix_grouper, n, config.critic.model.use_remove_padding),
    )
    return replace(config, actor_rollout_ref=replace(arr, actor=actor), critic=critic)


def _on_policy_update(config: HybridConfig, correction: CorrectionSettings | None) -> bool:
    """True when the actor update is one optimizer step on the whole batch with nothing else
    reading old log-probs: they then equal the update's own forward pass, so the separate
    pass is skipped (actor.skip_old_log_prob_on_policy). Rollout correction in bypass mode
    anchors on the engine's log-probs instead; decoupled correction with rejection or
    batch-normalised weights reads the whole batch's old log-probs before the update, so it
    keeps the pass."""
    actor, algorithm = config.actor_rollout_ref.actor, config.algorithm
    return (
        actor.skip_old_log_prob_on_policy
        and actor.ppo_epochs == 1
        and actor.ppo_mini_batch_size >= config.data.train_batch_size
        and not algorithm.use_kl_in_reward
        and not algorithm.filter_groups.enable
        and not (correction is not None and (correction.bypass or correction.needs_whole_batch))
    )


__all__ = ["with_derived_values"]
