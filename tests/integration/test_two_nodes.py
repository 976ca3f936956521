"""Two nodes on one machine: a Ray cluster of two raylets (`ray.cluster_utils.Cluster`,
2 CPUs each) that the driver joins through RAY_ADDRESS, as it joins a `ray start` cluster.

- `trainer.nnodes=2 trainer.n_gpus_per_node=1` places one rank on each node (each worker
  process is a child of a different raylet) and trains to the end, logging the driver's and
  the largest rank's resident memory every step, and leaves no worker on either node;
- removing the second node in the middle of a second run on the same cluster ends it with
  status 1 within 60 s and one `hybrid:` line saying the rank's node died, no traceback, and
  no worker left.

The two runs share one cluster (it takes seconds to start): the node-losing test comes last.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.run_helpers import clean_env, command_line, wait_for_steps

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=32, n_val=8, seed=3)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    # Each rank takes a whole node: the pool asks for cpu_count // n_gpus_per_node CPUs a slot.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    second = cluster.add_node(num_cpus=2)
    cluster.second = second
    yield cluster
    cluster.shutdown()


def _raylet_pid(node) -> int:
    return node.all_processes["raylet"][0].process.pid


def _workers() -> dict[int, int]:
    """{pid: parent pid} of every actor-rollout-ref worker process on this machine."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not (entry / "cmdline").read_bytes().startswith(b"ray::ActorRolloutRefWorker"):
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        found[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return found


def _ours(cluster) -> dict[int, int]:
    raylets = {_raylet_pid(node) for node in [cluster.head_node, *cluster.worker_nodes]}
    return {pid: parent for pid, parent in _workers().items() if parent in raylets}


def _assert_no_worker_left(cluster, within_s: float = 20) -> None:
    deadline = time.time() + within_s
    while _ours(cluster) and time.time() < deadline:
        time.sleep(0.5)
    assert not _ours(cluster), f"worker processes left on the cluster: {_ours(cluster)}"


def _start(cluster, model_dir, files, root, *extra):
    return subprocess.Popen(
        command_line(model_dir, files, root, "trainer.nnodes=2", "trainer.n_gpus_per_node=1", *extra),
        cwd=root.parent,
        env=clean_env(RAY_ADDRESS=cluster.address),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_one_rank_per_node_trains_to_the_end(cluster, tiny_model_dir, arithmetic_files, tmp_path):
    root = tmp_path / "run"
    proc = _start(cluster, tiny_model_dir, arithmetic_files, root, "trainer.total_training_steps=2")
    try:
        wait_for_steps(proc, root / "metrics.jsonl", 1)
        placed = _ours(cluster)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert sorted(placed.values()) == sorted([_raylet_pid(cluster.head_node), _raylet_pid(cluster.second)]), placed
    steps = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    for metrics in steps:  # host memory of the driver and of the largest rank, every step
        assert 0.1 < metrics["perf/cpu_memory_rss_gb"] < metrics["perf/worker_cpu_memory_rss_gb"] < 20
    _assert_no_worker_left(cluster)  # and the next test sees only its own run's workers


def test_losing_a_node_ends_the_run_in_one_line(cluster, tiny_model_dir, arithmetic_files, tmp_path):
    root = tmp_path / "run"
    proc = _start(cluster, tiny_model_dir, arithmetic_files, root)
    try:
        wait_for_steps(proc, root / "metrics.jsonl", 1)
        assert len(_ours(cluster)) == 2
        cluster.remove_node(cluster.second)
        removed_at = time.time()
        out, err = proc.communicate(timeout=120)
        took = time.time() - removed_at
    finally:
        proc.kill()
        proc.wait()
    print(
        f"the run ended {took:.1f} s after the node was removed; stderr's last lines:\n"
        + "\n".join(err.splitlines()[-3:])
    )
    assert proc.returncode == 1, err[-3000:]
    assert took < 60
    messages = [line for line in err.splitlines() if line.startswith("hybrid:")]
    assert len(messages) == 1, err[-3000:]
    assert "worker group 'actor_rollout': rank " in messages[0], messages[0]
    assert "died in " in messages[0] and ": its node " in messages[0] and " died (" in messages[0], messages[0]
    assert "Traceback" not in err
    _assert_no_worker_left(cluster)  # on the remaining node
