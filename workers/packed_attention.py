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
to itself, one SDPA call per prompt and per response (no (T, T) mask), so the work is what
the unshared rows would cost minus the repeated prompts. The same calls run on CUDA, where
SDPA picks its fused kernels. Registered with transformers under ATTN_IMPLEMENTATION.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ATTN_IMPLEMENTATION = "hybrid_packed_sdpa"


def packed_sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """query (1, H, T, D), key/value (1, H_kv, T, D) -> (1, T, H, D), as transformers' sdpa.

    A packed row arrives with `cu_seq_lens_q` (the sequence boundaries that
    workers/micro_batch.pack passes through the model's keyword arguments).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    layout = kwargs.get("shared_prefix")
    if layout is not None:
        if not causal or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
            raise ValueError("a prompt-once packed row needs causal self-attention over one packed row without a cache")
        return shared_prefix_attention(query, key, value, layout, dropout, scaling), None
    if cu_seq_lens is None or not causal or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)
    lengths = [n for n in cu_seq_lens.diff().tolist() if n]  # rows without tokens pack to nothing
    gqa = query.shape[1] != key.shape[1]
    outputs = [
        F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling, is_causal=True, enable_gqa=gqa).transpose(1, 2)
        for q, k, v in zip(query.split(lengths, dim=2), key.split(lengths, dim=2), value.split(lengths, dim=2))
    ]
    return torch.cat(outputs, dim=1), None  # one copy, already (1, T, H, D) and contiguous


def shared_prefix_attention(query, key, value, layout, dropout: float, scaling) -> torch.Tensor:
    """(1, H, T, D) query, (1, H_kv, T, D) key/value of a prompt-once row -> (1, T, H, D)."""
    gqa = query.shape[1] != key.shape[1]
    pieces = []
    for (p0, p_len), spans in zip(layout.prompts, layout.responses):
        prompt_k, prompt_v = key[:, :, p0 : p0 + p_len], value[:, :, p0 : p0 + p_len]
        if p_len:
            pieces.append(F.scaled_dot_product_attention(
                query[:, :, p0 : p0 + p_len], prompt_k, prompt_v, dropout_p=dropout, scale=scaling, is_causal=True, enable_gqa=gqa,
            ).transpose(1, 2))
        for r0, r_len in spans:
            if not r_len:
                continue
            # The response's row of the causal mask, right-aligned: all of the prompt, then its own past.
            allowed = torch.ones(r_len, p_len + r_len, dtype=torch.bool, device=query.device).tril(diagonal=p_len)
            pieces.append(F.scaled_dot_product_attention(
                query[:, :, r0 : r0 + r_len],
                torch.cat([prompt_k, key[:, :, r0 : r0 + r_len]], dim=2),
                torch.cat([prompt_v, value[:, :, r0 : r0 + r_len]], dim=2),
                attn_mask=allowed, dropout_p=dropout, scale=scaling, enable_gqa=gqa,
            ).transpose(1, 2))
    return torch.cat(pieces, dim=1)


def register_packed_attention() -> str:
    """Make ATTN_IMPLEMENTATION known to transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if ATTN_IMPLEMENTATION not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionInterface.register(ATTN_IMPLEMENTATION, packed_sdpa_attention_forward)
        # The padded and cached paths need sdpa's masks; a name without a mask function gets none.
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION
