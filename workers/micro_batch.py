"""Splitting a rank's batch into micro-batches, and packing sequences without padding.

`MicroBatching` is what a section says about one forward pass's size (a sample count, or
a token budget with `use_dynamic_bsz`); `micro_batch_indices` turns it into index lists.
`split_by_count` keeps order; `split_by_token_budget` groups samples so that each
micro-batch holds at most `max_token_len` real tokens (callers put results back by index).
`pack` turns a left/right padded batch into one row of concatenated sequences whose
position ids restart at 0 — transformers then masks attention per sequence
(use_remove_padding).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch
import torch.distributed as dist

from workers.device import current_device


@dataclass(frozen=True)
class MicroBatching:
    """One forward pass's share of a rank's batch, read from a config section.

    `micro_batch_size` (samples) applies unless `use_dynamic_bsz`; then micro-batches are
    packed up to `max_token_len` real tokens instead.
    """

    micro_batch_size: int | None
    use_dynamic_bsz: bool
    max_token_len: int


def micro_batch_indices(attention_mask: torch.Tensor, batching: MicroBatching, world_size: int) -> list[list[int]]:
    """Index lists of the rows of one rank's batch; with a token budget every rank runs the
    same number of micro-batches (FSDP2 synchronises inside each forward)."""
    if not batching.use_dynamic_bsz:
        return split_by_count(attention_mask.shape[0], batching.micro_batch_size)
    seq_lens = attention_mask.sum(-1).tolist()
    groups = split_by_token_budget(seq_lens, batching.max_token_len)
    if world_size > 1:
        count = torch.tensor([len(groups)], device=current_device())
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        groups = split_by_token_budget(seq_lens, batching.max_token_len, same_count_as=int(count.item()))
    return groups


def split_by_count(batch_size: int, micro_batch_size: int) -> list[list[int]]:
    return [list(range(i, min(i + micro_batch_size, batch_size))) for i in range(0, batch_size, micro_batch_size)]


def split_by_token_budget(seq_lens: list[int], max_token_len: int, same_count_as: int | None = None) -> list[list[int]]:
    """Balanced partition of samples into the fewest micro-batches under a token budget.

    Longest-first onto the currently lightest bin (a greedy Karmarkar-Karp-like rule);
    a single sample longer than the budget gets a micro-batch of its own. With
    `same_count_as`, at least that many bins are used (ranks must run the same number of
    forward passes only when they synchronise inside the model, which FSDP2 does).
    """
    if not seq_lens:
        return []
    total = sum(seq_lens)
    num_bins = max(-(-total // max_token_len), 1)
    if same_count_as is not None:
        num_bins = max(num_bins, same_count_as)
    num_bins = min(num_bins, len(seq_lens))
    while True:
        bins: list[tuple[int, int]] = [(0, b) for b in range(num_bins)]
        members: list[list[int]] = [[] for _ in range(num_bins)]
        order = sorted(range(len(seq_lens)), key=lambda i: -seq_lens[i])
        for idx in order:
            load, b = heapq.heappop(bins)
            members[b].append(idx)
            heapq.heappush(bins, (load + seq_lens[idx], b))
        overfull = any(
            sum(seq_lens[i] for i in m) > max_token_len and len(m) > 1 for m in members
        )
        if not overfull or num_bins == len(seq_lens):
            return [sorted(m) for m in members if m]
        num_bins += 1


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor):
    """Concatenate the real tokens of every row into one row.

    Returns packed (1, T) input ids and position ids, the flat index of each kept token in
    the (B, L) layout (so per-token results can be scattered back), and the sequence
    boundaries as transformers' varlen keyword arguments (`cu_seq_lens_q/k`,
    `max_length_q/k`), which the model passes on to its attention function
    (workers/packed_attention.py, or flash-attention's varlen kernel).
    """
    keep = attention_mask.reshape(-1).bool()
    flat_index = torch.nonzero(keep, as_tuple=False).squeeze(-1)
    packed_ids = input_ids.reshape(-1)[flat_index].unsqueeze(0)
    packed_pos = position_ids.reshape(-1)[flat_index].unsqueeze(0)
    row_lens = attention_mask.sum(dim=-1, dtype=torch.int32)
    cu_seq_lens = torch.nn.functional.pad(row_lens.cumsum(0, dtype=torch.int32), (1, 0))
    max_len = int(row_lens.max())
    varlen = {"cu_seq_lens_q": cu_seq_lens, "cu_seq_lens_k": cu_seq_lens, "max_length_q": max_len, "max_length_k": max_len}
    return packed_ids, packed_pos, flat_index, varlen
