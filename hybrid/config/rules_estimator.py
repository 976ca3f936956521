"""The rules of the advantage estimator across keys (hybrid/config/rules.py runs them), each read
from the estimator's spec (`EstimatorSpec` in hybrid/core_algos.py), never from its name: dynamic
sampling needs prompt groups, a greedy baseline rollout is single-turn, PF-PPO and a disabled
critic need to know whether it takes values. The rules of asynchronous training and of step-wise
trajectories ask the same spec in their own modules."""

from __future__ import annotations

from hybrid.config.schema import HybridConfig
from hybrid.core_algos import estimator_spec
from protocol.config_schema import INVALID, Problems, valid

ARR = "actor_rollout_ref"


def check_estimator(config: HybridConfig, problems: Problems) -> None:
    algo, arr = config.algorithm, config.actor_rollout_ref
    name = algo.adv_estimator
    if not valid(name):
        return
    spec = estimator_spec(name)
    if algo.filter_groups.enable is True and not spec.needs_groups:
        problems.add(
            f"algorithm.filter_groups.enable=True filters groups of responses per prompt, but "
            f"algorithm.adv_estimator={name!r} has no groups; use a group estimator "
            f"(e.g. grpo) or set algorithm.filter_groups.enable=false"
        )
    if arr.rollout.multi_turn.enable is True and spec.greedy_baseline:
        problems.add(
            f"algorithm.adv_estimator={name!r} with {ARR}.rollout.multi_turn.enable=True: its greedy baseline rollout "
            f"is single-turn; choose grpo, rloo or another group estimator"
        )
    if algo.use_pf_ppo is True and not spec.needs_critic:
        problems.add(
            "algorithm.use_pf_ppo=True resamples the batch after GAE's advantages (verl applies it with gae "
            f"only), but algorithm.adv_estimator={name!r} takes no values; set adv_estimator=gae or use_pf_ppo=false"
        )
    if config.critic is not INVALID and config.critic.enable is False and spec.needs_critic:
        problems.add(
            f"algorithm.adv_estimator={name!r} needs a value function but critic.enable=False; "
            "set critic.enable=true (or null) or choose another estimator"
        )


__all__ = ["check_estimator"]
