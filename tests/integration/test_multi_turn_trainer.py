"""The trainer drives multi-turn rollouts: one GRPO step and a validation with the
`arithmetic_retry` environment on the tiny random model (one in-process rank, the HF
engine). The rows reach the environments, the step's metrics carry `multi_turn/*` over the
whole batch, the scores are the environments' rewards (no custom reward function), the
validation accuracy is the same combined score, and observation tokens are masked out."""

from __future__ import annotations

import math

import pytest
import torch

from tests.integration.checkpoint_helpers import run_config, train

pytestmark = pytest.mark.integration

MT = "actor_rollout_ref.rollout.multi_turn"


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith_mt"), n_train=16, n_val=4, seed=5)


def test_one_grpo_step_and_validation_with_an_environment(tiny_model_dir, arithmetic_files, tmp_path, monkeypatch):
    from hybrid.rollouts import Rollouts

    cfg = run_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path / "run",
        "algorithm.adv_estimator=grpo",
        "data.max_response_length=32",  # the whole episode: 2 model turns of <= 4 tokens + 1 observation
        "trainer.total_training_steps=1",
        "trainer.test_freq=1",
        f"{MT}.enable=true",
        f"{MT}.env_class=arithmetic_retry",
        f"{MT}.max_assistant_turns=2",
        f"{MT}.max_tokens_per_turn=4",
    )
    seen = {}
    rollout_and_score = Rollouts.rollout_and_score

    def recording(self, batch, timing):
        batch, extra = rollout_and_score(self, batch, timing)
        seen.update({key: batch.batch[key].clone() for key in ("token_level_scores", "env_rewards", "response_mask")})
        seen["turns"] = list(batch.non_tensor_batch["multi_turn_turns"])
        return batch, extra

    monkeypatch.setattr(Rollouts, "rollout_and_score", recording)
    # Without custom_reward_function.path the built-in scorer is never asked (it would read
    # the observations as part of the answer).
    import reward.loader

    calls, load = [], reward.loader.load_reward_manager

    def counted(*args, **kwargs):
        manager = load(*args, **kwargs)

        def reward_fn(batch, return_dict=False):
            calls.append(len(batch))
            return manager(batch, return_dict=return_dict)

        return reward_fn

    monkeypatch.setattr(reward.loader, "load_reward_manager", counted)
    out = train(cfg)
    metrics = out["history"][-1]

    assert out["result"]["steps"] == 1
    assert metrics["multi_turn/turns/mean"] >= 1
    reasons = [metrics[f"multi_turn/finish_reason/{r}"] for r in ("done", "max_turns", "length", "error")]
    assert math.isclose(sum(reasons), 1.0)
    # Every sample of the batch (train_batch_size 4 x n 2) is in the metric, not rank 0's share.
    assert metrics["multi_turn/turns/mean"] == pytest.approx(sum(seen["turns"]) / 8)

    # No custom reward function: the scores are exactly the environments' rewards.
    assert seen["token_level_scores"].shape == (8, 32)
    assert torch.equal(seen["token_level_scores"], seen["env_rewards"])
    assert calls == []

    # A random model answers wrong, so trajectories take a second turn: their masks have
    # zeros (the observation) between model tokens.
    two_turns = [i for i, turns in enumerate(seen["turns"]) if turns == 2]
    assert two_turns, seen["turns"]
    for i in two_turns:
        mask = seen["response_mask"][i].tolist()
        ones = [j for j, m in enumerate(mask) if m == 1]
        assert 0 in mask[ones[0] : ones[-1]], mask

    # Validation runs the same loop; its accuracy is the environments' reward.
    val_core = [v for k, v in metrics.items() if k.startswith("val-core/") and k.endswith("/reward/mean@1")]
    assert len(val_core) == 1
    assert val_core[0] == pytest.approx(metrics["val-aux/multi_turn/reward/mean"])
    assert metrics["val-aux/multi_turn/turns/mean"] >= 1
    assert "val-aux/multi_turn/first_turn_reward/mean" in metrics
