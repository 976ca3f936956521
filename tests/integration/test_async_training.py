"""Asynchronous training end to end on the tiny model (hybrid/async_trainer.py): the training
rank and one rollout engine in their own Ray actors on the machine's two cores.

Shown: one-step-off at lag 0 gives the synchronous trainer's metrics (the async path
degenerates to sync); at lag 1 every batch after the first is exactly one version old;
a fully async run killed after a checkpoint and resumed keeps every group within the bound,
reports its queue and trains every prompt exactly once, the ones that were generating or
queued at the save included; SkyRL's simulated trainer (async_training.simulate_training)
sleeps each step and each push the configured seconds while generation goes on, with no
trainer model."""

from __future__ import annotations

import math

import pytest

from tests.integration.checkpoint_helpers import assert_metrics_close, run_config, train

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEPARATE = ["actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1", "trainer.worker_group=auto"]
AT = "async_training"


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=32, n_val=8, seed=3)


def _staleness(history) -> list[float]:
    return [h["async/staleness/max"] for h in history]


def test_one_step_off_at_lag_zero_is_synchronous_training(tiny_model_dir, arithmetic_files, tmp_path):
    # Both anchor on the trainer's old log-prob pass, so the only difference is where the engine lives.
    common = ["trainer.total_training_steps=2", "actor_rollout_ref.actor.skip_old_log_prob_on_policy=false"]
    sync = train(run_config(tiny_model_dir, arithmetic_files, tmp_path / "sync", *common))
    lag0 = train(
        run_config(
            tiny_model_dir,
            arithmetic_files,
            tmp_path / "lag0",
            *common,
            *SEPARATE,
            f"{AT}.mode=one_step_off",
            f"{AT}.max_staleness_steps=0",
            f"{AT}.use_rollout_log_probs=false",
        )
    )
    assert _staleness(lag0["history"]) == [0.0, 0.0]
    for a, b in zip(sync["history"], lag0["history"]):
        b = {k: v for k, v in b.items() if not k.startswith("async/")}
        assert_metrics_close(a, b, tol=1e-5)


def test_one_step_off_trains_on_data_one_version_old(tiny_model_dir, arithmetic_files, tmp_path):
    out = train(
        run_config(
            tiny_model_dir,
            arithmetic_files,
            tmp_path,
            "trainer.total_training_steps=3",
            *SEPARATE,
            f"{AT}.mode=one_step_off",
        )
    )
    history = out["history"]
    assert _staleness(history) == [0.0, 1.0, 1.0]  # step 1: the first weights; then one step behind
    assert [h["async/engine_version"] for h in history] == [0.0, 1.0, 2.0]
    assert all(math.isfinite(h["actor/pg_loss"]) for h in history)


def test_every_prompt_is_trained_once_across_a_kill_and_resume(tiny_model_dir, arithmetic_files, tmp_path):
    """Two steps, a checkpoint at step 2 with groups still generating and queued (generation
    runs windows ahead), the run gone; the resumed run regenerates those: across both runs no
    prompt is trained twice, and every prompt handed out is trained or still open (none lost)."""
    import torch

    run = [*SEPARATE, f"{AT}.mode=fully_async", f"{AT}.staleness_threshold=2.0", f"{AT}.trigger_parameter_sync_step=1"]

    def positions(trainer):
        state = trainer.stream.state_dict()
        return {"positions": list(trainer.trained_positions), "open": state["open"], "offset": state["offset"]}

    first = train(
        run_config(
            tiny_model_dir, arithmetic_files, tmp_path, "trainer.total_training_steps=2", "trainer.save_freq=2", *run
        ),
        inspect=positions,
    )
    saved = torch.load(tmp_path / "global_step_2" / "data.pt", weights_only=True)["stream"]
    assert saved["open"], "nothing was generating or queued at the save: the test would show nothing"
    second = train(
        run_config(
            tiny_model_dir, arithmetic_files, tmp_path, "trainer.total_training_steps=4", "trainer.save_freq=2", *run
        ),
        inspect=positions,
    )
    assert len(first["positions"]) == len(second["positions"]) == 4
    # Within the bound (staleness_threshold 2), with the queue and idle shares reported.
    history = first["history"] + second["history"]
    assert max(_staleness(history)) <= 2
    assert all("async/queue_depth" in h and "async/trainer_idle_share" in h for h in history)
    trained = first["positions"] + second["positions"]
    assert len(trained) == len(set(trained)), trained  # none twice
    handed_out = {(0, i) for i in range(second["offset"])}
    assert handed_out == set(trained) | {tuple(p) for p in second["open"]}  # none lost
    assert {tuple(p) for p in saved["open"]} <= set(second["positions"]) | {tuple(p) for p in second["open"]}


def test_fully_async_with_an_environment_and_dynamic_sampling(tiny_model_dir, arithmetic_files, tmp_path):
    """Two-turn episodes through the agent loops on the engine actor, with DAPO's dynamic
    sampling: flat groups (reward 5 for every sample) are dropped at the queue and other
    prompts generated, so no step trains a sample scored 5, and the drops are counted."""
    from tests.integration import flat_or_varying_env

    env = f"{flat_or_varying_env.__file__}:FlatOrVaryingEnv"
    mt = "actor_rollout_ref.rollout.multi_turn"
    out = train(
        run_config(
            tiny_model_dir,
            arithmetic_files,
            tmp_path,
            "trainer.total_training_steps=3",
            *SEPARATE,
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.dtype=bfloat16",
            "actor_rollout_ref.rollout.mode=async",
            "actor_rollout_ref.rollout.n=4",
            "data.max_response_length=32",
            f"{mt}.enable=true",
            f"{mt}.env_class={env}",
            f"{mt}.max_assistant_turns=2",
            f"{mt}.max_tokens_per_turn=4",
            f"{mt}.reward_placement=final",
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.metric=seq_reward",
            f"{AT}.mode=fully_async",
            f"{AT}.staleness_threshold=1.0",
            f"{AT}.trigger_parameter_sync_step=1",
        ),
        inspect=lambda trainer: {"positions": list(trainer.trained_positions)},
    )
    history = out["history"]
    assert len(history) == 3 and max(_staleness(history)) <= 1
    assert all(h["multi_turn/turns/max"] == 2.0 for h in history)
    assert max(h["critic/score/max"] for h in history) <= 1.0  # no flat group trained
    assert history[-1]["async/dropped_flat"] > 0  # about half the questions have even answers
    assert len(out["positions"]) == 6 == len(set(out["positions"]))


def test_simulated_steps_sleep_while_generation_goes_on(tiny_model_dir, arithmetic_files, tmp_path):
    """hybrid/async_sim.py: each step's recorded time is the configured sleep, each push holds the
    engine the configured seconds and advances its version, generation goes on and is scored,
    and no trainer worker exists to change the weights."""
    step_s, sync_s = 0.4, 0.2
    out = train(
        run_config(
            tiny_model_dir,
            arithmetic_files,
            tmp_path,
            "trainer.total_training_steps=3",
            "trainer.resume_mode=disable",
            *SEPARATE,
            f"{AT}.mode=fully_async",
            f"{AT}.staleness_threshold=1.0",
            f"{AT}.trigger_parameter_sync_step=1",
            f"{AT}.simulate_training=true",
            f"{AT}.simulate_training_step_seconds={step_s}",
            f"{AT}.simulate_weight_sync_seconds={sync_s}",
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
        assert step_s <= h["timing_s/simulated_step"] < step_s + 0.15, h["timing_s/simulated_step"]
        # The push: the engine paused, held sync_s, resumed (plus waiting for its call in progress).
        assert h["timing_s/update_weights"] >= sync_s, h["timing_s/update_weights"]
        assert h["response_length/mean"] > 0 and "critic/score/mean" in h
        assert not any(k.startswith(("actor/", "critic/advantages", "critic/returns")) for k in h)
    # Versions advance as in training (a push after every step), so staleness is accounted.
    assert [h["async/engine_version"] for h in history] == [0.0, 1.0, 2.0]
    assert out["engine_version"] == 3 and max(_staleness(history)) <= 1
    assert out["trainer_groups"] is None  # no trainer model: nothing changes the weights
    assert out["started"] >= 3 * 2  # 3 steps x ppo_mini_batch_size groups, and generation ran ahead
