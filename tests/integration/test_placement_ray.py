"""Placement on a real Ray cluster (CPU here): ranks of a CPU pool get the environment that
hides every GPU (Ray 2.60 no longer blanks CUDA_VISIBLE_DEVICES for an actor without a GPU),
and each reports its device at start, which the group checks (hybrid/placement.py): two
ranks reporting one GPU end the group's start in one line."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


def _start(worker_cls, name: str):
    """A 2-rank CPU group of `worker_cls`: (its reports, None) or (None, the error it raised)."""
    from hybrid.controller.ray_worker_group import RayResourcePool, RayWorkerGroup, WorkerFailedError

    pool = RayResourcePool(nnodes=1, slots_per_node=2, use_gpu=False, cpus_per_slot=1, name=name)
    try:
        group = RayWorkerGroup(pool, worker_cls, name=name)
    except WorkerFailedError as err:  # the group killed its actors before raising
        pool.remove()
        return None, err
    try:
        return group.placement, None
    finally:
        group.shutdown()
        pool.remove()


def test_cpu_ranks_hide_gpus_and_report_their_device(ray_cluster):
    from workers.base import Worker

    reports, error = _start(Worker, "placement_probe")
    assert error is None
    assert [r["device"] for r in reports] == ["cpu", "cpu"]
    assert [r["visible_devices"] for r in reports] == ["", ""]  # set by us, not left to Ray
    assert [r["device_uuid"] for r in reports] == [None, None]
    assert len({r["pid"] for r in reports}) == 2


def test_two_ranks_on_one_gpu_end_the_start_in_one_line(ray_cluster):
    """The ranks' reports carry a recorded GPU (one uuid for both): the group's start raises."""
    from workers.base import Worker

    class OneGpu(Worker):
        def process_info(self) -> dict:
            return {**super().process_info(), "device": "cuda", "device_index": 0, "device_uuid": "GPU-8f2e"}

    reports, error = _start(OneGpu, "clash_probe")
    assert reports is None
    message = str(error)
    assert "\n" not in message
    assert message.startswith("worker group 'clash_probe': ranks 0, 1 on node ")
    assert "share cuda:0 (uuid GPU-8f2e, CUDA_VISIBLE_DEVICES='')" in message
