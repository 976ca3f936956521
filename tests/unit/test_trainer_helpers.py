"""Small driver-side helpers of hybrid/trainer.py and the device switch."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid.trainer import numeric_columns


def test_numeric_extra_info_columns_become_metrics_and_others_are_left_out():
    extra = {
        "acc": [1, 0, 1.0],
        "format_ok": np.array([True, False, True]),  # bools are flags, not quantities
        "pred": ["3", "4", "5"],
        "short": [1.0],  # not one value per row
    }
    assert numeric_columns(extra, 3) == {"acc": [1.0, 0.0, 1.0]}


def test_select_device_cpu_hides_gpus_and_rejects_unknown(monkeypatch):
    from workers import device

    monkeypatch.delenv("HYBRID_DEVICE", raising=False)
    device.select_device("cpu")
    try:
        assert device.get_device_name() == "cpu" and device.get_dist_backend() == "gloo"
        with pytest.raises(ValueError, match="trainer.device='tpu' is not one of auto, cuda, cpu"):
            device.select_device("tpu")
    finally:
        monkeypatch.delenv("HYBRID_DEVICE", raising=False)
        device.is_cuda_available.cache_clear()
