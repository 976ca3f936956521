"""The pure parts of scripts/bench_agent_loop.py (no engine): the environment's lognormal
waits (their mean, their seeding), async's lower bound, the goals, and the JSON document."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from scripts.bench_agent_loop import (
    draw_latency,
    goals,
    lognormal_mu,
    lower_bound,
    median_row,
    summary,
    timeline_summary,
    trajectory_waits,
)


@pytest.mark.parametrize("mean", [1.0, 0.25, 3.0])
def test_the_lognormal_waits_have_the_asked_mean_and_sigma(mean):
    draws = np.array([draw_latency(0, i, t, mean, 1.0) for i in range(5000) for t in (1, 2, 3)])
    # The mean of 15,000 draws: its standard error is sqrt(e - 1) / sqrt(15000) = 1.1% of the mean.
    assert draws.mean() == pytest.approx(mean, rel=0.06)
    assert np.log(draws).std() == pytest.approx(1.0, rel=0.03)
    assert np.log(draws).mean() == pytest.approx(lognormal_mu(mean, 1.0), abs=0.03)
    assert math.exp(lognormal_mu(mean, 1.0) + 0.5) == pytest.approx(mean)


def test_a_wait_depends_only_on_seed_trajectory_and_turn():
    assert draw_latency(0, 7, 2, 1.0, 1.0) == draw_latency(0, 7, 2, 1.0, 1.0)
    others = {draw_latency(0, 7, 3, 1.0, 1.0), draw_latency(0, 8, 2, 1.0, 1.0), draw_latency(1, 7, 2, 1.0, 1.0)}
    assert draw_latency(0, 7, 2, 1.0, 1.0) not in others
    assert draw_latency(0, 7, 2, 0.0, 1.0) == 0.0  # the zero-latency runs do not wait
    waits = trajectory_waits(0, 4, 3, 1.0, 1.0)
    assert waits[2] == pytest.approx(sum(draw_latency(0, 2, t, 1.0, 1.0) for t in (1, 2, 3)))


def test_the_lower_bound_is_the_larger_of_engine_and_slowest_trajectory():
    bound = lower_bound(engine_busy_s=4.0, waits=[1.0, 5.0, 2.0], turn_s=0.5, turns=3)
    assert bound["slowest_trajectory"] == 1
    assert bound["slowest_env_wait_s"] == 5.0
    assert bound["slowest_generation_s"] == pytest.approx(1.5)
    assert bound["slowest_trajectory_s"] == pytest.approx(6.5)
    assert bound["bound_s"] == pytest.approx(6.5) and bound["binding"] == "slowest_trajectory"
    engine_bound = lower_bound(engine_busy_s=10.0, waits=[1.0, 5.0, 2.0], turn_s=0.5, turns=3)
    assert engine_bound["bound_s"] == 10.0 and engine_bound["binding"] == "engine"


def test_goals_pass_at_their_thresholds_and_fail_past_them():
    assert [g["passed"] for g in goals(2.0, 1.15, 0.95)] == [True, True, True]
    assert [g["passed"] for g in goals(1.99, 1.16, 0.94)] == [False, False, False]


def _row(mode, latency, wall):
    return median_row(mode, latency, [{"wall_s": wall, "engine_s": wall / 2}], trajectories=64)


def test_the_json_has_the_ratios_and_the_bound_at_the_top():
    rows = [
        _row("lock-step", 1.0, 40.0),
        _row("async", 1.0, 16.0),
        _row("lock-step", 0.0, 10.0),
        _row("async", 0.0, 10.0),
    ]
    bound = lower_bound(engine_busy_s=8.0, waits=[10.0, 12.0], turn_s=1.0, turns=3)
    doc = json.loads(json.dumps(summary(rows, bound, {"trajectories": 64})))
    assert {"ratio_latency_1s", "ratio_latency_0s", "async_over_bound", "rows", "bound", "goals", "setup"} <= set(doc)
    assert doc["ratio_latency_1s"] == pytest.approx(2.5)
    assert doc["ratio_latency_0s"] == pytest.approx(1.0)
    assert doc["async_over_bound"] == pytest.approx(16.0 / 15.0)
    assert doc["rows"][0]["trajectories_per_s"] == pytest.approx(64 / 40.0)
    assert doc["bound"]["slowest_env_wait_s"] == 12.0
    assert [g["passed"] for g in doc["goals"]] == [True, True, True]


def test_a_row_is_the_median_of_its_repeats():
    row = median_row("async", 1.0, [{"wall_s": w, "engine_s": w - 1} for w in (9.0, 3.0, 5.0)], trajectories=10)
    assert row["wall_s"] == 5.0 and row["engine_s"] == 4.0 and row["trajectories_per_s"] == 2.0
    assert row["walls_s"] == [9.0, 3.0, 5.0]


def test_the_request_timeline_sums():
    trace = {
        "arrived": [0.0, 1.0],
        "admitted": [0.1, 1.5],
        "finished": [2.0, 3.0],
        "resumed": [2.1, 3.0],
        "steps": [(0.1, 1.0, 1), (1.5, 2.0, 2), (2.5, 3.0, 40)],
    }
    summary_ = timeline_summary(trace, trajectory_busy_s=5.0)
    assert summary_["request_queued_s"] == pytest.approx(0.6)
    assert summary_["request_engine_s"] == pytest.approx(3.4)
    assert summary_["request_handback_s"] == pytest.approx(0.1)
    assert summary_["outside_s"] == pytest.approx(5.0 - 4.1)
    assert summary_["step_busy_s"] == pytest.approx(1.9) and summary_["step_gaps_s"] == pytest.approx(1.0)
    assert summary_["step_s_at_1_to_8"] == pytest.approx(0.7) and summary_["step_s_above_32"] == pytest.approx(0.5)
