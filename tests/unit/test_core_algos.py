"""Driver-side algorithm math (hybrid/core_algos.py): every advantage estimator against hand
arithmetic or a slow python loop written here, with padded masks and groups of sizes 3, 2
and 1; the registries and their errors; the KL controllers and the KL folded into rewards."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import hybrid.core_algos as C
import workers.losses as L

F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64), atol=atol, rtol=0
    )


def whiten_py(xs):
    """(x - mean) / sqrt(unbiased var + 1e-8) over a python list."""
    mean, var = statistics.mean(xs), statistics.variance(xs)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in xs]


# Six responses of three prompts, interleaved: group a has 3 responses, b has 2, c has 1.
# Each outcome score sits on the last valid token of a response of its own length (rewards
# are 0 on padding, as the reward manager writes them; outcome scores are row sums, as verl).
INDEX = np.array(["a", "b", "a", "c", "b", "a"], dtype=object)
LENGTHS = [3, 2, 1, 4, 4, 2]
SCORES = [1.0, 2.0, 0.0, 3.0, 0.0, 0.5]
T_LEN = 4


def outcome_batch():
    mask = torch.zeros(6, T_LEN, dtype=F64)
    rewards = torch.zeros(6, T_LEN, dtype=F64)
    for i, (n, s) in enumerate(zip(LENGTHS, SCORES)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask


def per_row(adv):
    """The single value each row carries on its valid tokens; asserts it is constant there and
    zero on padding."""
    out = []
    for i, n in enumerate(LENGTHS):
        row = adv[i]
        assert torch.all(row[n:] == 0), f"row {i} has non-zero padding: {row}"
        close(row[:n], torch.full((n,), row[0].item(), dtype=F64))
        out.append(row[0].item())
    return out


# ----------------------------------------------------------------------------- outcome estimators


def test_grpo_groups_of_three_two_one_by_hand():
    rewards, mask = outcome_batch()
    adv, ret = C.compute_grpo_outcome_advantage(rewards, mask, INDEX)
    eps = 1e-6
    # a: scores (1, 0, 0.5): mean 0.5, unbiased std sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    # b: scores (2, 0): mean 1, std sqrt((1 + 1) / 1) = sqrt2
    # c: single response: mean 0, std 1 (as verl)
    expected = [
        0.5 / (0.5 + eps),
        1 / (math.sqrt(2) + eps),
        -0.5 / (0.5 + eps),
        3 / (1 + eps),
        -1 / (math.sqrt(2) + eps),
        0.0,
    ]
    close(per_row(adv), expected)
    assert torch.equal(adv, ret)
    dr_adv, _ = C.compute_grpo_outcome_advantage(rewards, mask, INDEX, norm_adv_by_std_in_grpo=False)
    close(per_row(dr_adv), [0.5, 1.0, -0.5, 3.0, -1.0, 0.0])


def test_rloo_by_hand():
    rewards, mask = outcome_batch()
    adv, _ = C.compute_rloo_outcome_advantage(rewards, mask, INDEX)
    # a: score minus the mean of the other two: 1 - 0.25, 0 - 0.75, 0.5 - 0.5
    # b: 2 - 0, 0 - 2; c: a group of one keeps its raw score (as verl)
    close(per_row(adv), [0.75, 2.0, -0.75, 3.0, -2.0, 0.0])


def test_opo_length_weighted_baseline_by_hand():
    rewards, mask = outcome_batch()
    adv, _ = C.compute_opo_outcome_advantage(rewards, mask, INDEX)
    # a: lengths (3, 1, 2), scores (1, 0, 0.5): baseline (3 + 0 + 1) / 6 = 2/3
    # b: lengths (2, 4), scores (2, 0): baseline (4 + 0) / 6 = 2/3; c: baseline 0
    close(per_row(adv), [1 - 2 / 3, 2 - 2 / 3, -2 / 3, 3.0, -2 / 3, 0.5 - 2 / 3])


def test_gpg_by_hand_and_alpha_argument_is_recomputed_as_verl():
    rewards, mask = outcome_batch()
    # non-zero scores: 1, 2, 3, 0.5 -> alpha = 6 / 4 = 1.5; centred: a (0.5, -0.5, 0), b (1, -1), c 3
    expected = [0.75, 1.5, -0.75, 4.5, -1.5, 0.0]
    close(per_row(C.compute_gpg_outcome_advantage(rewards, mask, INDEX)[0]), expected)
    close(per_row(C.compute_gpg_outcome_advantage(rewards, mask, INDEX, alpha=10.0)[0]), expected)
    close(per_row(C.compute_gpg_outcome_advantage(rewards, mask, INDEX, f_norm=2.0)[0]), [x / 2 for x in expected])


def test_reinforce_plus_plus_baseline_whitens_over_all_valid_tokens():
    rewards, mask = outcome_batch()
    adv, ret = C.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, INDEX)
    centred = [0.5, 1.0, -0.5, 3.0, -1.0, 0.0]  # group mean removed; c (alone) keeps 3
    tokens = [c for c, n in zip(centred, LENGTHS) for _ in range(n)]
    white = whiten_py(tokens)
    starts = np.cumsum([0] + LENGTHS[:-1])
    close(per_row(adv), [white[s] for s in starts])
    assert torch.equal(adv, ret)


def test_estimators_reject_a_bad_index():
    rewards, mask = outcome_batch()
    with pytest.raises(ValueError, match="index has 2 entries but the batch has 6 rows"):
        C.compute_grpo_outcome_advantage(rewards, mask, INDEX[:2])
    with pytest.raises(ValueError, match="pass index="):
        C.compute_rloo_outcome_advantage(rewards, mask, None)


# ----------------------------------------------------------------------------- token-level estimators


def gae_py(rewards, values, mask, gamma, lam):
    """GAE by a plain reverse loop per row over python floats; masked positions are skipped
    (they carry the next value and the running advantage across)."""
    raw, rets = [], []
    for r, v, m in zip(rewards.tolist(), values.tolist(), mask.tolist()):
        nextv, last = 0.0, 0.0
        row = [0.0] * len(r)
        for k in reversed(range(len(r))):
            if m[k]:
                delta = r[k] + gamma * nextv - v[k]
                last = delta + gamma * lam * last
                nextv = v[k]
            row[k] = last
        raw.append(row)
        rets.append([(a + vv) if mm else 0.0 for a, vv, mm in zip(row, v, m)])
    flat = [a for row, m in zip(raw, mask.tolist()) for a, mm in zip(row, m) if mm]
    mean, var = statistics.mean(flat), statistics.variance(flat)
    adv = [
        [(a - mean) / math.sqrt(var + 1e-8) if mm else 0.0 for a, mm in zip(row, m)]
        for row, m in zip(raw, mask.tolist())
    ]
    return adv, rets


def test_gae_two_tokens_by_hand():
    # gamma 0.9, lam 0.8, values 0.5, reward 1 on the last token:
    # t=1: delta = 1 - 0.5 = 0.5 -> A1 = 0.5
    # t=0: delta = 0 + 0.9 * 0.5 - 0.5 = -0.05 -> A0 = -0.05 + 0.72 * 0.5 = 0.31
    # returns = A + V = (0.81, 1.0); whitening two values gives -+1/sqrt2
    adv, ret = C.compute_gae_advantage_return(t([[0.0, 1.0]]), t([[0.5, 0.5]]), t([[1, 1]]), gamma=0.9, lam=0.8)
    close(ret, [[0.81, 1.0]])
    close(adv, [[-1 / math.sqrt(2), 1 / math.sqrt(2)]], atol=1e-5)


def test_gae_matches_python_loop_with_padding_and_holes():
    torch.manual_seed(0)
    rewards, values = torch.randn(4, 6, dtype=F64), torch.randn(4, 6, dtype=F64)
    mask = t([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]])  # row 2 has a hole
    adv, ret = C.compute_gae_advantage_return(rewards, values, mask, gamma=0.95, lam=0.9)
    exp_adv, exp_ret = gae_py(rewards, values, mask, 0.95, 0.9)
    close(adv, exp_adv)
    close(ret, exp_ret)
    # gamma/lam from the algorithm config when not passed; an error naming the key when absent
    adv2, _ = C.compute_gae_advantage_return(
        rewards, values, mask, config=OmegaConf.create({"gamma": 0.95, "lam": 0.9})
    )
    close(adv2, exp_adv)
    with pytest.raises(ValueError, match="gae needs lam"):
        C.compute_gae_advantage_return(rewards, values, mask, gamma=1.0)


def test_reinforce_plus_plus_by_hand():
    # gamma 0.5. row 0: rewards (0, 0, 1), 3 valid -> G = (0.25, 0.5, 1)
    #            row 1: rewards (0.5, 1), 2 valid, junk 7 on padding -> G = (1.0, 1.0)
    rewards = t([[0.0, 0.0, 1.0], [0.5, 1.0, 7.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    adv, ret = C.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config={"gamma": 0.5})
    close(ret, [[0.25, 0.5, 1.0], [1.0, 1.0, 0.0]])
    w = whiten_py([0.25, 0.5, 1.0, 1.0, 1.0])
    close(adv, [w[:3], w[3:] + [0.0]])
    with pytest.raises(ValueError, match="reinforce_plus_plus needs gamma"):
        C.compute_reinforce_plus_plus_outcome_advantage(rewards, mask)


def test_remax_by_hand():
    rewards = t([[0.0, 0.0, 1.0, 0.0], [0.5, 0.0, 1.0, 0.0]])
    mask = t([[1, 1, 1, 0], [1, 1, 1, 1]])
    adv, ret = C.compute_remax_outcome_advantage(rewards, t([0.4, 1.0]), mask)
    # returns-to-go: row 0 (1, 1, 1, pad); row 1 (1.5, 1, 1, 0); minus the greedy reward on valid tokens
    close(ret, [[1.0, 1.0, 1.0, 0.0], [1.5, 1.0, 1.0, 0.0]])
    close(adv, [[0.6, 0.6, 0.6, 0.0], [0.5, 0.0, 0.0, -1.0]])


# ----------------------------------------------------------------------------- registry


def test_every_registered_estimator_takes_the_uniform_keyword_call():
    rewards, mask = outcome_batch()
    kwargs = dict(
        token_level_rewards=rewards,
        response_mask=mask,
        index=INDEX,
        values=torch.randn(6, T_LEN, dtype=F64),
        reward_baselines=t([0.1] * 6),
        gamma=1.0,
        lam=0.95,
        norm_adv_by_std_in_grpo=True,
        config=OmegaConf.create({"gamma": 1.0, "lam": 0.95}),
        unused_future_key=123,
    )
    for name in C.AdvantageEstimator:
        adv, ret = C.get_adv_estimator_fn(name)(**kwargs)
        assert adv.shape == ret.shape == (6, T_LEN), name
        assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0), name
        assert torch.isfinite(adv).all(), name


def test_advantage_registry_names_and_errors():
    assert {e.value for e in C.AdvantageEstimator} == {
        "gae",
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "opo",
        "gpg",
    }
    assert C.get_adv_estimator_fn(C.AdvantageEstimator.GRPO) is C.compute_grpo_outcome_advantage
    assert C.get_adv_estimator_fn("gae") is C.compute_gae_advantage_return
    assert C.AdvantageEstimator.GRPO == "grpo"
    with pytest.raises(ValueError, match=r"'grpo_passk'.*'gae'.*'rloo'"):
        C.get_adv_estimator_fn("grpo_passk")
    with pytest.raises(ValueError, match="already registered"):
        C.register_adv_est("grpo")(lambda **kw: None)

    @C.register_adv_est("test_custom_est")
    def custom(token_level_rewards, response_mask, **kwargs):
        return token_level_rewards, token_level_rewards

    try:
        assert C.get_adv_estimator_fn("test_custom_est") is custom
        C.register_adv_est("test_custom_est")(custom)  # same function again is fine
    finally:
        del C.ADV_ESTIMATOR_REGISTRY["test_custom_est"]


def test_losses_are_reexported_from_the_driver_module():
    for name in L.__all__:
        assert getattr(C, name) is getattr(L, name), name
    assert set(L.__all__) <= set(C.__all__)
    from hybrid.core_algos import agg_loss, get_policy_loss_fn, kl_penalty  # noqa: F401  verl-style import


# ----------------------------------------------------------------------------- KL control


def test_fixed_controller_never_moves():
    ctrl = C.FixedKLController(0.05)
    ctrl.update(current_kl=10.0, n_steps=256)
    assert ctrl.value == 0.05


def test_adaptive_controller_update_formula():
    ctrl = C.AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=100)
    ctrl.update(current_kl=0.06, n_steps=10)  # error 0.06/0.05 - 1 = 0.2 -> x (1 + 0.2 * 10/100) = 1.02
    assert ctrl.value == pytest.approx(0.102)
    ctrl.update(current_kl=5.0, n_steps=10)  # error 99 clipped to 0.2 -> x 1.02
    assert ctrl.value == pytest.approx(0.102 * 1.02)
    ctrl.update(current_kl=0.045, n_steps=10)  # error -0.1 -> x 0.99
    assert ctrl.value == pytest.approx(0.102 * 1.02 * 0.99)
    ctrl.update(current_kl=0.0, n_steps=50)  # error -1 clipped to -0.2 -> x (1 - 0.2 * 0.5) = 0.9
    assert ctrl.value == pytest.approx(0.102 * 1.02 * 0.99 * 0.9)


def test_get_kl_controller_from_config():
    fixed = C.get_kl_controller(
        OmegaConf.create({"type": "fixed", "kl_coef": 0.001, "horizon": 10000, "target_kl": 0.1})
    )
    assert isinstance(fixed, C.FixedKLController) and fixed.value == 0.001
    adaptive = C.get_kl_controller({"type": "adaptive", "kl_coef": 0.2, "horizon": 500, "target_kl": 0.1})
    assert isinstance(adaptive, C.AdaptiveKLController)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.2, 0.1, 500)
    with pytest.raises(ValueError, match="horizon must be > 0"):
        C.get_kl_controller({"type": "adaptive", "kl_coef": 0.2, "horizon": 0, "target_kl": 0.1})
    with pytest.raises(ValueError, match=r"'pid'.*\['fixed', 'adaptive'\]"):
        C.get_kl_controller({"type": "pid", "kl_coef": 0.2})


def test_kl_in_reward_by_hand_and_controller_update():
    scores = t([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    ref = torch.zeros(2, 4, dtype=F64)
    old = t([[0.1, 0.2, 0.3, 5.0], [0.4, -0.2, 9.0, 9.0]])  # k1 = old - ref; junk on padding
    mask = t([[1, 1, 1, 0], [1, 1, 0, 0]])
    ctrl = C.AdaptiveKLController(init_kl_coef=0.5, target_kl=0.1, horizon=10)
    rewards, metrics = C.kl_in_reward(scores, old, ref, mask, ctrl, kl_penalty="kl")
    # rewards = scores - 0.5 * kl on valid tokens; padding keeps its score
    close(rewards, [[-0.05, -0.1, 0.85, 0.0], [-0.2, 2.1, 0.0, 0.0]])
    # batch KL: mean over rows of the token-mean: (0.6/3 + 0.2/2) / 2 = 0.15
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.15)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5  # the beta applied, before the update
    # error 0.15/0.1 - 1 = 0.5 -> clipped 0.2; n_steps = batch size 2 -> x (1 + 0.2 * 2/10) = 1.04
    assert ctrl.value == pytest.approx(0.52)


def test_kl_in_reward_uses_the_chosen_estimator():
    scores = torch.zeros(1, 2, dtype=F64)
    old, ref, mask = t([[math.log(0.5), 0.0]]), t([[math.log(0.25), 0.0]]), t([[1, 0]])
    rewards, metrics = C.kl_in_reward(scores, old, ref, mask, C.FixedKLController(2.0), kl_penalty="low_var_kl")
    k3 = math.log(2) - 0.5  # exp(-ln2) + ln2 - 1
    close(rewards, [[-2.0 * k3, 0.0]])
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(k3)
