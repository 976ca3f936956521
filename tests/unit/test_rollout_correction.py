"""Rollout correction (workers/rollout_correction.py): every mode against weights and masks
worked out by hand on small tensors, the metrics against verl 0.9's formulas (restated here
from verl/trainer/ppo/rollout_corr_helper.py, computed on the whole batch at once), the
statistics of split micro-batches adding up to the whole batch, and the config section."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import workers.rollout_correction as RC

LN = math.log
F32 = torch.float32


def t(x, dtype=F32):
    return torch.tensor(x, dtype=dtype)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64),
        torch.as_tensor(expected, dtype=torch.float64),
        atol=atol,
        rtol=1e-6,
    )


def section(**kw):
    """An algorithm.rollout_correction section (attribute access, as the config reaches workers)."""
    base = dict(
        rollout_is=None,
        rollout_is_threshold=2.0,
        rollout_is_batch_normalize=False,
        rollout_rs=None,
        rollout_rs_threshold=None,
        bypass_mode=False,
        loss_type="ppo_clip",
    )
    base.update(kw)
    return SimpleNamespace(**base)


def settings(**kw):
    return RC.CorrectionSettings.from_config(section(**kw), -1)


def with_ratios(ratios, mask=None):
    """(old, rollout, mask) with pi_old / pi_rollout = `ratios` (old log-probs fixed at -1)."""
    lr = t([[LN(r) for r in row] for row in ratios])
    old = torch.full_like(lr, -1.0)
    mask = torch.ones_like(lr) if mask is None else t(mask)
    return old, old - lr, mask


def test_module_imports_only_torch_stdlib_and_workers():
    import ast
    from pathlib import Path

    roots = set()
    for node in ast.walk(ast.parse(Path(RC.__file__).read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots.add((node.module or "").split(".")[0])
    assert roots <= {"__future__", "collections", "dataclasses", "typing", "math", "torch", "workers"}, roots


# ----------------------------------------------------------------------------- importance weights


def test_token_tis_by_hand():
    # ratios 2, 0.5, 10 (capped at 3); a log-ratio of -30 is clamped to -20 first; padding is 0
    lr = t([[LN(2), -LN(2), LN(10), -30.0, 99.0]])
    mask = t([[1, 1, 1, 1, 0]])
    w, raw, _ = RC.importance_weights(lr, mask, settings(rollout_is="token", rollout_is_threshold=3.0))
    close(w, [[2.0, 0.5, 3.0, math.exp(-20), 0.0]])
    close(raw, [[2.0, 0.5, 10.0, math.exp(-20), 0.0]])
    assert not w.requires_grad


def test_sequence_tis_by_hand():
    # row 0: ratios 2 * 2 = 4 -> capped at 3; row 1: 0.5 (padding's huge log-ratio ignored);
    # row 2: log-ratio sum 25 -> clamped to 20 -> e^20 -> capped at 3
    lr = t([[LN(2), LN(2), 0.0], [LN(0.5), 50.0, 50.0], [10.0, 10.0, 5.0]])
    mask = t([[1, 1, 1], [1, 0, 0], [1, 1, 1]])
    s = settings(rollout_is="sequence", rollout_is_threshold="3")
    w, raw, seq_lr = RC.importance_weights(lr, mask, s)
    close(w, [[3.0, 3.0, 3.0], [0.5, 0.0, 0.0], [3.0, 3.0, 3.0]])
    close(raw[0], [4.0, 4.0, 4.0])
    close(raw[2, 0], math.exp(20), atol=1.0)
    close(seq_lr.squeeze(-1), [LN(4), LN(0.5), 25.0])  # metrics read the unclamped sum


def test_icepop_zeroes_weights_outside_the_bounds_and_keeps_the_mask():
    old, rollout, mask = with_ratios([[2.0, 0.4, 10.0, 1.0]])
    s = settings(rollout_is="token", rollout_is_threshold="0.5_5.0")
    assert (s.is_lower, s.is_upper) == (0.5, 5.0)
    corr = RC.compute_correction(old, rollout, mask, s)
    close(corr.weights, [[2.0, 0.0, 0.0, 1.0]])
    assert corr.keep is None  # IcePop changes coefficients, not the response mask
    seq = settings(rollout_is="sequence", rollout_is_threshold="0.5_5.0")
    close(RC.compute_correction(old, rollout, mask, seq).weights, [[0.0] * 4])  # product 8 > 5


def test_batch_normalisation_token_and_sequence():
    # token: weights 2, 0.5 | 1 (padding 0) -> mean over 3 tokens = 3.5 / 3
    old, rollout, mask = with_ratios([[2.0, 0.5], [1.0, 7.0]], [[1, 1], [1, 0]])
    s = settings(rollout_is="token", rollout_is_threshold=5.0, rollout_is_batch_normalize=True)
    corr = RC.compute_correction(old, rollout, mask, s)
    close(corr.weights, [[2 / (3.5 / 3), 0.5 / (3.5 / 3)], [1 / (3.5 / 3), 0.0]])
    metrics = RC.correction_metrics(corr.stats.values(), s)
    close(metrics["rollout_corr/rollout_is_batch_norm_factor"], 3.5 / 3)
    close(metrics["rollout_corr/rollout_is_mean"], 3.5 / 3)  # metrics describe the weights before it
    # sequence: row weights 4 (2 * 2) and 0.5 (one token): the mean is over sequences, 2.25
    seq = settings(rollout_is="sequence", rollout_is_threshold=5.0, rollout_is_batch_normalize=True)
    old, rollout, mask = with_ratios([[2.0, 2.0], [0.5, 9.0]], [[1, 1], [1, 0]])
    corr = RC.compute_correction(old, rollout, mask, seq)
    mean = (4.0 + 0.5) / 2  # one weight per sequence, not per token
    close(corr.weights, [[4 / mean, 4 / mean], [0.5 / mean, 0.0]])


def test_batch_normalisation_averages_over_what_all_reduce_spans():
    # This rank: one row of ratios 2, 2 (sum 4 over 2 tokens); another rank: ratios 1, 1.
    # Every rank divides by the mean over both, (4 + 2) / (2 + 2) = 1.5.
    s = settings(rollout_is="token", rollout_is_threshold=5.0, rollout_is_batch_normalize=True)

    def all_reduce(values, kind):
        assert kind == "sum"
        return values + torch.tensor([2.0, 2.0], dtype=torch.float64)

    corr = RC.compute_correction(*with_ratios([[2.0, 2.0]]), s, all_reduce)
    close(corr.weights, [[2 / 1.5, 2 / 1.5]])


def test_a_near_zero_mean_leaves_the_weights_alone():
    s = settings(rollout_is="token", rollout_is_threshold="0.5_2.0", rollout_is_batch_normalize=True)
    old, rollout, mask = with_ratios([[10.0, 0.1]])  # both zeroed by IcePop
    corr = RC.compute_correction(old, rollout, mask, s)
    close(corr.weights, [[0.0, 0.0]])
    close(RC.correction_metrics(corr.stats.values(), s)["rollout_corr/rollout_is_batch_norm_factor"], 1.0)


# ----------------------------------------------------------------------------- rejection sampling


def keep_of(option, threshold, ratios, mask=None):
    old, rollout, mask = with_ratios(ratios, mask)
    s = settings(rollout_rs=option, rollout_rs_threshold=threshold)
    return RC.compute_correction(old, rollout, mask, s).keep


def test_token_k1_bounds_are_on_the_inverse_ratio_as_verl_0_9():
    # verl 0.9: statistic -log(pi_old / pi_rollout) within [log lower, log upper], so the bounds
    # apply to pi_rollout / pi_old. Symmetric bounds: the same either way.
    close(keep_of("token_k1", "0.5_2.0", [[0.4, 1.9, 2.1, 0.6]]), [[0.0, 1.0, 0.0, 1.0]])
    # asymmetric "0.5_4.0": ratio 3 (1/3 < 0.5) is rejected, ratio 0.3 (1/0.3 = 3.3 <= 4) kept
    close(keep_of("token_k1", "0.5_4.0", [[3.0, 0.3]]), [[0.0, 1.0]])
    # one number u means 1/u to u
    close(keep_of("token_k1", 2.0, [[0.4, 2.1, 1.5]]), [[0.0, 0.0, 1.0]])


def test_token_k2_k3_upper_bounds():
    # k2 = lr^2 / 2 <= 0.5  <=>  |lr| <= 1
    close(keep_of("token_k2", 0.5, [[math.e * 1.01, math.e * 0.99, 1 / (math.e * 1.01)]]), [[0.0, 1.0, 0.0]])
    # k3 = r - 1 - log r <= 0.1: r = 1.5 -> 0.0945 kept, r = 0.6 -> 0.1108 rejected
    close(keep_of("token_k3", "0.1", [[1.5, 0.6]]), [[1.0, 0.0]])


def test_sequence_options_reject_whole_rows():
    ratios = [[2.0, 2.0, 1.0], [1.1, 0.9, 1.0], [1.0, 1.0, 50.0]]
    mask = [[1, 1, 1], [1, 1, 1], [1, 1, 0]]  # row 2's outlier is padding
    # seq_sum_k1: -(sum log r) in [log .5, log 2]: row 0 sums to log 4 -> rejected
    close(keep_of("seq_sum_k1", "0.5_2.0", ratios, mask), [[0.0] * 3, [1.0] * 3, [1.0] * 3])
    # seq_mean_k1 (geometric mean of the ratios) within 1/1.2 .. 1.2: row 0's is 4^(1/3) = 1.59
    close(keep_of("seq_mean_k1", 1.2, ratios, mask), [[0.0] * 3, [1.0] * 3, [1.0] * 3])
    # seq_max_k2: the worst token's lr^2 / 2 <= 0.02 (|lr| <= 0.2): log 2 = 0.69 rejects row 0
    close(keep_of("seq_max_k2", 0.02, ratios, mask), [[0.0] * 3, [1.0] * 3, [1.0] * 3])
    # seq_sum_k2 over row 1: (log 1.1^2 + log 0.9^2) / 2 = 0.0101 -> kept at 0.011, rejected at 0.01
    close(keep_of("seq_sum_k2", 0.011, ratios, mask)[1], [1.0] * 3)
    close(keep_of("seq_sum_k2", 0.01, ratios, mask)[1], [0.0] * 3)
    # seq_mean_k3 of row 1: mean of r - 1 - log r over 3 tokens
    k3 = (0.1 - LN(1.1) + -0.1 - LN(0.9)) / 3
    close(keep_of("seq_mean_k3", k3 * 1.01, ratios, mask)[1], [1.0] * 3)
    close(keep_of("seq_mean_k3", k3 * 0.99, ratios, mask)[1], [0.0] * 3)
    close(keep_of("seq_max_k3", 0.01, ratios, mask)[2], [1.0] * 3)


def test_chained_options_must_all_keep():
    ratios = [[1.9, 1.0], [1.0, 1.0], [3.0, 1.0]]
    keep = keep_of("token_k1, seq_max_k2, token_k1", "0.5_2.0,0.5", ratios)  # repeats dropped
    # token_k1 rejects the 3.0 token; seq_max_k2 (|lr| <= 1) keeps rows 0, 1 (log 1.9 = 0.64), rejects row 2
    close(keep, [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])


@pytest.mark.parametrize(
    ("options", "thresholds", "match"),
    [
        ("geometric", 1.01, "verl 0.9 spells it seq_mean_k1"),
        ("token_k4", 1.0, "unknown option"),
        ("token_k1", None, "needs rollout_rs_threshold"),
        ("token_k1,token_k2", "1,2,3", "3 entries for 2 options"),
        ("token_k2", "0.5_2", "one number"),
        ("seq_sum_k1", "2_0.5", "lower <= upper"),
        ("token_k3", -1, "positive"),
        (",", 1.0, "names no option"),
    ],
)
def test_rejection_spec_errors(options, thresholds, match):
    with pytest.raises(ValueError, match=match):
        RC.parse_rejection(options, thresholds)


@pytest.mark.parametrize("spec", ["abc", "0", "-2", "3_2", "0_2", True, None, "1_x"])
def test_is_threshold_errors(spec):
    with pytest.raises(ValueError):
        RC.parse_is_threshold(spec)


def test_is_threshold_forms():
    assert RC.parse_is_threshold(2) == (2.0, None)
    assert RC.parse_is_threshold("2.5") == (2.5, None)
    assert RC.parse_is_threshold(" 0.5_5.0 ") == (5.0, 0.5)


# ----------------------------------------------------------------------------- settings


def test_settings_off_and_the_older_tis_key():
    assert RC.CorrectionSettings.from_config(None, -1) is None
    assert RC.CorrectionSettings.from_config(section(), -1) is None
    # actor.tis_imp_ratio_cap = c > 0 is rollout_is=token, rollout_is_threshold=c, decoupled
    legacy = RC.CorrectionSettings.from_config(None, 1.5)
    assert legacy == RC.CorrectionSettings.from_config(section(rollout_is="token", rollout_is_threshold=1.5), -1)
    assert RC.CorrectionSettings.from_config(section(), 1.5) == legacy
    with pytest.raises(ValueError, match="write rollout_is=token rollout_is_threshold=1.5"):
        RC.CorrectionSettings.from_config(section(rollout_is="sequence"), 1.5)
    with pytest.raises(ValueError, match="reinforce needs bypass_mode"):
        RC.CorrectionSettings.from_config(section(rollout_is="token", loss_type="reinforce"), -1)


def test_which_settings_need_the_whole_batch():
    assert not settings(rollout_is="sequence").needs_whole_batch
    assert settings(rollout_is="token", rollout_is_batch_normalize=True).needs_whole_batch
    assert settings(rollout_rs="token_k1", rollout_rs_threshold=2.0).needs_whole_batch
    assert not settings(rollout_rs="token_k1", rollout_rs_threshold=2.0, bypass_mode=True).needs_whole_batch
    # normalisation without weights is nothing (the config refuses it)
    assert not settings(rollout_rs=None, rollout_is_batch_normalize=True, bypass_mode=True).batch_normalize


# ----------------------------------------------------------------------------- bypass denominators


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_rejected_loss_scale_gives_verls_bypass_aggregation(mode):
    """verl's bypass mode masks rejected tokens out of the loss numerator; its denominators
    (global tokens or sequences) come from the response mask before rejection."""
    from workers.losses import agg_loss

    pg = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = t([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    keep = t([[1, 0, 1], [0, 0, 1], [1, 1, 1]])
    kept = mask * keep
    if mode == "token-mean":
        expected = (1 + 3 + 7 + 8 + 9) / 8
    elif mode == "seq-mean-token-sum":
        expected = ((1 + 3) + 0 + (7 + 8 + 9)) / 3
    else:  # per-row mean over kept tokens, rows counted before rejection
        expected = ((1 + 3) / 2 + 0 + (7 + 8 + 9) / 3) / 3
    close(agg_loss(pg, kept, mode) * RC.rejected_loss_scale(mask, kept, mode), expected)


# ----------------------------------------------------------------------------- metrics vs verl


def verl_reference(old, rollout, mask, s):
    """verl 0.9's metric formulas on the whole batch (rollout_corr_helper.py, restated)."""

    def mm(x, m, axis=None):
        m = m.to(x.dtype)
        return (
            torch.where(m.bool(), x, 0).mul(m).sum(axis) / (m.sum(axis) + 1e-8)
            if axis is not None
            else torch.where(m.bool(), x, 0).mul(m).sum() / (m.sum() + 1e-8)
        )

    lr = old - rollout
    out = {}
    a, b = mm(old, mask, -1), mm(rollout, mask, -1)
    out["training_ppl"] = torch.exp(-a).mean()
    out["kl"] = mm(rollout - old, mask)
    out["k3_kl"] = mm(torch.exp(lr) - lr - 1, mask)
    out["log_ppl_abs_diff"] = (b - a).abs().mean()
    out["log_ppl_diff_max"] = (b - a).max()
    out["chi2_token"] = mm(torch.exp(lr.clamp(-20, 20)).square(), mask) - 1
    out["chi2_seq"] = torch.exp(2 * (torch.where(mask.bool(), lr, 0).sum(-1)).clamp(-20, 20)).mean() - 1
    if s.rollout_is is not None:
        w, raw, _ = RC.importance_weights(lr, mask, s)
        upper = s.is_upper
        wc = w.clamp(0, upper)
        out["rollout_is_mean"] = mm(w, mask)
        out["rollout_is_std"] = torch.sqrt(torch.clamp(mm(wc.square(), mask) - mm(wc, mask) ** 2, min=0))
        out["rollout_is_eff_sample_size"] = 1.0 / mm((wc / (mm(wc, mask) + 1e-8)).square(), mask)
        seq = mm(w, mask, -1)
        out["rollout_is_seq_mean"], out["rollout_is_seq_std"] = seq.mean(), seq.std()
        out["rollout_is_seq_max_deviation"] = (seq - 1).abs().max()
        out["rollout_is_seq_fraction_high"] = (mm(raw, mask, -1) > upper).float().mean()
        if s.rollout_is == "token":
            out["rollout_is_max"] = w.masked_fill(~mask.bool(), -math.inf).max()
            out["rollout_is_ratio_fraction_high"] = mm((raw > upper).float(), mask)
        else:
            seq_lr = torch.where(mask.bool(), lr, 0).sum(-1)
            out["rollout_is_max"] = torch.exp(seq_lr.max().clamp(max=20))
            out["rollout_is_ratio_fraction_low"] = (seq_lr < LN(s.is_lower)).float().mean()
    for option in s.rejection:
        stat = RC._token_statistic(lr, option.estimator)
        if option.reduction != "token":
            stat = RC._sequence_statistic(stat, mask, option.reduction).unsqueeze(-1).expand_as(mask)
        name = f"rollout_rs_{option.name}"
        out[f"{name}_mean"] = mm(stat, mask)
        seq_values = stat[:, 0] if option.reduction != "token" else mm(stat, mask, -1)
        out[f"{name}_seq_std"] = seq_values.std()
        out[f"{name}_seq_max_deviation"] = seq_values.abs().max()
        low, up = option.bounds
        out[f"{name}_std"] = torch.sqrt(
            mm(stat.clamp(low if low is not None else 0.0, up).square(), mask)
            - mm(stat.clamp(low if low is not None else 0.0, up), mask) ** 2
        )
        if option.reduction == "token":
            out[f"{name}_fraction_high"] = mm((stat > up).float(), mask)
        else:
            out[f"{name}_fraction_high"] = (seq_values > up).float().mean()
    return {f"rollout_corr/{k}": float(v) for k, v in out.items()}


CASES = [
    dict(rollout_is="token", rollout_is_threshold=1.5),
    dict(rollout_is="sequence", rollout_is_threshold="0.5_3.0"),
    dict(
        rollout_is="token",
        rollout_is_threshold=2.0,
        rollout_rs="token_k1,seq_mean_k3,seq_max_k2",
        rollout_rs_threshold="0.8_1.25,0.05,0.1",
    ),
    dict(rollout_rs="seq_sum_k1,token_k2", rollout_rs_threshold="0.5_2.0,0.02"),
]


def random_batch(seed=0, rows=6, length=7):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, length, generator=gen) * 3
    rollout = old + 0.3 * torch.randn(rows, length, generator=gen)
    lengths = torch.randint(2, length + 1, (rows,), generator=gen)
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).float()
    return old, rollout, mask


@pytest.mark.parametrize("case", CASES, ids=["token_tis", "seq_icepop", "token_tis_3rs", "rs_only"])
def test_metrics_follow_verl_formulas(case):
    s = settings(**case)
    old, rollout, mask = random_batch()
    corr = RC.compute_correction(old, rollout, mask, s)
    metrics = RC.correction_metrics(corr.stats.values(), s)
    reference = verl_reference(old, rollout, mask, s)
    for key, value in reference.items():
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert all(key.startswith("rollout_corr/") for key in metrics)
    if s.rejection:
        kept = mask * corr.keep
        assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(
            float(1 - kept.sum() / mask.sum()), abs=1e-6
        )


@pytest.mark.parametrize("case", CASES, ids=["token_tis", "seq_icepop", "token_tis_3rs", "rs_only"])
def test_split_micro_batches_add_up_to_the_whole_batch(case):
    """What lets the actor compute per micro-batch (and per rank) and report the batch's numbers."""
    s = settings(**case)
    old, rollout, mask = random_batch(seed=1)
    whole = RC.compute_correction(old, rollout, mask, s)
    merged = RC.Stats()
    weights, keeps = [], []
    for rows in ([0, 1], [2], [3, 4, 5]):
        part = RC.compute_correction(old[rows], rollout[rows], mask[rows], s)
        merged.merge(part.stats)
        weights.append(part.weights)
        keeps.append(part.keep)
    whole_metrics = RC.correction_metrics(whole.stats.values(), s)
    merged_metrics = RC.correction_metrics(merged.values(), s)
    assert whole_metrics.keys() == merged_metrics.keys()
    for key in whole_metrics:
        assert merged_metrics[key] == pytest.approx(whole_metrics[key], rel=1e-5, abs=1e-6), key
    if whole.weights is not None:
        close(torch.cat(weights), whole.weights)
    if whole.keep is not None:
        close(torch.cat(keeps), whole.keep)


def test_stats_reduce_combines_ranks():
    a, b = RC.Stats(), RC.Stats()
    for stats, value in ((a, 1.0), (b, 3.0)):
        stats.add("n", t(value))
        stats.add("m", t(10 * value))
        stats.add_max("hi", t(value))
        stats.add_min("lo", t(value))

    def all_reduce(values, kind):  # rank b's statistics arrive in the same (sorted) order
        table = {"sum": b.sums, "max": b.maxs, "min": b.mins}[kind]
        other = torch.stack([table[n] for n in sorted(table)])
        return {"sum": values + other, "max": torch.maximum(values, other), "min": torch.minimum(values, other)}[kind]

    a.reduce(all_reduce)
    assert a.values() == {"n": 4.0, "m": 40.0, "hi": 3.0, "lo": 1.0}


# ----------------------------------------------------------------------------- the config section


def test_config_section_defaults_and_refusals():
    from hybrid.config import ConfigError, build_config

    rc = build_config([]).algorithm.rollout_correction
    assert (rc.rollout_is, rc.rollout_rs, rc.bypass_mode, rc.loss_type) == (None, None, False, "ppo_clip")
    assert RC.CorrectionSettings.from_config(rc, -1) is None  # the default job: nothing applied
    key = "algorithm.rollout_correction."
    ok = build_config([key + "rollout_rs='token_k1,seq_max_k2'", key + "rollout_rs_threshold='0.5_2.0,3'"])
    # Rejection needs the whole batch's old log-probs first: the driver keeps that pass.
    actor = ok.actor_rollout_ref.actor
    assert actor.correction.needs_whole_batch and not actor.on_policy_update
    assert build_config([]).actor_rollout_ref.actor.on_policy_update  # the default job skips it
    with pytest.raises(ConfigError) as err:
        build_config(
            [
                key + "rollout_is=geometric",
                key + "rollout_rs=geometric",
                key + "rollout_rs_threshold=1.01",
                key + "loss_type=reinforce",
                "actor_rollout_ref.actor.tis_imp_ratio_cap=2",
            ]
        )
    message = str(err.value)
    for expected in (
        "rollout_is='geometric' is not supported",
        "verl 0.9 spells it seq_mean_k1",
        "loss_type='reinforce' is the loss of bypass mode",
        "tis_imp_ratio_cap=2.0 is verl's older spelling",
    ):
        assert expected in message, message
    with pytest.raises(
        ConfigError, match="rollout_is_batch_normalize=True normalises importance weights, but rollout_is=null"
    ):
        build_config([key + "rollout_is_batch_normalize=true"])
    with pytest.raises(ConfigError, match="loss_mode='gspo' would be ignored"):
        build_config(
            [
                key + "bypass_mode=true",
                key + "loss_type=reinforce",
                "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
            ]
        )
