"""The statistics and metrics of off-policy rollout correction (workers/rollout_correction.py):
`Stats`, the sufficient statistics (sums, maxima, minima) that add up over micro-batches and
ranks, and `correction_metrics`, verl 0.9's `rollout_corr/...` metrics from those of the
whole batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from workers.rollout_correction_settings import _EPS, SAFETY_BOUND, CorrectionSettings, RejectionOption

AllReduce = Callable[[torch.Tensor, str], torch.Tensor]  # (float64 values, "sum" | "max" | "min")


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


def _rs_option_metrics(
    v: dict[str, float], option: RejectionOption, tokens: float, valid_rows: float
) -> dict[str, float]:
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


__all__ = ["AllReduce", "Stats", "correction_metrics"]
