"""Splitting a rank's batch into micro-batches, and packing sequences without padding.

`MicroBatching` (workers/config/batching.py) is what a section says about one forward
pass's size (a sample count, or a token budget with `use_dynamic_bsz`); `micro_batches` / `micro_batch_indices` turn it
into index lists. Counting keeps order; `split_by_token_budget` groups samples so that each
micro-batch holds at most `max_token_len` real tokens (callers put results back by index).
Prompt groups (workers/shared_prefix.py) are the units when prompts are shared.
`pack` turns a left/right padded batch into one row of concatenated sequences whose
position ids restart at 0 — transformers then masks attention per sequence
(use_remove_padding); `pack_for_responses` packs that way or prompt-once.
"""

from __future__ import annotations

import heapq

import torch
import torch.distributed as dist

from workers.config.batching import MicroBatching
from workers.device import current_device
from workers.shared_prefix import group_token_counts, pack_shared, prompt_groups


def micro_batches(tensors, batching: MicroBatching, world_size: int) -> list[list[int]]:
    """Index lists of a rank's rows (`tensors`: input_ids, attention_mask, position_ids,
    responses), prompt groups kept whole when `batching.share_prompts`."""
    mask = tensors["attention_mask"]
    if not batching.share_prompts:
        return micro_batch_indices(mask, batching, world_size)
    response_len = tensors["responses"].shape[1]
    groups = prompt_groups(tensors["input_ids"], mask, tensors["position_ids"], response_len)
    return micro_batch_indices(mask, batching, world_size, groups, group_token_counts(mask, response_len, groups))


def micro_batch_indices(
    attention_mask: torch.Tensor,
    batching: MicroBatching,
    world_size: int,
    groups: list[list[int]] | None = None,
    group_tokens: list[int] | None = None,
) -> list[list[int]]:
    """Index lists of the rows of one rank's batch, never cutting one of `groups` unless a
    group alone exceeds the micro-batch size; every rank runs the same number of
    micro-batches when their counts can differ (FSDP2 synchronises inside each forward)."""
    if groups is None:
        groups = [[row] for row in range(attention_mask.shape[0])]
        group_tokens = attention_mask.sum(-1).tolist()
    if not batching.use_dynamic_bsz:
        micro = split_groups_by_count(groups, batching.micro_batch_size)
        if world_size == 1 or not batching.share_prompts:
            return micro
        return _same_count(micro, _max_over_ranks(len(micro)))
    bins = split_by_token_budget(group_tokens, batching.max_token_len)
    if world_size > 1:
        count = _max_over_ranks(len(bins))
        bins = split_by_token_budget(group_tokens, batching.max_token_len, same_count_as=count)
    micro = [sorted(row for g in b for row in groups[g]) for b in bins]
    return _same_count(micro, count) if world_size > 1 else micro


def _max_over_ranks(value: int) -> int:
    count = torch.tensor([value], device=current_device())
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def _same_count(micro: list[list[int]], count: int) -> list[list[int]]:
    """Halve the largest micro-batches until there are `count` (another rank needs that many)."""
    micro = list(micro)
    while len(micro) < count:
        largest = max(range(len(micro)), key=lambda i: len(micro[i]))
        rows = micro[largest]
        if len(rows) < 2:
            raise ValueError(
                f"this rank has {sum(map(len, micro))} rows, fewer than the {count} micro-batches another rank runs"
            )
        micro[largest : largest + 1] = [rows[: len(rows) // 2], rows[len(rows) // 2 :]]
    return micro


def split_groups_by_count(groups: list[list[int]], micro_batch_size: int) -> list[list[int]]:
    """Whole groups, in order, up to `micro_batch_size` rows per micro-batch; a group larger
    than that is cut into pieces of that size (each still shares its prompt)."""
    pieces = [g[i : i + micro_batch_size] for g in groups for i in range(0, len(g), micro_batch_size)]
    micro: list[list[int]] = []
    for piece in pieces:
        if micro and len(micro[-1]) + len(piece) <= micro_batch_size:
            micro[-1] = micro[-1] + piece
        else:
            micro.append(list(piece))
    return micro


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
        overfull = any(sum(seq_lens[i] for i in m) > max_token_len and len(m) > 1 for m in members)
        if not overfull or num_bins == len(seq_lens):
            return [sorted(m) for m in members if m]
        num_bins += 1


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor):
    """Concatenate the real tokens of every row into one row.

    Returns packed (1, T) input ids and position ids, `packed_at` (B * L,): the packed
    position of each real token of the (B, L) layout, -1 at padding (so per-token results
    can be gathered back), and the sequence boundaries as transformers' varlen keyword
    arguments (`cu_seq_lens_q/k`, `max_length_q/k`), which the model passes on to its
    attention function (workers/packed_attention.py, or flash-attention's varlen kernel).
    """
    keep = attention_mask.reshape(-1).bool()
    flat_index = torch.nonzero(keep, as_tuple=False).squeeze(-1)
    packed_ids = input_ids.reshape(-1)[flat_index].unsqueeze(0)
    packed_pos = position_ids.reshape(-1)[flat_index].unsqueeze(0)
    packed_at = torch.full((keep.numel(),), -1, dtype=torch.long, device=input_ids.device)
    packed_at[flat_index] = torch.arange(flat_index.numel(), device=input_ids.device)
    row_lens = attention_mask.sum(dim=-1, dtype=torch.int32)
    cu_seq_lens = torch.nn.functional.pad(row_lens.cumsum(0, dtype=torch.int32), (1, 0))
    max_len = int(row_lens.max())
    varlen = {
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": max_len,
        "max_length_k": max_len,
    }
    return packed_ids, packed_pos, packed_at, varlen


def pack_for_responses(micro: dict, share_prompts: bool):
    """Pack a micro-batch (prompt-once with `share_prompts`) for results at its responses.

    Returns the packed ids and positions, the model's extra keyword arguments, and
    `source` (B, R): the packed position whose output predicts each response token (-1
    where there is none), the positions `logits_to_keep` and value heads read.
    """
    input_ids, attention_mask, position_ids = micro["input_ids"], micro["attention_mask"], micro["position_ids"]
    batch, seq_len = input_ids.shape
    response_len = micro["responses"].shape[1]
    if share_prompts:
        packed_ids, packed_pos, packed_at, kwargs = pack_shared(input_ids, attention_mask, position_ids, response_len)
    else:
        packed_ids, packed_pos, packed_at, kwargs = pack(input_ids, attention_mask, position_ids)
    rows = torch.arange(batch, device=input_ids.device).unsqueeze(1) * seq_len
    cols = torch.arange(seq_len - response_len - 1, seq_len - 1, device=input_ids.device).unsqueeze(0)
    return packed_ids, packed_pos, kwargs, packed_at[rows + cols]


def response_inputs(micro: dict, packed: bool, share_prompts: bool):
    """The model's inputs for a micro-batch, the positions whose outputs predict response
    tokens (`logits_to_keep`), and which (row, response column) has one: None for the
    padded layout, whose outputs come back (B, R + 1); packed rows give the valid ones."""
    if not (packed or share_prompts):
        inputs = {k: micro[k] for k in ("input_ids", "attention_mask", "position_ids")}
        return inputs, micro["responses"].shape[1] + 1, None
    packed_ids, packed_pos, kwargs, source = pack_for_responses(micro, share_prompts)
    valid = source >= 0
    return {"input_ids": packed_ids, "position_ids": packed_pos, **kwargs}, source[valid], valid


def to_rows(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(N,) values at the valid (row, response column) places of a zero (B, R) tensor."""
    rows = torch.zeros(valid.shape, dtype=torch.float32, device=values.device)
    rows[valid] = values
    return rows
