"""A worker process that dies in the middle of a run (Ray worker group, tiny random model,
the Hugging Face rollout engine), through the command line as a user runs it:

- rank 1 of a 2-rank run is killed with SIGKILL after the first step;
- the one rank of a 1-rank run is killed by Ray's own memory monitor after the first step:
  the run's Ray cluster is started with a kill threshold a few GiB above the node's memory
  use, and this test then fills the node's memory until the monitor kills the rank.

Each run must end within 60 s of the kill with status 1 and one `hybrid:` line naming the
rank, its node and pid and the cause Ray reports, no traceback, and no process of the run
left (Ray's actors, raylet and GCS included: the run is started in its own session, as a
job's processes are)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.run_helpers import (
    clean_env,
    command_line,
    kill_session,
    processes_left,
    session_processes,
    wait_for_steps,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=32, n_val=8, seed=3)


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
        command_line(tiny_model_dir, arithmetic_files, root),
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
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
    print(
        f"the run ended {took:.1f} s after the kill; stdout's last lines:\n"
        + "\n".join(out.splitlines()[-5:])
        + "\nstderr's last lines:\n"
        + "\n".join(err.splitlines()[-3:])
    )
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


# Ray's memory monitor (in the raylet) kills a worker when the node's memory use passes
# RAY_memory_usage_threshold (a fraction of the node's memory), checked every
# RAY_memory_monitor_refresh_ms; the raylet reads both when the run's private cluster starts.
# The threshold is set HEADROOM_GIB above the node's use before the run, enough for the run
# itself (about 1.5 GiB) and for other processes on the machine to come and go: a rank
# killed while the run starts would not be the failure under test.
HEADROOM_GIB = 4
CHUNK = 256 * 2**20
MAX_FILL_GIB = HEADROOM_GIB + 2


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# Its threshold is the node's memory in use plus a margin: another test process running beside it
# (make test's second worker) moves that by gigabytes, so it runs alone.
@pytest.mark.serial
def test_worker_killed_by_rays_memory_monitor_ends_the_run_out_of_memory(tiny_model_dir, arithmetic_files, tmp_path):
    from ray._private.utils import get_system_memory, get_used_memory  # how the raylet measures the node

    total, used = get_system_memory(), get_used_memory()
    if total - used < (MAX_FILL_GIB + 2) * 2**30:
        pytest.skip(f"{(total - used) / 2**30:.1f} GiB of memory free: too little to fill {MAX_FILL_GIB} GiB safely")
    threshold = (used + HEADROOM_GIB * 2**30) / total
    root = tmp_path / "run"
    env = clean_env(RAY_memory_usage_threshold=f"{threshold:.4f}", RAY_memory_monitor_refresh_ms="100")
    proc = subprocess.Popen(
        command_line(tiny_model_dir, arithmetic_files, root, ranks=1),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    fill = []
    try:
        wait_for_steps(proc, root / "metrics.jsonl", 1)
        victim = worker_pid(proc.pid, rank=0)
        filling_from = time.time()
        # Fill the node's memory (pages written, so they count) until the monitor kills the rank:
        # until the node's use is 2 GiB past the threshold, measured as the raylet measures it
        # (memory other processes free meanwhile would otherwise leave a fixed fill short of
        # the threshold: one clean-clone run filled 6 GiB and the rank lived), never closer than
        # 1.5 GiB to the whole machine.
        stop_at = min(threshold * total + 2 * 2**30, total - 1.5 * 2**30)
        while alive(victim) and proc.poll() is None and get_used_memory() < stop_at:
            fill.append(b"\x01" * CHUNK)
            time.sleep(0.2)
        filled, killed_after = len(fill) * CHUNK / 2**30, time.time() - filling_from
        out, err = proc.communicate(timeout=120)
        took = time.time() - filling_from
        fill.clear()
        left = processes_left(proc)
    finally:
        fill.clear()
        kill_session(proc)
    print(
        f"threshold {threshold:.4f} of {total / 2**30:.1f} GiB; the rank died {killed_after:.1f} s after the filling "
        f"started, {filled:.2f} GiB filled; the run ended {took:.1f} s after the filling started; "
        "stdout's last lines:\n"
        + "\n".join(out.splitlines()[-5:])
        + "\nstderr's last lines:\n"
        + "\n".join(err.splitlines()[-3:])
    )
    assert proc.returncode == 1, err[-3000:]
    assert took < 60
    messages = [line for line in err.splitlines() if line.startswith("hybrid:")]
    assert len(messages) == 1, err[-3000:]
    assert "worker group 'actor_rollout': rank 0 (ActorRolloutRefWorker) died in " in messages[0], messages[0]
    assert re.search(
        rf" on node [\d.]+ \(id [0-9a-f]{{8}}, pid {victim}\): out of memory: Ray's memory monitor killed it "
        r"\(memory on the node was [\d.]+ ?GB used / [\d.]+ ?GB limit\)\. The run cannot go on without it; "
        r"HYBRID_DEBUG=1 shows Ray's whole report\.$",
        messages[0],
    ), messages[0]
    assert "Traceback" not in err
    assert not left, f"processes left behind: {left}"
