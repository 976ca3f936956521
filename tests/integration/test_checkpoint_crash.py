"""Crash safety through the real command line: `python -m hybrid.main_ppo` saving every step
is killed with SIGKILL while its step-2 checkpoint is half written (the child process
installs `workers.checkpoint.after_model_shard`, which holds every rank after its model
shard, then runs the command line's module). The half-written folder keeps its temporary
name, so a restart with resume_mode=auto resumes from step 1, removes the partial folder,
and finishes the run with complete checkpoints only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.checkpoint_helpers import tiny_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 240

# `python -m hybrid.main_ppo`, with a hook that holds the step-2 save after the model shard.
HELD_AT_STEP_2 = """
import runpy, sys, time
import workers.checkpoint
workers.checkpoint.after_model_shard = lambda step: time.sleep(600) if step == 2 else None
sys.argv = ["hybrid.main_ppo", *sys.argv[1:]]
runpy.run_module("hybrid.main_ppo", run_name="__main__", alter_sys=True)
"""


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=32, n_val=8, seed=3)


def _command(model_dir, files, root, held: bool = False) -> list[str]:
    program = ["-c", HELD_AT_STEP_2] if held else ["-m", "hybrid.main_ppo"]
    return [
        sys.executable,
        *program,
        *tiny_run(model_dir, files, root),
        "trainer.n_gpus_per_node=1",
        "trainer.worker_group=local",
        "trainer.total_training_steps=3",
        "trainer.save_freq=1",
        "trainer.merge_on_finish=false",
    ]


def _env() -> dict:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    # In-process worker groups of earlier tests in this pytest process leave their rank and
    # rendezvous port here; the child must pick its own port, not collide with ours.
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_sigkill_while_saving_resumes_from_previous_checkpoint(tiny_model_dir, arithmetic_files, tmp_path):
    root = tmp_path / "run"
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(
        _command(tiny_model_dir, arithmetic_files, root, held=True),
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_env(),
        start_new_session=True,
    )
    shard = root / "global_step_2.partial" / "actor" / "model_world_size_1_rank_0.safetensors"
    deadline = time.time() + WAIT_S
    try:
        while not shard.exists():
            assert proc.poll() is None, (
                f"the run ended early ({proc.returncode}): {(tmp_path / 'first.log').read_text()[-3000:]}"
            )
            assert time.time() < deadline, "the step-2 checkpoint never started"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
    assert proc.returncode == -signal.SIGKILL
    assert (root / "global_step_1" / "data.pt").is_file()
    assert not (root / "global_step_2").exists()
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "1"

    second = subprocess.run(
        _command(tiny_model_dir, arithmetic_files, root),
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    output = second.stdout + second.stderr
    assert second.returncode == 0, output[-3000:]
    assert f"removed partial checkpoint {root / 'global_step_2.partial'}" in output
    assert f"resumed from {root / 'global_step_1'} at step 1" in output
    assert sorted(n for n in os.listdir(root) if n.startswith("global_step")) == [
        "global_step_1",
        "global_step_2",
        "global_step_3",
    ]
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "3"
    steps = [
        json.loads(line)["step"]
        for line in (root / "metrics.jsonl").read_text().splitlines()
        if "timing_s/step" in line
    ]
    # Each step once: the resumed run's record continues the first run's at step 1.
    assert steps == [1, 2, 3]
