"""SIGTERM and Ctrl-C on a tiny random model (one in-process rank, the seeded Hugging Face
rollout engine):

- a SIGTERM during a step's rollout, during its actor update and during its checkpoint
  write each let that step finish, save it (the write in progress completes first), and
  end `fit` with RunStopped (status 143) naming the checkpoint; the runs resumed from
  those checkpoints together equal an uninterrupted run step for step (metrics within 1e-6);
- through the command line on a Ray worker group, a SIGTERM from outside ends
  `python -m hybrid.main_ppo` with status 143, the checkpoint path on stderr, no
  traceback, and no process of its session left (Ray's included).

The signals are sent by hooks installed by this test only: around the worker group's
calls (rollout, update) and `workers.checkpoint.after_model_shard` (checkpoint write).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.checkpoint_helpers import assert_metrics_close, run_config, tiny_run
from tests.integration.run_helpers import kill_session, processes_left

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STEPS = ("trainer.total_training_steps=4", "trainer.save_freq=2")


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=32, n_val=8, seed=3)


def train_until_stopped(cfg) -> tuple[list[dict], BaseException | None]:
    """Run `cfg` in this process; (history of the steps run, the RunStopped that ended it or None)."""
    from transformers import AutoTokenizer

    from hybrid.errors import RunStopped
    from hybrid.run import build_dataloaders
    from hybrid.trainer import PPOTrainer
    from reward.loader import load_reward_manager

    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path)
    train_dl, val_dl = build_dataloaders(cfg, tokenizer)
    reward_fn = load_reward_manager(cfg, tokenizer, num_examine=0)
    trainer = PPOTrainer(cfg, tokenizer, train_dl, val_dl, reward_fn, reward_fn)
    stopped = None
    try:
        trainer.init_workers()
        trainer.fit()
    except RunStopped as err:
        stopped = err
    finally:
        trainer.shutdown()
    return trainer.history, stopped


def _sigterm_on_call(monkeypatch, method: str, nth: int) -> None:
    """Send this process SIGTERM when the driver makes its `nth` `method` call to a worker
    group in this run: the signal arrives while that phase of the step runs."""
    from hybrid.controller.local_worker_group import LocalWorkerGroup

    original = LocalWorkerGroup._execute
    calls = {"n": 0}

    def execute(self, method_name, per_rank_calls):
        if method_name == method:
            calls["n"] += 1
            if calls["n"] == nth:
                os.kill(os.getpid(), signal.SIGTERM)
        return original(self, method_name, per_rank_calls)

    monkeypatch.setattr(LocalWorkerGroup, "_execute", execute)


def _sigterm_in_checkpoint_write(monkeypatch, step: int) -> None:
    import workers.checkpoint

    def hook(global_step: int) -> None:
        if global_step == step:
            os.kill(os.getpid(), signal.SIGTERM)  # the model shard is written, the rest not yet

    monkeypatch.setattr(workers.checkpoint, "after_model_shard", hook)


@pytest.fixture(scope="module")
def reference(tiny_model_dir, arithmetic_files, tmp_path_factory) -> list[dict]:
    """The four steps run uninterrupted (saving every 2 steps changes nothing they compute)."""
    history, stopped = train_until_stopped(
        run_config(tiny_model_dir, arithmetic_files, tmp_path_factory.mktemp("reference"), *STEPS)
    )
    assert stopped is None and [h["step"] for h in history] == [1, 2, 3, 4]
    return history


def test_sigterm_in_rollout_checkpoint_write_and_update_resumes_exactly(
    tiny_model_dir, arithmetic_files, tmp_path, reference
):
    """Four steps saving every 2, stopped three times and resumed each time: SIGTERM during
    step 1's rollout (saved at 1), during step 2's checkpoint write (that save completes),
    during step 3's actor update (saved at 3); the last run finishes step 4. Together they
    equal an uninterrupted run step for step."""

    root = tmp_path / "stopped"
    history = []
    # (phase, how the signal is sent, the step the run stops after); each run resumes the last.
    stops = [
        ("rollout", lambda mp: _sigterm_on_call(mp, "generate_sequences", nth=1), 1),
        ("checkpoint write", lambda mp: _sigterm_in_checkpoint_write(mp, step=2), 2),
        ("update", lambda mp: _sigterm_on_call(mp, "update_actor", nth=1), 3),
    ]
    for phase, install, step in stops:
        with pytest.MonkeyPatch.context() as mp:
            install(mp)
            steps, stopped = train_until_stopped(run_config(tiny_model_dir, arithmetic_files, root, *STEPS))
        assert stopped is not None, f"SIGTERM during the {phase} did not stop the run"
        checkpoint = root / f"global_step_{step}"
        assert stopped.exit_status == 143 and stopped.checkpoint == str(checkpoint), phase
        assert f"stopped by SIGTERM after step {step} of 4; checkpoint: {checkpoint}" in str(stopped)
        assert [h["step"] for h in steps] == [step], phase
        assert (checkpoint / "data.pt").is_file() and (checkpoint / "actor" / "optim_world_size_1_rank_0.pt").is_file()
        assert (root / "latest_checkpointed_iteration.txt").read_text() == str(step)
        assert not [n for n in os.listdir(root) if n.endswith(".partial")], phase
        history += steps
    last, stopped = train_until_stopped(run_config(tiny_model_dir, arithmetic_files, root, *STEPS))
    assert stopped is None and [h["step"] for h in last] == [4]
    for a, b in zip(reference, history + last, strict=True):
        assert_metrics_close(a, b)


def test_a_stop_saves_even_with_checkpointing_off(tiny_model_dir, arithmetic_files, tmp_path, reference):
    """verl's default trainer.save_freq=-1 (no checkpoints): a SIGTERM during step 2's update
    still saves step 2 (trainer.save_on_stop, on by default), the message says how to resume,
    and the resumed run's steps 3 and 4 equal the uninterrupted run's. With save_on_stop=false
    the stop saves nothing and says so."""
    off = ("trainer.total_training_steps=4", "trainer.save_freq=-1")
    root = tmp_path / "stopped"
    with pytest.MonkeyPatch.context() as mp:
        _sigterm_on_call(mp, "update_actor", nth=2)
        first, stopped = train_until_stopped(run_config(tiny_model_dir, arithmetic_files, root, *off))
    checkpoint = root / "global_step_2"
    assert stopped is not None and stopped.checkpoint == str(checkpoint)
    assert "run the same command to resume from it" in str(stopped)
    assert (checkpoint / "data.pt").is_file() and (root / "latest_checkpointed_iteration.txt").read_text() == "2"
    rest, stopped = train_until_stopped(run_config(tiny_model_dir, arithmetic_files, root, *off))
    assert stopped is None and [h["step"] for h in first + rest] == [1, 2, 3, 4]
    for a, b in zip(reference, first + rest, strict=True):
        assert_metrics_close(a, b)

    with pytest.MonkeyPatch.context() as mp:
        _sigterm_on_call(mp, "update_actor", nth=1)
        _, stopped = train_until_stopped(
            run_config(tiny_model_dir, arithmetic_files, tmp_path / "off", *off, "trainer.save_on_stop=false")
        )
    assert stopped.checkpoint is None and "nothing saved: trainer.save_on_stop=false" in str(stopped)
    assert not (tmp_path / "off" / "global_step_1").exists()


# A child process that runs the command line with step 2's rollout held for a while, so
# the test's SIGTERM arrives during a step (the hook is this test's, not the trainer's). It
# wraps the worker group's dispatch in the driver, before any group is built.
HELD_ROLLOUT = """
import runpy, sys, time
from hybrid.controller.base import WorkerGroup
marker = sys.argv.pop(1)
original = WorkerGroup._call
calls = []
def call(self, method_name, mode, *args, **kwargs):
    if method_name == "generate_sequences":
        calls.append(method_name)
        if len(calls) == 2:
            open(marker, "w").close()
            time.sleep(3)
    return original(self, method_name, mode, *args, **kwargs)
WorkerGroup._call = call
sys.argv = ["hybrid.main_ppo", *sys.argv[1:]]
runpy.run_module("hybrid.main_ppo", run_name="__main__", alter_sys=True)
"""


def _command_line(model_dir, files, root) -> list[str]:
    return [
        *tiny_run(model_dir, files, root),
        "trainer.n_gpus_per_node=1",
        "trainer.worker_group=ray",
        "trainer.total_training_steps=20",
        "trainer.total_epochs=3",  # 8 steps an epoch (32 rows / 4)
        "trainer.save_freq=10",
        "trainer.merge_on_finish=false",
    ]


def test_sigterm_through_the_command_line_with_ray(tiny_model_dir, arithmetic_files, tmp_path):
    """`python -m hybrid.main_ppo` on a Ray worker group (its own session, as a job's
    processes are): SIGTERM to the driver during step 2 saves step 2 and exits 143 with the
    checkpoint on stderr, and no process of the session is left (Ray's actor, raylet and
    GCS included)."""
    root, marker = tmp_path / "run", tmp_path / "in_step_2"
    env = dict(
        os.environ, TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RAY_ADDRESS"):
        env.pop(key, None)  # left by earlier in-process worker groups of this pytest process
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD_ROLLOUT, str(marker), *_command_line(tiny_model_dir, arithmetic_files, root)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while not marker.exists():
            assert proc.poll() is None, f"the run ended early ({proc.returncode}): {proc.communicate()[1][-3000:]}"
            assert time.time() < deadline, "step 2 never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        left = processes_left(proc)
    finally:
        kill_session(proc)
    assert proc.returncode == 143, err[-3000:]
    checkpoint = root / "global_step_2"
    assert f"hybrid: stopped by SIGTERM after step 2 of 20; checkpoint: {checkpoint}" in err
    assert "Traceback" not in err
    assert (checkpoint / "data.pt").is_file()
    steps = [json.loads(line)["step"] for line in (root / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert not left, f"processes left behind: {left}"
