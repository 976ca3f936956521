"""Device-side policy losses for PPO-family training: the policy-loss registry, the losses
registered in it (vanilla PPO, GSPO, Clip-Cov, KL-Cov, CISPO, SAPO, GPG, geo-mean, GLM-5's rollout_is) and the
REINFORCE loss of bypass mode; each registered loss carries a ``PolicyLossSpec`` (what it asks of its
batches: the config rules read it). The shared maths they are built from (masked statistics, log-probs and entropy
from logits, loss aggregation, KL estimators, the value and entropy losses) is in
workers/loss_math.py and re-exported here, so callers import all of it from this module.

Everything works on padded ``(batch, response_len)`` tensors with a ``response_mask`` and
imports only torch, the standard library and workers.loss_math, because workers must not
import the driver. A policy loss reads its settings from ``config``, the
``actor_rollout_ref.actor`` section (attribute access); the config holds every default, so
none is repeated here. Names and argument names follow verl's
``verl/trainer/ppo/core_algos.py``; ``hybrid.core_algos`` re-exports all of it.

Differences from verl, on purpose (those of the shared maths: workers/loss_math.py):
  * every policy loss returns the three metrics ``actor/pg_clipfrac``, ``actor/ppo_kl``,
    ``actor/pg_clipfrac_lower`` as detached tensors (zero where a loss has no such notion),
    so the actor can average them without branching and without a device sync per call;
  * every policy loss clamps the log-ratio to [-20, 20] before ``exp`` (verl skips it in
    clip_cov / kl_cov), and every one multiplies in the rollout-correction weights
    (``rollout_is_weights``, computed in workers/rollout_correction.py) through one helper;
  * an unknown policy loss name raises ``ValueError`` listing the registered ones.

``seq-mean-token-sum-norm`` divides by ``config.loss_scale_factor`` (verl 0.9's key; null:
the response horizon), as verl passes it through ``global_batch_info``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from workers.loss_math import (
    AGG_LOSS_MODES,
    AGGREGATIONS,
    KL_PENALTY_KINDS,
    AggregationSpec,
    agg_loss,
    aggregation_spec,
    compute_entropy_loss,
    compute_value_loss,
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "logprobs_from_logits",
    "entropy_from_logits",
    "AGG_LOSS_MODES",
    "AGGREGATIONS",
    "AggregationSpec",
    "aggregation_spec",
    "agg_loss",
    "KL_PENALTY_KINDS",
    "kl_penalty",
    "POLICY_LOSS_REGISTRY",
    "PolicyLossSpec",
    "register_policy_loss",
    "get_policy_loss_fn",
    "policy_loss_spec",
    "apply_truncated_is",
    "compute_policy_loss_vanilla",
    "compute_policy_loss_gspo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_cispo",
    "compute_policy_loss_sapo",
    "compute_policy_loss_gpg",
    "compute_policy_loss_rollout_is",
    "compute_value_loss",
    "compute_entropy_loss",
]

# ----------------------------------------------------------------------------- config access


def _clip_range(config: Any) -> tuple[float, float]:
    """(clip_ratio_low, clip_ratio_high); a null bound means clip_ratio (verl's rule)."""
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    return float(low), float(high)


# ----------------------------------------------------------------------------- policy losses

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
POLICY_LOSS_REGISTRY: dict[str, PolicyLossFn] = {}


class PolicyLossSpec(NamedTuple):
    """What a policy loss asks of its batches, stated where it is registered.

    ``row_mean_by``: the objective (named in refusals, e.g. "GMPO") when the loss is a mean over a
    micro-batch's rows whatever their response mask, so a row of mask 0 (a dummy row padding a
    mini-batch) would still count; "" for a loss aggregated through ``agg_loss`` over the mask."""

    row_mean_by: str = ""

    @property
    def rows_whatever_mask(self) -> bool:
        """Its loss averages over a micro-batch's rows whatever their response mask."""
        return bool(self.row_mean_by)


# The spec of a policy loss registered without one (a user's ``@register_policy_loss("name")``,
# as in verl): it aggregates through ``agg_loss`` over the response mask.
DEFAULT_POLICY_LOSS_SPEC = PolicyLossSpec()
_POLICY_LOSS_SPECS: dict[str, PolicyLossSpec] = {}


def register_policy_loss(name: str, spec: PolicyLossSpec | None = None) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss under ``name`` with its spec (``DEFAULT_POLICY_LOSS_SPEC``
    when none is given); a later registration replaces it, as verl."""
    if spec is not None and not isinstance(spec, PolicyLossSpec):
        raise TypeError(f"register_policy_loss({name!r}): spec must be a PolicyLossSpec, got {spec!r}")

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSS_REGISTRY[name] = fn
        _POLICY_LOSS_SPECS[name] = spec or DEFAULT_POLICY_LOSS_SPEC
        return fn

    return decorator


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The registered policy loss called ``name``."""
    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(f"Unsupported policy loss mode: {name!r}. Registered: {sorted(POLICY_LOSS_REGISTRY)}")
    return POLICY_LOSS_REGISTRY[name]


def policy_loss_spec(name: str) -> PolicyLossSpec:
    """The spec of the registered policy loss ``name`` (one put into ``POLICY_LOSS_REGISTRY``
    directly has the default spec)."""
    get_policy_loss_fn(name)  # an unknown name fails here, listing the registered ones
    return _POLICY_LOSS_SPECS.get(name, DEFAULT_POLICY_LOSS_SPEC)


def apply_truncated_is(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """``pg_losses`` times the rollout-correction importance weights, or unchanged without them.

    Every policy loss calls this after its own clipping, as verl 0.9 multiplies
    ``rollout_is_weights`` in. The weights (``workers/rollout_correction.py``: token or
    sequence level, truncated or IcePop-zeroed, maybe batch-normalised) arrive detached.
    """
    if rollout_is_weights is None:
        return pg_losses
    return pg_losses * rollout_is_weights


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    # exp of an unclamped log-ratio overflows on padding or after a bad step.
    return torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)


def _metrics(clipfrac: torch.Tensor | float, ppo_kl: torch.Tensor, clipfrac_lower: torch.Tensor | float, ref):
    def as_t(x):
        return x.detach() if torch.is_tensor(x) else torch.tensor(float(x), device=ref.device)

    return {
        "actor/pg_clipfrac": as_t(clipfrac),
        "actor/ppo_kl": as_t(ppo_kl),
        "actor/pg_clipfrac_lower": as_t(clipfrac_lower),
    }


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """PPO clip with asymmetric range and dual clip.

    ``r = exp(logp - old)``; ``L1 = -A r``; ``L2 = -A clip(r, 1 - low, 1 + high)``;
    ``Lc = max(L1, L2)``; for ``A < 0`` the loss is ``min(Lc, -A c)`` with ``c = clip_ratio_c``
    (dual clip, https://arxiv.org/abs/1912.09729). ``pg_clipfrac``: share of tokens with
    ``L2 > L1``; ``pg_clipfrac_lower``: share with ``A < 0`` and ``Lc > -A c``.
    """
    low, high = _clip_range(config)
    clip_ratio_c = float(config.clip_ratio_c)
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip lower bound) must be > 1.0, got {clip_ratio_c}")
    neg_kl = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(neg_kl)
    ppo_kl = masked_mean(-neg_kl, response_mask)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = masked_mean((torch.gt(clip_pg_losses1, pg_losses3) & (advantages < 0)).float(), response_mask)

    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_losses = apply_truncated_is(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, config.loss_scale_factor)
    return pg_loss, _metrics(pg_clipfrac, ppo_kl, pg_clipfrac_lower, pg_loss)


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode="seq-mean-token-mean",
    config=None,
    rollout_is_weights=None,
):
    """GSPO (https://arxiv.org/abs/2507.18071): a sequence-level ratio, the geometric mean of
    the token ratios, ``s_i = exp(mean_t(logp - old))``, clipped PPO-style.

    Per token the ratio is ``sg[s_i] * pi / sg[pi]`` (value ``s_i``, gradient of the token's
    log-prob), its log clamped at 10. The loss is aggregated by ``loss_agg_mode``
    (``actor.loss_agg_mode``), as verl 0.9 does; the paper's objective is
    ``seq-mean-token-mean``, which a GSPO run should set (verl's GSPO example does). verl 0.6 to
    0.8 hard-coded ``seq-mean-token-mean`` here. ``pg_clipfrac_lower`` is 0.
    """
    low, high = _clip_range(config)
    neg_kl = log_prob - old_log_prob
    seq_len = response_mask.to(log_prob.dtype).sum(dim=-1).clamp(min=1)
    neg_kl_seq = masked_sum(neg_kl, response_mask, axis=-1) / seq_len
    log_seq_ratio = log_prob - log_prob.detach() + neg_kl_seq.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(log_seq_ratio, max=10.0))

    pg_losses1 = -advantages * seq_ratio
    pg_losses2 = -advantages * torch.clamp(seq_ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    pg_losses = apply_truncated_is(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, config.loss_scale_factor)

    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    ppo_kl = masked_mean(-_log_ratio(log_prob, old_log_prob), response_mask)
    return pg_loss, _metrics(pg_clipfrac, ppo_kl, 0.0, pg_loss)


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """Clip-Cov (https://arxiv.org/abs/2505.22617): PPO clip, plus the gradient of a few
    tokens with large advantage/log-prob covariance is cut.

    ``cov = (A - mean A) (logp - mean logp)`` over valid tokens. Candidates: valid tokens not
    already clipped by PPO with ``clip_cov_lb < cov < clip_cov_ub``; up to
    ``max(1, int(clip_cov_ratio * n_valid))`` of them, drawn at random, get their loss
    multiplied by 0. ``pg_clipfrac`` is the share of cut tokens; ``pg_clipfrac_lower`` is 0.
    """
    low, high = _clip_range(config)
    clip_cov_ratio = float(config.policy_loss.clip_cov_ratio)
    clip_cov_lb = float(config.policy_loss.clip_cov_lb)
    clip_cov_ub = float(config.policy_loss.clip_cov_ub)
    if clip_cov_ratio <= 0:
        raise ValueError(f"policy_loss.clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    neg_kl = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(neg_kl)
    ppo_kl = masked_mean(-neg_kl, response_mask)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    valid = response_mask > 0
    with torch.no_grad():
        clip_by_origin = (pg_losses2 > pg_losses1) & valid
        logp = log_prob.detach()
        cov = (advantages - masked_mean(advantages, response_mask)) * (logp - masked_mean(logp, response_mask))
        candidates = torch.nonzero((cov > clip_cov_lb) & (cov < clip_cov_ub) & valid & ~clip_by_origin)
        clip_num = max(int(clip_cov_ratio * int(valid.sum().item())), 1)
        corr = torch.ones_like(advantages)
        if len(candidates) > 0:
            pick = torch.randperm(len(candidates), device=candidates.device)[: min(clip_num, len(candidates))]
            chosen = candidates[pick]
            corr[chosen[:, 0], chosen[:, 1]] = 0
    pg_clipfrac = masked_mean((corr == 0).float(), response_mask)

    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    pg_losses = apply_truncated_is(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, config.loss_scale_factor)
    return pg_loss, _metrics(pg_clipfrac, ppo_kl, 0.0, pg_loss)


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """KL-Cov (https://arxiv.org/abs/2505.22617): unclipped ``-A r``, except on the
    ``max(1, int(kl_cov_ratio * n_valid))`` valid tokens with the largest covariance
    ``(A - mean A)(logp - mean logp)``, whose loss is ``-A r + ppo_kl_coef * |logp - old|``.

    ``actor/ppo_kl`` is the masked mean of ``|logp - old|`` (as verl); the clip fractions are 0.
    """
    kl_cov_ratio = float(config.policy_loss.kl_cov_ratio)
    ppo_kl_coef = float(config.policy_loss.ppo_kl_coef)
    if kl_cov_ratio <= 0:
        raise ValueError(f"policy_loss.kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    neg_kl = _log_ratio(log_prob, old_log_prob)
    abs_kl = neg_kl.abs()
    ratio = torch.exp(neg_kl)
    ppo_kl_abs = masked_mean(abs_kl, response_mask)
    pg_losses = -advantages * ratio
    valid = response_mask > 0
    n_valid = int(valid.sum().item())
    if n_valid > 0:
        with torch.no_grad():
            adv_v = advantages[valid].detach().float()
            logp_v = log_prob[valid].detach().float()
            cov = (adv_v - adv_v.mean()) * (logp_v - logp_v.mean())
            top = torch.topk(cov, max(1, int(n_valid * kl_cov_ratio))).indices
            penalised = torch.zeros(n_valid, dtype=torch.bool, device=cov.device)
            penalised[top] = True
            select = torch.zeros_like(valid)
            select[valid] = penalised
        pg_losses = torch.where(select, pg_losses + ppo_kl_coef * abs_kl, pg_losses)
    pg_losses = apply_truncated_is(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, config.loss_scale_factor)
    return pg_loss, _metrics(0.0, ppo_kl_abs, 0.0, pg_loss)


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """CISPO (https://arxiv.org/abs/2506.13585): clip the importance weight, not the update.

    ``L = -sg[clip(r, 1 - low, 1 + high)] * A * logp``: every token keeps a gradient (through
    ``logp``), scaled by the detached clipped ratio. ``pg_clipfrac``: share of tokens whose
    ratio was clipped; ``pg_clipfrac_lower`` is 0.
    """
    low, high = _clip_range(config)
    neg_kl = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(neg_kl)
    ppo_kl = masked_mean(-neg_kl, response_mask)
    clipped = torch.clamp(ratio, 1 - low, 1 + high)
    pg_losses = -clipped.detach() * advantages * log_prob
    pg_clipfrac = masked_mean((ratio != clipped).float(), response_mask)
    pg_losses = apply_truncated_is(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, config.loss_scale_factor)
    return pg_loss, _metrics(pg_clipfrac, ppo_kl, 0.0, pg_loss)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode="seq-mean-token-mean",
    config=None,
    rollout_is_weights=None,
):
    """SAPO, Soft Adaptive Policy Optimization (https://arxiv.org/abs/2511.20347).

    A smooth gate replaces the hard clip: with ``r = exp(logp - old)`` and
    ``tau = sapo_tau_pos if A > 0 else sapo_tau_neg``,

        f(r) = (4 / tau) * sigmoid(tau * (r - 1)),      L = -f(r) * A.

    ``f'(1) = 1``, so on-policy the gradient equals the vanilla policy gradient; off-policy it
    decays smoothly (faster for negative advantages when ``tau_neg > tau_pos``). As in verl
    the loss is always aggregated ``seq-mean-token-mean``. There is no clipping, so both clip
    fractions are 0.
    """
    tau_pos = float(config.policy_loss.sapo_tau_pos)
    tau_neg = float(config.policy_loss.sapo_tau_neg)
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"SAPO temperatures must be > 0, got sapo_tau_pos={tau_pos}, sapo_tau_neg={tau_neg}")
    neg_kl = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(neg_kl)
    ppo_kl = masked_mean(-neg_kl, response_mask)
    taus = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    pg_losses = -gates * advantages
    pg_losses = apply_truncated_is(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean")
    return pg_loss, _metrics(0.0, ppo_kl, 0.0, pg_loss)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """GPG (https://arxiv.org/abs/2504.02546): plain policy gradient ``L = -logp * A``, no ratio.
    ``actor/ppo_kl`` is still reported for monitoring; the clip fractions are 0."""
    pg_losses = -log_prob * advantages
    pg_losses = apply_truncated_is(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, config.loss_scale_factor)
    ppo_kl = masked_mean(-_log_ratio(log_prob, old_log_prob), response_mask)
    return pg_loss, _metrics(0.0, ppo_kl, 0.0, pg_loss)


@register_policy_loss("geo_mean", PolicyLossSpec(row_mean_by="GMPO"))
def compute_policy_loss_geo_mean(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """GMPO (https://arxiv.org/abs/2507.20673), verl's ``geo_mean``: the sequence ratio is the
    geometric mean of the token ratios, each token's log-ratio first clipped PPO-style on the
    side its advantage's sign picks (``sgn(A) * min(sgn(A) r, sgn(A) clip(r))`` in log space);
    the loss is ``-mean_t(A) * ratio`` per sequence, averaged over the micro-batch's rows
    whatever ``loss_agg_mode`` says (verl's definition, sequence-level advantages). Token
    importance weights enter as their geometric mean per sequence. The clip fractions count
    tokens whose log-ratio was clipped, by the sign of their advantage."""
    low, high = _clip_range(config)
    mask = response_mask.to(log_prob.dtype)
    neg_kl = log_prob - old_log_prob
    sign = torch.sign(advantages)
    neg_kl_clamped = torch.clamp(neg_kl, -low, high)
    neg_kl_min = sign * torch.minimum(sign * neg_kl, sign * neg_kl_clamped)
    tokens = mask.sum(dim=-1)
    ratio = torch.exp((neg_kl_min * mask).sum(dim=-1) / (tokens + 1e-8))
    advantage = (advantages * mask).sum(dim=-1) / (tokens + 1e-8)
    pg_losses = -advantage * ratio
    if rollout_is_weights is not None:
        pg_losses = pg_losses * torch.exp((torch.log(rollout_is_weights + 1e-10) * mask).sum(dim=-1) / (tokens + 1e-8))
    pg_loss = pg_losses.mean()
    clipped = torch.ne(neg_kl, neg_kl_clamped)
    clipfrac = masked_mean((clipped & (advantages > 0)).float(), response_mask)
    clipfrac_lower = masked_mean((clipped & (advantages < 0)).float(), response_mask)
    return pg_loss, _metrics(clipfrac, masked_mean(-neg_kl, response_mask), clipfrac_lower, pg_loss)


@register_policy_loss("rollout_is")
def compute_policy_loss_rollout_is(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """GLM-5's agentic loss (section 4.1.2 of https://arxiv.org/abs/2602.15763), SkyRL's
    ``policy_loss_type=rollout_is``: ``L = -sg[f(r)] * A * logp`` with ``r = exp(logp - old)``
    and ``f(r) = r`` strictly inside ``(1 - clip_ratio_low, 1 + clip_ratio_high)``, 0 outside:
    a token whose ratio left the band has no gradient at all (CISPO clamps it instead). The
    anchor is meant to be the engine's log-probs: run it in bypass mode
    (``algorithm.rollout_correction.bypass_mode=true``, or asynchronous training with
    ``use_rollout_log_probs``), where ``old_log_prob`` is ``rollout_log_probs``.
    ``pg_clipfrac``: share of tokens outside the band; ``pg_clipfrac_lower`` is 0.
    """
    low, high = _clip_range(config)
    neg_kl = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(neg_kl)
    ppo_kl = masked_mean(-neg_kl, response_mask)
    in_band = (ratio > 1 - low) & (ratio < 1 + high)
    calibrated = torch.where(in_band, ratio, torch.zeros_like(ratio))
    pg_losses = -calibrated.detach() * advantages * log_prob
    pg_clipfrac = masked_mean((~in_band).float(), response_mask)
    pg_losses = apply_truncated_is(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, config.loss_scale_factor)
    return pg_loss, _metrics(pg_clipfrac, ppo_kl, 0.0, pg_loss)


def compute_policy_loss_reinforce(
    rollout_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode="token-mean",
    config=None,
    rollout_is_weights=None,
):
    """REINFORCE against the rollout engine (verl 0.9's ``loss_type=reinforce`` in bypass mode):
    ``L = -A * w * logp`` with the detached weights ``w`` (pi_theta / pi_rollout; none when
    ``rollout_is`` is off), no ratio and no clipping. Not a ``loss_mode``: bypass mode picks it.
    ``actor/ppo_kl`` is the masked mean of ``rollout_log_prob - logp``; the clip fractions are 0.
    """
    pg_losses = -advantages * log_prob
    pg_losses = apply_truncated_is(pg_losses, rollout_is_weights)
    scale = None if config is None else config.loss_scale_factor  # config may be left out here
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, scale)
    ppo_kl = masked_mean(rollout_log_prob - log_prob.detach(), response_mask)
    return pg_loss, _metrics(0.0, ppo_kl, 0.0, pg_loss)
