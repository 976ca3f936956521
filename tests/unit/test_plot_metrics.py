"""scripts/plot_metrics.py: the command on a small synthetic metrics.jsonl writes the four
PNGs as real images; repeated steps merge with later values winning; missing series are
left out; a missing, empty or malformed file fails with a message saying so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.plot_metrics import MetricsFileError, load_metrics, plot_metrics

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ALL_PLOTS = {"reward.png", "kl_entropy.png", "response_length.png", "timing.png"}


def run_script(*args):
    return subprocess.run(
        [sys.executable, "-m", "scripts.plot_metrics", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def full_rows(steps=6):
    rows = [{"step": 0, "val-core/arithmetic/reward/mean@1": 0.1}]
    for s in range(1, steps + 1):
        row = {
            "step": s,
            "critic/score/mean": 0.1 * s,
            "critic/score/min": 0.0,
            "critic/score/max": 1.0,
            "actor/kl_loss": 0.001 * s,
            "actor/entropy": 2.0 - 0.1 * s,
            "response_length/mean": 20.0 - s,
            "response_length/max": 48.0,
            "timing_s/gen": 3.0,
            "timing_s/update_weights": 0.5,
            "timing_s/reward": 0.1,
            "timing_s/old_log_prob": 1.0,
            "timing_s/update_actor": 2.0,
            "timing_s/step": 6.2,
        }
        if s % 3 == 0:
            row["val-core/arithmetic/reward/mean@1"] = 0.1 + 0.05 * s
            row["timing_s/testing"] = 4.0
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def assert_png(path: Path):
    from PIL import Image

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        width, height = img.size
        assert width >= 400 and height >= 200, (path, img.size)
        # not a blank canvas: a plot has many distinct colours
        assert len(img.convert("RGB").getcolors(maxcolors=1 << 16) or range(1 << 16)) > 10, path


def test_script_writes_valid_pngs(tmp_path):
    run_dir = tmp_path / "run"
    write_jsonl(run_dir / "metrics.jsonl", full_rows())
    out = tmp_path / "plots"
    result = run_script(run_dir, "--out", out)
    assert result.returncode == 0, result.stderr
    written = {Path(line).name for line in result.stdout.split()}
    assert written == ALL_PLOTS
    assert {p.name for p in out.iterdir()} == ALL_PLOTS
    for name in ALL_PLOTS:
        assert_png(out / name)


def test_script_accepts_the_file_and_defaults_to_plots_next_to_it(tmp_path):
    metrics = write_jsonl(tmp_path / "run" / "metrics.jsonl", full_rows(3))
    result = run_script(metrics)
    assert result.returncode == 0, result.stderr
    assert {p.name for p in (tmp_path / "run" / "plots").iterdir()} == ALL_PLOTS


def test_missing_series_are_skipped(tmp_path):
    # A GRPO run without KL and without validation: no kl panel, reward without val, and
    # the entropy panel alone.
    rows = [{"step": s, "critic/score/mean": 0.2, "actor/entropy": 1.0, "timing_s/step": 1.0} for s in (1, 2)]
    written = plot_metrics(write_jsonl(tmp_path / "metrics.jsonl", rows), tmp_path / "out")
    assert {p.name for p in written} == {"reward.png", "kl_entropy.png", "timing.png"}
    for path in written:
        assert_png(path)


def test_nothing_plottable_is_reported(tmp_path):
    write_jsonl(tmp_path / "metrics.jsonl", [{"step": 1, "something/else": 1.0}])
    assert plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "out") == []
    result = run_script(tmp_path / "metrics.jsonl", "--out", tmp_path / "out")
    assert result.returncode == 1 and "nothing to plot" in result.stderr


def test_repeated_steps_merge_later_values_winning(tmp_path):
    # A resumed run appends: step 2 again (new values), then its validation-only line.
    rows = [
        {"step": 1, "critic/score/mean": 0.1},
        {"step": 2, "critic/score/mean": 0.9, "actor/entropy": 1.5},
        {"step": 2, "critic/score/mean": 0.2},
        {"step": 2, "val-core/a/reward/mean@1": 0.4},
        {"step": 3, "critic/score/mean": None},
    ]
    loaded = load_metrics(write_jsonl(tmp_path / "metrics.jsonl", rows))
    assert [r["step"] for r in loaded] == [1, 2, 3]
    assert loaded[1] == {"step": 2, "critic/score/mean": 0.2, "actor/entropy": 1.5, "val-core/a/reward/mean@1": 0.4}


def test_steps_are_sorted(tmp_path):
    rows = [{"step": 3, "a": 1.0}, {"step": 1, "a": 1.0}, {"step": 2, "a": 1.0}]
    assert [r["step"] for r in load_metrics(write_jsonl(tmp_path / "metrics.jsonl", rows))] == [1, 2, 3]


def test_missing_file_is_a_clear_error(tmp_path):
    result = run_script(tmp_path / "nope.jsonl")
    assert result.returncode == 2
    assert "nope.jsonl does not exist" in result.stderr and "Traceback" not in result.stderr
    (tmp_path / "empty_run").mkdir()
    result = run_script(tmp_path / "empty_run")
    assert result.returncode == 2 and "without metrics.jsonl" in result.stderr


def test_empty_file_is_a_clear_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("\n\n")
    result = run_script(tmp_path / "metrics.jsonl")
    assert result.returncode == 2
    assert "has no metric rows" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "plots").exists()


def test_malformed_lines(tmp_path):
    # a truncated last line (killed mid-write) is skipped with a warning
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "critic/score/mean": 0.5}) + '\n{"step": 2, "crit')
    with pytest.warns(UserWarning, match=":2: skipping an incomplete last line"):
        assert [r["step"] for r in load_metrics(path)] == [1]
    result = run_script(path, "--out", tmp_path / "out")
    assert result.returncode == 0
    assert "plot_metrics: warning:" in result.stderr and "skipping an incomplete last line" in result.stderr
    # a bad line in the middle is an error naming the line
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(MetricsFileError, match=r"metrics.jsonl:2: not a JSON object"):
        load_metrics(path)
    path.write_text('{"step": 1}\n{"critic/score/mean": 1.0}\n')
    with pytest.raises(MetricsFileError, match=r":2: the row has no integer \"step\""):
        load_metrics(path)


def test_validation_per_question_type_is_drawn_dashed(tmp_path, monkeypatch):
    from hybrid import plots

    rows = full_rows()
    for row in rows:
        if "val-core/arithmetic/reward/mean@1" in row:
            row["val-aux/arithmetic/1-digit/reward/mean@1"] = 0.9
            row["val-aux/arithmetic/2-digit/reward/mean@1"] = 0.2
            row["val-aux/arithmetic/2-digit/reward/mean@2"] = 0.3  # another N: not this curve's
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, out_dir, name: figures.append(fig) or out_dir / name)
    plots.plot_reward(plots.load_metrics(write_jsonl(tmp_path / "metrics.jsonl", rows)), tmp_path)
    lines = {line.get_label(): line for line in figures[0].axes[0].get_lines()}
    assert set(lines) == {"train reward (critic/score/mean)", "val arithmetic reward mean@1", "  1-digit", "  2-digit"}
    assert lines["  2-digit"].get_linestyle() == "--" and list(lines["  2-digit"].get_ydata()) == [0.2, 0.2, 0.2]


def test_staleness_histogram_sums_the_steps_counts(tmp_path, monkeypatch):
    from hybrid import plots

    rows = full_rows(3)
    rows[1].update({"async/staleness/count_0": 8.0, "async/dropped_stale": 0.0})
    rows[2].update({"async/staleness/count_0": 4.0, "async/staleness/count_1": 4.0, "async/dropped_stale": 1.0})
    rows[3].update({"async/staleness/count_1": 6.0, "async/staleness/count_2": 2.0, "async/dropped_stale": 3.0})
    path = write_jsonl(tmp_path / "metrics.jsonl", rows)
    assert_png(plots.plot_staleness(plots.load_metrics(path), tmp_path))
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, out_dir, name: figures.append(fig) or out_dir / name)
    plots.plot_staleness(plots.load_metrics(path), tmp_path)
    per_step, whole_run = figures[0].axes
    # per step: bars of age 0, then 1, then 2, stacked; a step without an age has a 0-high bar
    heights = [[bar.get_height() for bar in container] for container in per_step.containers]
    assert heights == [[8.0, 4.0, 0.0], [0.0, 4.0, 6.0], [0.0, 0.0, 2.0]]
    assert [bar.get_height() for bar in whole_run.containers[0]] == [12.0, 10.0, 2.0]
    assert whole_run.get_title().endswith("groups dropped as too stale: 3")
    # a synchronous run has no staleness counts: no plot
    assert plots.plot_staleness(plots.load_metrics(write_jsonl(tmp_path / "s.jsonl", full_rows(3))), tmp_path) is None
