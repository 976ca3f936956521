"""hybrid's counterparts of SkyRL's off-policy pieces against SkyRL's own code: the rollout_is
policy loss (workers/losses.py), the sequence masks (rejection options seq_geo_ratio /
seq_prod_ratio of workers/rollout_correction.py) and sequence-level TIS (rollout_is=sequence):
loss, gradient and masks agree to 1e-6 on random inputs, log-ratios beyond +-20 included.

The oracle functions are SkyRL's (NovaSky-AI/SkyRL a9564572eb8e,
skyrl/backends/skyrl_train/utils/{ppo_utils,off_policy_correction_utils,torch_utils}.py,
Apache-2.0), copied with only the config turned into a namespace and metrics left out.
SkyRL scales the advantages by the loss reduction before the loss (token_mean: divided by the
mini-batch's valid tokens) and then sums ``loss * loss_mask``; hybrid's token-mean aggregation
is that same number.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import workers.losses as L
from workers.rollout_correction import (
    CorrectionSettings,
    compute_correction,
    correction_metrics,
    rejected_loss_scale,
    rejection_keep,
)
from workers.rollout_correction_settings import parse_rejection

# ----------------------------------------------------------------------------- SkyRL a9564572eb8e


def _sk_masked_mean(tensor, mask, dim=None):
    if mask is None:
        return tensor.mean(axis=dim)
    return (tensor * mask).sum(axis=dim) / mask.sum(axis=dim).clamp(min=1.0)


def _sk_safe_exp_delta(delta, clip=20.0, out_dtype=None):
    y = torch.clamp(delta.to(torch.float32), -clip, clip).exp()
    return y.to(out_dtype or delta.dtype)


def _sk_compute_tis_ratio(old_log_probs, rollout_logprobs, loss_mask, tis_ratio_type, opc):
    token_tis_log_ratio = old_log_probs - rollout_logprobs
    token_tis_ratio = _sk_safe_exp_delta(token_tis_log_ratio, clip=20.0, out_dtype=old_log_probs.dtype)
    if tis_ratio_type == "token":
        return torch.clamp(token_tis_ratio, max=opc.token_tis_ratio_clip_high).detach()
    seq_tis_log_ratio = (token_tis_log_ratio * loss_mask).sum(dim=-1, keepdim=True)
    seq_tis_ratio = _sk_safe_exp_delta(seq_tis_log_ratio, clip=20.0, out_dtype=old_log_probs.dtype)
    return torch.clamp(seq_tis_ratio, max=opc.sequence_tis_ratio_clip_high).detach()


def _sk_compute_sequence_mask(old_log_probs, rollout_logprobs, loss_mask, sequence_mask_metric, opc):
    token_tis_log_ratio = old_log_probs - rollout_logprobs
    if sequence_mask_metric == "geometric":
        num_tokens = loss_mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
        seq_tis_log_ratio = (token_tis_log_ratio * loss_mask).sum(dim=-1, keepdim=True)
        geo_mean_ratio = _sk_safe_exp_delta(seq_tis_log_ratio / num_tokens, clip=20.0, out_dtype=old_log_probs.dtype)
        seq_over_high = geo_mean_ratio > opc.geo_mask_high
        seq_under_low = geo_mean_ratio < opc.geo_mask_low
        return (~seq_over_high & ~seq_under_low).float()
    seq_tis_log_ratio = (token_tis_log_ratio * loss_mask).sum(dim=-1, keepdim=True)
    seq_tis_ratio = _sk_safe_exp_delta(seq_tis_log_ratio, clip=20.0, out_dtype=old_log_probs.dtype)
    seq_over_high = seq_tis_ratio > opc.product_mask_high
    seq_under_low = seq_tis_ratio < opc.product_mask_low
    return (~seq_over_high & ~seq_under_low).float()


def _sk_apply_off_policy_correction(loss, old_log_probs, rollout_logprobs, loss_mask, opc):
    tis_ratio = None
    if opc.tis_ratio_type is not None:
        tis_ratio = _sk_compute_tis_ratio(old_log_probs, rollout_logprobs, loss_mask, opc.tis_ratio_type, opc)
    if opc.sequence_mask_metric is not None:
        loss_mask = loss_mask * _sk_compute_sequence_mask(
            old_log_probs, rollout_logprobs, loss_mask, opc.sequence_mask_metric, opc
        )
    if tis_ratio is not None:
        loss = loss * tis_ratio
    return loss, loss_mask


def _sk_rollout_is_policy_loss(log_probs, old_log_probs, advantages, config, loss_mask, rollout_logprobs):
    ratio = _sk_safe_exp_delta(log_probs - rollout_logprobs, clip=20.0, out_dtype=log_probs.dtype)
    in_range = (ratio > 1 - config.eps_clip_low) & (ratio < 1 + config.eps_clip_high)
    calibrated_ratio = torch.where(in_range, ratio, torch.zeros_like(ratio))
    loss = -(calibrated_ratio.detach() * advantages * log_probs)
    clip_ratio = _sk_masked_mean((~in_range).float(), loss_mask).mean().detach().item()
    loss, loss_mask = _sk_apply_off_policy_correction(
        loss, old_log_probs, rollout_logprobs, loss_mask, config.off_policy_correction
    )
    return (loss * loss_mask).sum(), clip_ratio


def _sk_regular_policy_loss(log_probs, old_log_probs, advantages, config, loss_mask, rollout_logprobs):
    # SkyRL's ppo_policy_loss for policy_loss_type=regular (no dual clip), then its correction.
    ratio = _sk_safe_exp_delta(log_probs - old_log_probs, clip=20.0, out_dtype=log_probs.dtype)
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - config.eps_clip_low, 1 + config.eps_clip_high) * advantages
    loss = -torch.min(surr1, surr2)
    loss, loss_mask = _sk_apply_off_policy_correction(
        loss, old_log_probs, rollout_logprobs, loss_mask, config.off_policy_correction
    )
    return (loss * loss_mask).sum()


def _opc(**over):
    base = dict(
        tis_ratio_type=None,
        token_tis_ratio_clip_high=2.0,
        sequence_tis_ratio_clip_high=5.0,
        sequence_mask_metric=None,
        geo_mask_high=1.01,
        geo_mask_low=0.99,
        product_mask_high=2.0,
        product_mask_low=0.5,
    )
    base.update(over)
    return SimpleNamespace(**base)


# ----------------------------------------------------------------------------- inputs


def _inputs(seed: int, rows: int = 6, cols: int = 9, spread: float = 0.05):
    g = torch.Generator().manual_seed(seed)
    rollout = -torch.rand(rows, cols, generator=g, dtype=torch.float64) * 3
    old = rollout + torch.randn(rows, cols, generator=g, dtype=torch.float64) * spread
    current = old + torch.randn(rows, cols, generator=g, dtype=torch.float64) * spread
    lengths = torch.randint(1, cols + 1, (rows,), generator=g)
    mask = (torch.arange(cols)[None, :] < lengths[:, None]).to(torch.float64)
    mask[-1] = 0.0  # an empty row: no valid token
    advantages = torch.randn(rows, 1, generator=g, dtype=torch.float64).expand(rows, cols).clone()
    return current, old, rollout, mask, advantages


def _actor(low: float, high: float):
    return SimpleNamespace(clip_ratio=0.2, clip_ratio_low=low, clip_ratio_high=high, loss_scale_factor=None)


# ----------------------------------------------------------------------------- tests

MASKS = [("geometric", "seq_geo_ratio", "0.99_1.01"), ("product", "seq_prod_ratio", "0.5_2.0")]


@pytest.mark.parametrize("seed", range(4))
def test_rollout_is_loss_matches_skyrl(seed):
    """Wide bands and narrow ones (most tokens outside): loss, gradient and clip fraction."""
    low, high, spread = (0.2, 0.28, 0.2) if seed % 2 else (0.01, 0.02, 0.02)
    current, _, rollout, mask, adv = _inputs(seed, spread=spread)
    ours_lp = current.clone().requires_grad_(True)
    theirs_lp = current.clone().requires_grad_(True)
    loss, metrics = L.get_policy_loss_fn("rollout_is")(
        old_log_prob=rollout,
        log_prob=ours_lp,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode="token-mean",
        config=_actor(low, high),
    )
    cfg = SimpleNamespace(eps_clip_low=low, eps_clip_high=high, off_policy_correction=_opc())
    ref, clip_ratio = _sk_rollout_is_policy_loss(
        theirs_lp, theirs_lp.detach(), adv / mask.sum().clamp(min=1), cfg, mask, rollout
    )
    loss.backward()
    ref.backward()
    assert abs(float(loss.detach()) - float(ref.detach())) < 1e-6
    assert torch.allclose(ours_lp.grad, theirs_lp.grad, atol=1e-6, rtol=0)
    assert abs(float(metrics["actor/pg_clipfrac"]) - clip_ratio) < 1e-6
    assert 0 < clip_ratio < 1  # both kinds of token are in the test


def test_rollout_is_loss_by_hand():
    """One row, bounds (0.8, 1.2): ratios 1.1 (kept), 1.5 and 0.5 (no gradient), 1.2 (the open
    bound: no gradient). d loss / d logp = -r * A / 4 for the kept token only."""
    rollout = torch.zeros(1, 4, dtype=torch.float64)
    ratios = torch.tensor([[1.1, 1.5, 0.5, 1.2]], dtype=torch.float64)
    logp = ratios.log().requires_grad_(True)
    adv = torch.full((1, 4), 2.0, dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.float64)
    loss, metrics = L.compute_policy_loss_rollout_is(rollout, logp, adv, mask, "token-mean", _actor(0.2, 0.2))
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.1 * 2.0 / 4, 0.0, 0.0, 0.0], abs=1e-6)
    assert float(loss.detach()) == pytest.approx(-1.1 * 2.0 * float(ratios[0, 0].log()) / 4, abs=1e-6)
    assert float(metrics["actor/pg_clipfrac"]) == pytest.approx(0.75)


@pytest.mark.parametrize("metric,option,bounds", MASKS)
@pytest.mark.parametrize("seed", range(5))
def test_sequence_masks_match_skyrl(metric, option, bounds, seed):
    """Including a token whose log-ratio is beyond 20 (verl's seq_mean_k1 clamps it first)."""
    _, old, rollout, mask, _ = _inputs(seed, rows=8, cols=12, spread=0.01 if metric == "geometric" else 0.3)
    old[seed % 7, 0] = rollout[seed % 7, 0] + 23.0
    theirs = _sk_compute_sequence_mask(old, rollout, mask, metric, _opc())
    ours = rejection_keep(old - rollout, mask, parse_rejection(option, bounds))
    assert torch.equal(ours, theirs.expand_as(mask))
    assert 0 < float(theirs.sum()) < theirs.numel()  # kept and masked rows both occur


def test_geometric_mask_by_hand():
    """Token log-ratios (pi_old / pi_rollout) 0.02, 0.0, 0.0, 0.0 (mean 0.005: ratio 1.00501, kept
    within 0.99..1.01); 0.04, 0.0 (mean 0.02: 1.0202, masked); 21, -20, 0 (mean 1/3: 1.396,
    masked; clamping each token at 20 first, as verl's seq_mean_k1 does, gives mean 0: kept)."""
    lr = torch.tensor([[0.02, 0.0, 0.0, 0.0], [0.04, 0.0, 0.0, 0.0], [21.0, -20.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float64)
    keep = rejection_keep(lr, mask, parse_rejection("seq_geo_ratio", "0.99_1.01"))
    assert keep[:, 0].tolist() == [1.0, 0.0, 0.0]
    verl_like = rejection_keep(lr, mask, parse_rejection("seq_mean_k1", f"{1 / 1.01}_{1 / 0.99}"))
    assert verl_like[:, 0].tolist() == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("metric,option,bounds", MASKS)
@pytest.mark.parametrize("seed", range(3))
def test_bypass_rollout_is_with_sequence_mask_matches_skyrl(metric, option, bounds, seed):
    """What the actor's bypass path computes for one micro-batch (workers/actor.py
    _PolicyMicroLoss._policy_gradient: the mask from the detached current log-probs, the loss
    over the kept tokens, times kept / all) is SkyRL's rollout_is loss with its sequence mask,
    old log-probs being the current ones (one optimizer step per batch)."""
    current, _, rollout, mask, adv = _inputs(seed, rows=8, cols=12, spread=0.02 if metric == "geometric" else 0.3)
    settings = CorrectionSettings(None, float("inf"), None, False, parse_rejection(option, bounds), True, "ppo_clip")
    ours_lp = current.clone().requires_grad_(True)
    corr = compute_correction(ours_lp.detach(), rollout, mask, settings)
    kept = mask * corr.keep
    loss, _ = L.compute_policy_loss_rollout_is(rollout, ours_lp, adv, kept, "token-mean", _actor(0.2, 0.28))
    loss = loss * rejected_loss_scale(mask, kept, "token-mean").to(loss.dtype)
    theirs_lp = current.clone().requires_grad_(True)
    opc = _opc(sequence_mask_metric=metric)
    cfg = SimpleNamespace(eps_clip_low=0.2, eps_clip_high=0.28, off_policy_correction=opc)
    ref, _ = _sk_rollout_is_policy_loss(
        theirs_lp, theirs_lp.detach(), adv / mask.sum().clamp(min=1), cfg, mask, rollout
    )
    loss.backward()
    ref.backward()
    assert 0 < float(kept.sum()) < float(mask.sum())
    assert abs(float(loss.detach()) - float(ref.detach())) < 1e-6
    assert torch.allclose(ours_lp.grad, theirs_lp.grad, atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", range(4))
def test_sequence_tis_matches_skyrl(seed):
    """rollout_is=sequence with threshold c (decoupled) is SkyRL's tis_ratio_type=sequence with
    sequence_tis_ratio_clip_high=c, in the weights and in the regular PPO loss they multiply."""
    current, old, rollout, mask, adv = _inputs(seed, spread=0.3)
    old[0, 0] = rollout[0, 0] + 25.0  # beyond the clamp
    settings = CorrectionSettings("sequence", 5.0, None, False, (), False, "ppo_clip")
    weights = compute_correction(old, rollout, mask, settings).weights
    theirs = _sk_compute_tis_ratio(old, rollout, mask, "sequence", _opc(sequence_tis_ratio_clip_high=5.0))
    # SkyRL exponentiates in float32: equal to its precision.
    assert torch.allclose(weights, theirs * mask, atol=1e-6, rtol=1e-6)
    ours_lp = current.clone().requires_grad_(True)
    theirs_lp = current.clone().requires_grad_(True)
    actor = SimpleNamespace(**vars(_actor(0.2, 0.28)), clip_ratio_c=1e9)
    loss, _ = L.compute_policy_loss_vanilla(old, ours_lp, adv, mask, "token-mean", actor, rollout_is_weights=weights)
    cfg = SimpleNamespace(eps_clip_low=0.2, eps_clip_high=0.28, off_policy_correction=_opc(tis_ratio_type="sequence"))
    ref = _sk_regular_policy_loss(theirs_lp, old, adv / mask.sum().clamp(min=1), cfg, mask, rollout)
    loss.backward()
    ref.backward()
    assert abs(float(loss.detach()) - float(ref.detach())) < 1e-6
    assert torch.allclose(ours_lp.grad, theirs_lp.grad, atol=1e-6, rtol=0)


def test_sequence_mask_metrics_by_hand():
    """The geometric mask's metrics (verl's rollout_rs_* names): three rows of 4, 2 and 3
    tokens with geometric-mean ratios 1.00501, 1.0202 (masked) and 1.396 (masked)."""
    lr = torch.tensor([[0.02, 0.0, 0.0, 0.0], [0.04, 0.0, 0.0, 0.0], [21.0, -20.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float64)
    rejection = parse_rejection("seq_geo_ratio", "0.99_1.01")
    settings = CorrectionSettings(None, float("inf"), None, False, rejection, False, "ppo_clip")
    corr = compute_correction(lr, torch.zeros_like(lr), mask, settings)
    metrics = correction_metrics(corr.stats.values(), settings)
    name = "rollout_corr/rollout_rs_seq_geo_ratio"
    assert metrics[f"{name}_masked_fraction"] == pytest.approx(5 / 9)
    assert metrics[f"{name}_seq_masked_fraction"] == pytest.approx(2 / 3)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(5 / 9)
    assert metrics[f"{name}_seq_max"] == pytest.approx(math.exp(1 / 3))
    assert metrics[f"{name}_seq_min"] == pytest.approx(math.exp(0.005))
    assert metrics[f"{name}_seq_fraction_high"] == pytest.approx(2 / 3)
