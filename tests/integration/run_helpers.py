"""Shared pieces of the tests that run the trainer as a user does, in a process session of its
own (preemption, a worker that dies, two nodes): the command line of a long tiny-model run
through Ray, a clean environment for it, waiting for its steps, and the session's processes."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from tests.integration.checkpoint_helpers import tiny_run

REPO = Path(__file__).resolve().parents[2]


def command_line(model_dir, files, root, *extra, ranks: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hybrid.main_ppo",
        *tiny_run(model_dir, files, root),
        f"trainer.n_gpus_per_node={ranks}",
        "trainer.worker_group=ray",
        "trainer.total_training_steps=200",
        "trainer.total_epochs=25",  # 8 steps an epoch (32 rows / 4): a run that outlasts the kill
        "trainer.save_freq=-1",
        "trainer.merge_on_finish=false",
        "trainer.plot_on_finish=false",
        *extra,
    ]


def clean_env(**extra) -> dict:
    env = dict(
        os.environ, TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
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


def processes_left(proc) -> list[str]:
    """Those of the ended run's session still alive after 20 s (Ray's own processes end
    just after the driver)."""
    deadline = time.time() + 20
    while session_processes(proc.pid) and time.time() < deadline:
        time.sleep(0.5)
    return session_processes(proc.pid)


def kill_session(proc) -> None:
    """SIGKILL whatever the run's session still has, and reap the run."""
    for line in session_processes(proc.pid):
        os.kill(int(line.split()[0]), signal.SIGKILL)
    proc.wait()


def session_processes(sid: int) -> list[str]:
    """'pid name' of every live process in session `sid` (read from /proc: Linux)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # ended while we looked
        name_end = stat.rindex(")")
        fields = stat[name_end + 2 :].split()  # state, ppid, pgrp, session, ...
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(f"{entry} {stat[stat.index('(') + 1 : name_end]}")
    return found
