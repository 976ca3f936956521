"""Device-side loss math (workers/losses.py, workers/loss_math.py) against numbers worked out by
hand or by slow python loops written here, including padded masks and the gradient each loss
must give."""

from __future__ import annotations

import ast
import dataclasses
import functools
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import workers.loss_math as loss_math
import workers.losses as L

F64 = torch.float64
LN = math.log


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64), atol=atol, rtol=0
    )


def test_losses_module_imports_only_torch_and_stdlib():
    # workers must never import the driver (hybrid); this also catches reward/protocol creep.
    # The policy losses (workers/losses.py) may import their shared maths (workers/loss_math.py).
    for path in (L.__file__, loss_math.__file__):
        tree = ast.parse(Path(path).read_text())
        roots = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module != "workers.loss_math":
                roots.add((node.module or "").split(".")[0])
        assert roots <= {"__future__", "collections", "typing", "math", "torch", "numpy"}, (path, roots)


# ----------------------------------------------------------------------------- masked stats


def test_masked_sum_mean_ignore_padding_even_when_it_is_nan_or_inf():
    values = t([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    close(L.masked_sum(values, mask), 7.0)  # 1 + 2 + 4
    close(L.masked_mean(values, mask), 7.0 / 3)
    close(L.masked_mean(values, mask, axis=-1), [1.5, 4.0])  # (1+2)/2, 4/1
    close(L.masked_mean(values, torch.zeros_like(mask)), 0.0)  # empty mask: 0, not NaN


def test_masked_var_and_whiten_by_hand():
    values = t([[1.0, 2.0, 99.0], [4.0, -50.0, 7.0]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    # valid: 1, 2, 4; mean 7/3; squared deviations 16/9 + 1/9 + 25/9 = 42/9
    close(L.masked_var(values, mask, unbiased=False), (42 / 9) / 3)
    close(L.masked_var(values, mask), (42 / 9) / 2)  # = 7/3
    white = L.masked_whiten(values, mask)
    expected = [(v - 7 / 3) / math.sqrt(7 / 3 + 1e-8) for v in (1.0, 2.0, 4.0)]
    close(torch.stack([white[0, 0], white[0, 1], white[1, 0]]), expected)
    unshifted = L.masked_whiten(values, mask, shift_mean=False)
    close(unshifted[0, 0], expected[0] + 7 / 3)


def test_masked_var_rejects_empty_and_single_element_masks():
    values = t([[1.0, 2.0]])
    with pytest.raises(ValueError, match="empty"):
        L.masked_var(values, t([[0, 0]]))
    with pytest.raises(ValueError, match="single element"):
        L.masked_var(values, t([[1, 0]]))


# ----------------------------------------------------------------------------- logits


def test_logprobs_and_entropy_by_hand():
    # logits [0, ln 3] -> probs [1/4, 3/4]
    logits = t([[[0.0, LN(3)], [0.0, LN(3)]]])
    labels = torch.tensor([[1, 0]])
    close(L.logprobs_from_logits(logits, labels), [[LN(3 / 4), LN(1 / 4)]])
    h = -(0.25 * LN(0.25) + 0.75 * LN(0.75))
    close(L.entropy_from_logits(logits), [[h, h]])
    close(L.entropy_from_logits(torch.zeros(1, 1, 4, dtype=F64)), [[LN(4)]])  # uniform over 4


def test_logprobs_and_entropy_chunked_match_full_softmax_with_gradients(monkeypatch):
    monkeypatch.setattr(loss_math, "_CHUNK_ELEMS", 7)  # V=5 -> one row per chunk, 6 chunks
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, dtype=F64, requires_grad=True)
    labels = torch.randint(0, 5, (2, 3))
    got = L.logprobs_from_logits(logits, labels)
    ref = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    close(got, ref)
    (g_got,) = torch.autograd.grad(got.sum(), logits)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    close(g_got, g_ref)
    p = torch.softmax(logits, -1)
    close(L.entropy_from_logits(logits), -(p * torch.log(p)).sum(-1))


def test_logprobs_from_bf16_logits_are_float32_and_accurate():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 50).to(torch.bfloat16)
    labels = torch.randint(0, 50, (2, 4))
    got = L.logprobs_from_logits(logits, labels)
    assert got.dtype == torch.float32
    ref = torch.log_softmax(logits.double(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    close(got.double(), ref, atol=1e-5)


def test_compute_entropy_loss_masks_padding():
    logits = torch.zeros(1, 3, 4, dtype=F64)
    logits[0, 1] = t([0.0, LN(3), -1e9, -1e9])  # entropy of [1/4, 3/4]
    logits[0, 2] = float("nan")  # padding
    mask = t([[1, 1, 0]])
    h = -(0.25 * LN(0.25) + 0.75 * LN(0.75))
    close(L.compute_entropy_loss(logits, mask, "token-mean"), (LN(4) + h) / 2)


# ----------------------------------------------------------------------------- aggregation

LOSS_MAT = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [float("nan")] * 4]
LOSS_MASK = [[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]]  # row 2 is a padding row


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 17 / 5),  # (1+2+3+5+6) / 5 tokens
        ("seq-mean-token-sum", 8.5),  # (6 + 11) / 2 sequences; the empty row is not counted
        ("seq-mean-token-mean", 3.75),  # (6/3 + 11/2) / 2
        ("seq-mean-token-sum-norm", 2.125),  # (6/4 + 11/4) / 2, horizon T = 4
    ],
)
def test_agg_loss_modes_by_hand(mode, expected):
    close(L.agg_loss(t(LOSS_MAT), t(LOSS_MASK), mode), expected)


def test_agg_loss_norm_with_explicit_scale_and_unknown_mode():
    close(L.agg_loss(t(LOSS_MAT), t(LOSS_MASK), "seq-mean-token-sum-norm", loss_scale_factor=2), 4.25)  # (3+5.5)/2
    close(L.agg_loss(t(LOSS_MAT), t(LOSS_MASK), "token-sum"), 17.0)  # 1+2+3 + 5+6, the NaN padding row left out
    with pytest.raises(ValueError, match=r"token-max.*Valid modes.*seq-mean-token-mean"):
        L.agg_loss(t(LOSS_MAT), t(LOSS_MASK), "token-max")


# ----------------------------------------------------------------------------- KL


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("kl", LN(2)),  # log 0.5 - log 0.25
        ("k1", LN(2)),
        ("abs", LN(2)),
        ("mse", 0.5 * LN(2) ** 2),
        ("k2", 0.5 * LN(2) ** 2),
        ("low_var_kl", LN(2) - 0.5),  # x = ref - logp = -ln2: e^x - x - 1 = 0.5 + ln2 - 1
        ("k3", LN(2) - 0.5),
    ],
)
def test_kl_penalty_kinds_by_hand(kind, expected):
    close(L.kl_penalty(t([[LN(0.5)]]), t([[LN(0.25)]]), kind), [[expected]])


def test_kl_abs_is_symmetric_and_k3_is_clamped():
    close(L.kl_penalty(t([[LN(0.25)]]), t([[LN(0.5)]]), "abs"), [[LN(2)]])
    close(L.kl_penalty(t([[LN(0.25)]]), t([[LN(0.5)]]), "kl"), [[-LN(2)]])
    # x = ref - logp = -30 -> clamp -20 -> e^-20 + 19 > 10 -> 10; x = +30 -> e^20 - 21 -> 10
    close(L.kl_penalty(t([[0.0, -30.0]]), t([[-30.0, 0.0]]), "low_var_kl"), [[10.0, 10.0]])


def test_kl_full_over_vocabulary():
    p = t([[[0.5, 0.5]]]).log()
    q = t([[[0.25, 0.75]]]).log()
    # 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln(4/3)
    close(L.kl_penalty(p, q, "full"), [[0.5 * LN(4 / 3)]])
    with pytest.raises(NotImplementedError, match=r"\(B, T, V\)"):
        L.kl_penalty(t([[0.1]]), t([[0.2]]), "full")


def test_kl_plus_variant_has_k3_value_and_k2_gradient():
    logp = t([[LN(0.5), -1.0]]).requires_grad_()
    ref = t([[LN(0.25), -0.3]])
    value = L.kl_penalty(logp, ref, "k3+")
    close(value, L.kl_penalty(logp, ref, "k3"))
    (grad,) = torch.autograd.grad(value.sum(), logp)
    close(grad, (logp - ref).detach())  # d/dlogp of 0.5 (logp - ref)^2


def test_kl_unknown_kind_lists_kinds():
    with pytest.raises(ValueError, match=r"'k4'.*low_var_kl"):
        L.kl_penalty(t([[0.0]]), t([[0.0]]), "k4")


# ----------------------------------------------------------------------------- config access


@functools.lru_cache(maxsize=1)
def _default_actor_section():
    from hybrid.config import build_config

    return build_config().actor_rollout_ref.actor


def actor_section(policy_loss: dict | None = None, **keys):
    """The default `actor_rollout_ref.actor` section (ppo_trainer.yaml), as the worker passes
    it to the losses, with `keys` (and `policy_loss` keys) replaced."""
    section = _default_actor_section()
    if policy_loss:
        keys["policy_loss"] = dataclasses.replace(section.policy_loss, **policy_loss)
    return dataclasses.replace(section, **keys)


def test_losses_read_the_section_and_hold_no_defaults_of_their_own():
    assert not hasattr(L, "_ACTOR_DEFAULTS")
    assert L._clip_range(actor_section(clip_ratio=0.1, clip_ratio_high=0.3)) == (0.2, 0.3)  # yaml's low
    assert L._clip_range(actor_section(clip_ratio=0.1, clip_ratio_low=None, clip_ratio_high=0.3)) == (0.1, 0.3)
    old, logp = _ratio_case([[LN(1.5)]])
    lacking = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2)  # no clip_ratio_c
    with pytest.raises(AttributeError, match="clip_ratio_c"):
        L.compute_policy_loss_vanilla(old, logp, t([[1.0]]), t([[1]]), config=lacking)


# ----------------------------------------------------------------------------- policy losses


def _ratio_case(log_ratios, logp=None):
    """old/new log-probs whose ratio exp(logp - old) is exactly exp(log_ratios)."""
    lr = t(log_ratios)
    logp = torch.full_like(lr, -1.0) if logp is None else t(logp)
    return logp - lr, logp.clone().requires_grad_()


# Five valid tokens, one per PPO case, and padding holding absurd values.
#   a: A=+1 r=1.5  -> L1=-1.5  L2=-1.28 (clip at 1.28) -> -1.28, clipped
#   b: A=+1 r=0.5  -> L1=-0.5  L2=-0.8                 -> -0.5
#   c: A=-1 r=0.5  -> L1=0.5   L2=0.8 (clip at 0.8)    -> 0.8, clipped; below c*|A| = 3
#   d: A=-1 r=5    -> L1=5     L2=1.28                 -> 5, dual-clipped to 3
#   e: A=-2 r=1.1  -> L1=2.2   L2=2.2                  -> 2.2
VANILLA_LR = [[LN(1.5), LN(0.5), LN(0.5), 30.0], [LN(5.0), LN(1.1), -30.0, 0.0]]
VANILLA_ADV = [[1.0, 1.0, -1.0, 100.0], [-1.0, -2.0, 100.0, 100.0]]
VANILLA_MASK = [[1, 1, 1, 0], [1, 1, 0, 0]]
CLIP = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
CFG = actor_section(**CLIP)


def test_vanilla_ppo_dual_clip_by_hand():
    old, logp = _ratio_case(VANILLA_LR)
    loss, m = L.compute_policy_loss_vanilla(old, logp, t(VANILLA_ADV), t(VANILLA_MASK), "token-mean", CFG)
    close(loss, (-1.28 - 0.5 + 0.8 + 3.0 + 2.2) / 5)  # 0.844
    close(m["actor/pg_clipfrac"], 2 / 5)  # a, c
    close(m["actor/pg_clipfrac_lower"], 1 / 5)  # d
    close(m["actor/ppo_kl"], -LN(1.5 * 0.5 * 0.5 * 5.0 * 1.1) / 5)
    (grad,) = torch.autograd.grad(loss, logp)
    # d(-A r)/dlogp = -A r for unclipped tokens, 0 for clipped ones; / 5 tokens
    close(grad, [[0.0, -0.5 / 5, 0.0, 0.0], [0.0, 2.2 / 5, 0.0, 0.0]])
    seq_loss, _ = L.compute_policy_loss_vanilla(old, logp, t(VANILLA_ADV), t(VANILLA_MASK), "seq-mean-token-mean", CFG)
    close(seq_loss, ((-1.28 - 0.5 + 0.8) / 3 + (3.0 + 2.2) / 2) / 2)


def test_vanilla_clip_range_falls_back_to_clip_ratio_in_every_config_form():
    old, logp = _ratio_case([[LN(1.5)]])
    for cfg in (
        actor_section(clip_ratio=0.1, clip_ratio_low=None, clip_ratio_high=None),
        SimpleNamespace(
            clip_ratio=0.1,
            clip_ratio_low=None,
            clip_ratio_high=None,
            clip_ratio_c=3.0,
            tis_imp_ratio_cap=-1,
            loss_scale_factor=None,
        ),
    ):
        loss, _ = L.compute_policy_loss_vanilla(old, logp, t([[1.0]]), t([[1]]), config=cfg)
        close(loss, -1.1)  # clipped at 1 + 0.1
    with pytest.raises(ValueError, match="clip_ratio_c"):
        L.compute_policy_loss_vanilla(old, logp, t([[1.0]]), t([[1]]), config=actor_section(clip_ratio_c=1.0))


# The actor section as GSPO reads it (attribute access, as the config reaches the losses).
GSPO_CFG = SimpleNamespace(
    clip_ratio=0.2,
    clip_ratio_low=0.2,
    clip_ratio_high=0.28,
    clip_ratio_c=3.0,
    tis_imp_ratio_cap=-1,
    loss_scale_factor=None,
)


def test_gspo_sequence_ratio_by_hand():
    # s_i is the geometric mean of the token ratios, exp(mean log-ratio):
    # row 0: log-ratios [ln1.44, 0] -> s = 1.2 (arithmetic mean would be 1.22), A=+1 -> -1.2
    # row 1: log-ratios [ln.9]*3    -> s = 0.9, A=-1                              -> 0.9
    # row 2: log-ratios [ln2, 0]    -> s = sqrt2 > 1.28, A=+1 -> -1.28 (both tokens clipped)
    old, logp = _ratio_case([[LN(1.44), 0.0, 40.0], [LN(0.9)] * 3, [LN(2), 0.0, -40.0]])
    adv = t([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
    mask = t([[1, 1, 0], [1, 1, 1], [1, 1, 0]])
    loss, m = L.compute_policy_loss_gspo(old, logp, adv, mask, "seq-mean-token-mean", GSPO_CFG)
    close(loss, (-1.2 + 0.9 - 1.28) / 3)
    close(m["actor/pg_clipfrac"], 2 / 7)
    close(m["actor/pg_clipfrac_lower"], 0.0)
    (grad,) = torch.autograd.grad(loss, logp)
    # unclipped: d(-A * sg[s] * pi/sg[pi])/dlogp = -A s, / tokens of the row / 3 sequences
    close(grad, [[-1.2 / 6, -1.2 / 6, 0.0], [0.1, 0.1, 0.1], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, expected, per_token",
    [
        # per_token: d loss / d (token loss) for the two rows (2 and 3 valid tokens)
        ("seq-mean-token-mean", -1.55, (1 / 4, 1 / 6)),
        ("token-mean", -8.2 / 5, (1 / 5, 1 / 5)),
        ("seq-mean-token-sum", -4.1, (1 / 2, 1 / 2)),
        ("seq-mean-token-sum-norm", -4.1 / 3, (1 / 6, 1 / 6)),
    ],
)
def test_gspo_aggregates_by_loss_agg_mode_as_verl_0_9(mode, expected, per_token):
    # verl 0.9's compute_policy_loss_gspo calls agg_loss(..., loss_agg_mode=loss_agg_mode).
    # Unclipped rows of 2 and 3 tokens:
    #   row 0: log-ratios [ln1.1, ln1.1] -> s = 1.1, A = [1, 1]    -> losses [-1.1, -1.1]
    #   row 1: log-ratios [0, 0, 0]      -> s = 1,   A = [1, 2, 3] -> losses [-1, -2, -3]
    # seq-mean-token-mean (-1.1 + -2) / 2; token-mean -8.2 / 5; seq-mean-token-sum (-2.2 - 6) / 2;
    # seq-mean-token-sum-norm that / 3 (the horizon).
    old, logp = _ratio_case([[LN(1.1), LN(1.1), 30.0], [0.0, 0.0, 0.0]])
    adv = t([[1.0, 1.0, 50.0], [1.0, 2.0, 3.0]])
    mask = t([[1, 1, 0], [1, 1, 1]])
    loss, m = L.compute_policy_loss_gspo(old, logp, adv, mask, mode, GSPO_CFG)
    close(loss, expected)
    close(m["actor/pg_clipfrac"], 0.0)
    (grad,) = torch.autograd.grad(loss, logp)
    # d(-A sg[s] pi / sg[pi]) / dlogp = -A s per token, times the aggregation's weight
    w0, w1 = per_token
    close(grad, [[-1.1 * w0, -1.1 * w0, 0.0], [-1 * w1, -2 * w1, -3 * w1]])


def _slow_cov(adv, logp, mask):
    """(A - mean A)(logp - mean logp) over valid tokens, by python loops."""
    cells = [(i, j) for i in range(len(mask)) for j in range(len(mask[0])) if mask[i][j]]
    ma = sum(adv[i][j] for i, j in cells) / len(cells)
    ml = sum(logp[i][j] for i, j in cells) / len(cells)
    return {(i, j): (adv[i][j] - ma) * (logp[i][j] - ml) for i, j in cells}


COV_ADV = [[2.0, -1.0, 0.5], [1.0, -2.0, 0.0]]
COV_LOGP = [[-0.5, -2.0, -1.0], [-3.0, -0.2, -9.0]]
COV_MASK = [[1, 1, 1], [1, 1, 0]]
COV_LR = [[0.01, -0.02, 0.03], [0.0, 0.05, 0.0]]  # all ratios inside [0.8, 1.28]: nothing PPO-clipped


def _unclipped_loss_cells(adv, mask):
    ratio = [[math.exp(x) for x in row] for row in COV_LR]
    return {(i, j): -adv[i][j] * ratio[i][j] for i in range(2) for j in range(3) if mask[i][j]}


def test_clip_cov_cuts_the_single_token_in_the_covariance_window():
    cov = _slow_cov(COV_ADV, COV_LOGP, COV_MASK)
    inside = sorted(cov, key=cov.get)[-1]  # the largest covariance; put only it in the window
    lb = sorted(cov.values())[-2] + 1e-3
    cfg = actor_section(
        policy_loss={"clip_cov_ratio": 0.2, "clip_cov_lb": lb, "clip_cov_ub": cov[inside] + 1.0}, **CLIP
    )
    old, logp = _ratio_case(COV_LR, COV_LOGP)
    loss, m = L.compute_policy_loss_clip_cov(old, logp, t(COV_ADV), t(COV_MASK), "token-mean", cfg)
    cells = _unclipped_loss_cells(COV_ADV, COV_MASK)
    close(loss, sum(v for k, v in cells.items() if k != inside) / 5)
    close(m["actor/pg_clipfrac"], 1 / 5)
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad[inside] == 0 and all(grad[k] != 0 for k in cells if k != inside)


def test_clip_cov_never_picks_a_token_ppo_already_clipped():
    cov = _slow_cov(COV_ADV, COV_LOGP, COV_MASK)
    top = sorted(cov, key=cov.get)[-1]  # (0, 0), A=+2: give it ratio 1.5 so PPO clips it at 1.28
    lb = sorted(cov.values())[-2] + 1e-3
    cfg = actor_section(policy_loss={"clip_cov_ratio": 0.2, "clip_cov_lb": lb, "clip_cov_ub": cov[top] + 1.0}, **CLIP)
    lr = [row[:] for row in COV_LR]
    lr[top[0]][top[1]] = LN(1.5)
    old, logp = _ratio_case(lr, COV_LOGP)
    loss, m = L.compute_policy_loss_clip_cov(old, logp, t(COV_ADV), t(COV_MASK), "token-mean", cfg)
    cells = _unclipped_loss_cells(COV_ADV, COV_MASK)
    cells[top] = -2.0 * 1.28  # PPO-clipped loss of the top token, kept (not cut to 0)
    close(loss, sum(cells.values()) / 5)
    close(m["actor/pg_clipfrac"], 0.0)


def test_clip_cov_draws_at_most_clip_num_of_the_candidates():
    cfg = actor_section(policy_loss={"clip_cov_ratio": 0.2, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0}, **CLIP)
    old, logp = _ratio_case(COV_LR, COV_LOGP)
    cells = _unclipped_loss_cells(COV_ADV, COV_MASK)
    possible = [sum(v for k, v in cells.items() if k != cut) / 5 for cut in cells]
    for seed in range(3):
        torch.manual_seed(seed)
        loss, m = L.compute_policy_loss_clip_cov(old, logp, t(COV_ADV), t(COV_MASK), "token-mean", cfg)
        close(m["actor/pg_clipfrac"], 1 / 5)  # max(1, int(0.2 * 5)) = 1 token cut
        assert any(abs(loss.item() - p) < 1e-7 for p in possible)  # masked_mean adds 1e-8 to the count


def test_kl_cov_penalises_the_top_covariance_tokens():
    cov = _slow_cov(COV_ADV, COV_LOGP, COV_MASK)
    top2 = sorted(cov, key=cov.get)[-2:]  # int(5 * 0.4) = 2 tokens
    cfg = actor_section(policy_loss={"kl_cov_ratio": 0.4, "ppo_kl_coef": 0.5})
    old, logp = _ratio_case(COV_LR, COV_LOGP)
    loss, m = L.compute_policy_loss_kl_cov(old, logp, t(COV_ADV), t(COV_MASK), "token-mean", cfg)
    cells = _unclipped_loss_cells(COV_ADV, COV_MASK)
    expected = sum(v + (0.5 * abs(COV_LR[i][j]) if (i, j) in top2 else 0.0) for (i, j), v in cells.items()) / 5
    close(loss, expected)
    close(m["actor/ppo_kl"], sum(abs(COV_LR[i][j]) for i, j in cells) / 5)
    with pytest.raises(ValueError, match="kl_cov_ratio"):
        L.compute_policy_loss_kl_cov(
            old, logp, t(COV_ADV), t(COV_MASK), config=actor_section(policy_loss={"kl_cov_ratio": 0})
        )


def test_cispo_by_hand():
    # a: A=+1 r=1.5 -> weight clip 1.28, logp=-1 -> -1.28 * 1 * -1 = 1.28
    # b: A=-1 r=0.9 -> weight 0.9,       logp=-2 -> -0.9 * -1 * -2 = -1.8
    old, logp = _ratio_case([[LN(1.5), LN(0.9), 9.0]], [[-1.0, -2.0, -5.0]])
    loss, m = L.compute_policy_loss_cispo(old, logp, t([[1.0, -1.0, 7.0]]), t([[1, 1, 0]]), "token-mean", CFG)
    close(loss, (1.28 - 1.8) / 2)
    close(m["actor/pg_clipfrac"], 0.5)
    (grad,) = torch.autograd.grad(loss, logp)
    close(grad, [[-1.28 / 2, 0.9 / 2, 0.0]])  # -sg[w] A / 2: clipped tokens keep a gradient


def test_sapo_by_hand_and_on_policy_gradient_equals_vanilla():
    # A=+1, r=1, tau_pos=1:      f = 4 sigmoid(0) = 2           -> loss -2
    # A=-1, r=2, tau_neg=1.05:   f = (4/1.05) sigmoid(1.05) = 3.809524 * 0.740775 = 2.8220 -> loss +2.8220
    old, logp = _ratio_case([[0.0, LN(2.0), 5.0], [0.0, 0.0, 0.0]])
    adv, mask = t([[1.0, -1.0, 3.0], [-2.0, 0.5, 1.0]]), t([[1, 1, 0], [1, 1, 1]])
    cfg = actor_section(policy_loss={"sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05})
    loss, m = L.compute_policy_loss_sapo(old, logp, adv, mask, "token-mean", cfg)
    f_neg = (4 / 1.05) / (1 + math.exp(-1.05))
    row1 = (-(4 / 1.05) * 0.5 * -2.0 - 4 * 0.5 * 0.5 - 4 * 0.5 * 1.0) / 3
    close(loss, ((-2.0 + f_neg) / 2 + row1) / 2)  # always seq-mean-token-mean
    close(m["actor/pg_clipfrac"], 0.0)
    (grad,) = torch.autograd.grad(loss, logp)
    # f'(1) = 4 sigmoid'(0) = 1 whatever tau: on-policy the gradient is -A, like plain PG
    close(grad[1], t([2.0, -0.5, -1.0]) / 3 / 2)
    with pytest.raises(ValueError, match="sapo_tau_pos"):
        L.compute_policy_loss_sapo(old, logp, adv, mask, config=actor_section(policy_loss={"sapo_tau_pos": 0.0}))


def test_gpg_by_hand():
    old, logp = _ratio_case([[0.3, 0.0, 0.0]], [[-1.0, -2.0, -8.0]])
    loss, m = L.compute_policy_loss_gpg(old, logp, t([[2.0, -1.0, 5.0]]), t([[1, 1, 0]]), "token-mean", actor_section())
    close(loss, (2.0 + -2.0) / 2)  # -(-1 * 2) + -(-2 * -1) = 2 - 2
    close(m["actor/ppo_kl"], -0.3 / 2)
    (grad,) = torch.autograd.grad(loss, logp)
    close(grad, [[-1.0, 0.5, 0.0]])


# Every registered loss with a deterministic config: clip_cov's window holds no token.
ALL_LOSS_CFG = actor_section(policy_loss={"clip_cov_lb": 1e6, "clip_cov_ub": 2e6}, **CLIP)


@pytest.mark.parametrize("name", sorted(L.POLICY_LOSS_REGISTRY))
def test_rollout_is_weights_scale_every_loss(name):
    # Rollout-correction weights (workers/rollout_correction.py) multiply every loss after its clipping.
    fn = L.get_policy_loss_fn(name)
    old, logp = _ratio_case(COV_LR, COV_LOGP)
    adv, mask = t(COV_ADV), t(COV_MASK)
    plain, _ = fn(old, logp, adv, mask, "token-mean", ALL_LOSS_CFG)
    # a weight of 2 on every token: every aggregation is linear -> loss x2
    weighted, metrics = fn(
        old, logp, adv, mask, "token-mean", ALL_LOSS_CFG, rollout_is_weights=torch.full_like(old, 2.0)
    )
    close(weighted, 2 * plain)
    close(fn(old, logp, adv, mask, "token-mean", ALL_LOSS_CFG, rollout_is_weights=None)[0], plain)
    assert set(metrics) >= {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}
    assert all(torch.is_tensor(v) and not v.requires_grad for v in metrics.values())


def test_truncated_is_applies_per_token_weights():
    pg = t([[1.0, -2.0, 3.0]])
    close(L.apply_truncated_is(pg, t([[2.0, 0.5, 0.0]])), [[2.0, -1.0, 0.0]])
    assert L.apply_truncated_is(pg, None) is pg


def test_reinforce_loss_by_hand():
    # verl 0.9's bypass loss_type=reinforce: L = -A * w * logp, aggregated; no ratio, no clip.
    logp = t([[LN(0.5), LN(0.25), 0.0]]).requires_grad_()
    rollout = t([[LN(0.4), LN(0.25), 5.0]])
    adv, mask = t([[1.0, -2.0, 7.0]]), t([[1, 1, 0]])
    weights = t([[1.25, 1.0, 0.0]])
    loss, m = L.compute_policy_loss_reinforce(rollout, logp, adv, mask, "token-mean", None, rollout_is_weights=weights)
    close(loss, (-1.0 * 1.25 * LN(0.5) + 2.0 * 1.0 * LN(0.25)) / 2)
    (grad,) = torch.autograd.grad(loss, logp)
    close(grad, [[-1.25 / 2, 2.0 / 2, 0.0]])  # -A w / tokens: the weight is a constant
    close(m["actor/ppo_kl"], ((LN(0.4) - LN(0.5)) + 0.0) / 2)  # mean(rollout - logp)
    close(m["actor/pg_clipfrac"], 0.0)
    plain, _ = L.compute_policy_loss_reinforce(rollout, logp, adv, mask, "seq-mean-token-sum")
    close(plain, -LN(0.5) + 2.0 * LN(0.25))  # one sequence: the token sum of -A logp


def test_policy_loss_registry():
    assert set(L.POLICY_LOSS_REGISTRY) >= {"vanilla", "gspo", "clip_cov", "kl_cov", "cispo", "sapo", "gpg"}
    assert L.get_policy_loss_fn("vanilla") is L.compute_policy_loss_vanilla
    with pytest.raises(ValueError, match=r"'nope'.*'cispo'.*'vanilla'"):
        L.get_policy_loss_fn("nope")

    @L.register_policy_loss("test_custom_loss")
    def custom(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode="token-mean",
        config=None,
        rollout_is_weights=None,
    ):
        return log_prob.sum(), {}

    try:
        assert L.get_policy_loss_fn("test_custom_loss") is custom
    finally:
        del L.POLICY_LOSS_REGISTRY["test_custom_loss"]


# ----------------------------------------------------------------------------- value loss


def test_value_loss_by_hand():
    # (vpred, old value, return), cliprange 0.5:
    #   t0 (1, 1, 2): clip 1   -> l1 = 1, l2 = 1     -> 1
    #   t1 (3, 1, 2): clip 1.5 -> l1 = 1, l2 = 0.25  -> 1
    #   t2 (3, 1, 4): clip 1.5 -> l1 = 1, l2 = 6.25  -> 6.25 (clipped term wins)
    vpreds = t([[1.0, 3.0, 3.0, 50.0]]).requires_grad_()
    values, returns, mask = t([[1.0, 1.0, 1.0, 0.0]]), t([[2.0, 2.0, 4.0, -50.0]]), t([[1, 1, 1, 0]])
    vf_loss, clipfrac = L.compute_value_loss(vpreds, returns, values, mask, 0.5)
    close(vf_loss, 0.5 * (1 + 1 + 6.25) / 3)  # 1.375
    close(clipfrac, 1 / 3)
    (grad,) = torch.autograd.grad(vf_loss, vpreds)
    # 0.5 * d(v - R)^2 / 3 = (v - R) / 3 where unclipped wins; the clipped value is constant in v
    close(grad, [[-1 / 3, 1 / 3, 0.0, 0.0]])


def test_geo_mean_gmpo_against_a_per_token_loop():
    """GMPO (verl's geo_mean) by hand: clip each token's log-ratio on its advantage's side,
    geometric mean per sequence, -mean(A) * ratio, mean over rows; gradients by autograd."""
    import math
    from types import SimpleNamespace

    from workers.losses import get_policy_loss_fn

    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.0]], dtype=torch.float64)
    new = torch.tensor([[-0.7, -2.5, -0.4], [-0.9, -1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float64)
    config = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28)
    loss, metrics = get_policy_loss_fn("geo_mean")(old, new, adv, mask, "token-mean", config)
    expected, clipped_pos, clipped_neg = 0.0, 0, 0
    for row in range(2):
        logs, advs = [], []
        for t in range(3):
            if not mask[row, t]:
                continue
            r, a = float(new.detach()[row, t] - old[row, t]), float(adv[row, t])
            c = min(max(r, -0.2), 0.28)
            logs.append(math.copysign(1, a) * min(math.copysign(1, a) * r, math.copysign(1, a) * c))
            advs.append(a)
            clipped_pos += c != r and a > 0
            clipped_neg += c != r and a < 0
        expected += -(sum(advs) / len(advs)) * math.exp(sum(logs) / len(logs)) / 2
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-7)  # verl divides by tokens + 1e-8
    assert float(metrics["actor/pg_clipfrac"]) == pytest.approx(clipped_pos / 5)
    assert float(metrics["actor/pg_clipfrac_lower"]) == pytest.approx(clipped_neg / 5)
    loss.backward()
    # Row 0 (A > 0): token 0's log-ratio 0.3 is clipped at 0.28 (no gradient), token 1's -0.5
    # is kept (the min passes low values), token 2 is masked.
    assert new.grad[0, 0] == 0 and new.grad[0, 1] != 0 and new.grad[0, 2] == 0
