"""The CPU part of gpu_check's placement and offload_policy checks (scripts/gpu_check_placement.py),
as a lent GPU machine runs them: two spawned processes report their devices (CPU ranks never
clash), and a tiny Llama under FSDP2 with offload_policy on two gloo ranks gathers, exports,
clips and steps exactly as the same model unsharded."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_gpu_check_checks_pass_on_the_cpu(tmp_path):
    from scripts.gpu_check_placement import run_checks

    results = run_checks(set(), tmp_path)
    assert sorted(results) == ["offload_collectives", "placement"]
    placement = results["placement"]["check"]
    assert results["placement"]["rc"] == 0, placement
    assert [r["device"] for r in placement["all_local_rank_0"]["reports"]] == ["cpu", "cpu"]
    offload = results["offload_collectives"]["check"]
    assert results["offload_collectives"]["rc"] == 0, offload
    first = offload["ranks"][0]
    assert offload["world"] == 2 and first["backend"] == "gloo"
    assert first["kept_devices"] == ["cpu"]
    assert first["gather_max_gap"] == 0.0  # the gathered weights are the unsharded model's, bit for bit
    assert first["grad_norm_rel_gap"] <= 1e-6 and first["step_moved"] > 0
