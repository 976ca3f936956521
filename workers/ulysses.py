"""Ulysses sequence parallelism: the ranks of a group split every packed row's tokens.

`ulysses_sequence_parallel_size` = sp consecutive ranks form a group (data-parallel ranks
= world / sp). The group works on the union of its members' rows (`gather_group_rows`;
each member returns only its own rows' results, `own_rows`), and every forward pass
splits the packed row into sp equal slices of tokens (`SequenceSplit`). Outside attention
every operation is per token, so each rank runs the layers on its slice only; around
attention an all-to-all trades the slice of all heads for the whole row of some heads
(`heads_for_whole_row`), the packed attention runs on the whole row (every sequence and
prompt-once layout as without SP), and a second all-to-all trades back. Query heads are
split as evenly as possible (9 heads on 2 ranks: 5 and 4); key/value heads go with their
query heads when they split evenly, and are repeated to one per query head otherwise.

Results come back per kept position (the positions predicting response tokens) through a
differentiable all-reduce: every rank of the group then holds the whole micro-batch's
log-probs or values and computes the same loss. The all-reduce's backward sums the sp
identical gradients, which is what FSDP's average over sp times more ranks than there are
data-parallel ones needs; the loss weights count each row once per group member for the
same reason (workers/optimizer_step.py sums counts over all ranks), so the update equals
the data-parallel one exactly. Written for NCCL; runs with gloo on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from protocol.data_proto import DataProto
from workers.device import current_device


class _AllReduceSum(torch.autograd.Function):
    """all_reduce (sum) with its gradient: every rank's output is the sum, so each input's
    gradient is the sum of the outputs' gradients (torch.distributed.nn's, which is deprecated)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        out = tensor.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _AllToAllSingle(torch.autograd.Function):
    """all_to_all_single with its gradient: the same exchange with the split sizes swapped."""

    @staticmethod
    def forward(ctx, flat: torch.Tensor, output_split_sizes, input_split_sizes, group) -> torch.Tensor:
        ctx.sizes, ctx.group = (output_split_sizes, input_split_sizes), group
        out = flat.new_empty(sum(output_split_sizes))
        dist.all_to_all_single(out, flat.contiguous(), output_split_sizes, input_split_sizes, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        output_split_sizes, input_split_sizes = ctx.sizes
        grad_in = grad.new_empty(sum(input_split_sizes))
        dist.all_to_all_single(grad_in, grad.contiguous(), input_split_sizes, output_split_sizes, group=ctx.group)
        return grad_in, None, None, None


def differentiable_all_reduce(tensor: torch.Tensor, group) -> torch.Tensor:
    return _AllReduceSum.apply(tensor, group)


def differentiable_all_to_all(flat: torch.Tensor, output_split_sizes, input_split_sizes, group) -> torch.Tensor:
    return _AllToAllSingle.apply(flat, list(output_split_sizes), list(input_split_sizes), group)


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's sequence-parallel group: `size` consecutive ranks, this one `rank` in it."""

    group: object
    size: int
    rank: int


def sequence_parallel_group(size: int, key: str) -> SequenceParallel | None:
    """Build every group (each rank must create every group, in the same order) and return
    this rank's; None for size 1. `key` names the setting in messages."""
    if size == 1:
        return None
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ValueError(f"{key}={size} does not divide the world size {world}")
    mine = None
    for start in range(0, world, size):
        group = dist.new_group(list(range(start, start + size)))
        if start <= rank < start + size:
            mine = SequenceParallel(group, size, rank - start)
    return mine


def check_heads(hf_config, size: int, key: str) -> None:
    """Every rank of a group needs at least one attention head."""
    heads = getattr(hf_config, "num_attention_heads", None)
    if heads is None:
        raise ValueError(
            f"{key}={size}: the model's config has no num_attention_heads; Ulysses splits attention by heads"
        )
    if heads < size:
        raise ValueError(f"{key}={size} is more than the model's {heads} attention heads; use at most {heads}")


def data_parallel_size(world_size: int, sp: SequenceParallel | None) -> int:
    return world_size // (sp.size if sp else 1)


def check_data_parallel_size(configured: int, world_size: int, sp: SequenceParallel | None, section: str) -> None:
    """The config's mini-batches per rank were derived for `configured` data-parallel groups
    (trainer.nnodes x trainer.n_gpus_per_node / ulysses size); a worker group of another size
    would split each optimizer step wrongly, so it stops here."""
    actual = data_parallel_size(world_size, sp)
    if configured != actual:
        raise ValueError(
            f"{section}: the config was built for {configured} data-parallel group(s), but this worker group has "
            f"{world_size} rank(s) = {actual} group(s); build the config with trainer.nnodes x "
            f"trainer.n_gpus_per_node equal to the number of ranks"
        )


# ---------------------------------------------------------------- rows of the group


def gather_group_rows(data: DataProto, sp: SequenceParallel | None) -> DataProto:
    """The rows of every member of the group, in rank order (the same on each member)."""
    if sp is None:
        return data
    tensors = {}
    for key, value in data.batch.items():
        local = value.to(current_device()).contiguous()
        parts = [torch.empty_like(local) for _ in range(sp.size)]
        dist.all_gather(parts, local, group=sp.group)
        tensors[key] = torch.cat(parts).to(value.device)
    non_tensors = {}
    for key, value in data.non_tensor_batch.items():
        parts = [None] * sp.size
        dist.all_gather_object(parts, value, group=sp.group)
        non_tensors[key] = np.concatenate(parts)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=dict(data.meta_info))


def own_rows(values: torch.Tensor, sp: SequenceParallel | None) -> torch.Tensor:
    """This member's rows of a result computed for the whole group's rows."""
    if sp is None:
        return values
    rows = values.shape[0] // sp.size
    return values[sp.rank * rows : (sp.rank + 1) * rows]


# ---------------------------------------------------------------- one forward pass


class SequenceSplit:
    """One packed forward pass cut for this rank: `inputs` (this rank's slice of the packed
    row, padded at the end to a multiple of sp, with the attention's `ulysses` argument),
    `keep` (this rank's kept positions, local), `local(x)` (this rank's part of a vector
    over all kept positions), `gather(x)` (the inverse, for the whole group, differentiable).
    Without SP every part is the identity."""

    def __init__(self, inputs: dict, keep: torch.Tensor, sp: SequenceParallel | None):
        self.sp = sp
        if sp is None:
            self.inputs, self.keep, self.mine = inputs, keep, None
            return
        total = inputs["input_ids"].shape[1]
        local_len = -(-total // sp.size)
        start = sp.rank * local_len
        pad = local_len * sp.size - total
        sliced = {
            name: F.pad(inputs[name], (0, pad))[:, start : start + local_len] for name in ("input_ids", "position_ids")
        }
        self.inputs = {**inputs, **sliced, "ulysses": UlyssesAttention(sp, total, local_len)}
        self.mine = (keep >= start) & (keep < start + local_len)
        self.mine_index = self.mine.nonzero().squeeze(-1)  # log-probs and entropy both gather through it
        self.keep = keep[self.mine] - start

    def local(self, values: torch.Tensor) -> torch.Tensor:
        return values if self.sp is None else values[self.mine]

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        if self.sp is None:
            return values
        whole = values.new_zeros((self.mine.numel(), *values.shape[1:]))
        whole = whole.index_put((self.mine_index,), values)
        return differentiable_all_reduce(whole, group=self.sp.group)


def _split_sizes(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


@dataclass(frozen=True)
class UlyssesAttention:
    """What the attention function needs to run on the whole row (workers/packed_attention.py)."""

    sp: SequenceParallel
    total_len: int  # real tokens of the packed row (the slices add padding at the end)
    local_len: int

    def heads_for_whole_row(self, query, key, value):
        """(1, H, local, D) query, (1, H_kv, local, D) key/value -> this rank's heads over
        the whole row, the padding cut: (1, h, T, D) and (1, h_kv, T, D)."""
        heads, kv_heads, size = query.shape[1], key.shape[1], self.sp.size
        if kv_heads % size or heads % size:
            # Uneven or too few key/value heads: one per query head, split like the queries.
            repeat = heads // kv_heads
            key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
            kv_heads = heads
        q = self._to_heads(query, _split_sizes(heads, size))
        k = self._to_heads(key, _split_sizes(kv_heads, size))
        v = self._to_heads(value, _split_sizes(kv_heads, size))
        return q[:, :, : self.total_len], k[:, :, : self.total_len], v[:, :, : self.total_len]

    def _to_heads(self, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        size, dim, local = self.sp.size, x.shape[-1], self.local_len
        mine = sizes[self.sp.rank]
        flat = x[0].contiguous().reshape(-1)  # heads-major: rank j's heads are one block
        out = differentiable_all_to_all(
            flat,
            output_split_sizes=[mine * local * dim] * size,
            input_split_sizes=[h * local * dim for h in sizes],
            group=self.sp.group,
        )
        return out.reshape(size, mine, local, dim).transpose(0, 1).reshape(1, mine, size * local, dim)

    def row_slice_for_all_heads(self, output: torch.Tensor, heads: int) -> torch.Tensor:
        """(1, T, h, D) attention output of this rank's heads -> (1, local, H, D) of its slice."""
        size, local = self.sp.size, self.local_len
        mine, dim = output.shape[2], output.shape[3]
        padded = F.pad(output, (0, 0, 0, 0, 0, local * size - self.total_len))
        flat = padded[0].contiguous().reshape(-1)  # token-major: rank j's slice is one block
        sizes = _split_sizes(heads, size)
        out = differentiable_all_to_all(
            flat,
            output_split_sizes=[local * h * dim for h in sizes],
            input_split_sizes=[local * mine * dim] * size,
            group=self.sp.group,
        )
        pieces = [p.reshape(local, h, dim) for p, h in zip(out.split([local * h * dim for h in sizes]), sizes)]
        return torch.cat(pieces, dim=1).unsqueeze(0)
