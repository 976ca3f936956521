"""Model FLOPs utilisation of an update: verl's `perf/mfu/actor` and `perf/mfu/critic`.

The count is verl's (verl/utils/flops_counter.py, dense decoder models): forward + backward
take 6 FLOPs per weight of the linear layers (attention projections, gated MLP, embedding and
output layer) per token, plus 6 x seqlen^2 x head_dim x heads per layer and sequence for the
attention products, over every token of every sample (prompt and response, as verl's
`global_token_num`), times ppo_epochs. The utilisation is that over the update's seconds and
the device's dense bf16 peak from its datasheet (verl's table). A CPU has no datasheet figure
and a mixture-of-experts model no dense count: there the metric is left out, not invented.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.device import accelerator_name

# Dense bf16 peak FLOP/s by device name, verl's figures; the longest matching name wins
# ("H100" must not match an "H20" entry first).
DEVICE_PEAK_FLOPS = {
    "GB200": 2.5e15,
    "B200": 2.25e15,
    "MI300X": 1336e12,
    "H100": 989e12,
    "H800": 989e12,
    "H200": 989e12,
    "H20": 148e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362.05e12,
    "L40": 181.05e12,
    "A40": 149.7e12,
    "L20": 119.5e12,
}

_MOE_ATTRIBUTES = ("num_experts", "num_local_experts", "n_routed_experts")


def peak_flops(device_name: str | None) -> float | None:
    """The datasheet peak for a GPU name such as 'NVIDIA H200', or None when unknown."""
    if not device_name:
        return None
    matches = [name for name in DEVICE_PEAK_FLOPS if name in device_name]
    return DEVICE_PEAK_FLOPS[max(matches, key=len)] if matches else None


def training_flops(config, seqlens: Sequence[int]) -> float | None:
    """Forward + backward FLOPs of a dense decoder over sequences of these lengths (verl's
    count), or None for a mixture-of-experts config, whose active weights verl counts per model."""
    config = getattr(config, "text_config", None) or config
    if any(getattr(config, name, None) for name in _MOE_ATTRIBUTES):
        return None
    hidden = config.hidden_size
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    layers = config.num_hidden_layers
    mlp = 3 * hidden * config.intermediate_size
    attention_linear = hidden * (2 * heads * head_dim + 2 * kv_heads * head_dim)
    embedding_and_head = 2 * config.vocab_size * hidden
    dense = (mlp + attention_linear) * layers + embedding_and_head
    attention = 6 * sum(n * n for n in seqlens) * head_dim * heads * layers
    return 6 * dense * sum(seqlens) + attention


def mfu(config, seqlens: Sequence[int], seconds: float, epochs: int, device_name: str | None) -> float | None:
    """Achieved over peak FLOP/s of one rank's update, or None where either is unknown."""
    peak = peak_flops(device_name)
    flops = training_flops(config, seqlens)
    if peak is None or flops is None or seconds <= 0:
        return None
    return flops * epochs / seconds / peak


def update_mfu(role: str, config, data, seconds: float, epochs: int) -> dict[str, float]:
    """`perf/mfu/<role>` for one rank's update of the rows it was dispatched (a DataProto with
    an attention_mask), or nothing where the utilisation is unknown (see the module doc)."""
    seqlens = data.batch["attention_mask"].sum(-1).tolist()
    value = mfu(config, seqlens, seconds, epochs, accelerator_name())
    return {} if value is None else {f"perf/mfu/{role}": value}
