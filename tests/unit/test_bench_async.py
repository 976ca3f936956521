"""The pure parts of scripts/bench_async.py (no model, no run): the latency environment's
seeded lognormal waits and its episodes, the modes' and workloads' keys, a row from metrics
records, the ratios, goals and JSON document, the table, the load wait and the CPU accounting."""

from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import pytest

from scripts.bench_async import (
    accuracy_result,
    cpu_delta,
    goals,
    mode_overrides,
    others,
    run_row,
    summary,
    table_lines,
    val_success,
    wait_for_quiet,
    work_ceiling,
    workload_overrides,
)
from scripts.latency_env import LatencyRetryEnv, draw_latency, lognormal_mu


def test_the_waits_have_the_asked_mean_and_sigma():
    draws = np.array([draw_latency(0, 0, i, k, t, 1.0, 1.0) for i in range(2500) for k in range(2) for t in (1, 2, 3)])
    # 15,000 draws: the mean's standard error is sqrt(e - 1) / sqrt(15000) = 1.1% of the mean.
    assert draws.mean() == pytest.approx(1.0, rel=0.06)
    assert np.log(draws).std() == pytest.approx(1.0, rel=0.03)
    assert np.log(draws).mean() == pytest.approx(lognormal_mu(1.0, 1.0), abs=0.03)
    assert math.exp(lognormal_mu(2.0, 0.5) + 0.125) == pytest.approx(2.0)


def test_a_wait_depends_only_on_seed_split_row_sample_and_turn():
    wait = draw_latency(0, 0, 7, 1, 2, 1.0, 1.0)
    assert wait == draw_latency(0, 0, 7, 1, 2, 1.0, 1.0)
    changed = [(1, 0, 7, 1, 2), (0, 1, 7, 1, 2), (0, 0, 8, 1, 2), (0, 0, 7, 2, 2), (0, 0, 7, 1, 3)]
    assert all(draw_latency(*key, 1.0, 1.0) != wait for key in changed)
    assert draw_latency(0, 0, 7, 1, 2, 0.0, 1.0) == 0.0


def _env(index: int, split: str = "train", mean: float = 0.0):
    extras = {"reward_model": {"ground_truth": "12"}, "extra_info": {"split": split, "index": index}}
    return LatencyRetryEnv({"seed": 0, "latency_mean": mean, "latency_sigma": 1.0}, extras)


def test_the_environment_numbers_a_rows_trajectories_and_keeps_arithmetic_retry_rules():
    first, second, other = _env(900001), _env(900001), _env(900001, split="val")
    assert (first.sample, second.sample, other.sample) == (0, 1, 0)
    assert first.wait_s(1) == 0.0
    slow = _env(900002, mean=1.0)
    assert slow.wait_s(2) == draw_latency(0, 0, 900002, 0, 2, 1.0, 1.0)
    wrong = asyncio.run(first.step("It is 11"))
    assert wrong["done"] is False and wrong["reward"] == 0.0
    assert wrong["observations"] == [{"role": "user", "content": "Incorrect, try again."}]
    right = asyncio.run(first.step("12"))
    assert right["done"] is True and right["reward"] == 1.0
    assert first.get_metrics() == {"attempts": 2, "solved": 1.0, "first_attempt_correct": 0.0, "env_latency_s": 0.0}


def test_the_modes_keys():
    assert mode_overrides("sync") == ["actor_rollout_ref.rollout.mode=async"]
    off = mode_overrides("one_step_off")
    assert "actor_rollout_ref.hybrid_engine=false" in off and "async_training.mode=one_step_off" in off
    s4 = mode_overrides("fully_async_s4")
    for key in ("max_staleness_steps=4", "staleness_threshold=4", "trigger_parameter_sync_step=1", "require_batches=1"):
        assert f"async_training.{key}" in s4
    assert "rollout.n_gpus_per_node=1" in s4 and "trainer.n_gpus_per_node=1" in s4
    with pytest.raises(ValueError):
        mode_overrides("fully_async_s")
    multi = workload_overrides("multi", 1.0, 1.0, 3)
    assert (
        "data.max_response_length=96" in multi
        and "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=24" in multi
    )
    assert "actor_rollout_ref.rollout.multi_turn.env_kwargs.seed=3" in multi
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=8" in workload_overrides("single", 1.0, 1.0, 0)


def _records(mode: str, steps: int = 4) -> list[dict]:
    out = [{"step": 0, "val-core/arithmetic/reward/mean@1": 0.3}]
    for s in range(1, steps + 1):
        record = {"step": s, "timing_s/step": 10.0, "timing_s/gen": 4.0, "timing_s/update_actor": 5.0}
        record.update({"critic/score/mean": 0.5, "response_length/mean": 20.0})
        if mode != "sync":
            record.update({"async/trainer_idle_share": 0.1 * s, "async/generator_idle_share": 0.2})
            record.update(
                {"async/staleness/max": float(min(s - 1, 2)), "async/dropped_stale": s, "async/dropped_flat": 0}
            )
        out.append(record)
    return out


def _row(mode: str, workload: str = "multi", seconds_per_step: float = 10.0) -> dict:
    arrivals = {s: 100.0 + s * seconds_per_step for s in range(1, 5)}
    return run_row(mode, workload, _records(mode), arrivals)


def test_a_row_skips_the_first_step_and_reads_the_shares():
    sync = _row("sync")
    assert sync["timed_steps"] == 3 and sync["timed_s"] == pytest.approx(30.0)
    assert sync["steps_per_s"] == pytest.approx(0.1) and sync["samples_per_s"] == pytest.approx(3.2)
    assert sync["trainer_idle_share"] == pytest.approx(0.4) and sync["generator_idle_share"] == pytest.approx(0.6)
    assert sync["max_staleness"] is None and sync["timing_s"]["update_actor"] == pytest.approx(5.0)
    fa = _row("fully_async_s4", seconds_per_step=5.0)
    assert fa["trainer_idle_share"] == pytest.approx(0.3)  # steps 2-4: 0.2, 0.3, 0.4
    assert fa["max_staleness"] == 2.0 and fa["dropped_groups"] == 4
    with pytest.raises(ValueError):
        run_row("sync", "multi", _records("sync", steps=1), {1: 0.0})


def test_the_document_ratios_goals_and_table():
    rows = [_row("sync"), _row("fully_async_s4", seconds_per_step=5.0), _row("sync", "single")]
    rows.append({"workload": "single", "mode": "fully_async_s4", "ok": False, "error_kind": "exit 1"})
    accuracy = accuracy_result({0: 0.3, 4: 0.5}, {0: 0.3, 4: 0.46}, steps=4)
    doc = summary(rows, accuracy, {"machine": "test"})
    assert doc["ratio_fully_async_latency"] == pytest.approx(2.0)
    assert doc["max_staleness_seen"] == 2.0 and doc["trainer_idle_share"] == pytest.approx(0.3)
    assert doc["ratio_fully_async_single"] is None
    assert accuracy["gap_points"] == pytest.approx(-4.0)
    assert [g["passed"] for g in doc["goals"]] == [True, False, False]
    json.dumps(doc)  # plain JSON
    lines = table_lines(doc["rows"], "single")
    assert lines[0].split()[:3] == ["mode", "steps/s", "samples/s"] and "FAILED (exit 1)" in lines[3]
    multi = "\n".join(table_lines(doc["rows"], "multi"))
    assert "2.00" in multi and "update_actor 5.00" in multi
    assert doc["work_ceiling_latency"] is None  # the records carry no agent/engine_busy_share


def test_the_work_ceiling_fills_only_the_idle_share_of_generation():
    # Generation 40% of the sync step, the engine empty a quarter of it: 10% of the step idle.
    sync = {**_row("sync"), "agent/engine_busy_share": 0.75}
    assert work_ceiling(sync) == pytest.approx(1 / 0.9)
    assert work_ceiling({**sync, "agent/engine_busy_share": 1.0}) == pytest.approx(1.0)
    doc = summary([sync, _row("fully_async_s4", seconds_per_step=8.0)], None, {})
    assert doc["work_ceiling_latency"] == pytest.approx(1 / 0.9)
    assert doc["ratio_fully_async_latency"] == pytest.approx(1.25)


def test_goals_at_their_thresholds_and_without_values():
    assert [g["passed"] for g in goals(1.8, 0.10, -3.0)] == [True, True, True]
    assert [g["passed"] for g in goals(1.79, 0.11, 3.1)] == [False, False, False]
    assert [g["passed"] for g in goals(None, None, None)] == [None, None, None]


def test_validation_lines_give_success_by_step():
    assert val_success(_records("sync")) == {0: 0.3}


def test_the_load_wait_polls_until_quiet_or_gives_up():
    loads, slept = iter([1.5, 1.2, 0.9]), []
    out = wait_for_quiet(1.0, 30.0, 1200.0, load=lambda: (next(loads),), sleep=slept.append)
    assert out == {"load_before": 0.9, "load_waited_s": 60.0, "quiet": True} and slept == [30.0, 30.0]
    busy = wait_for_quiet(1.0, 30.0, 60.0, load=lambda: (2.0,), sleep=lambda s: None)
    assert busy["quiet"] is False and busy["load_waited_s"] == 60.0


def test_other_processes_cpu_leaves_out_the_bench_tree_and_the_runs_session():
    # pid: (parent, session, cpu s): 10 the bench, 11 its run (session 11), 12 a Ray daemon
    # re-parented to init in the run's session, 20 and 21 someone else's.
    table = {1: (0, 1, 0.0), 10: (1, 5, 1.0), 11: (10, 11, 2.0), 12: (1, 11, 3.0), 20: (1, 20, 4.0), 21: (20, 20, 5.0)}
    assert others(table, root=10, session=11) == {1: 0.0, 20: 4.0, 21: 5.0}
    assert cpu_delta({20: 4.0, 21: 5.0}, {20: 6.5, 22: 1.0}) == pytest.approx(3.5)
