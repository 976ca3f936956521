"""Capability specs (issue 37, point 1): every advantage estimator, policy loss and aggregation
mode carries its facts where it is registered, and the config rules and the driver ask those
facts. Built-in facts are checked against a table written from the papers / verl; plug-in
estimators and losses registered here (with unusual specs) are refused or accepted by the
rules through their specs alone, and `compute_advantage` hands an estimator exactly the inputs
its spec names."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from hybrid.config import ConfigError, build_config
from hybrid.core_algos import (
    ADV_ESTIMATOR_REGISTRY,
    DEFAULT_ESTIMATOR_SPEC,
    EstimatorSpec,
    estimator_spec,
    get_adv_estimator_fn,
    register_adv_est,
)
from protocol.data_proto import DataProto
from workers.losses import (
    AGG_LOSS_MODES,
    POLICY_LOSS_REGISTRY,
    AggregationSpec,
    PolicyLossSpec,
    agg_loss,
    aggregation_spec,
    compute_policy_loss_vanilla,
    policy_loss_spec,
    register_policy_loss,
)

ARR = "actor_rollout_ref"

# name: (needs_groups, needs_critic, greedy_baseline, outcome_only), from each method's definition.
BUILT_IN_FACTS = {
    "gae": (False, True, False, False),  # per-token values; no groups
    "grpo": (True, False, False, True),
    "rloo": (True, False, False, True),
    "reinforce_plus_plus": (False, False, False, False),  # discounted returns per token, batch whitening
    "reinforce_plus_plus_baseline": (True, False, False, True),
    "remax": (False, False, True, False),  # the greedy response's reward as the baseline
    "opo": (True, False, False, False),  # the baseline weighs whole responses by their lengths
    "gpg": (True, False, False, True),
    "maxrl": (True, False, False, True),
    "simple_baseline": (False, False, False, True),  # the batch mean: no groups
    "no_op": (False, False, False, False),  # the token-level rewards themselves
}


def test_every_registered_estimator_has_a_spec_its_function_can_take():
    assert set(BUILT_IN_FACTS) <= set(ADV_ESTIMATOR_REGISTRY)
    for name in ADV_ESTIMATOR_REGISTRY:
        assert isinstance(estimator_spec(name), EstimatorSpec), name
    for name in BUILT_IN_FACTS:
        params = inspect.signature(get_adv_estimator_fn(name)).parameters
        assert set(estimator_spec(name).inputs) <= set(params), (name, set(estimator_spec(name).inputs) - set(params))
        assert "config" in params, name  # compute_advantage always passes the algorithm section


@pytest.mark.parametrize("name", sorted(BUILT_IN_FACTS))
def test_built_in_estimator_facts(name):
    spec = estimator_spec(name)
    assert (spec.needs_groups, spec.needs_critic, spec.greedy_baseline, spec.outcome_only) == BUILT_IN_FACTS[name]
    assert spec.needs_groups == ("index" in spec.inputs)  # a group estimator is given the uids, and only it


def test_unknown_estimator_and_wrong_spec_fail_in_one_line():
    with pytest.raises(ValueError, match="Unknown advantage estimator: 'nope'"):
        estimator_spec("nope")
    with pytest.raises(TypeError, match="spec must be an EstimatorSpec"):
        register_adv_est("bad_spec", {"needs_groups": True})


@pytest.fixture
def plugin():
    """Register `fn` under `name` with `spec` (None: verl's spelling, no spec) for one test."""
    added: list[str] = []

    def register(name, fn, spec=None):
        register_adv_est(name, spec)(fn) if spec is not None else register_adv_est(name)(fn)
        added.append(name)
        return fn

    yield register
    for name in added:
        ADV_ESTIMATOR_REGISTRY.pop(name)


def test_an_estimator_registered_without_a_spec_gets_the_documented_default(plugin):
    plugin("verl_style_plugin", lambda **kwargs: get_adv_estimator_fn("grpo")(**kwargs))
    spec = estimator_spec("verl_style_plugin")
    assert spec is DEFAULT_ESTIMATOR_SPEC
    assert spec.inputs == ("token_level_rewards", "response_mask", "index")
    assert spec.needs_groups and spec.outcome_only and not spec.needs_critic and not spec.greedy_baseline


def _batch(rows: int = 4, width: int = 3) -> DataProto:
    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(rows, width)
    mask[0, -1] = 0
    return DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.rand(rows, width, generator=gen) * mask,
            "token_level_scores": torch.rand(rows, width, generator=gen) * mask,
            "response_mask": mask,
            "reward_baselines": torch.rand(rows, generator=gen),
        },
        non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)},
    )


class _Algorithm:
    adv_estimator = "spec_recorder"
    gamma, lam, norm_adv_by_std_in_grpo = 0.9, 0.8, False


def test_compute_advantage_passes_exactly_what_the_spec_names(plugin):
    from hybrid.batch_ops import compute_advantage

    seen = {}

    def recorder(**kwargs):
        seen.update(kwargs)
        mask = kwargs["response_mask"]
        return mask * 2.0, mask * 3.0

    inputs = ("token_level_rewards", "response_mask", "index", "token_level_scores", "gamma", "reward_baselines")
    plugin("spec_recorder", recorder, EstimatorSpec(inputs, beyond_outcome="the raw scores too"))
    batch = _batch()
    compute_advantage(batch, _Algorithm())
    assert set(seen) == set(inputs) | {"config"}
    assert seen["token_level_scores"] is batch.batch["token_level_scores"]
    assert list(seen["index"]) == ["a", "a", "b", "b"] and seen["gamma"] == 0.9
    assert torch.equal(batch.batch["advantages"], batch.batch["response_mask"] * 2.0)
    assert torch.equal(batch.batch["returns"], batch.batch["response_mask"] * 3.0)
    batch.pop(batch_keys=["token_level_scores"])
    with pytest.raises(ValueError, match="adv_estimator='spec_recorder' takes 'token_level_scores'"):
        compute_advantage(batch, _Algorithm())


def test_compute_advantage_gives_the_built_ins_their_inputs():
    """GAE and ReMax through compute_advantage equal their functions called by hand."""
    from hybrid.batch_ops import compute_advantage
    from hybrid.core_algos import compute_gae_advantage_return, compute_remax_outcome_advantage

    batch = _batch()
    batch.batch["values"] = torch.rand(4, 3, generator=torch.Generator().manual_seed(1))
    tensors = batch.batch

    class Gae(_Algorithm):
        adv_estimator = "gae"

    compute_advantage(batch, Gae())
    expected, _ = compute_gae_advantage_return(
        tensors["token_level_rewards"], tensors["values"], tensors["response_mask"], gamma=0.9, lam=0.8
    )
    assert torch.allclose(tensors["advantages"], expected)

    class Remax(_Algorithm):
        adv_estimator = "remax"

    compute_advantage(batch, Remax())
    expected, _ = compute_remax_outcome_advantage(
        tensors["token_level_rewards"], tensors["reward_baselines"], tensors["response_mask"]
    )
    assert torch.allclose(tensors["advantages"], expected)


# ----------------------------------------------------------------------------- rules ask the spec


def _problems(overrides: list[str]) -> str:
    try:
        build_config(overrides)
    except ConfigError as error:
        return str(error)
    return ""


def _echo(**kwargs):
    mask = kwargs["response_mask"]
    return mask.float(), mask.float()


def test_a_plugin_with_a_greedy_baseline_is_refused_where_remax_is(plugin):
    plugin(
        "greedy_groups",
        _echo,
        EstimatorSpec(("token_level_rewards", "response_mask", "index", "reward_baselines")),
    )
    base = ["algorithm.adv_estimator=greedy_groups"]
    assert _problems(base) == ""
    assert not build_config(base).use_critic
    multi = _problems([*base, f"{ARR}.rollout.multi_turn.enable=true", "data.return_raw_chat=true"])
    assert "algorithm.adv_estimator='greedy_groups' with actor_rollout_ref.rollout.multi_turn.enable=True" in multi
    asynchronous = _problems(
        [*base, f"{ARR}.hybrid_engine=false", "async_training.mode=one_step_off", "rollout.n_gpus_per_node=1"]
    )
    assert "algorithm.adv_estimator='greedy_groups' needs a greedy rollout of every batch" in asynchronous
    # It has groups: dynamic sampling is accepted (remax, which has none, is refused).
    assert _problems([*base, "algorithm.filter_groups.enable=true"]) == ""
    assert "has no groups" in _problems(["algorithm.adv_estimator=remax", "algorithm.filter_groups.enable=true"])


def test_a_plugin_that_takes_values_gets_a_critic(plugin):
    plugin(
        "value_plugin",
        _echo,
        EstimatorSpec(("token_level_rewards", "values", "response_mask"), needs_groups=False, beyond_outcome="values"),
    )
    base = ["algorithm.adv_estimator=value_plugin"]
    assert build_config(base).use_critic
    assert "algorithm.adv_estimator='value_plugin' needs a value function but critic.enable=False" in _problems(
        [*base, "critic.enable=false"]
    )
    assert "has no groups" in _problems([*base, "algorithm.filter_groups.enable=true"])
    assert _problems([*base, "algorithm.use_pf_ppo=true"]) == ""  # PF-PPO follows the values, as with gae
    assert "takes no values" in _problems(["algorithm.adv_estimator=grpo", "algorithm.use_pf_ppo=true"])


def test_step_wise_refuses_a_plugin_by_what_its_spec_says_it_needs(plugin):
    plugin("lengthy_plugin", _echo, EstimatorSpec(beyond_outcome="each response's token count"))
    mt = f"{ARR}.rollout.multi_turn"
    step_wise = [f"{mt}.enable=true", f"{mt}.step_wise_trajectories=true", "data.return_raw_chat=true"]
    message = _problems([*step_wise, "algorithm.adv_estimator=lengthy_plugin"])
    assert "algorithm.adv_estimator=lengthy_plugin" in message and "needs each response's token count" in message
    assert "adv_estimator" not in _problems([*step_wise, "algorithm.adv_estimator=grpo"])


# ----------------------------------------------------------------------------- losses and aggregation

# mode: (seq_level, summed), from each mode's definition (agg_loss's docstring, verl 0.9).
AGGREGATION_FACTS = {
    "token-mean": (False, False),
    "token-sum": (False, True),
    "seq-mean-token-sum": (True, False),
    "seq-mean-token-mean": (True, False),
    "seq-mean-token-sum-norm": (True, False),
}


def test_aggregation_specs_and_their_reductions():
    assert set(AGG_LOSS_MODES) == set(AGGREGATION_FACTS)
    gen = torch.Generator().manual_seed(2)
    loss = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.float64)
    rows = [loss[i][mask[i] > 0] for i in range(2)]  # the third row has no token
    expected = {
        "token-mean": torch.cat(rows).mean(),
        "token-sum": torch.cat(rows).sum(),
        "seq-mean-token-sum": torch.stack([r.sum() for r in rows]).mean(),
        "seq-mean-token-mean": torch.stack([r.mean() for r in rows]).mean(),
        "seq-mean-token-sum-norm": torch.stack([r.sum() / 5 for r in rows]).mean(),
    }
    for mode, facts in AGGREGATION_FACTS.items():
        spec = aggregation_spec(mode)
        assert isinstance(spec, AggregationSpec) and (spec.seq_level, spec.summed) == facts, mode
        assert torch.allclose(agg_loss(loss, mask, mode), expected[mode]), mode
    with pytest.raises(ValueError, match="Invalid loss_agg_mode: 'seq-mean'"):
        aggregation_spec("seq-mean")


def test_every_policy_loss_has_a_spec_and_geo_mean_averages_rows():
    for name in POLICY_LOSS_REGISTRY:
        assert isinstance(policy_loss_spec(name), PolicyLossSpec), name
    assert policy_loss_spec("geo_mean").rows_whatever_mask
    assert not any(policy_loss_spec(n).rows_whatever_mask for n in ("vanilla", "gspo", "sapo", "cispo"))


def test_a_plugin_loss_that_averages_rows_is_refused_with_padding():
    register_policy_loss("rows_plugin", PolicyLossSpec(row_mean_by="the plug-in's row mean"))(
        compute_policy_loss_vanilla
    )
    try:
        # 4 prompts x 5 samples over 8 ranks: mini-batches padded with dummy rows.
        uneven = ["trainer.n_gpus_per_node=8", "data.train_batch_size=16", f"{ARR}.actor.ppo_mini_batch_size=4"]
        uneven += [f"{ARR}.rollout.n=5", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2"]
        loss = f"{ARR}.actor.policy_loss.loss_mode=rows_plugin"
        padded = _problems([*uneven, "trainer.pad_mini_batches=true", loss])
        assert "the plug-in's row mean averages its loss over a micro-batch's rows" in padded
        assert _problems([*uneven, "trainer.pad_mini_batches=true", f"{ARR}.actor.policy_loss.loss_mode=vanilla"]) == ""
    finally:
        POLICY_LOSS_REGISTRY.pop("rows_plugin")
