"""Buckets of weights for an engine whose shards are other processes (workers/weight_sync.layer_buckets):
every weight once, in order, about the budget each, and never a layer split over two buckets (vLLM
processes a layer when all of its weights arrived in one reload)."""

from __future__ import annotations

import torch

from workers.weight_sync import layer_buckets, layer_of

LAYER = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj")


def llama_pairs(layers: int) -> list[tuple[str, torch.Tensor]]:
    pairs = [("model.embed_tokens.weight", torch.zeros(64, 16))]
    for i in range(layers):
        pairs += [(f"model.layers.{i}.{part}.weight", torch.zeros(16, 16)) for part in LAYER]
    return pairs + [("model.norm.weight", torch.zeros(16)), ("lm_head.weight", torch.zeros(64, 16))]


def test_layer_of_names_the_module_a_weight_is_loaded_with():
    assert layer_of("model.layers.12.self_attn.q_proj.weight") == "model.layers.12"
    assert layer_of("visual.blocks.0.attn.qkv.bias") == "visual.blocks.0"
    assert layer_of("model.embed_tokens.weight") == "model.embed_tokens"
    assert layer_of("lm_head.weight") == "lm_head"


def test_buckets_hold_every_weight_once_and_close_only_between_layers():
    pairs = llama_pairs(layers=5)
    one_weight = 16 * 16 * 4
    buckets = list(layer_buckets(iter(pairs), bucket_bytes=2 * one_weight))  # smaller than one layer
    assert [name for bucket in buckets for name, _ in bucket] == [name for name, _ in pairs]
    homes = {}
    for index, bucket in enumerate(buckets):
        for name, _ in bucket:
            homes.setdefault(layer_of(name), set()).add(index)
    assert all(len(where) == 1 for where in homes.values()), homes
    # A budget below one layer: each decoder layer is a bucket of its own (six weights).
    layer_buckets_only = [b for b in buckets if layer_of(b[0][0]).startswith("model.layers.")]
    assert [len(b) for b in layer_buckets_only] == [len(LAYER)] * 5


def test_a_large_budget_packs_several_layers_per_bucket():
    pairs = llama_pairs(layers=6)
    layer_bytes = len(LAYER) * 16 * 16 * 4
    buckets = list(layer_buckets(iter(pairs), bucket_bytes=2 * layer_bytes))
    sizes = [sum(t.numel() * t.element_size() for _, t in b) for b in buckets]
    # Each bucket but the last reached the budget, and ended at a layer's end.
    assert all(size >= 2 * layer_bytes for size in sizes[:-1]), sizes
    assert len(buckets) < len(pairs) and sum(len(b) for b in buckets) == len(pairs)
