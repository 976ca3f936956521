"""Garbage at masked positions changes nothing.

A multi-turn response holds observation (environment) tokens with `response_mask` 0 between
the model's tokens, and padding after them. Whatever the logits, log-probs, old/ref/engine
log-probs, advantages or values hold there must not reach the loss, the gradient or the
metrics. Each test builds one such batch twice: once with ordinary numbers everywhere, once
with huge (but finite) random numbers, +-1e4, at every masked position, and runs it through
the functions the actor update itself uses (workers/losses.py, workers/rollout_correction.py,
and DataParallelPPOActor.update_policy with a logits table standing in for the model).

Asserted: equal losses, KL, entropy and metrics (fp tolerance), a gradient that is exactly 0
at every masked position (and equal elsewhere), masked parameters left untouched by the
optimizer step; and, as an independent reference, that the losses of the multi-turn layout
equal those of the same model tokens packed contiguously (the single-turn layout).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from types import SimpleNamespace

import pytest
import torch

from hybrid.config.rules import kl_kinds
from protocol.data_proto import DataProto
from workers.losses import (
    AGG_LOSS_MODES,
    POLICY_LOSS_REGISTRY,
    agg_loss,
    compute_value_loss,
    entropy_from_logits,
    get_policy_loss_fn,
    kl_penalty,
    logprobs_from_logits,
)
from workers.rollout_correction import CorrectionSettings, compute_correction

# M: a model token (mask 1); o: an observation token (mask 0, attended); .: padding.
ROWS = [
    "MMMooooMMMM...",  # two turns, then padding
    "MMoooMMooMMMMM",  # three turns, up to the budget
    "MMMMMMMMMMMMMM",  # one turn, no mask at all
    "MMMM..........",  # one short turn
    "MoooooooMMM...",  # a long observation after a one-token answer
    "..............",  # an empty response: every position masked
]
B, R = len(ROWS), len(ROWS[0])
V = 11  # vocabulary of the stand-in model
P = 3  # prompt length
TEMPERATURE = 0.7
GARBAGE = 1e4

ALL_POLICY_LOSSES = tuple(POLICY_LOSS_REGISTRY)
ALL_AGG_MODES = tuple(AGG_LOSS_MODES)
ALL_KL_KINDS = kl_kinds() + tuple(k + "+" for k in kl_kinds())  # "+": straight-through k2 gradient


def test_the_registries_hold_what_this_file_covers():
    # A new loss or aggregation is covered automatically; this catches an empty registry.
    assert {"vanilla", "gspo", "clip_cov", "kl_cov", "cispo", "sapo", "gpg"} <= set(ALL_POLICY_LOSSES)
    assert {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"} <= set(ALL_AGG_MODES)
    assert {"low_var_kl", "kl", "abs", "mse"} <= set(ALL_KL_KINDS)


# ----------------------------------------------------------------------------- the batch


def _mask() -> torch.Tensor:
    return torch.tensor([[1 if c == "M" else 0 for c in row] for row in ROWS], dtype=torch.long)


def _attended() -> torch.Tensor:
    return torch.tensor([[0 if c == "." else 1 for c in row] for row in ROWS], dtype=torch.long)


def make_batch(garbage: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    """Logits (B, R + 1, V) as the model returns them (the last column predicts nothing),
    the sampled responses and the per-token inputs of the losses. With `garbage`, every
    masked position holds +-1e4 noise instead (the ordinary numbers elsewhere are the same)."""
    gen = torch.Generator().manual_seed(seed)
    mask = _mask()
    logits = torch.randn(B, R + 1, V, generator=gen) * 2.0
    responses = torch.randint(0, V, (B, R), generator=gen)
    current = logprobs_from_logits(logits[:, :-1] / TEMPERATURE, responses)
    batch = {
        "logits": logits,
        "responses": responses,
        "response_mask": mask,
        "old_log_probs": current + 0.3 * torch.randn(B, R, generator=gen),
        "ref_log_prob": current + 0.5 * torch.randn(B, R, generator=gen),
        "rollout_log_probs": current + 0.2 * torch.randn(B, R, generator=gen),
        "advantages": torch.randn(B, 1, generator=gen).expand(B, R) * mask,  # zero where masked, as estimators do
        "values": torch.randn(B, R, generator=gen),
        "returns": torch.randn(B, R, generator=gen) * mask,
    }
    if garbage:
        noise = torch.Generator().manual_seed(seed + 1000)
        hole = mask == 0

        def junk(*shape):
            return (torch.rand(*shape, generator=noise) * 2 - 1) * GARBAGE

        batch["logits"][:, :-1][hole] = junk(int(hole.sum()), V)
        batch["logits"][:, -1] = junk(B, V)
        for key in ("old_log_probs", "ref_log_prob", "rollout_log_probs", "advantages", "values", "returns"):
            batch[key] = batch[key].clone()
            batch[key][hole] = junk(int(hole.sum()))
    return batch


def compact(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same model tokens packed to the front of each row (the single-turn layout),
    zeros after them; the horizon R stays, so seq-mean-token-sum-norm divides alike."""
    mask = batch["response_mask"]
    out = {k: torch.zeros_like(v) for k, v in batch.items()}
    for i in range(B):
        keep = mask[i].nonzero().squeeze(-1)
        n = keep.numel()
        for key, value in batch.items():
            if key == "logits":
                out[key][i, :n] = value[i, :-1][keep]
            else:
                out[key][i, :n] = value[i][keep]
        out["response_mask"][i, :n] = 1
    return out


@functools.cache
def actor_config(*overrides: str):
    from hybrid.config import build_config

    base = (
        "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.2",  # cut a few tokens, not one
        "actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0.2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_coef=0.1",
    )
    return build_config([*base, *overrides])


def _loss_config(loss_mode: str, agg: str):
    a = "actor_rollout_ref.actor."
    return actor_config(f"{a}policy_loss.loss_mode={loss_mode}", f"{a}loss_agg_mode={agg}").actor_rollout_ref.actor


def assert_same(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), (what, sorted(set(a) ^ set(b)))
    for key in a:
        x, y = torch.as_tensor(a[key], dtype=torch.float64), torch.as_tensor(b[key], dtype=torch.float64)
        assert torch.isfinite(y).all(), f"{what}: {key} is not finite with garbage at masked positions: {y}"
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-6, msg=lambda m, key=key: f"{what}: {key}: {m}")


# ----------------------------------------------------------------------------- the loss functions


def loss_terms(batch: dict, loss_mode: str, agg: str) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Every scalar the actor's loss is made of, as the actor combines them, and the
    gradients of their sum wrt the logits and the current log-probs."""
    cfg = _loss_config(loss_mode, agg)
    logits = batch["logits"].clone().requires_grad_(True)
    scaled = logits[:, :-1] / TEMPERATURE
    mask = batch["response_mask"]
    log_prob = logprobs_from_logits(scaled, batch["responses"])
    log_prob.retain_grad()
    settings = CorrectionSettings("token", 2.0, None, False, (), False, "ppo_clip")
    weights = compute_correction(batch["old_log_probs"], batch["rollout_log_probs"], mask, settings).weights
    out: dict[str, torch.Tensor] = {}
    for name, is_weights in (("pg", None), ("pg_tis", weights)):
        torch.manual_seed(0)  # clip_cov draws the tokens it cuts
        pg_loss, pg_metrics = get_policy_loss_fn(loss_mode)(
            old_log_prob=batch["old_log_probs"],
            log_prob=log_prob,
            advantages=batch["advantages"],
            response_mask=mask,
            loss_agg_mode=agg,
            config=cfg,
            rollout_is_weights=is_weights,
        )
        out[f"{name}/loss"] = pg_loss
        out.update({f"{name}/{k}": v for k, v in pg_metrics.items()})
    out["entropy"] = agg_loss(entropy_from_logits(scaled), mask, agg)
    for kind in ALL_KL_KINDS:
        out[f"kl/{kind}"] = agg_loss(kl_penalty(log_prob, batch["ref_log_prob"], kind), mask, agg)
    total = out["pg/loss"] + out["pg_tis/loss"] - 0.01 * out["entropy"] + sum(out[f"kl/{k}"] for k in ALL_KL_KINDS)
    total.backward()
    return {k: v.detach() for k, v in out.items()}, logits.grad, log_prob.grad


@pytest.mark.parametrize("agg", ALL_AGG_MODES)
@pytest.mark.parametrize("loss_mode", ALL_POLICY_LOSSES)
def test_policy_loss_kl_and_entropy_ignore_masked_garbage(loss_mode, agg):
    clean, clean_grad, clean_lp_grad = loss_terms(make_batch(garbage=False), loss_mode, agg)
    dirty, dirty_grad, dirty_lp_grad = loss_terms(make_batch(garbage=True), loss_mode, agg)
    assert_same(clean, dirty, f"{loss_mode}/{agg}")

    hole = _mask() == 0
    assert torch.count_nonzero(dirty_grad[:, :-1][hole]) == 0
    assert torch.count_nonzero(dirty_grad[:, -1]) == 0
    assert torch.count_nonzero(dirty_lp_grad[hole]) == 0
    torch.testing.assert_close(dirty_grad, clean_grad, rtol=1e-5, atol=1e-7)
    assert clean_grad[:, :-1][~hole].abs().sum() > 0  # the model tokens do get a gradient

    # Independent reference: the same model tokens laid out as one contiguous turn.
    packed, packed_grad, _ = loss_terms(compact(make_batch(garbage=False)), loss_mode, agg)
    assert_same(packed, clean, f"{loss_mode}/{agg} packed")
    for i in range(B):
        keep = _mask()[i].nonzero().squeeze(-1)
        torch.testing.assert_close(clean_grad[i, :-1][keep], packed_grad[i, : keep.numel()], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("agg", ALL_AGG_MODES)
def test_value_loss_ignores_masked_garbage(agg):
    def value_loss(batch):
        vpreds = (batch["values"] + 0.1).clone().requires_grad_(True)
        loss, clipfrac = compute_value_loss(
            vpreds, batch["returns"], batch["values"], batch["response_mask"], 0.05, agg
        )
        loss.backward()
        return {"vf_loss": loss.detach(), "vf_clipfrac": clipfrac}, vpreds.grad

    clean, clean_grad = value_loss(make_batch(garbage=False))
    dirty, dirty_grad = value_loss(make_batch(garbage=True))
    assert_same(clean, dirty, f"value/{agg}")
    assert torch.count_nonzero(dirty_grad[_mask() == 0]) == 0
    torch.testing.assert_close(dirty_grad, clean_grad)


# ----------------------------------------------------------------------------- the actor update


class LogitsTable(torch.nn.Module):
    """A stand-in causal LM: row i's logits are a trainable (R + 1, V) table, found through
    the first prompt token (the row's number), so micro-batches may take any rows. Column j
    is the logits at sequence position P - 1 + j (the one predicting response token j).
    Takes padded rows (`logits_to_keep` = R + 1) and packed ones (use_remove_padding: one
    row of real tokens, varlen boundaries, `logits_to_keep` = the packed positions to keep)."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(logits.clone())

    def forward(self, input_ids, position_ids, use_cache, logits_to_keep, attention_mask=None, **varlen):
        if not varlen:
            assert logits_to_keep == self.table.shape[1]
            return SimpleNamespace(logits=self.table[input_ids[:, 0]])
        starts = varlen["cu_seq_lens_q"].long()
        seq_of = torch.bucketize(logits_to_keep, starts[1:], right=True)  # which packed row
        column = logits_to_keep - starts[seq_of] - (P - 1)  # the prompt is never padded here
        assert bool((column >= 0).all()) and bool((column < self.table.shape[1]).all())
        rows = input_ids[0, starts[seq_of]]
        return SimpleNamespace(logits=self.table[rows, column].unsqueeze(0))


def actor_data(batch: dict, on_policy: bool, bypass: bool = False) -> DataProto:
    prompt = torch.cat([torch.arange(B).unsqueeze(1), torch.zeros(B, P - 1, dtype=torch.long)], dim=1)
    attention_mask = torch.cat([torch.ones(B, P, dtype=torch.long), _attended()], dim=1)
    tensors = {
        "input_ids": torch.cat([prompt, batch["responses"]], dim=1),
        "attention_mask": attention_mask,
        "position_ids": torch.clamp(attention_mask.cumsum(-1) - 1, min=0),
        **{k: batch[k] for k in ("responses", "response_mask", "advantages", "ref_log_prob", "rollout_log_probs")},
    }
    if not on_policy:
        tensors["old_log_probs"] = batch["rollout_log_probs" if bypass else "old_log_probs"]
    return DataProto.from_dict(tensors=tensors)


def run_update(batch: dict, cfg, on_policy: bool, mini_batch_size: int = B, packed: bool = False):
    """One `update_policy` call on the stand-in model (SGD, lr 0.1): the metrics, the summed
    gradient of every backward pass, and the table after the optimizer steps. The derived
    fields the driver's config fills are set for this batch: one response per row, one rank,
    `mini_batch_size` rows per optimizer step, on-policy (no old log-probs) or not."""
    from workers.actor import DataParallelPPOActor

    cfg = dataclasses.replace(
        cfg, on_policy_update=on_policy, rollout_n=1, data_parallel_size=1, ppo_mini_batch_size=mini_batch_size
    )
    torch.manual_seed(0)
    model = LogitsTable(batch["logits"])
    grads = []
    model.table.register_hook(lambda g: grads.append(g.clone()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    actor = DataParallelPPOActor(model, use_remove_padding=packed, config=cfg, optimizer=optimizer)
    data = actor_data(batch, on_policy, bypass=cfg.correction is not None and cfg.correction.bypass)
    metrics = actor.update_policy(data, TEMPERATURE)
    assert grads, "no backward pass ran"
    return metrics, torch.stack(grads).sum(0), model.table.detach().clone()


def check_update(cfg, on_policy: bool, mini_batch_size: int = B, packed: bool = False) -> dict:
    clean_batch, dirty_batch = make_batch(garbage=False), make_batch(garbage=True)
    clean, clean_grad, clean_after = run_update(clean_batch, cfg, on_policy, mini_batch_size, packed)
    dirty, dirty_grad, dirty_after = run_update(dirty_batch, cfg, on_policy, mini_batch_size, packed)
    assert_same(clean, dirty, "update_policy metrics")
    hole = _mask() == 0
    assert torch.count_nonzero(dirty_grad[:, :-1][hole]) == 0
    assert torch.count_nonzero(dirty_grad[:, -1]) == 0
    torch.testing.assert_close(dirty_grad, clean_grad, rtol=1e-5, atol=1e-7)
    # The optimizer moved the model tokens' logits alike and left the masked ones as they were.
    assert torch.equal(dirty_after[:, :-1][hole], dirty_batch["logits"][:, :-1][hole])
    torch.testing.assert_close(dirty_after[:, :-1][~hole], clean_after[:, :-1][~hole], rtol=1e-5, atol=1e-6)
    assert not torch.equal(clean_after, clean_batch["logits"])
    return clean


@pytest.mark.parametrize("on_policy", [False, True])
def test_the_stand_in_model_gives_the_same_update_packed_and_padded(on_policy):
    # So the remove_padding cases below run the same model as the padded ones.
    cfg = actor_config().actor_rollout_ref.actor
    padded, padded_grad, _ = run_update(make_batch(garbage=False), cfg, on_policy)
    packed, packed_grad, _ = run_update(make_batch(garbage=False), cfg, on_policy, packed=True)
    assert_same(padded, packed, "packed vs padded")
    torch.testing.assert_close(packed_grad, padded_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "remove_padding"])
@pytest.mark.parametrize("agg", ALL_AGG_MODES)
@pytest.mark.parametrize("loss_mode", ALL_POLICY_LOSSES)
def test_actor_update_ignores_masked_garbage(loss_mode, agg, packed):
    a = "actor_rollout_ref.actor."
    cfg = actor_config(f"{a}policy_loss.loss_mode={loss_mode}", f"{a}loss_agg_mode={agg}").actor_rollout_ref.actor
    # Two mini-batches of 3 rows, micro-batches of 2: uneven micro-batches, global weights.
    metrics = check_update(cfg, on_policy=False, mini_batch_size=B // 2, packed=packed)
    for key in ("actor/pg_loss", "actor/entropy_loss", "actor/kl_loss", "actor/grad_norm"):
        assert key in metrics and math.isfinite(metrics[key]), key


@pytest.mark.parametrize("kind", ALL_KL_KINDS)
def test_actor_kl_loss_ignores_masked_garbage(kind):
    cfg = actor_config(f"actor_rollout_ref.actor.kl_loss_type={kind}").actor_rollout_ref.actor
    metrics = check_update(cfg, on_policy=False, mini_batch_size=B // 2)
    assert metrics["actor/kl_loss"] != 0


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "remove_padding"])
@pytest.mark.parametrize("agg", ALL_AGG_MODES)
def test_on_policy_update_and_its_engine_gap_metrics_ignore_masked_garbage(agg, packed):
    # On-policy, the update reports what the skipped old log-prob pass would have: the
    # entropy and the engine/trainer gap (rollout/logp_abs_diff_*), over model tokens only.
    cfg = actor_config(f"actor_rollout_ref.actor.loss_agg_mode={agg}").actor_rollout_ref.actor
    metrics = check_update(cfg, on_policy=True, packed=packed)
    assert {"actor/entropy", "rollout/logp_abs_diff_mean", "rollout/logp_abs_diff_max"} <= metrics.keys()
    # Reference: the gap over the model tokens, computed here.
    batch = make_batch(garbage=False)
    current = logprobs_from_logits(batch["logits"][:, :-1] / TEMPERATURE, batch["responses"])
    gap = (batch["rollout_log_probs"] - current).abs()[_mask().bool()]
    assert metrics["rollout/logp_abs_diff_mean"] == pytest.approx(float(gap.mean()), rel=1e-5)
    assert metrics["rollout/logp_abs_diff_max"] == pytest.approx(float(gap.max()), rel=1e-5)


CORRECTIONS = {
    "decoupled_token_tis_and_rejection": [
        "rollout_is=token",
        "rollout_rs='token_k1,seq_max_k2'",
        "rollout_rs_threshold='0.5_2.0,2.0'",
    ],
    "decoupled_sequence_is_normalized": [
        "rollout_is=sequence",
        "rollout_is_threshold=5.0",
        "rollout_is_batch_normalize=true",
        "rollout_rs=seq_mean_k3",
        "rollout_rs_threshold=0.5",
    ],
    "bypass_ppo_clip": [
        "bypass_mode=true",
        "rollout_is=token",
        "rollout_rs=seq_sum_k1",
        "rollout_rs_threshold='0.2_5.0'",
    ],
    "bypass_reinforce": [
        "bypass_mode=true",
        "loss_type=reinforce",
        "rollout_is=token",
        "rollout_rs=token_k2",
        "rollout_rs_threshold=0.05",
    ],
}


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("name", sorted(CORRECTIONS))
def test_rollout_correction_ignores_masked_garbage(name, agg):
    overrides = [f"algorithm.rollout_correction.{o}" for o in CORRECTIONS[name]]
    config = actor_config(f"actor_rollout_ref.actor.loss_agg_mode={agg}", *overrides)
    metrics = check_update(config.actor_rollout_ref.actor, on_policy=False)
    corr = {k for k in metrics if k.startswith("rollout_corr/")}
    assert {"rollout_corr/kl", "rollout_corr/rollout_is_mean"} <= corr, sorted(corr)
    assert any(k.startswith("rollout_corr/rollout_rs_") for k in corr), sorted(corr)
