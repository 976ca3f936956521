"""Attention for packed rows (use_remove_padding) without a dense block-diagonal mask.

transformers' `sdpa` turns a packed row (several sequences concatenated, position ids
restarting at 0) into a (T, T) block-diagonal causal mask, so attention costs T^2 although
only the sum of each sequence's L^2 is needed: with 8 sequences packed, seven eighths of
the attention work is thrown away (measured: 15% of an actor update of the 135M model on
CPU). This attention runs causal SDPA on each sequence of the row instead, taking the
boundaries `pack` already knows, and is plain `sdpa` (same mask, same kernel) for
everything else: padded batches, generation with a cache, rows packed by someone else.
A row packed prompt-once (workers/shared_prefix.py) arrives with `shared_prefix`, its
layout: each prompt attends causally to itself, each response to its prompt and causally
to itself, in two SDPA calls over padded batches (no (T, T) mask), so the work is what
the unshared rows would cost minus the repeated prompts. A row split for sequence
parallelism arrives with `ulysses` (workers/ulysses.py) and is attended whole, for some
heads, between two all-to-alls. The same calls run on CUDA, where
SDPA picks its fused kernels. Registered with transformers under ATTN_IMPLEMENTATION.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from workers.device import is_cuda_available

ATTN_IMPLEMENTATION = "hybrid_packed_sdpa"
# On the host, SDPA's math kernel (batched matrix products) beats its flash kernel on
# short sequences, forward and backward (measured on the 135M model's update in bf16: 8%
# of the step); above this many attention scores per call flash's O(L) memory wins.
_HOST_MATH_MAX_SCORES = 1 << 24


def _sdpa(q, k, v, **kwargs):
    """F.scaled_dot_product_attention with the kernel choice above."""
    scores = q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2]
    if is_cuda_available() or scores > _HOST_MATH_MAX_SCORES:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def packed_sdpa_attention_forward(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """query (1, H, T, D), key/value (1, H_kv, T, D) -> (1, T, H, D), as transformers' sdpa.

    A packed row arrives with `cu_seq_lens_q` (the sequence boundaries that
    workers/micro_batch.pack passes through the model's keyword arguments).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    ulysses = kwargs.pop("ulysses", None)
    if ulysses is not None:
        # Sequence parallel (workers/ulysses.py): this rank's heads over the whole row.
        heads = query.shape[1]
        query, key, value = ulysses.heads_for_whole_row(query, key, value)
        output, _ = packed_sdpa_attention_forward(
            module, query, key, value, None, dropout, scaling, is_causal, **kwargs
        )
        return ulysses.row_slice_for_all_heads(output, heads), None
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    layout = kwargs.get("shared_prefix")
    if layout is not None:
        if not causal or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
            raise ValueError("a prompt-once packed row needs causal self-attention over one packed row without a cache")
        return shared_prefix_attention(query, key, value, layout, dropout, scaling), None
    if cu_seq_lens is None or not causal or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    lengths = [n for n in cu_seq_lens.diff().tolist() if n]  # rows without tokens pack to nothing
    gqa = query.shape[1] != key.shape[1]
    outputs = [
        _sdpa(q, k, v, dropout_p=dropout, scale=scaling, is_causal=True, enable_gqa=gqa).transpose(1, 2)
        for q, k, v in zip(query.split(lengths, dim=2), key.split(lengths, dim=2), value.split(lengths, dim=2))
    ]
    return torch.cat(outputs, dim=1), None  # one copy, already (1, T, H, D) and contiguous


def shared_prefix_attention(query, key, value, layout, dropout: float, scaling) -> torch.Tensor:
    """(1, H, T, D) query, (1, H_kv, T, D) key/value of a prompt-once row -> (1, T, H, D).

    Two SDPA calls over padded batches (the layout's gathers): SDPA's cost on small
    sequences is mostly per call, so one call per prompt and per response would cost more
    than the padding does.
    """
    gqa = query.shape[1] != key.shape[1]
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (T, heads, D) views

    def gather(x, index):  # (B, L) packed positions -> (B, heads, L, D)
        return _gather_rows(x, index).transpose(1, 2)

    pieces = []
    if layout.prompt_index.numel():
        index = layout.prompt_index
        # Prompts are padded at the end: the causal mask alone keeps real rows off the padding.
        out = _sdpa(
            gather(q, index),
            gather(k, index),
            gather(v, index),
            dropout_p=dropout,
            scale=scaling,
            is_causal=True,
            enable_gqa=gqa,
        )
        pieces.append(out.transpose(1, 2).reshape(-1, *out.shape[1:2], out.shape[-1]))
    if layout.response_query_index.numel():
        keys = layout.response_key_index
        out = _sdpa(
            gather(q, layout.response_query_index),
            gather(k, keys),
            gather(v, keys),
            attn_mask=layout.response_mask,
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=gqa,
        )
        pieces.append(out.transpose(1, 2).reshape(-1, *out.shape[1:2], out.shape[-1]))
    return _gather_rows(torch.cat(pieces), layout.output_index).unsqueeze(0)


def _gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[index] along the first dimension. In half precision through index_select, whose
    backward (index_add) took a fifth of the time of indexing's (index_put with
    accumulate) on the host for bf16 attention inputs; in fp32 indexing was the faster."""
    if x.dtype in (torch.bfloat16, torch.float16):
        return x.index_select(0, index.reshape(-1)).view(*index.shape, *x.shape[1:])
    return x[index]


def register_packed_attention() -> str:
    """Make ATTN_IMPLEMENTATION known to transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if ATTN_IMPLEMENTATION not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionInterface.register(ATTN_IMPLEMENTATION, packed_sdpa_attention_forward)
        # The padded and cached paths need sdpa's masks; a name without a mask function gets none.
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION
