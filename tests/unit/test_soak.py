"""scripts/soak.py's summary: growth from the end of warm-up to the end, per process, and
its table; no training here (the soak run itself is long, run by hand)."""

from __future__ import annotations

import pytest

from scripts.soak import format_summary, growth_percent, per_process_series, summarize


def _record(step, driver_rss, worker_rss, fds=40, threads=30):
    return {
        "step": step,
        "driver": {"rss_gb": driver_rss, "fds": fds, "threads": threads},
        "workers": [{"rss_gb": r, "fds": fds + 60, "threads": threads + 30} for r in worker_rss],
    }


def test_growth_is_from_the_first_step_after_warm_up_to_the_last():
    steps = [1, 10, 20, 21, 200]
    assert growth_percent(steps, [0.5, 0.9, 1.0, 1.2, 1.03], from_step=20) == pytest.approx(3.0)
    assert growth_percent(steps, [0.5, 0.9, 1.0, 1.2, 0.95], from_step=15) == pytest.approx(
        -5.0
    )  # first step >= 15 is 20


def test_growth_needs_two_records_after_warm_up_and_a_positive_start():
    with pytest.raises(ValueError, match="at least two records from step 20"):
        growth_percent([1, 20], [1.0, 1.0], from_step=20)
    with pytest.raises(ValueError, match="positive start"):
        growth_percent([20, 21], [0.0, 1.0], from_step=20)


def test_summary_per_process_and_table():
    records = [_record(s, 0.6 + 0.001 * s, [2.0, 2.2 + 0.01 * s], fds=40 + (s == 30), threads=30) for s in range(1, 31)]
    series = per_process_series(records)
    assert list(series) == ["driver", "rank0", "rank1"] and series["rank1"]["step"][-1] == 30
    summary = summarize(records, from_step=20)
    assert summary["rank0"]["rss_growth_pct"] == pytest.approx(0.0)
    assert summary["rank1"]["rss_growth_pct"] == pytest.approx(100 * 0.1 / 2.4)
    assert summary["driver"]["fds_start"] == 40 and summary["driver"]["fds_end"] == 41
    table = format_summary(summary, 20, 30)
    assert "largest RSS growth from step 20 to 30: 4.17 % (within the 5 % goal)" in table
    assert "OVER" in format_summary(summarize(records, from_step=1), 1, 30)
