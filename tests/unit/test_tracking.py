"""Loggers (hybrid/tracking.py): metrics.jsonl lines (append on resume, non-numbers
dropped with a warning, NaN as null), the console line's format, backend-name errors, a
tensorboard event file read back with tensorboard's own reader, and the validation
samples table and val_generations.jsonl."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from hybrid.tracking import Tracking, ValidationGenerationsLogger, console_line, mlflow_metric_name, to_float


def read_jsonl(path):
    # strict parse: NaN or Infinity in the file is an error
    def reject(token):
        raise ValueError(f"non-standard JSON constant {token}")

    return [json.loads(line, parse_constant=reject) for line in path.read_text().splitlines()]


def test_file_backend_writes_one_json_line_per_step(tmp_path):
    tracker = Tracking("p", "e", default_backend=["file"], local_dir=tmp_path / "run")
    tracker.log(
        {"critic/score/mean": 0.5, "timing_s/gen": np.float32(1.5), "perf/throughput": torch.tensor(7.0)}, step=1
    )
    tracker.log({"critic/score/mean": float("nan"), "x": float("inf"), "n": np.int64(3), "ok": True}, step=2)
    tracker.finish()
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert rows == [
        {"step": 1, "critic/score/mean": 0.5, "timing_s/gen": 1.5, "perf/throughput": 7.0},
        {"step": 2, "critic/score/mean": None, "x": None, "n": 3.0, "ok": 1.0},
    ]


def test_file_backend_appends_for_resumed_runs(tmp_path):
    for step in (1, 2):
        tracker = Tracking("p", "e", default_backend="file", local_dir=tmp_path)
        tracker.log({"a": float(step)}, step=step)
        tracker.finish()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


def test_continue_from_forgets_steps_past_the_resumed_one(tmp_path, capsys):
    first = Tracking("p", "e", default_backend="file", local_dir=tmp_path)
    first.log({"val": 0.5}, step=0)
    for step in (1, 2, 3):
        first.log({"x": float(step)}, step=step)
    first.finish()
    resumed = Tracking("p", "e", default_backend=["console", "file"], local_dir=tmp_path)
    resumed.continue_from(1)  # the checkpoint of step 1: the earlier run's steps 2 and 3 are gone
    resumed.log({"x": 20.0}, step=2)
    resumed.finish()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 0, "val": 0.5}, {"step": 1, "x": 1.0}, {"step": 2, "x": 20.0}]
    assert f"hybrid: {tmp_path / 'metrics.jsonl'}: dropped 2 line(s) logged after step 1" in capsys.readouterr().out
    fresh = Tracking("p", "e", default_backend="file", local_dir=tmp_path)
    fresh.continue_from(0)  # a run from step 0 in the same folder starts a new record
    fresh.finish()
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    assert "dropped 3 line(s) logged by an earlier run in this folder" in capsys.readouterr().out


def test_non_numbers_are_dropped_with_one_warning_per_key(tmp_path):
    tracker = Tracking("p", "e", default_backend=["file"], local_dir=tmp_path)
    with pytest.warns(UserWarning, match="text"):
        tracker.log({"a": 1.0, "text": "hello", "vec": torch.tensor([1.0, 2.0])}, step=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tracker.log({"a": 2.0, "text": "again"}, step=2)  # already warned about "text"
    tracker.finish()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows == [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}]


def test_to_float():
    assert to_float(3) == 3.0 and to_float(np.float32(0.5)) == 0.5 and to_float(torch.tensor([2.0])) == 2.0
    assert to_float(np.array([4])) == 4.0 and to_float(True) == 1.0
    for not_a_number in ("1.0", [1.0], torch.tensor([1.0, 2.0]), np.array(["x"]), None):
        assert to_float(not_a_number) is None


def test_console_line_format():
    data = {
        "critic/score/mean": 0.41,
        "val-core/a/reward/mean@1": 0.5,
        "val-core/b/reward/mean@1": 0.6,
        "val-core/b/reward/best@4": 1.0,  # not a mean: not in the average
        "actor/kl_loss": 0.001,
        "actor/ppo_kl": 9.0,  # kl_loss wins
        "actor/entropy": 1.2,
        "response_length/mean": 23.0,
        "timing_s/step": 8.123,
    }
    assert console_line(data, 3) == "step 3 | score 0.41 | val 0.55 | kl 0.001 | ent 1.2 | len 23 | 8.1 s"
    assert console_line({}, 7) == "step 7"
    assert console_line({"actor/ppo_kl": 2e-5, "response_length/mean": 1234.0}, 1) == "step 1 | kl 2e-05 | len 1.23e+03"
    # Agent loops: the most trajectories in flight and the slow tail's latency.
    agents = {"critic/score/mean": 0.5, "agent/in_flight/max": 64.0, "agent/latency_s/p95": 3.14159, "timing_s/step": 9}
    assert console_line(agents, 2) == "step 2 | score 0.5 | agents 64 | p95 3.14 | 9.0 s"


def test_console_backend_prints_the_line(tmp_path, capsys):
    tracker = Tracking("p", "e", default_backend=["console"], local_dir=tmp_path)
    tracker.log({"critic/score/mean": 0.25, "timing_s/step": 2.0}, step=4)
    tracker.finish()
    assert capsys.readouterr().out.strip() == "step 4 | score 0.25 | 2.0 s"
    assert not (tmp_path / "metrics.jsonl").exists()


def test_unknown_backend_names_it_and_the_supported_ones(tmp_path):
    with pytest.raises(ValueError) as info:
        Tracking("p", "e", default_backend=["console", "nope"], local_dir=tmp_path)
    message = str(info.value)
    assert "'nope'" in message and "trainer.logger" in message
    for name in ("console", "file", "tensorboard", "wandb", "mlflow"):
        assert name in message


def test_failed_backend_closes_the_ones_already_open(tmp_path, monkeypatch):
    import hybrid.tracking as T

    def broken(*args, **kwargs):
        raise ImportError("no wandb here")

    opened = []

    class RecordingFileBackend(T._FileBackend):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(T, "_FileBackend", RecordingFileBackend)
    monkeypatch.setattr(T, "_WandbBackend", broken)
    with pytest.raises(ImportError, match="no wandb here"):
        Tracking("p", "e", default_backend=["file", "wandb"], local_dir=tmp_path)
    # the file opened for the first backend is closed, not leaked
    assert len(opened) == 1 and opened[0]._fh.closed


def test_tensorboard_writes_readable_scalars(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    tracker = Tracking("p", "e", default_backend=["tensorboard"], local_dir=tmp_path)
    tracker.log({"critic/score/mean": 0.25, "val-core/a/reward/mean@1": 0.5}, step=1)
    tracker.log({"critic/score/mean": 0.75}, step=2)
    tracker.finish()
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    score = [(e.step, e.value) for e in acc.Scalars("critic/score/mean")]
    assert score == [(1, 0.25), (2, 0.75)]
    assert [(e.step, e.value) for e in acc.Scalars("val-core/a/reward/mean@1")] == [(1, 0.5)]


def test_tensorboard_dir_from_environment(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb_elsewhere"))
    tracker = Tracking("p", "e", default_backend=["tensorboard"], local_dir=tmp_path / "run")
    tracker.log({"a": 1.0}, step=1)
    tracker.finish()
    assert list((tmp_path / "tb_elsewhere").glob("events.out.tfevents.*"))
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_mlflow_metric_names():
    assert mlflow_metric_name("val-core/a/reward/mean@4") == "val-core/a/reward/mean_at_4"
    assert mlflow_metric_name("x:y(z)") == "x_y_z_"


SAMPLES = [
    ("What is 12+30? Reply with only the number.", "42", 1.0),
    ("line one\nline two " + "x" * 80, "a very long answer " * 5, 0.0),
    ("q", "r", float("nan")),
    ("q2", "r2", "n/a"),
]


def test_validation_table():
    table = ValidationGenerationsLogger().table(SAMPLES, step=5)
    lines = table.splitlines()
    assert lines[0] == "validation samples at step 5:"
    assert lines[1].split("|")[0].strip() == "input" and lines[1].rstrip().endswith("score")
    rows = lines[3:]
    assert len(rows) == 4
    # fixed-width columns: every row's separators line up with the header's
    header_bars = [i for i, ch in enumerate(lines[1]) if ch == "|"]
    for row in rows:
        assert [i for i, ch in enumerate(row) if ch == "|"] == header_bars
    assert rows[0].split("|")[1].strip() == "42" and rows[0].split("|")[2].strip() == "1"
    assert "⏎" in rows[1] and "\n" not in rows[1] and "…" in rows[1]
    assert rows[2].split("|")[2].strip() == "nan"
    assert rows[3].split("|")[2].strip() == "n/a"


def test_validation_logger_outputs(tmp_path, capsys):
    logger = ValidationGenerationsLogger(local_dir=tmp_path / "run")
    logger.log(["console", "file"], SAMPLES, step=5)
    logger.log(["file"], SAMPLES[:1], step=10)
    out = capsys.readouterr().out
    assert "validation samples at step 5:" in out and "step 10" not in out
    rows = read_jsonl(tmp_path / "run" / "val_generations.jsonl")
    assert [r["step"] for r in rows] == [5, 10]
    first = rows[0]["samples"]
    # the file keeps full texts, unclipped
    assert first[1]["input"] == SAMPLES[1][0] and first[1]["output"] == SAMPLES[1][1]
    assert [s["score"] for s in first] == [1.0, 0.0, None, "n/a"]


def test_validation_logger_console_only_writes_no_file(tmp_path, capsys):
    ValidationGenerationsLogger(local_dir=tmp_path).log("console", SAMPLES[:1], step=1)
    assert "validation samples at step 1:" in capsys.readouterr().out
    assert not (tmp_path / "val_generations.jsonl").exists()


def test_finish_is_idempotent_and_stops_logging(tmp_path):
    tracker = Tracking("p", "e", default_backend=["file", "console"], local_dir=tmp_path)
    tracker.log({"a": 1.0}, step=1)
    tracker.finish()
    tracker.finish()
    tracker.log({"a": 2.0}, step=2)
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "a": 1.0}]


def test_wandb_run_gets_the_configs_tags(tmp_path, monkeypatch):
    # wandb is an optional package: a module recording wandb.init's arguments stands in for it
    import sys
    import types

    calls = []

    class Run:
        def finish(self):
            calls.append("finish")

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: calls.append(kw) or Run()))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    Tracking("p", "e", default_backend=["wandb"], local_dir=tmp_path, wandb_tags=("grpo", "skyrl")).finish()
    assert calls[0]["tags"] == ["grpo", "skyrl"] and calls[0]["project"] == "p" and calls[-1] == "finish"
    calls.clear()
    Tracking("p", "e", default_backend=["wandb"], local_dir=tmp_path, wandb_tags=None)
    assert "tags" not in calls[0]
