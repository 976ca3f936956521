"""Driver-side PPO-family algorithm math: advantage estimators, KL controllers, and the KL
penalty folded into rewards. Re-exports the device-side losses from ``workers.losses`` so
``from hybrid.core_algos import agg_loss, kl_penalty, get_policy_loss_fn`` works as in verl.

Advantage estimators live in a registry (``register_adv_est`` / ``get_adv_estimator_fn``), each
with an ``EstimatorSpec`` that states its facts: which inputs it takes (the trainer passes those
and ``config``, the algorithm section), whether it compares a prompt's responses (``index``
groups), whether it needs a critic (it takes ``values``) or a greedy baseline generation (it
takes ``reward_baselines``), and what besides each response's final score its advantages are
built from. Config rules, the driver and the rollout ask ``estimator_spec(name)`` instead of
comparing names (tests/unit/test_spec_names.py counts). All estimators take ``(B, T)`` tensors and
return ``(advantages, returns)`` shaped ``(B, T)``, zero where ``response_mask`` is 0, and
accept (and ignore) keywords they do not use, so verl-style calls with the whole superset work.

``index`` is a numpy array of group ids (the prompt uid of each response). Outcome
estimators use the sequence score ``token_level_rewards.sum(-1)``.

Differences from verl: GAE and REINFORCE++ zero their outputs on masked positions (verl
leaves whitened garbage there that the masked losses ignore); ``get_kl_controller`` raises
``ValueError`` naming the valid types; GAE and REINFORCE++ accept ``gamma``/``lam`` as
keywords and fall back to ``config``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import torch

from workers.losses import (
    AGG_LOSS_MODES,
    AGGREGATIONS,
    KL_PENALTY_KINDS,
    POLICY_LOSS_REGISTRY,
    AggregationSpec,
    PolicyLossSpec,
    agg_loss,
    aggregation_spec,
    apply_truncated_is,
    compute_entropy_loss,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_rollout_is,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    compute_value_loss,
    entropy_from_logits,
    get_policy_loss_fn,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    policy_loss_spec,
    register_policy_loss,
)
from workers.losses import __all__ as _losses_all

__all__ = list(_losses_all) + [
    "AdvantageEstimator",
    "ADV_ESTIMATOR_REGISTRY",
    "EstimatorSpec",
    "DEFAULT_ESTIMATOR_SPEC",
    "register_adv_est",
    "get_adv_estimator_fn",
    "estimator_spec",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_maxrl_advantage",
    "compute_simple_baseline_advantage",
    "compute_no_op_advantage",
    "FixedKLController",
    "AdaptiveKLController",
    "get_kl_controller",
    "kl_in_reward",
]

# ----------------------------------------------------------------------------- registry


class AdvantageEstimator(str, Enum):  # noqa: UP042 (StrEnum would change str() of a member)
    """The built-in estimators' names (``algorithm.adv_estimator``)."""

    GAE = "gae"
    GRPO = "grpo"
    RLOO = "rloo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    OPO = "opo"
    GPG = "gpg"


@dataclass(frozen=True)
class EstimatorSpec:
    """What an advantage estimator needs, stated where it is registered.

    ``inputs``: the keywords the trainer passes it (``config``, the algorithm section, always
    comes too): ``index`` is the rows' prompt uids; ``gamma``, ``lam`` and
    ``norm_adv_by_std_in_grpo`` are read from the algorithm section; any other name is the
    batch's column of that name (``values`` from the critic, ``reward_baselines`` from the
    greedy generation, or one the step already has, e.g. ``token_level_scores``).
    ``needs_groups``: its advantages compare the responses of one prompt (the ``index`` groups),
    so dynamic sampling (filter_groups) can keep or drop whole groups for it.
    ``beyond_outcome``: what, besides each response's final score, its advantages are built
    from ("" for an outcome estimator); a rule that needs one advantage per trajectory names it.
    """

    inputs: tuple[str, ...] = ("token_level_rewards", "response_mask", "index")
    needs_groups: bool = True
    beyond_outcome: str = ""

    @property
    def needs_critic(self) -> bool:
        """It takes the critic's ``values`` (GAE): a critic is built when critic.enable is null."""
        return "values" in self.inputs

    @property
    def greedy_baseline(self) -> bool:
        """It takes ``reward_baselines``: the score of a greedy generation per prompt (ReMax)."""
        return "reward_baselines" in self.inputs

    @property
    def outcome_only(self) -> bool:
        """Its advantages are one value per response, built from the final scores alone."""
        return not self.beyond_outcome


# The spec of an estimator registered without one (a user's ``@register_adv_est("name")``, as in
# verl): it is given the token-level rewards, the response mask and the prompt uids, and is
# taken to compare a prompt's responses from their final scores (GRPO-like).
DEFAULT_ESTIMATOR_SPEC = EstimatorSpec()

ADV_ESTIMATOR_REGISTRY: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}
_ESTIMATOR_SPECS: dict[str, EstimatorSpec] = {}


def _est_name(name_or_enum: str | AdvantageEstimator) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else str(name_or_enum)


def register_adv_est(name_or_enum: str | AdvantageEstimator, spec: EstimatorSpec | None = None) -> Callable:
    """Decorator registering an advantage estimator with its spec (``DEFAULT_ESTIMATOR_SPEC``
    when none is given); registering another function under a taken name raises (two
    estimators silently sharing a name is always a bug)."""
    if spec is not None and not isinstance(spec, EstimatorSpec):
        raise TypeError(f"register_adv_est({name_or_enum!r}): spec must be an EstimatorSpec, got {spec!r}")

    def decorator(fn):
        name = _est_name(name_or_enum)
        if name in ADV_ESTIMATOR_REGISTRY and ADV_ESTIMATOR_REGISTRY[name] is not fn:
            raise ValueError(f"Advantage estimator {name!r} is already registered: {ADV_ESTIMATOR_REGISTRY[name]}")
        ADV_ESTIMATOR_REGISTRY[name] = fn
        _ESTIMATOR_SPECS[name] = spec or DEFAULT_ESTIMATOR_SPEC
        return fn

    return decorator


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The registered advantage estimator called ``name_or_enum``."""
    name = _est_name(name_or_enum)
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(f"Unknown advantage estimator: {name!r}. Registered: {sorted(ADV_ESTIMATOR_REGISTRY)}")
    return ADV_ESTIMATOR_REGISTRY[name]


def estimator_spec(name_or_enum: str | AdvantageEstimator) -> EstimatorSpec:
    """The spec of the registered estimator ``name_or_enum`` (one registered into
    ``ADV_ESTIMATOR_REGISTRY`` directly, as verl's dict allows, has the default spec)."""
    name = _est_name(name_or_enum)
    get_adv_estimator_fn(name)  # an unknown name fails here, listing the registered ones
    return _ESTIMATOR_SPECS.get(name, DEFAULT_ESTIMATOR_SPEC)


def _cfg(config: Any, key: str) -> Any:
    if config is None:
        return None
    return config.get(key) if hasattr(config, "get") else getattr(config, key, None)


def _required(value: Any, config: Any, key: str, estimator: str) -> float:
    if value is None:
        value = _cfg(config, key)
    if value is None:
        raise ValueError(f"{estimator} needs {key}: pass {key}= or a config with algorithm.{key}")
    return float(value)


def _groups(index: np.ndarray, bsz: int) -> dict[Any, list[int]]:
    """Row numbers of each group id, in first-seen order."""
    if index is None:
        raise ValueError("this advantage estimator groups responses by prompt: pass index= (the uid of each row)")
    if len(index) != bsz:
        raise ValueError(f"index has {len(index)} entries but the batch has {bsz} rows")
    groups: dict[Any, list[int]] = defaultdict(list)
    for i in range(bsz):
        groups[index[i]].append(i)
    return groups


def _group_relative(
    scores: torch.Tensor,
    index: np.ndarray,
    per_group: Callable[[list[int]], torch.Tensor],
    singleton: Callable[[list[int]], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Each row's new score: `per_group(rows)` for the rows of a group of two or more,
    `singleton(rows)` for a group of one (by default it keeps its score)."""
    out = scores.clone()
    with torch.no_grad():
        for rows in _groups(index, scores.shape[0]).values():
            shaped = per_group if len(rows) > 1 else singleton
            if shaped is not None:
                out[rows] = shaped(rows)
    return out


def _outcome(per_row: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One value per row broadcast over its response tokens: (advantages, returns)."""
    adv = per_row.unsqueeze(-1) * response_mask
    return adv, adv


# ----------------------------------------------------------------------------- estimators


@register_adv_est(
    AdvantageEstimator.GAE,
    EstimatorSpec(
        ("token_level_rewards", "values", "response_mask", "gamma", "lam"),
        needs_groups=False,
        beyond_outcome="per-token values and returns",
    ),
)
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | None = None,
    lam: float | None = None,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (https://arxiv.org/abs/1506.02438), computed backwards over the response.

    ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}``, where masked
    positions are skipped (the next value and the running advantage carry across them).
    ``returns = A + V`` (before whitening); advantages are then whitened over the mask.
    """
    gamma = _required(gamma, config, "gamma", "gae")
    lam = _required(lam, config, "lam", "gae")
    mask = response_mask.to(values.dtype)
    with torch.no_grad():
        nextvalues = torch.zeros_like(values[:, 0])
        lastgaelam = torch.zeros_like(values[:, 0])
        reversed_adv = []
        for t in reversed(range(token_level_rewards.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            new_gaelam = delta + gamma * lam * lastgaelam
            nextvalues = values[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
            lastgaelam = new_gaelam * mask[:, t] + (1 - mask[:, t]) * lastgaelam
            reversed_adv.append(lastgaelam)
        advantages = torch.stack(reversed_adv[::-1], dim=1)
        returns = (advantages + values) * mask
        advantages = masked_whiten(advantages, mask) * mask
    return advantages, returns


@register_adv_est(
    AdvantageEstimator.GRPO, EstimatorSpec(("token_level_rewards", "response_mask", "index", "norm_adv_by_std_in_grpo"))
)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: ``(score - group mean) / (group std + epsilon)`` (unbiased std), or only the
    mean subtracted when ``norm_adv_by_std_in_grpo`` is False (Dr. GRPO). A group of one
    gets mean 0 and std 1, as verl. Broadcast over the response tokens."""
    scores = token_level_rewards.sum(dim=-1)

    def normalised(rows: list[int], mean=None, std=None) -> torch.Tensor:
        group = scores[rows]
        mean, std = (group.mean(), group.std()) if mean is None else (mean, std)
        return (group - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else group - mean

    return _outcome(_group_relative(scores, index, normalised, lambda rows: normalised(rows, 0.0, 1.0)), response_mask)


@register_adv_est(AdvantageEstimator.RLOO, DEFAULT_ESTIMATOR_SPEC)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (https://arxiv.org/abs/2402.14740): score minus the mean of the *other* responses
    of the group, ``n/(n-1) (score - group mean)``. A group of one keeps its raw score, as verl."""
    scores = token_level_rewards.sum(dim=-1)

    def leave_one_out(rows: list[int]) -> torch.Tensor:
        return (scores[rows] - scores[rows].mean()) * len(rows) / (len(rows) - 1)

    return _outcome(_group_relative(scores, index, leave_one_out), response_mask)


@register_adv_est(
    AdvantageEstimator.REINFORCE_PLUS_PLUS,
    EstimatorSpec(
        ("token_level_rewards", "response_mask", "gamma"),
        needs_groups=False,
        beyond_outcome="per-token discounted returns",
    ),
)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    gamma: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (https://arxiv.org/abs/2501.03262): discounted returns-to-go
    ``G_t = r_t + gamma G_{t+1}`` (reset on masked tokens), advantages = G whitened over the
    whole batch's mask. ``gamma`` falls back to ``config.gamma``."""
    gamma = _required(gamma, config, "gamma", "reinforce_plus_plus")
    mask = response_mask.to(token_level_rewards.dtype)
    with torch.no_grad():
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[1])):
            running = token_level_rewards[:, t] + gamma * running
            returns[:, t] = running
            running = running * mask[:, t]
        returns = returns * mask
        advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE, DEFAULT_ESTIMATOR_SPEC)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: score minus the group mean (0 for a group of one), broadcast over
    the response, then whitened over the whole batch's mask."""
    scores = token_level_rewards.sum(dim=-1)
    out = _group_relative(scores, index, lambda rows: scores[rows] - scores[rows].mean())
    with torch.no_grad():
        mask = response_mask.to(scores.dtype)
        tiled = out.unsqueeze(-1) * mask
        adv = masked_whiten(tiled, mask) * mask
    return adv, adv


@register_adv_est(
    AdvantageEstimator.REMAX,
    EstimatorSpec(
        ("token_level_rewards", "reward_baselines", "response_mask"),
        needs_groups=False,
        beyond_outcome="a greedy baseline rollout per prompt",
    ),
)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (https://arxiv.org/abs/2310.10505): returns-to-go (undiscounted) minus the
    reward of the greedy response, ``reward_baselines`` of shape (B,)."""
    mask = response_mask.to(token_level_rewards.dtype)
    with torch.no_grad():
        returns = (token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1]) * mask
        advantages = returns - reward_baselines.unsqueeze(-1) * mask
    return advantages, returns


@register_adv_est(
    AdvantageEstimator.OPO, EstimatorSpec(beyond_outcome="a baseline weighted by each whole response's length")
)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (https://arxiv.org/abs/2505.23585): score minus the length-weighted group baseline
    ``sum(len_j score_j) / sum(len_j)`` (0 for a group of one)."""
    scores = token_level_rewards.sum(dim=-1)
    lengths = response_mask.to(scores.dtype).sum(dim=-1)

    def length_weighted(rows: list[int]) -> torch.Tensor:
        return scores[rows] - (lengths[rows] * scores[rows]).sum() / lengths[rows].sum()

    return _outcome(_group_relative(scores, index, length_weighted), response_mask)


@register_adv_est(AdvantageEstimator.GPG, DEFAULT_ESTIMATOR_SPEC)
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (https://arxiv.org/abs/2504.02546): ``alpha (score - group mean) / f_norm`` with
    ``alpha = B / max(1, #rows with non-zero score)`` (group of one: mean 0).

    As in verl, ``alpha`` is always recomputed from the batch; the argument is accepted only
    so verl-style calls keep working."""
    scores = token_level_rewards.sum(dim=-1)
    batch_alpha = scores.shape[0] / max(1, int(torch.count_nonzero(scores).item()))

    def scaled(rows: list[int], mean=None) -> torch.Tensor:
        mean = scores[rows].mean() if mean is None else mean
        return batch_alpha * (scores[rows] - mean) / f_norm

    return _outcome(_group_relative(scores, index, scaled, lambda rows: scaled(rows, 0.0)), response_mask)


# SkyRL's estimators (--dialect skyrl, trainer.algorithm.advantage_estimator); verl has neither.


@register_adv_est("maxrl", DEFAULT_ESTIMATOR_SPEC)
def compute_maxrl_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SkyRL's MaxRL (ppo_utils.compute_maxrl_advantage): ``(score - group mean) / (group mean
    + epsilon)``, the group-relative reward normalised by the group's mean; a group of one keeps
    its raw score. Broadcast over the response tokens."""
    scores = token_level_rewards.sum(dim=-1)

    def mean_normalised(rows: list[int]) -> torch.Tensor:
        mean = scores[rows].mean()
        return (scores[rows] - mean) / (mean + epsilon)

    return _outcome(_group_relative(scores, index, mean_normalised), response_mask)


@register_adv_est("simple_baseline", EstimatorSpec(("token_level_rewards", "response_mask"), needs_groups=False))
def compute_simple_baseline_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config: Any = None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimator SkyRL's custom-estimator example registers
    (examples/train/algorithms/custom_advantage_estimator): the masked response reward minus
    the mean over the whole batch, no groups."""
    with torch.no_grad():
        rewards = (token_level_rewards * response_mask).sum(dim=-1, keepdim=True)
        adv = (rewards - rewards.mean()) * response_mask
    return adv, adv.clone()


@register_adv_est(
    "no_op",
    EstimatorSpec(
        ("token_level_rewards", "response_mask"),
        needs_groups=False,
        beyond_outcome="the token-level rewards themselves",
    ),
)
def compute_no_op_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config: Any = None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimator SkyRL's on-policy distillation example registers
    (examples/train/on_policy_distillation): the token-level rewards passed through as both the
    advantages and the returns (there, the teacher's per-token grades: hybrid/distillation.py)."""
    with torch.no_grad():
        adv = token_level_rewards * response_mask
    return adv, adv.clone()


# ----------------------------------------------------------------------------- KL control


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al., https://arxiv.org/abs/1909.08593):
    ``value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon``."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + proportional_error * n_steps / self.horizon


def get_kl_controller(kl_ctrl_config: Any) -> FixedKLController | AdaptiveKLController:
    """Build the controller from ``algorithm.kl_ctrl`` (``type``, ``kl_coef``, ``target_kl``, ``horizon``)."""
    kind = _cfg(kl_ctrl_config, "type")
    if kind == "fixed":
        return FixedKLController(kl_coef=_cfg(kl_ctrl_config, "kl_coef"))
    if kind == "adaptive":
        horizon = _cfg(kl_ctrl_config, "horizon")
        if horizon is None or horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {horizon}")
        return AdaptiveKLController(
            init_kl_coef=_cfg(kl_ctrl_config, "kl_coef"), target_kl=_cfg(kl_ctrl_config, "target_kl"), horizon=horizon
        )
    raise ValueError(f"Unknown algorithm.kl_ctrl.type: {kind!r}. Valid types: ['fixed', 'adaptive']")


def kl_in_reward(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: FixedKLController | AdaptiveKLController,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's ``apply_kl_penalty`` as a pure function: ``rewards = scores - beta * kl * mask``.

    The batch KL is the mean over sequences of each sequence's token-mean KL; the controller
    is updated with it (``n_steps`` = batch size). Metrics report that KL and the ``beta``
    that was applied (the value before the update).
    """
    kld = _kl_penalty_fn(old_log_prob, ref_log_prob, kl_penalty) * response_mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = float(torch.mean(masked_mean(kld, response_mask, axis=-1)).item())
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


# kl_in_reward's argument shadows the module-level function; keep a handle to the latter.
_kl_penalty_fn = kl_penalty
