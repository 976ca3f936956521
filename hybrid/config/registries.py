"""The names each config choice may take, read from the registries that implement them.

One list exists per concept: the code that runs a choice registers it, and the config
accepts exactly what is registered at validation time (after the plug-in modules of
`actor_rollout_ref.model.external_lib` were imported). Functions, not constants, so a
registration made later is seen.
"""

from __future__ import annotations

# `full` needs log-probs over the whole vocabulary; the workers keep only the sampled
# tokens' (as verl does), so it cannot run from the config.
KL_FULL_REASON = (
    "the 'full' KL needs log-probs over the whole vocabulary for every token, and the workers keep only the "
    "sampled tokens' log-probs (as verl's FSDP workers do); use low_var_kl (k3), kl (k1), mse (k2) or abs"
)


def adv_estimators() -> tuple[str, ...]:
    from hybrid.core_algos import ADV_ESTIMATOR_REGISTRY

    return tuple(ADV_ESTIMATOR_REGISTRY)


def policy_losses() -> tuple[str, ...]:
    from workers.losses import POLICY_LOSS_REGISTRY

    return tuple(POLICY_LOSS_REGISTRY)


def loss_agg_modes() -> tuple[str, ...]:
    from workers.losses import AGG_LOSS_MODES

    return tuple(AGG_LOSS_MODES)


def kl_kinds() -> tuple[str, ...]:
    """KL estimators a config may name (`<kind>+` adds a straight-through gradient)."""
    from workers.losses import KL_PENALTY_KINDS

    return tuple(kind for kind in KL_PENALTY_KINDS if kind != "full")


def reward_managers() -> tuple[str, ...]:
    from reward.manager import REWARD_MANAGER_REGISTRY

    return tuple(REWARD_MANAGER_REGISTRY)


def loggers() -> tuple[str, ...]:
    from hybrid.tracking import SUPPORTED_BACKENDS

    return tuple(SUPPORTED_BACKENDS)


def checkpoint_contents() -> tuple[str, ...]:
    from workers.checkpoint import CONTENTS

    return tuple(CONTENTS)


REGISTRIES = {
    "algorithm.adv_estimator": adv_estimators,
    "actor_rollout_ref.actor.policy_loss.loss_mode": policy_losses,
    "actor_rollout_ref.actor.loss_agg_mode": loss_agg_modes,
    "actor_rollout_ref.actor.kl_loss_type": kl_kinds,
    "algorithm.kl_penalty": kl_kinds,
    "reward_model.reward_manager": reward_managers,
    "trainer.logger": loggers,
}
