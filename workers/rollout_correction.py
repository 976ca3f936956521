"""Off-policy rollout correction (verl 0.9's `algorithm.rollout_correction`) as tensor functions.

The engine that sampled a response (vLLM in bf16, an older checkpoint) is not exactly the
policy the trainer differentiates. Three policies meet in one update: pi_rollout (the
engine's log-probs, `rollout_log_probs`), pi_old (the PPO anchor) and pi_theta (trained).
Decoupled mode corrects pi_old / pi_rollout; bypass mode makes pi_rollout the anchor and, for
the policy-gradient loss, corrects pi_theta / pi_rollout. What this module computes:

* importance weights, per token (`token`: w_t = exp(lr_t)) or per sequence (`sequence`:
  w = exp(sum_t lr_t), the same for every token of the row), `lr` the log-ratio clamped to
  [-20, 20] (SAFETY_BOUND) before `exp`; zero on padding; truncated at an upper bound (TIS)
  or zeroed outside [lower, upper] (IcePop, threshold "lower_upper"); detached; optionally
  divided by their mean over the batch (tokens for `token`, sequences for `sequence`);
* rejection sampling: a token (token_*) or a whole sequence (seq_sum_*, seq_mean_*, seq_max_*)
  leaves the loss when its divergence statistic is out of bounds: k1 = -lr between
  log(lower) and log(upper) (so the bounds are on pi_rollout / pi_old, exactly as verl 0.9),
  k2 = lr^2 / 2 and k3 = exp(lr) - 1 - lr at most the upper bound; SkyRL's sequence masks
  (seq_geo_ratio, seq_prod_ratio) keep a sequence whose geometric mean or product of
  pi_old / pi_rollout (exp of the unclamped mean or sum of lr, clamped to [-20, 20]) lies in
  [lower, upper]; several options are ANDed;
* verl's `rollout_corr/...` metrics, kept as sufficient statistics (`Stats`: sums, maxima,
  minima) so micro-batches and ranks add up to exactly the numbers of the whole batch.

`CorrectionSettings.from_config` reads the `algorithm.rollout_correction` section (or the
older `actor.tis_imp_ratio_cap`, which is token TIS). Where the numbers are computed and what
"batch" means is the actor's business (workers/actor.py). This module holds the math and
re-exports the rest: the settings and their parsing (rollout_correction_settings.py), the
statistics and the metrics made from them (rollout_correction_metrics.py). Imports only
torch, the standard library and workers.losses: workers must not import the driver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from workers.losses import aggregation_spec, masked_mean, masked_sum
from workers.rollout_correction_metrics import AllReduce, Stats, correction_metrics
from workers.rollout_correction_settings import (
    _EPS,
    IS_LEVELS,
    LOSS_TYPES,
    OLDER_RS_NAMES,
    RS_OPTIONS,
    SAFETY_BOUND,
    CorrectionSettings,
    RejectionOption,
    parse_is_threshold,
    parse_rejection,
)

__all__ = [
    "SAFETY_BOUND",
    "IS_LEVELS",
    "RS_OPTIONS",
    "LOSS_TYPES",
    "OLDER_RS_NAMES",
    "RejectionOption",
    "CorrectionSettings",
    "Correction",
    "Stats",
    "parse_is_threshold",
    "parse_rejection",
    "importance_weights",
    "rejection_keep",
    "compute_correction",
    "rejected_loss_scale",
    "correction_metrics",
]


def _masked_extreme(values: torch.Tensor, keep: torch.Tensor, largest: bool) -> torch.Tensor:
    fill = -math.inf if largest else math.inf
    filled = values.masked_fill(~keep, fill)
    if filled.numel() == 0:
        return torch.tensor(fill, dtype=torch.float64)
    return filled.max() if largest else filled.min()


# ----------------------------------------------------------------------------- weights


def importance_weights(log_ratio: torch.Tensor, mask: torch.Tensor, settings: CorrectionSettings):
    """`(weights, raw, metric_log_ratio)`: truncated (or IcePop-zeroed) detached weights and
    the raw ones, both 0 on padding, and the log-ratio the metrics read (per token, or the
    unclamped per-sequence sum (B, 1))."""
    mask_f = mask.to(log_ratio.dtype)
    if settings.rollout_is == "token":
        metric_log_ratio = log_ratio
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        metric_log_ratio = masked_sum(log_ratio, mask_f, axis=-1).unsqueeze(-1)
        raw = torch.exp(metric_log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * mask_f
    if settings.is_lower is None:
        weights = raw.clamp(max=settings.is_upper)
    else:
        inside = (raw >= settings.is_lower) & (raw <= settings.is_upper)
        weights = torch.where(inside, raw, torch.zeros_like(raw))
    return weights.detach(), raw.detach(), metric_log_ratio.detach()


def _normalized(weights, mask, settings, all_reduce: AllReduce | None, stats: Stats) -> torch.Tensor:
    """The weights divided by their mean over the batch `all_reduce` spans (this tensor alone
    when None): over tokens for token weights, over sequences (each its weight) for sequence
    weights; left as they are when that mean is ~0."""
    mask_f = mask.to(weights.dtype)
    if settings.rollout_is == "token":
        total, count = masked_sum(weights, mask_f), mask_f.sum()
    else:
        rows = (mask_f.sum(-1) > 0).to(weights.dtype)
        total, count = (masked_mean(weights, mask_f, axis=-1) * rows).sum(), rows.sum()
    pair = torch.stack([total, count]).double()
    if all_reduce is not None:
        pair = all_reduce(pair, "sum")
    mean = pair[0] / pair[1].clamp(min=_EPS)
    factor = torch.where(mean > _EPS, mean, torch.ones_like(mean))
    stats.add("is_norm_factor", factor)
    stats.add("is_norm_count", torch.ones_like(factor))
    return weights / factor.to(weights.dtype)


def _add_is_stats(stats: Stats, weights, raw, metric_log_ratio, mask, settings: CorrectionSettings) -> None:
    """Sufficient statistics of verl's `compute_is_metrics` (weights before normalisation)."""
    mask_b = mask.bool()
    mask_f = mask.to(weights.dtype)
    upper = settings.is_upper
    lower = settings.is_lower if settings.is_lower is not None else 1.0 / upper
    clamped = weights.clamp(min=0.0, max=upper)
    stats.add("is_w", masked_sum(weights, mask_f))
    stats.add("is_wc", masked_sum(clamped, mask_f))
    stats.add("is_wc2", masked_sum(clamped.square(), mask_f))
    if settings.rollout_is == "token":
        stats.add("is_hi", masked_sum((raw > upper).to(mask_f.dtype), mask_f))
        stats.add("is_lo", masked_sum((raw < lower).to(mask_f.dtype), mask_f))
        stats.add_max("is_wmax", _masked_extreme(weights, mask_b, True))
        stats.add_min("is_wmin", _masked_extreme(weights, mask_b, False))
    else:
        seq_lr = metric_log_ratio.squeeze(-1)
        stats.add_max("is_lrmax", seq_lr.max())
        stats.add_min("is_lrmin", seq_lr.min())
        stats.add("is_rows_hi", (seq_lr > math.log(upper)).sum())
        stats.add("is_rows_lo", (seq_lr < math.log(lower)).sum())
    seq_w = masked_mean(weights, mask_f, axis=-1)
    raw_seq_w = masked_mean(raw, mask_f, axis=-1)
    stats.add("is_s", seq_w.sum())
    stats.add("is_s2", seq_w.square().sum())
    stats.add_max("is_smax", seq_w.max())
    stats.add_min("is_smin", seq_w.min())
    stats.add("is_raw_s_hi", (raw_seq_w > upper).sum())
    stats.add("is_raw_s_lo", (raw_seq_w < lower).sum())
    if settings.is_lower is not None:
        outside = (raw < settings.is_lower) | (raw > settings.is_upper)
        stats.add("is_oob", masked_sum(outside.to(mask_f.dtype), mask_f))


# ----------------------------------------------------------------------------- rejection


def _token_statistic(log_ratio: torch.Tensor, estimator: str) -> torch.Tensor:
    lr = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    if estimator == "k1":
        return -lr
    if estimator == "k2":
        return 0.5 * lr.square()
    return torch.exp(lr) - 1.0 - lr


def _sequence_statistic(token_stat: torch.Tensor, mask: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "sum":
        return masked_sum(token_stat, mask, axis=-1)
    if reduction == "mean":
        return masked_mean(token_stat, mask, axis=-1)
    largest = token_stat.masked_fill(~mask.bool(), -math.inf).max(dim=-1).values
    return torch.where(largest == -math.inf, torch.zeros_like(largest), largest)


def _sequence_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, reduction: str) -> torch.Tensor:
    """SkyRL's compute_sequence_mask statistic, op for op: the masked sum of the (unclamped)
    log-ratios, divided by the response length (at least 1) for `geo`, clamped to [-20, 20]
    in float32 and exponentiated."""
    total = (log_ratio * mask).sum(dim=-1)
    if reduction == "geo":
        total = total / mask.sum(dim=-1).clamp(min=1.0)
    ratio = total.to(torch.float32).clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    return ratio.to(log_ratio.dtype)


def rejection_keep(log_ratio: torch.Tensor, mask: torch.Tensor, options, stats: Stats | None = None) -> torch.Tensor:
    """(B, T) float keep mask, 1 where every option keeps the token (padding included): the
    response mask of the loss is `mask * keep`. Adds verl's RS statistics to `stats`."""
    mask_f = mask.to(log_ratio.dtype)
    mask_b = mask.bool()
    keep_all = torch.ones_like(log_ratio)
    for option in options:
        if option.estimator == "ratio":
            seq_stat = _sequence_ratio(log_ratio, mask_f, option.reduction)
            token_stat = seq_stat.unsqueeze(-1).expand_as(mask_f)
        else:
            token_stat = _token_statistic(log_ratio, option.estimator)
            seq_stat = None
            if option.reduction != "token":
                seq_stat = _sequence_statistic(token_stat, mask_f, option.reduction)
        stat = token_stat if seq_stat is None else seq_stat
        low, up = option.bounds
        kept = stat <= up if low is None else (stat >= low) & (stat <= up)
        kept = kept if seq_stat is None else kept.unsqueeze(-1).expand_as(mask_b)
        keep = kept.to(log_ratio.dtype)
        keep_all = keep_all * keep
        if stats is not None:
            per_token = token_stat if seq_stat is None else seq_stat.unsqueeze(-1).expand_as(mask_f)
            _add_rs_option_stats(stats, option, per_token, seq_stat, keep, mask_f)
    if stats is not None:
        stats.add("rs_rejected", masked_sum(1.0 - keep_all, mask_f))
        rejected_rows = ((keep_all < 0.5) & mask_b).any(dim=-1)
        stats.add("rs_rejected_rows", rejected_rows.sum())
    return keep_all


def _add_rs_option_stats(stats: Stats, option: RejectionOption, per_token, seq_stat, keep, mask_f) -> None:
    """Sufficient statistics of verl's `compute_rs_metrics` for one option."""
    p = f"rs_{option.name}_"
    low, up = option.bounds
    floor = low if low is not None else 0.0
    valid = mask_f.sum(-1) > 0
    seq_values = seq_stat if seq_stat is not None else masked_mean(per_token, mask_f, axis=-1)
    clamped = per_token.clamp(min=floor, max=up)
    stats.add(p + "x", masked_sum(per_token, mask_f))
    stats.add(p + "xc", masked_sum(clamped, mask_f))
    stats.add(p + "xc2", masked_sum(clamped.square(), mask_f))
    if seq_stat is None:
        stats.add_max(p + "xmax", _masked_extreme(per_token, mask_f.bool(), True))
        stats.add_min(p + "xmin", _masked_extreme(per_token, mask_f.bool(), False))
        stats.add(p + "hi", masked_sum((per_token > up).to(mask_f.dtype), mask_f))
        if low is not None:
            stats.add(p + "lo", masked_sum((per_token < low).to(mask_f.dtype), mask_f))
    stats.add(p + "v", seq_values[valid].sum())
    stats.add(p + "v2", seq_values[valid].square().sum())
    stats.add_max(p + "vmax", _masked_extreme(seq_values, valid, True))
    stats.add_min(p + "vmin", _masked_extreme(seq_values, valid, False))
    stats.add(p + "vhi", (seq_values[valid] > up).sum())
    if low is not None:
        stats.add(p + "vlo", (seq_values[valid] < low).sum())
    stats.add(p + "rejected", masked_sum(1.0 - keep, mask_f))
    stats.add(p + "rejected_rows", (((keep < 0.5) & mask_f.bool()).any(dim=-1) & valid).sum())


# ----------------------------------------------------------------------------- off-policy gap


def _add_offpolicy_stats(stats: Stats, old_log_prob, rollout_log_prob, mask) -> None:
    """Sufficient statistics of verl's `compute_offpolicy_metrics` (pi_old vs pi_rollout)."""
    mask_f = mask.to(old_log_prob.dtype)
    log_ratio = old_log_prob - rollout_log_prob
    old_mean = masked_mean(old_log_prob, mask_f, axis=-1)
    rollout_mean = masked_mean(rollout_log_prob, mask_f, axis=-1)
    diff = rollout_mean - old_mean
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq_sum = masked_sum(log_ratio, mask_f, axis=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    stats.add("tokens", mask_f.sum())
    stats.add("rows", torch.tensor(float(mask_f.shape[0]), device=mask_f.device))
    stats.add("valid_rows", (mask_f.sum(-1) > 0).sum())
    stats.add("op_train_ppl", torch.exp(-old_mean).sum())
    stats.add("op_train_logppl", (-old_mean).sum())
    stats.add("op_rollout_ppl", torch.exp(-rollout_mean).sum())
    stats.add("op_rollout_logppl", (-rollout_mean).sum())
    stats.add("op_kl", masked_sum(rollout_log_prob - old_log_prob, mask_f))
    # verl's k3_kl exponentiates the unclamped log-ratio.
    stats.add("op_k3", masked_sum(torch.exp(log_ratio) - log_ratio - 1, mask_f))
    stats.add("op_d", diff.sum())
    stats.add("op_absd", diff.abs().sum())
    stats.add_max("op_dmax", diff.max())
    stats.add_min("op_dmin", diff.min())
    stats.add("op_ppl_ratio", torch.exp(diff).sum())
    stats.add("op_rho2", masked_sum(torch.exp(safe).square(), mask_f))
    stats.add("op_rho2_seq", torch.exp(2.0 * seq_sum).sum())


# ----------------------------------------------------------------------------- one pass


@dataclass
class Correction:
    weights: torch.Tensor | None  # (B, T), detached; None without importance weights
    keep: torch.Tensor | None  # (B, T) 1 kept / 0 rejected; None without rejection
    stats: Stats


def compute_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    settings: CorrectionSettings,
    all_reduce: AllReduce | None = None,
) -> Correction:
    """Weights, rejection and statistics of one batch (verl's
    `compute_rollout_correction_and_rejection_mask`). `old_log_prob` is pi_old (decoupled)
    or the detached pi_theta (bypass). Batch normalisation averages over what `all_reduce`
    spans besides these rows (None: these rows only)."""
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"rollout correction: log-prob shapes {tuple(old_log_prob.shape)} and {tuple(rollout_log_prob.shape)} "
            f"and response mask {tuple(response_mask.shape)} must agree"
        )
    old_log_prob = old_log_prob.detach()
    rollout_log_prob = rollout_log_prob.detach().to(old_log_prob.dtype)
    log_ratio = old_log_prob - rollout_log_prob
    stats = Stats()
    weights = keep = None
    if settings.rollout_is is not None:
        weights, raw, metric_log_ratio = importance_weights(log_ratio, response_mask, settings)
        _add_is_stats(stats, weights, raw, metric_log_ratio, response_mask, settings)
        if settings.batch_normalize:
            weights = _normalized(weights, response_mask, settings, all_reduce, stats)
    if settings.rejection:
        keep = rejection_keep(log_ratio, response_mask, settings.rejection, stats)
    _add_offpolicy_stats(stats, old_log_prob, rollout_log_prob, response_mask)
    return Correction(weights, keep, stats)


def rejected_loss_scale(response_mask: torch.Tensor, kept_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Factor turning a loss aggregated over `kept_mask` into one whose denominator still
    counts every token (or sequence, for seq-mean-*) of `response_mask`: verl's bypass mode
    masks rejected tokens out of the numerator only (its global token count is taken first).
    token-sum has no denominator: 1."""
    aggregation = aggregation_spec(loss_agg_mode)
    if aggregation.summed:
        return torch.ones((), dtype=torch.float64, device=response_mask.device)
    if aggregation.seq_level:
        kept, total = (kept_mask.sum(-1) > 0).sum(), (response_mask.sum(-1) > 0).sum()
    else:
        kept, total = kept_mask.sum(), response_mask.sum()
    return kept.double() / total.double().clamp(min=1)
