"""A worker process that dies in the middle of a 2-rank run (Ray worker group, tiny random
model, the Hugging Face rollout engine), through the command line as a user runs it: rank
1's process is killed with SIGKILL after the first step. The run must end within 60 s
with status 1 and one `hybrid:` line naming the rank, its node and pid and the cause Ray
reports, no traceback, and no process of the run left (Ray's actors, raylet and GCS
included: the run is started in its own session, as a job's processes are)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.checkpoint_helpers import tiny_run
from tests.integration.test_preemption import kill_session, processes_left, session_processes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=32, n_val=8, seed=3)


def command_line(model_dir, files, root, *extra) -> list[str]:
    return [
        sys.executable, "-m", "hybrid.main_ppo",
        *tiny_run(model_dir, files, root),
        "trainer.n_gpus_per_node=2",
        "trainer.worker_group=ray",
        "trainer.total_training_steps=200",
        "trainer.save_freq=-1",
        "trainer.merge_on_finish=false",
        "trainer.plot_on_finish=false",
        *extra,
    ]


def clean_env(**extra) -> dict:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RAY_ADDRESS"):
        env.pop(key, None)  # left by earlier in-process worker groups of this pytest process
    env.update(extra)
    return env


def wait_for_steps(proc, metrics: Path, steps: int, timeout_s: float = 300) -> None:
    deadline = time.time() + timeout_s
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= steps):
        assert proc.poll() is None, f"the run ended early ({proc.returncode}): {proc.communicate()[1][-3000:]}"
        assert time.time() < deadline, f"step {steps} never finished"
        time.sleep(0.2)


def worker_pid(sid: int, rank: int) -> int:
    """The pid of the actor-rollout-ref worker of `rank` among session `sid`'s processes."""
    for line in session_processes(sid):
        pid = int(line.split()[0])
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline.startswith(b"ray::ActorRolloutRefWorker") and f"RANK={rank}".encode() in environ:
            return pid
    raise AssertionError(f"no worker process of rank {rank} in session {sid}: {session_processes(sid)}")


def test_sigkilled_worker_ends_the_run_naming_rank_node_and_cause(tiny_model_dir, arithmetic_files, tmp_path):
    root = tmp_path / "run"
    proc = subprocess.Popen(
        command_line(tiny_model_dir, arithmetic_files, root), cwd=tmp_path, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        wait_for_steps(proc, root / "metrics.jsonl", 1)
        victim = worker_pid(proc.pid, rank=1)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        out, err = proc.communicate(timeout=120)
        took = time.time() - killed_at
        left = processes_left(proc)
    finally:
        kill_session(proc)
    print(f"the run ended {took:.1f} s after the kill; stdout's last lines:\n" + "\n".join(out.splitlines()[-5:])
          + "\nstderr's last lines:\n" + "\n".join(err.splitlines()[-3:]))
    assert proc.returncode == 1, err[-3000:]
    assert took < 60
    messages = [line for line in err.splitlines() if line.startswith("hybrid:")]
    assert len(messages) == 1, err[-3000:]
    assert "worker group 'actor_rollout': rank 1 (ActorRolloutRefWorker) died in " in messages[0]
    assert re.search(rf" on node [\d.]+ \(id [0-9a-f]{{8}}, pid {victim}\): ", messages[0]), messages[0]
    assert "killed by a signal (SIGKILL" in messages[0]
    assert "Traceback" not in err
    assert "A worker died or was killed" not in out + err  # Ray's own paragraph: replaced by the line above
    assert not left, f"processes left behind: {left}"
