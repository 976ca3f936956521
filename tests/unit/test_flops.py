"""verl's FLOPs count and the device peak table behind perf/mfu/*, against hand-computed numbers."""

from types import SimpleNamespace

import pytest

from workers.flops import mfu, peak_flops, training_flops


def dense_config(**overrides):
    values = dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=2,
        intermediate_size=128,
        vocab_size=100,
    )
    return SimpleNamespace(**{**values, **overrides})


def test_training_flops_matches_hand_count():
    # mlp 3*64*128 = 24576; q,k,v,o 64*(64+32+32+64) = 12288; embedding + head 2*100*64 = 12800
    # dense weights (24576+12288)*2 + 12800 = 86528, x 6 x 8 tokens = 4153344
    # attention 6 x (3^2 + 5^2) x 16 x 4 x 2 = 26112
    assert training_flops(dense_config(), [3, 5]) == 4153344 + 26112


def test_head_dim_defaults_to_hidden_over_heads_and_kv_heads_to_heads():
    config = dense_config(head_dim=None, num_key_value_heads=None)
    # head_dim 16, 4 kv heads: q,k,v,o 64*256 = 16384; dense (24576+16384)*2 + 12800 = 94720
    assert training_flops(config, [4]) == 6 * 94720 * 4 + 6 * 16 * 16 * 4 * 2


def test_mixture_of_experts_has_no_dense_count():
    assert training_flops(dense_config(num_experts=8), [4]) is None
    assert training_flops(dense_config(num_local_experts=8), [4]) is None


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H200", 989e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H20", 148e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA L40S", 362.05e12),
        ("NVIDIA GeForce RTX 4090", None),
        (None, None),
    ],
)
def test_peak_flops_by_device_name(name, peak):
    assert peak_flops(name) == peak


def test_mfu_is_achieved_over_peak_times_epochs():
    flops = 4153344 + 26112
    assert mfu(dense_config(), [3, 5], seconds=2.0, epochs=3, device_name="NVIDIA H200") == pytest.approx(
        flops * 3 / 2.0 / 989e12, rel=1e-12
    )
    assert mfu(dense_config(), [3, 5], seconds=2.0, epochs=1, device_name=None) is None
