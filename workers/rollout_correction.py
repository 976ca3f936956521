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
  k2 = lr^2 / 2 and k3 = exp(lr) - 1 - lr at most the upper bound; several options are ANDed;
* verl's `rollout_corr/...` metrics, kept as sufficient statistics (`Stats`: sums, maxima,
  minima) so micro-batches and ranks add up to exactly the numbers of the whole batch.

`CorrectionSettings.from_config` reads the `algorithm.rollout_correction` section (or the
older `actor.tis_imp_ratio_cap`, which is token TIS). Where the numbers are computed and what
"batch" means is the actor's business (workers/actor.py). Imports only torch, the standard
library and workers.losses: workers must not import the driver.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from workers.losses import masked_mean, masked_sum

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

# exp(20) ~ 4.9e8 and exp(-20) ~ 2e-9: the widest ratios that stay finite and meaningful.
SAFETY_BOUND = 20.0
IS_LEVELS = ("token", "sequence")
RS_OPTIONS = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)
LOSS_TYPES = ("ppo_clip", "reinforce")
# verl 0.6/0.7 named rejection by level (with rollout_rs_threshold_lower and a per-token veto);
# 0.8 and 0.9 name the statistic instead. These are the nearest 0.9 options.
OLDER_RS_NAMES = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}
_EPS = 1e-8

AllReduce = Callable[[torch.Tensor, str], torch.Tensor]  # (float64 values, "sum" | "max" | "min")


# ----------------------------------------------------------------------------- settings


def parse_is_threshold(spec: Any) -> tuple[float, float | None]:
    """`(upper, lower)` of `rollout_is_threshold`: a number (or numeric string) is the TIS
    upper bound (lower None); `"lower_upper"` gives IcePop's bounds. ValueError otherwise."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"{spec!r} must be a number or a 'lower_upper' string such as '0.5_5.0'")
    lower_text, sep, upper_text = str(spec).strip().partition("_")
    try:
        upper = float(upper_text if sep else lower_text)
        lower = float(lower_text) if sep else None
    except ValueError:
        raise ValueError(f"{spec!r} is neither a number nor 'lower_upper' (e.g. '0.5_5.0')") from None
    if not upper > 0:
        raise ValueError(f"{spec!r}: the upper bound must be positive")
    if lower is not None and not 0 < lower <= upper:
        raise ValueError(f"{spec!r}: the lower bound must be positive and at most the upper bound")
    return upper, lower


@dataclass(frozen=True)
class RejectionOption:
    """One rejection criterion: `name` from RS_OPTIONS; `lower`/`upper` as written (ratio
    bounds for k1 options, a divergence bound for k2/k3, whose `lower` is None)."""

    name: str
    lower: float | None
    upper: float

    @property
    def estimator(self) -> str:
        return self.name[-2:]

    @property
    def reduction(self) -> str:
        """`token`, or how a sequence's token statistics become one: `sum`, `mean`, `max`."""
        return "token" if self.name.startswith("token_") else self.name.split("_")[1]

    @property
    def bounds(self) -> tuple[float | None, float]:
        """The bounds in the statistic's own units: log-ratios for k1, as written otherwise."""
        if self.estimator == "k1":
            return math.log(self.lower), math.log(self.upper)
        return None, self.upper


def parse_rejection(options: str, thresholds: Any) -> tuple[RejectionOption, ...]:
    """`rollout_rs` (comma-separated options, repeats dropped) with `rollout_rs_threshold`
    (one entry for all, or one per option). A k1 entry is `lower_upper`, or one number u
    meaning `1/u_u`; k2/k3 entries are one positive upper bound. ValueError otherwise."""
    names = list(dict.fromkeys(part.strip() for part in str(options).split(",") if part.strip()))
    if not names:
        raise ValueError(f"{options!r} names no option; choose from {', '.join(RS_OPTIONS)}")
    for name in names:
        if name not in RS_OPTIONS:
            older = f" (verl 0.9 spells it {OLDER_RS_NAMES[name]})" if name in OLDER_RS_NAMES else ""
            raise ValueError(f"unknown option {name!r}{older}; choose from {', '.join(RS_OPTIONS)}")
    if thresholds is None or isinstance(thresholds, bool):
        raise ValueError("rejection needs rollout_rs_threshold (one entry, or one per option)")
    specs = [str(thresholds)] if isinstance(thresholds, (int, float)) else [
        part.strip() for part in str(thresholds).split(",") if part.strip()
    ]
    if len(specs) not in (1, len(names)):
        raise ValueError(f"{thresholds!r} has {len(specs)} entries for {len(names)} options; give one, or one per option")
    specs = specs * len(names) if len(specs) == 1 else specs
    return tuple(_rejection_option(name, spec) for name, spec in zip(names, specs))


def _rejection_option(name: str, spec: str) -> RejectionOption:
    lower_text, sep, upper_text = spec.partition("_")
    try:
        if name.endswith("k1"):
            upper = float(upper_text if sep else lower_text)
            lower = float(lower_text) if sep else 1.0 / upper
        elif sep:
            raise ValueError
        else:
            upper, lower = float(spec), None
    except (ValueError, ZeroDivisionError):
        form = "'lower_upper' or one number" if name.endswith("k1") else "one number (no '_')"
        raise ValueError(f"threshold {spec!r} for {name}: expected {form}") from None
    if not upper > 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"threshold {spec!r} for {name}: bounds must be positive, lower <= upper")
    return RejectionOption(name, lower, upper)


@dataclass(frozen=True)
class CorrectionSettings:
    """What the actor applies, resolved once from the config (thresholds parsed)."""

    rollout_is: str | None  # None, "token" or "sequence"
    is_upper: float
    is_lower: float | None  # IcePop when set
    batch_normalize: bool
    rejection: tuple[RejectionOption, ...]
    bypass: bool
    loss_type: str

    @classmethod
    def from_config(cls, section: Any, tis_imp_ratio_cap: float) -> CorrectionSettings | None:
        """Settings of `section` (algorithm.rollout_correction, or None when not given) and of
        verl's older `actor.tis_imp_ratio_cap` (> 0: token TIS at that cap, decoupled, which is
        `rollout_is=token, rollout_is_threshold=cap`). None when nothing is on."""
        cap = float(tis_imp_ratio_cap)
        on = section is not None and (
            section.rollout_is is not None or section.rollout_rs is not None or section.bypass_mode
        )
        if on and cap > 0:
            raise ValueError(
                f"actor.tis_imp_ratio_cap={cap} and algorithm.rollout_correction are both set; "
                f"write rollout_is=token rollout_is_threshold={cap} in algorithm.rollout_correction instead"
            )
        if not on:
            return cls("token", cap, None, False, (), False, "ppo_clip") if cap > 0 else None
        if section.loss_type not in LOSS_TYPES or (section.loss_type == "reinforce" and not section.bypass_mode):
            raise ValueError(f"loss_type={section.loss_type!r}: choose {' or '.join(LOSS_TYPES)}; reinforce needs bypass_mode")
        upper, lower = math.inf, None
        if section.rollout_is is not None:
            if section.rollout_is not in IS_LEVELS:
                raise ValueError(f"rollout_is={section.rollout_is!r}: choose {' or '.join(IS_LEVELS)} or null")
            upper, lower = parse_is_threshold(section.rollout_is_threshold)
        rejection = () if section.rollout_rs is None else parse_rejection(section.rollout_rs, section.rollout_rs_threshold)
        normalize = bool(section.rollout_is_batch_normalize) and section.rollout_is is not None
        return cls(section.rollout_is, upper, lower, normalize, rejection, bool(section.bypass_mode), section.loss_type)

    @property
    def needs_whole_batch(self) -> bool:
        """Decoupled rejection or batch-normalised weights change the loss of every micro-batch
        through numbers only the whole batch has (kept-token counts, the weights' mean), so
        the update needs old log-probs of all rows before its first backward pass."""
        return not self.bypass and (bool(self.rejection) or self.batch_normalize)


# ----------------------------------------------------------------------------- statistics


@dataclass
class Stats:
    """Named float64 statistics that add up over micro-batches (`merge`) and ranks
    (`reduce`): sums add, maxima take the largest, minima the smallest."""

    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    maxs: dict[str, torch.Tensor] = field(default_factory=dict)
    mins: dict[str, torch.Tensor] = field(default_factory=dict)

    def add(self, name: str, value: torch.Tensor) -> None:
        value = value.detach().double()
        self.sums[name] = self.sums[name] + value if name in self.sums else value

    def add_max(self, name: str, value: torch.Tensor) -> None:
        value = value.detach().double()
        self.maxs[name] = torch.maximum(self.maxs[name], value) if name in self.maxs else value

    def add_min(self, name: str, value: torch.Tensor) -> None:
        value = value.detach().double()
        self.mins[name] = torch.minimum(self.mins[name], value) if name in self.mins else value

    def merge(self, other: Stats) -> None:
        for name, value in other.sums.items():
            self.add(name, value)
        for name, value in other.maxs.items():
            self.add_max(name, value)
        for name, value in other.mins.items():
            self.add_min(name, value)

    def reduce(self, all_reduce: AllReduce) -> None:
        """Combine every rank's statistics (a collective: every rank calls it, same names)."""
        for kind, table in (("sum", self.sums), ("max", self.maxs), ("min", self.mins)):
            names = sorted(table)
            if names:
                reduced = all_reduce(torch.stack([table[n].to(torch.float64).reshape(()) for n in names]), kind)
                table.update({n: reduced[i] for i, n in enumerate(names)})

    def values(self) -> dict[str, float]:
        """Every statistic as a float (one device sync)."""
        names = [*self.sums, *self.maxs, *self.mins]
        if not names:
            return {}
        tensors = [*self.sums.values(), *self.maxs.values(), *self.mins.values()]
        flat = torch.stack([t.reshape(()).cpu() for t in tensors]).tolist()
        return dict(zip(names, flat))


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


def rejection_keep(log_ratio: torch.Tensor, mask: torch.Tensor, options, stats: Stats | None = None) -> torch.Tensor:
    """(B, T) float keep mask, 1 where every option keeps the token (padding included): the
    response mask of the loss is `mask * keep`. Adds verl's RS statistics to `stats`."""
    mask_f = mask.to(log_ratio.dtype)
    mask_b = mask.bool()
    keep_all = torch.ones_like(log_ratio)
    for option in options:
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
    masks rejected tokens out of the numerator only (its global token count is taken first)."""
    if loss_agg_mode.startswith("seq-mean"):
        kept, total = (kept_mask.sum(-1) > 0).sum(), (response_mask.sum(-1) > 0).sum()
    else:
        kept, total = kept_mask.sum(), response_mask.sum()
    return kept.double() / total.double().clamp(min=1)


# ----------------------------------------------------------------------------- metrics


def correction_metrics(values: dict[str, float], settings: CorrectionSettings) -> dict[str, float]:
    """verl 0.9's `rollout_corr/...` metrics from `Stats.values()` of the whole batch."""
    tokens, rows = values["tokens"], values["rows"]
    metrics = _offpolicy_metrics(values, tokens, rows)
    if settings.rollout_is is not None:
        metrics.update(_is_metrics(values, settings, tokens, rows))
    if settings.rejection:
        metrics["rollout_rs_masked_fraction"] = values["rs_rejected"] / (tokens + _EPS)
        metrics["rollout_rs_seq_masked_fraction"] = values["rs_rejected_rows"] / max(rows, 1.0)
        for option in settings.rejection:
            metrics.update(_rs_option_metrics(values, option, tokens, values["valid_rows"]))
    return {f"rollout_corr/{name}": float(value) for name, value in metrics.items()}


def _mean_std(total: float, total_sq: float, count: float, unbiased: bool) -> tuple[float, float]:
    """Mean and standard deviation from sums: unbiased as torch.std over rows, or biased
    with verl's masked_mean (count + 1e-8) over tokens."""
    if unbiased and count < 1:
        return 0.0, 0.0
    mean = total / (count + (0.0 if unbiased else _EPS))
    if unbiased:
        var = (total_sq - total * total / count) / (count - 1) if count > 1 else 0.0
    else:
        var = total_sq / (count + _EPS) - mean * mean
    return mean, math.sqrt(max(var, 0.0))


def _offpolicy_metrics(v: dict[str, float], tokens: float, rows: float) -> dict[str, float]:
    rows = max(rows, 1.0)
    return {
        "training_ppl": v["op_train_ppl"] / rows,
        "training_log_ppl": v["op_train_logppl"] / rows,
        "kl": v["op_kl"] / (tokens + _EPS),
        "k3_kl": v["op_k3"] / (tokens + _EPS),
        "rollout_ppl": v["op_rollout_ppl"] / rows,
        "rollout_log_ppl": v["op_rollout_logppl"] / rows,
        "log_ppl_diff": v["op_d"] / rows,
        "log_ppl_abs_diff": v["op_absd"] / rows,
        "log_ppl_diff_max": v["op_dmax"],
        "log_ppl_diff_min": v["op_dmin"],
        "ppl_ratio": v["op_ppl_ratio"] / rows,
        "chi2_token": v["op_rho2"] / (tokens + _EPS) - 1.0,
        "chi2_seq": v["op_rho2_seq"] / rows - 1.0,
    }


def _is_metrics(v: dict[str, float], settings: CorrectionSettings, tokens: float, rows: float) -> dict[str, float]:
    upper = settings.is_upper
    m = {"rollout_is_mean": v["is_w"] / (tokens + _EPS)}
    if settings.rollout_is == "token":
        m["rollout_is_ratio_fraction_high"] = v["is_hi"] / (tokens + _EPS)
        m["rollout_is_ratio_fraction_low"] = v["is_lo"] / (tokens + _EPS)
        m["rollout_is_max"], m["rollout_is_min"] = v["is_wmax"], v["is_wmin"]
    else:
        m["rollout_is_max"] = math.exp(min(v["is_lrmax"], SAFETY_BOUND))
        m["rollout_is_min"] = math.exp(v["is_lrmin"])
        m["rollout_is_ratio_fraction_high"] = v["is_rows_hi"] / rows
        m["rollout_is_ratio_fraction_low"] = v["is_rows_lo"] / rows
    clamped_mean, m["rollout_is_std"] = _mean_std(v["is_wc"], v["is_wc2"], tokens, unbiased=False)
    m["rollout_is_std"] = m["rollout_is_std"] if tokens > 1 else 0.0
    mean_sq = v["is_wc2"] / (tokens + _EPS)
    m["rollout_is_eff_sample_size"] = (clamped_mean + _EPS) ** 2 / mean_sq if mean_sq > 0 else float("nan")
    m["rollout_is_seq_mean"], m["rollout_is_seq_std"] = _mean_std(v["is_s"], v["is_s2"], rows, unbiased=True)
    m["rollout_is_seq_max"], m["rollout_is_seq_min"] = v["is_smax"], v["is_smin"]
    m["rollout_is_seq_max_deviation"] = max(v["is_smax"] - 1.0, 1.0 - v["is_smin"])
    m["rollout_is_seq_fraction_high"] = v["is_raw_s_hi"] / rows
    m["rollout_is_seq_fraction_low"] = v["is_raw_s_lo"] / rows
    if settings.is_lower is not None:
        m["rollout_is_oob_ratio"] = v["is_oob"] / (tokens + _EPS)
    if "is_norm_count" in v:
        m["rollout_is_batch_norm_factor"] = v["is_norm_factor"] / v["is_norm_count"]
    return m


def _rs_option_metrics(v: dict[str, float], option: RejectionOption, tokens: float, valid_rows: float) -> dict[str, float]:
    p, name = f"rs_{option.name}_", f"rollout_rs_{option.name}"
    low = option.bounds[0]
    m = {f"{name}_mean": v[p + "x"] / (tokens + _EPS)}
    seq_mean, seq_std = _mean_std(v[p + "v"], v[p + "v2"], valid_rows, unbiased=True)
    if option.reduction == "token":
        m[f"{name}_max"], m[f"{name}_min"] = v[p + "xmax"], v[p + "xmin"]
        m[f"{name}_fraction_high"] = v[p + "hi"] / (tokens + _EPS)
        m[f"{name}_fraction_low"] = v[p + "lo"] / (tokens + _EPS) if low is not None else 0.0
    else:
        m[f"{name}_max"], m[f"{name}_min"] = v[p + "vmax"], v[p + "vmin"]
        m[f"{name}_fraction_high"] = v[p + "vhi"] / max(valid_rows, 1.0)
        m[f"{name}_fraction_low"] = v[p + "vlo"] / max(valid_rows, 1.0) if low is not None else 0.0
    m[f"{name}_std"] = _mean_std(v[p + "xc"], v[p + "xc2"], tokens, unbiased=False)[1] if tokens > 1 else 0.0
    m[f"{name}_seq_mean"] = seq_mean if valid_rows > 0 else 0.0
    m[f"{name}_seq_std"] = seq_std
    m[f"{name}_seq_max"] = v[p + "vmax"] if valid_rows > 0 else 0.0
    m[f"{name}_seq_min"] = v[p + "vmin"] if valid_rows > 0 else 0.0
    m[f"{name}_seq_max_deviation"] = max(abs(v[p + "vmax"]), abs(v[p + "vmin"])) if valid_rows > 0 else 0.0
    m[f"{name}_seq_fraction_high"] = v[p + "vhi"] / max(valid_rows, 1.0)
    if low is not None:
        m[f"{name}_seq_fraction_low"] = v[p + "vlo"] / max(valid_rows, 1.0)
    m[f"{name}_masked_fraction"] = v[p + "rejected"] / (tokens + _EPS)
    m[f"{name}_seq_masked_fraction"] = v[p + "rejected_rows"] / valid_rows if valid_rows > 0 else 0.0
    return m
