"""Placement on a real Ray cluster (CPU here): ranks of a CPU pool get the environment that
hides every GPU (Ray 2.60 no longer blanks CUDA_VISIBLE_DEVICES for an actor without a GPU),
and each reports its device at start, which the group checks (hybrid/placement.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_cpu_ranks_hide_gpus_and_report_their_device():
    import ray

    from hybrid.controller.ray_worker_group import RayResourcePool, RayWorkerGroup
    from workers.base import Worker

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        pool = RayResourcePool(nnodes=1, slots_per_node=2, use_gpu=False, cpus_per_slot=1, name="placement_probe")
        group = RayWorkerGroup(pool, Worker, name="probe")
        try:
            reports = group.placement
        finally:
            group.shutdown()
            pool.remove()
    finally:
        ray.shutdown()
    assert [r["device"] for r in reports] == ["cpu", "cpu"]
    assert [r["visible_devices"] for r in reports] == ["", ""]  # set by us, not left to Ray
    assert [r["device_uuid"] for r in reports] == [None, None]
    assert len({r["pid"] for r in reports}) == 2
