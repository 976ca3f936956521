"""Ulysses attention on gloo ranks, without a model: the packed attention of a row split
across sp ranks (all-to-all to heads, attention over the whole row, all-to-all back)
gives each rank its slice of the unsplit output, and the gradients of its slices of query,
key and value, within 1e-6 in fp64. Head layouts: key/value heads that split evenly
(4 / 2), query heads that do not (3 / 1, 9 / 3 on 2 ranks: SmolLM2's), and a row whose
length is not a multiple of sp (padding), holding four packed sequences. The whole model
with SP (prompt-once, padded, packed, token budgets) is in test_worker_groups.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.integration

TOL = 1e-6
LAYOUTS = [(4, 2), (3, 1), (9, 3), (2, 1)]  # (query heads, key/value heads)
SEQUENCES = [7, 1, 12, 5]  # lengths packed into one row of 25 tokens


def _inputs(heads: int, kv_heads: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    total, dim = sum(SEQUENCES), 8
    q = torch.randn(1, heads, total, dim, generator=gen, dtype=torch.float64)
    k = torch.randn(1, kv_heads, total, dim, generator=gen, dtype=torch.float64)
    v = torch.randn(1, kv_heads, total, dim, generator=gen, dtype=torch.float64)
    w = torch.randn(1, total, heads, dim, generator=gen, dtype=torch.float64)  # a loss: sum(out * w)
    return q, k, v, w


def _attend(q, k, v, extra: dict):
    from workers.packed_attention import packed_sdpa_attention_forward

    cu = torch.tensor([0, *torch.tensor(SEQUENCES).cumsum(0).tolist()], dtype=torch.int32)
    module = torch.nn.Module()
    module.is_causal = True
    out, _ = packed_sdpa_attention_forward(module, q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu, **extra)
    return out


def _rank_main(rank: int, world: int, port: int, out_dir: str):
    from workers.ulysses import SequenceParallel, UlyssesAttention

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    sp = SequenceParallel(dist.new_group(list(range(world))), world, rank)
    total = sum(SEQUENCES)
    local = -(-total // world)
    start = rank * local
    errors = {}
    for heads, kv_heads in LAYOUTS:
        q, k, v, w = _inputs(heads, kv_heads, seed=heads * 10 + kv_heads)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        reference = _attend(*leaves, {})
        (reference * w).sum().backward()
        sliced = [x[:, :, start : start + local].clone().requires_grad_() for x in (q, k, v)]
        pad = local - sliced[0].shape[2]
        padded = [torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in sliced]  # the last rank's padding
        out = _attend(*padded, {"ulysses": UlyssesAttention(sp, total, local)})
        real = min(local, total - start)
        (out[:, :real] * w[:, start : start + real]).sum().backward()
        errors[(heads, kv_heads)] = max(
            float((out[:, :real] - reference[:, start : start + real]).abs().max()),
            *(float((s.grad - full.grad[:, :, start : start + local]).abs().max()) for s, full in zip(sliced, leaves)),
        )
    # One file per rank (no multiprocessing Manager: a server process the ranks must reach).
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({f"{h}/{kv}": e for (h, kv), e in errors.items()}))
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_ulysses_attention_matches_the_whole_row(world, tmp_path):
    from workers.base import find_free_port

    mp.spawn(_rank_main, args=(world, find_free_port(), str(tmp_path)), nprocs=world, join=True)
    errors = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(world)}
    assert sorted(errors) == list(range(world)) and all(len(e) == len(LAYOUTS) for e in errors.values())
    for rank, per_layout in errors.items():
        for layout, error in per_layout.items():
            assert error <= TOL, f"rank {rank}, heads {layout}: {error}"
