"""SkyRL's simulated fully async trainer (hybrid/async_sim.py, async_training.simulate_training)
on the tiny model: one rollout engine in its own Ray actor, no trainer model. Shown: each step
sleeps the configured seconds (its recorded timing), each push holds the engines the configured
seconds and advances their version, generation goes on and is scored, and no trainer worker
exists to change the weights."""

from __future__ import annotations

import pytest

from tests.integration.checkpoint_helpers import run_config, train

pytestmark = [pytest.mark.integration, pytest.mark.slow]

AT = "async_training"
STEP_S, SYNC_S = 0.4, 0.2


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=32, n_val=8, seed=3)


def test_simulated_steps_sleep_while_generation_goes_on(tiny_model_dir, arithmetic_files, tmp_path):
    out = train(
        run_config(
            tiny_model_dir,
            arithmetic_files,
            tmp_path,
            "trainer.total_training_steps=3",
            "trainer.resume_mode=disable",
            "actor_rollout_ref.hybrid_engine=false",
            "rollout.n_gpus_per_node=1",
            "trainer.worker_group=auto",
            f"{AT}.mode=fully_async",
            f"{AT}.staleness_threshold=1.0",
            f"{AT}.trigger_parameter_sync_step=1",
            f"{AT}.simulate_training=true",
            f"{AT}.simulate_training_step_seconds={STEP_S}",
            f"{AT}.simulate_weight_sync_seconds={SYNC_S}",
        ),
        inspect=lambda trainer: {
            "trainer_groups": trainer.actor_rollout_wg,
            "started": trainer.producer.started,
            "engine_version": trainer.engines.version,
        },
    )
    history = out["history"]
    assert len(history) == 3
    for h in history:
        # The step's "training" is the sleep, measured around it (a sleep never ends early).
        assert STEP_S <= h["timing_s/simulated_step"] < STEP_S + 0.15, h["timing_s/simulated_step"]
        # The push: the engine paused, held SYNC_S, resumed (plus waiting for its call in progress).
        assert h["timing_s/update_weights"] >= SYNC_S, h["timing_s/update_weights"]
        assert h["response_length/mean"] > 0 and "critic/score/mean" in h
        assert not any(k.startswith(("actor/", "critic/advantages", "critic/returns")) for k in h)
    # Versions advance as in training (a push after every step), so staleness is accounted.
    assert [h["async/engine_version"] for h in history] == [0.0, 1.0, 2.0]
    assert out["engine_version"] == 3 and max(h["async/staleness/max"] for h in history) <= 1
    assert out["trainer_groups"] is None  # no trainer model: nothing changes the weights
    assert out["started"] >= 3 * 2  # 3 steps x ppo_mini_batch_size groups, and generation ran ahead
