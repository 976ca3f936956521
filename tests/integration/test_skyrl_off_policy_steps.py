"""What SkyRL's fully async examples map to, run on the tiny model: the rollout_is loss in bypass
mode with SkyRL's geometric sequence mask (rollout_rs=seq_geo_ratio), and trainer.max_training_steps
ending a run of two epochs early. The formulas are checked against SkyRL's code in
tests/unit/test_skyrl_oracle_off_policy.py; this checks that the trainer runs them."""

from __future__ import annotations

import math

import pytest

from tests.integration.checkpoint_helpers import run_config, train

pytestmark = pytest.mark.integration

RC = "algorithm.rollout_correction."


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=8, n_val=4, seed=5)


@pytest.mark.slow  # one short trainer run of three steps: about 10 s on two CPU cores
def test_rollout_is_with_the_geometric_mask_trains_and_the_step_cap_ends_the_run(
    tiny_model_dir, arithmetic_files, tmp_path
):
    cfg = run_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        # 8 prompts / 4 per step = 2 steps per epoch, 2 epochs = 4 steps; the cap stops at 3
        "trainer.total_training_steps=null",
        "trainer.total_epochs=2",
        "trainer.max_training_steps=3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # one optimizer step per batch
        "actor_rollout_ref.actor.policy_loss.loss_mode=rollout_is",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        RC + "bypass_mode=true",
        RC + "rollout_rs=seq_geo_ratio",
        RC + "rollout_rs_threshold='0.99_1.01'",
    )
    history = train(cfg)["history"]
    assert len(history) == 3  # not the 4 steps of the two epochs
    for step in history:
        assert math.isfinite(step["actor/pg_loss"]) and math.isfinite(step["actor/grad_norm"])
        assert 0 <= step["actor/pg_clipfrac"] <= 1
        assert 0 <= step["rollout_corr/rollout_rs_seq_geo_ratio_masked_fraction"] <= 1
        assert "timing_s/old_log_prob" not in step  # bypass: the engine's log-probs are the anchor
