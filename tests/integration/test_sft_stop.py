"""SIGTERM to a running SFT job (a tiny model in a subprocess, as a scheduler would preempt it):
the step in progress finishes, a complete checkpoint of it is published (never a `.partial`
folder), the exit status is 128 + SIGTERM, and the same command resumes from it. With two
torchrun ranks the signal goes to rank 1 only: both ranks stop after the same step and both
shards are in the checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.integration.sft_helpers import REPO, one_thread_env, tiny_sft_run, torchrun

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LONG = 500  # steps (and epochs, which would end the run first): far more than run before the signal arrives


@pytest.fixture(scope="module")
def overrides(tmp_path_factory, tiny_model_dir):
    return [
        *tiny_sft_run(tmp_path_factory.mktemp("sft_data"), tiny_model_dir, n_train=32, n_val=0),
        "data.train_batch_size=4",
        "data.micro_batch_size_per_gpu=2",
        "trainer.save_freq=1000",  # > 0: checkpointing on, but only the stop saves
    ]


def _steps_logged(out) -> list[int]:
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    return [json.loads(line)["step"] for line in open(path) if line.endswith("\n")]


def _start_and_stop(command: list[str], out, pick=lambda proc: proc.pid) -> tuple[subprocess.CompletedProcess, int]:
    """Start the job, send SIGTERM to `pick(process)` once two steps are logged; (result, the
    last step logged)."""
    proc = subprocess.Popen(
        command, cwd=REPO, env=one_thread_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 120
    while len(_steps_logged(out)) < 2:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "the job logged no two steps in 120 s"
        time.sleep(0.05)
    os.kill(pick(proc), signal.SIGTERM)
    log, _ = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(command, proc.returncode, log), _steps_logged(out)[-1]


def _assert_complete_checkpoint(out, step: int, ranks: int) -> None:
    assert sorted(os.listdir(out)) == [f"global_step_{step}", "latest_checkpointed_iteration.txt", "metrics.jsonl"]
    assert (out / "latest_checkpointed_iteration.txt").read_text() == str(step)
    folder = out / f"global_step_{step}"
    assert torch.load(folder / "data.pt", weights_only=True)["global_step"] == step
    meta = json.loads((folder / "actor" / "fsdp_config.json").read_text())
    assert (meta["world_size"], meta["global_step"]) == (ranks, step)
    for rank in range(ranks):
        for name in ("model", "optim", "extra_state"):
            ext = "safetensors" if name == "model" else "pt"
            assert (folder / "actor" / f"{name}_world_size_{ranks}_rank_{rank}.{ext}").is_file()


def test_sigterm_saves_the_step_and_the_same_command_resumes(overrides, tmp_path):
    from hybrid.config.sft_schema import load_sft_config, typed_sft_config
    from hybrid.sft_trainer import run_sft

    out = tmp_path / "run"
    args = [*overrides, f"trainer.default_local_dir={out}"]
    done, step = _start_and_stop(
        [
            sys.executable,
            "-m",
            "hybrid.sft_trainer",
            *args,
            f"trainer.total_training_steps={LONG}",
            f"trainer.total_epochs={LONG}",
        ],
        out,
    )
    assert done.returncode == 128 + signal.SIGTERM, done.stdout[-3000:]
    assert f"stopped by SIGTERM after step {step} of {LONG}; checkpoint: {out}/global_step_{step}" in done.stdout
    _assert_complete_checkpoint(out, step, ranks=1)
    summary = run_sft(typed_sft_config(load_sft_config([*args, f"trainer.total_training_steps={step + 2}"])))
    assert summary["steps"] == step + 2
    assert _steps_logged(out) == list(range(1, step + 3))  # the resumed run went on at step + 1


def test_sigterm_to_one_rank_stops_both_at_the_same_step(overrides, tmp_path):
    import psutil

    def rank_1(proc):
        for child in psutil.Process(proc.pid).children(recursive=True):
            if child.environ().get("RANK") == "1":
                return child.pid
        raise AssertionError("torchrun started no rank 1")

    out = tmp_path / "run"
    command = [
        *torchrun(2),
        *overrides,
        f"trainer.default_local_dir={out}",
        f"trainer.total_training_steps={LONG}",
        f"trainer.total_epochs={LONG}",
    ]
    done, step = _start_and_stop(command, out, rank_1)
    assert done.returncode != 0
    assert f"stopped by SIGTERM after step {step} of {LONG}; checkpoint: {out}/global_step_{step}" in done.stdout
    _assert_complete_checkpoint(out, step, ranks=2)
