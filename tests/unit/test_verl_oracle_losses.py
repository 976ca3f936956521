"""hybrid's policy losses (workers/losses.py) against verl 0.9.1's own code, in every loss
aggregation mode hybrid has: loss, gradient and metrics agree to 1e-6.

The oracle functions below are verl 0.9.1's (verl/trainer/ppo/core_algos.py, Apache-2.0),
copied with only what makes them run without verl: ``verl_F.masked_mean`` is the local
``_masked_mean`` (verl's formula), the config is a namespace carrying verl's field names, and
``global_batch_info`` is empty (one data-parallel rank: verl then aggregates over the
micro-batch itself, as hybrid's agg_loss does). Docstrings and comments are left out.
"""

from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace

import pytest
import torch

import workers.losses as L

MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


# ----------------------------------------------------------------------------- verl 0.9.1


def _masked_mean(values, mask, axis=None):
    s = (values * mask).sum() if axis is None else (values * mask).sum(axis=axis)
    return s / (mask.sum() + 1e-8) if axis is None else s / (mask.sum(axis=axis) + 1e-8)


def _metrics(clipfrac, ppo_kl, clipfrac_lower):
    return {"actor/pg_clipfrac": clipfrac, "actor/ppo_kl": ppo_kl, "actor/pg_clipfrac_lower": clipfrac_lower}


def agg_loss(
    loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None
):
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            batch_num_tokens = loss_mask.sum()
        loss = (loss_mat * loss_mask).sum() / batch_num_tokens * dp_size
    elif loss_agg_mode == "token-sum":
        loss = (loss_mat * loss_mask).sum() * dp_size
    elif loss_agg_mode in ["seq-mean-token-sum", "seq-mean-token-sum-norm"]:
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float().to(loss_mat.dtype)
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        loss = (seq_losses * seq_mask).sum() / global_batch_size * dp_size
        if loss_agg_mode == "seq-mean-token-sum-norm":
            if loss_scale_factor is None:
                loss_scale_factor = loss_mask.shape[-1]
            loss /= loss_scale_factor
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).float().to(loss_mat.dtype)
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        loss = (seq_losses * seq_mask).sum() / global_batch_size * dp_size
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")
    return loss


def verl_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):
    clip_ratio = config.clip_ratio
    cliprange_low = config.clip_ratio_low if config.clip_ratio_low is not None else clip_ratio
    cliprange_high = config.clip_ratio_high if config.clip_ratio_high is not None else clip_ratio
    clip_ratio_c = config.clip_ratio_c
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = _masked_mean(-negative_approx_kl, response_mask)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = _masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = _masked_mean(torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **config.global_batch_info)
    return pg_loss, _metrics(pg_clipfrac, ppo_kl, pg_clipfrac_lower)


def verl_gspo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):
    clip_ratio_low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    clip_ratio_high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    negative_approx_kl_seq = torch.sum(negative_approx_kl * response_mask, dim=-1) / seq_lengths
    log_seq_importance_ratio = log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
    log_seq_importance_ratio = torch.clamp(log_seq_importance_ratio, max=10.0)
    seq_importance_ratio = torch.exp(log_seq_importance_ratio)
    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **config.global_batch_info)
    pg_clipfrac = _masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    ppo_kl = _masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, {"actor/pg_clipfrac": pg_clipfrac, "actor/ppo_kl": ppo_kl, "actor/pg_clipfrac_lower": 0.0}


def verl_sapo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):
    tau_pos = torch.as_tensor(config.tau_pos, dtype=advantages.dtype, device=advantages.device)
    tau_neg = torch.as_tensor(config.tau_neg, dtype=advantages.dtype, device=advantages.device)

    def gate_function(x, tau):
        return torch.sigmoid(tau * (x - 1.0)) * (4.0 / tau)

    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    taus = torch.where(condition=advantages > 0, input=tau_pos, other=tau_neg)
    pg_losses = -gate_function(ratio, taus) * advantages
    pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean", **config.global_batch_info)
    ppo_kl = _masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": ppo_kl, "actor/pg_clipfrac_lower": 0.0}


def verl_gpg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):
    pg_losses = -log_prob * advantages
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **config.global_batch_info), {}


def verl_cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):
    clip_ratio_low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    clip_ratio_high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = _masked_mean(-negative_approx_kl, response_mask)
    clipped_ratio = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = -clipped_ratio.detach() * advantages * log_prob
    pg_clipfrac = _masked_mean((ratio != clipped_ratio).float(), response_mask)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **config.global_batch_info)
    return pg_loss, {"actor/pg_clipfrac": pg_clipfrac, "actor/ppo_kl": ppo_kl, "actor/pg_clipfrac_lower": 0.0}


def verl_kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):
    kl_cov_ratio = config.policy_loss.kl_cov_ratio
    ppo_kl_coef = config.policy_loss.ppo_kl_coef
    negative_approx_kl = log_prob - old_log_prob
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(negative_approx_kl)
    ppo_kl_abs = _masked_mean(negative_approx_kl.abs(), response_mask)
    pg_losses1 = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl
    pg_losses = pg_losses1
    all_valid = response_mask > 0
    all_valid_idx = torch.nonzero(all_valid.reshape(-1), as_tuple=True)[0]
    all_valid_adv = advantages[all_valid].detach().reshape(-1).cpu()
    all_valid_logp = log_prob[all_valid].detach().reshape(-1).cpu()
    k = min(kl_cov_ratio, len(all_valid_adv))
    if k != 0:
        cov_lst_all = (all_valid_adv - all_valid_adv.mean()) * (all_valid_logp - all_valid_logp.mean())
        k_percent_nums = max(1, int(len(cov_lst_all) * kl_cov_ratio))
        large_cov_idxs = torch.topk(cov_lst_all, k_percent_nums, largest=True).indices
        if len(large_cov_idxs) != 0:
            large_cov_idxs = all_valid_idx[large_cov_idxs]
            rows, cols = large_cov_idxs // advantages.shape[1], large_cov_idxs % advantages.shape[1]
            pg_losses[rows, cols] = pg_losses_kl[rows, cols]
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **config.global_batch_info)
    return pg_loss, {"actor/ppo_kl": ppo_kl_abs}


def verl_geo_mean(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):
    cliprange_low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    cliprange_high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    negative_approx_kl = log_prob - old_log_prob
    ppo_kl = _masked_mean(-negative_approx_kl, response_mask)
    sgn_advantage = torch.sign(advantages)
    negative_approx_kl_clamp = torch.clamp(negative_approx_kl, -cliprange_low, cliprange_high)
    negative_approx_kl_min = torch.min(sgn_advantage * negative_approx_kl, sgn_advantage * negative_approx_kl_clamp)
    negative_approx_kl_min = sgn_advantage * negative_approx_kl_min
    response_mask_sum = response_mask.sum(dim=-1)
    ratio = torch.exp((negative_approx_kl_min * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8))
    advantage = (advantages * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8)
    pg_loss = torch.mean(-advantage * ratio)
    clipped = torch.ne(negative_approx_kl, negative_approx_kl_clamp)
    pg_clipfrac = _masked_mean((clipped * (advantages > 0)).float(), response_mask)
    pg_clipfrac_lower = _masked_mean((clipped * (advantages < 0)).float(), response_mask)
    return pg_loss, _metrics(pg_clipfrac, ppo_kl, pg_clipfrac_lower)


ORACLES = {
    "vanilla": verl_vanilla,
    "gspo": verl_gspo,
    "sapo": verl_sapo,
    "gpg": verl_gpg,
    "cispo": verl_cispo,
    "kl_cov": verl_kl_cov,
    "geo_mean": verl_geo_mean,
}


# ----------------------------------------------------------------------------- the comparison


@functools.cache
def _actor_section():
    from hybrid.config import build_config

    return build_config().actor_rollout_ref.actor


def _configs(loss_scale_factor=None):
    """hybrid's actor section and verl's ActorConfig fields, with the same values."""
    ours = _actor_section()
    ours = dataclasses.replace(
        ours,
        loss_scale_factor=loss_scale_factor,
        clip_ratio=0.2,
        clip_ratio_low=0.15,
        clip_ratio_high=0.28,
        clip_ratio_c=2.5,
        policy_loss=dataclasses.replace(
            ours.policy_loss, kl_cov_ratio=0.1, ppo_kl_coef=0.7, sapo_tau_pos=1.0, sapo_tau_neg=1.05
        ),
    )
    verl = SimpleNamespace(
        clip_ratio=0.2,
        clip_ratio_low=0.15,
        clip_ratio_high=0.28,
        clip_ratio_c=2.5,
        tau_pos=1.0,
        tau_neg=1.05,
        policy_loss=SimpleNamespace(kl_cov_ratio=0.1, ppo_kl_coef=0.7),
        # verl's ppo_loss puts loss_scale_factor into global_batch_info
        global_batch_info={} if loss_scale_factor is None else {"loss_scale_factor": loss_scale_factor},
    )
    return ours, verl


def _batch(seed: int):
    """Rows of different lengths (one fully masked), log-ratios wide enough to clip."""
    g = torch.Generator().manual_seed(seed)
    rows, width = 6, 9
    old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 3
    logp = (old + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.3).requires_grad_(True)
    adv = torch.randn(rows, width, generator=g, dtype=torch.float64)
    lengths = torch.tensor([9, 5, 1, 7, 0, 3])
    mask = (torch.arange(width)[None, :] < lengths[:, None]).to(torch.float64)
    return old, logp, adv, mask


@pytest.mark.parametrize("mode", [*MODES, "seq-mean-token-sum-norm/loss_scale_factor=7"])
@pytest.mark.parametrize("name", sorted(ORACLES))
def test_policy_loss_matches_verl_0_9(name, mode):
    mode, _, scale = mode.partition("/loss_scale_factor=")
    ours_cfg, verl_cfg = _configs(int(scale) if scale else None)
    for seed in (0, 1):
        old, logp, adv, mask = _batch(seed)
        theirs, their_metrics = ORACLES[name](old, logp, adv, mask, mode, verl_cfg)
        (their_grad,) = torch.autograd.grad(theirs, logp)
        loss, metrics = L.get_policy_loss_fn(name)(
            old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, loss_agg_mode=mode, config=ours_cfg
        )
        (grad,) = torch.autograd.grad(loss, logp)
        torch.testing.assert_close(loss, theirs, atol=1e-6, rtol=0)
        torch.testing.assert_close(grad, their_grad, atol=1e-6, rtol=0)
        for key, value in their_metrics.items():
            torch.testing.assert_close(
                torch.as_tensor(metrics[key], dtype=torch.float64),
                torch.as_tensor(value, dtype=torch.float64),
                atol=1e-6,
                rtol=0,
                msg=lambda m, key=key: f"{name} {mode} {key}: {m}",
            )
