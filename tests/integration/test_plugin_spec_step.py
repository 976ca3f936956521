"""A plug-in advantage estimator with unusual needs, registered from this file only, runs one real
training step with no other edit (issue 37, point 1): it compares a prompt's responses (groups),
takes the score of a greedy generation per prompt (`reward_baselines`, ReMax's input) and an
extra column of the step (`token_level_scores`). Its spec alone makes the config check accept
it, the driver generate greedily before the step, and `compute_advantage` hand it those inputs.
The tiny random model, the Hugging Face engine, one in-process rank."""

from __future__ import annotations

import pytest
import torch

from hybrid.core_algos import ADV_ESTIMATOR_REGISTRY, EstimatorSpec, register_adv_est
from tests.integration.checkpoint_helpers import run_config, train

pytestmark = pytest.mark.integration

NAME = "greedy_group_mix"
CALLS: list[dict] = []
SPEC = EstimatorSpec(
    inputs=("token_level_rewards", "response_mask", "index", "reward_baselines", "token_level_scores"),
    needs_groups=True,
    beyond_outcome="a greedy baseline rollout per prompt",
)


def greedy_group_mix(**kwargs):
    """Each response's score minus the mean of its group's mean score and its prompt's greedy score."""
    mask, index, baselines = kwargs["response_mask"], kwargs["index"], kwargs["reward_baselines"]
    scores = kwargs["token_level_rewards"].sum(-1)
    groups = {uid: scores[[j for j, other in enumerate(index) if other == uid]].mean() for uid in set(index)}
    group_mean = torch.stack([groups[uid] for uid in index])
    advantages = (scores - 0.5 * (group_mean + baselines)).unsqueeze(-1) * mask
    CALLS.append(
        dict(
            keys=set(kwargs),
            index=list(index),
            baselines=baselines.clone(),
            scores=kwargs["token_level_scores"].sum(-1).clone(),
            advantages=advantages.clone(),
            mask=mask.clone(),
        )
    )
    return advantages, advantages


@pytest.fixture
def plugin():
    register_adv_est(NAME, SPEC)(greedy_group_mix)
    CALLS.clear()
    yield
    ADV_ESTIMATOR_REGISTRY.pop(NAME)


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=8, n_val=4, seed=13)


def test_a_plugin_estimator_with_a_greedy_baseline_and_groups_trains_one_step(
    plugin, tiny_model_dir, arithmetic_files, tmp_path
):
    cfg = run_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path / "run",
        f"algorithm.adv_estimator={NAME}",  # validate_config (in run_config) accepts it
        "trainer.total_training_steps=1",
        "trainer.save_freq=-1",
    )
    history = train(cfg)["history"]
    assert len(history) == 1 and len(CALLS) == 1
    call, metrics = CALLS[0], history[0]
    assert call["keys"] == set(SPEC.inputs) | {"config"}  # what its spec names, and the algorithm section
    assert "timing_s/gen_max" in metrics  # the greedy generation ran, as for remax
    # 4 prompts x 2 samples: the two rows of a prompt share its uid and its greedy baseline.
    index, baselines = call["index"], call["baselines"]
    assert len(index) == 8 and len(set(index)) == 4
    for i in range(0, 8, 2):
        assert index[i] == index[i + 1] and baselines[i] == baselines[i + 1]
    # The step's data metrics read the advantages the plug-in returned.
    valid = torch.masked_select(call["advantages"], call["mask"].bool())
    assert metrics["critic/advantages/mean"] == pytest.approx(float(valid.mean()), abs=1e-6)
    assert metrics["critic/score/mean"] == pytest.approx(float(call["scores"].mean()), abs=1e-6)
