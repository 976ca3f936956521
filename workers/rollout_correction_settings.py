"""The settings of off-policy rollout correction (workers/rollout_correction.py):
`CorrectionSettings` resolved once from `algorithm.rollout_correction` (or the older
`actor.tis_imp_ratio_cap`), the parsing of its threshold strings and rejection options, and
the constants the math and the metrics share. Imports only the standard library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# exp(20) ~ 4.9e8 and exp(-20) ~ 2e-9: the widest ratios that stay finite and meaningful.
SAFETY_BOUND = 20.0
IS_LEVELS = ("token", "sequence")
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
    "seq_geo_ratio",
    "seq_prod_ratio",
)
# SkyRL's sequence masks (off_policy_correction.sequence_mask_metric geometric / product): the
# sequence's geometric mean or product of the token ratios pi_old / pi_rollout, from the
# unclamped log-ratios (summed, or averaged over the response), clamped to [-20, 20] before exp
# and kept within [lower, upper]. verl's seq_mean_k1 / seq_sum_k1 clamp each token's log-ratio
# first and bound the inverse ratio.
RATIO_RS_OPTIONS = ("seq_geo_ratio", "seq_prod_ratio")
LOSS_TYPES = ("ppo_clip", "reinforce")
# verl 0.6/0.7 named rejection by level (with rollout_rs_threshold_lower and a per-token veto);
# 0.8 and 0.9 name the statistic instead. These are the nearest 0.9 options.
OLDER_RS_NAMES = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}
_EPS = 1e-8


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
        """k1, k2, k3, or `ratio` for RATIO_RS_OPTIONS."""
        return "ratio" if self.name in RATIO_RS_OPTIONS else self.name[-2:]

    @property
    def reduction(self) -> str:
        """`token`, or how a sequence's token statistics become one: `sum`, `mean`, `max`
        (`geo`, `prod` for RATIO_RS_OPTIONS)."""
        return "token" if self.name.startswith("token_") else self.name.split("_")[1]

    @property
    def bounds(self) -> tuple[float | None, float]:
        """The bounds in the statistic's own units: log-ratios for k1, as written otherwise."""
        if self.estimator == "ratio":
            return self.lower, self.upper
        if self.estimator == "k1":
            return math.log(self.lower), math.log(self.upper)
        return None, self.upper


def parse_rejection(options: str, thresholds: Any) -> tuple[RejectionOption, ...]:
    """`rollout_rs` (comma-separated options, repeats dropped) with `rollout_rs_threshold`
    (one entry for all, or one per option). A k1 or ratio entry is `lower_upper`, or one number
    u meaning `1/u_u`; k2/k3 entries are one positive upper bound. ValueError otherwise."""
    names = list(dict.fromkeys(part.strip() for part in str(options).split(",") if part.strip()))
    if not names:
        raise ValueError(f"{options!r} names no option; choose from {', '.join(RS_OPTIONS)}")
    for name in names:
        if name not in RS_OPTIONS:
            older = f" (verl 0.9 spells it {OLDER_RS_NAMES[name]})" if name in OLDER_RS_NAMES else ""
            raise ValueError(f"unknown option {name!r}{older}; choose from {', '.join(RS_OPTIONS)}")
    if thresholds is None or isinstance(thresholds, bool):
        raise ValueError("rejection needs rollout_rs_threshold (one entry, or one per option)")
    specs = (
        [str(thresholds)]
        if isinstance(thresholds, (int, float))
        else [part.strip() for part in str(thresholds).split(",") if part.strip()]
    )
    if len(specs) not in (1, len(names)):
        raise ValueError(
            f"{thresholds!r} has {len(specs)} entries for {len(names)} options; give one, or one per option"
        )
    specs = specs * len(names) if len(specs) == 1 else specs
    return tuple(_rejection_option(name, spec) for name, spec in zip(names, specs))


def _rejection_option(name: str, spec: str) -> RejectionOption:
    lower_text, sep, upper_text = spec.partition("_")
    two_sided = name.endswith("k1") or name in RATIO_RS_OPTIONS
    try:
        if two_sided:
            upper = float(upper_text if sep else lower_text)
            lower = float(lower_text) if sep else 1.0 / upper
        elif sep:
            raise ValueError
        else:
            upper, lower = float(spec), None
    except (ValueError, ZeroDivisionError):
        form = "'lower_upper' or one number" if two_sided else "one number (no '_')"
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
            raise ValueError(
                f"loss_type={section.loss_type!r}: choose {' or '.join(LOSS_TYPES)}; reinforce needs bypass_mode"
            )
        upper, lower = math.inf, None
        if section.rollout_is is not None:
            if section.rollout_is not in IS_LEVELS:
                raise ValueError(f"rollout_is={section.rollout_is!r}: choose {' or '.join(IS_LEVELS)} or null")
            upper, lower = parse_is_threshold(section.rollout_is_threshold)
        rejection = (
            () if section.rollout_rs is None else parse_rejection(section.rollout_rs, section.rollout_rs_threshold)
        )
        normalize = bool(section.rollout_is_batch_normalize) and section.rollout_is is not None
        return cls(section.rollout_is, upper, lower, normalize, rejection, bool(section.bypass_mode), section.loss_type)

    @property
    def needs_whole_batch(self) -> bool:
        """Decoupled rejection or batch-normalised weights change the loss of every micro-batch
        through numbers only the whole batch has (kept-token counts, the weights' mean), so
        the update needs old log-probs of all rows before its first backward pass."""
        return not self.bypass and (bool(self.rejection) or self.batch_normalize)


__all__ = [
    "CorrectionSettings",
    "IS_LEVELS",
    "LOSS_TYPES",
    "OLDER_RS_NAMES",
    "RATIO_RS_OPTIONS",
    "RS_OPTIONS",
    "RejectionOption",
    "SAFETY_BOUND",
    "parse_is_threshold",
    "parse_rejection",
]
