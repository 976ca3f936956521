"""Packed-row attention (workers/packed_attention.py) on a tiny random Llama: the same
logits and gradients as transformers' sdpa with its block-diagonal mask, and as each
sequence run alone; attention really runs per sequence; padded batches are plain sdpa."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from workers.micro_batch import pack
from workers.packed_attention import register_packed_attention

pytestmark = pytest.mark.integration

TOL = 1e-5


def _models(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    packed = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation=register_packed_attention()
    )
    dense = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    assert packed.config.num_key_value_heads < packed.config.num_attention_heads  # GQA is exercised
    return packed, dense


def _logits_and_grads(model, **inputs):
    model.zero_grad(set_to_none=True)
    logits = model(**inputs, use_cache=False).logits
    (logits.float().pow(2).mean()).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_packed_row_matches_sdpa_and_separate_sequences(tiny_model_dir, monkeypatch):
    packed, dense = _models(tiny_model_dir)
    lengths = [5, 9, 3, 7]
    gen = torch.Generator().manual_seed(1)
    # rows right-padded to 9, packed by the actor's own `pack` (boundaries included)
    rows = torch.randint(0, packed.config.vocab_size, (len(lengths), max(lengths)), generator=gen)
    mask = (torch.arange(max(lengths)) < torch.tensor(lengths).unsqueeze(1)).long()
    ids, pos, _, varlen = pack(rows, mask, (mask.cumsum(-1) - 1).clamp(min=0))
    assert varlen["cu_seq_lens_q"].tolist() == [0, 5, 14, 17, 24] and varlen["max_length_q"] == 9

    seen_lengths = []
    real_sdpa = F.scaled_dot_product_attention

    def spy(q, *args, **kwargs):
        seen_lengths.append(q.shape[2])
        return real_sdpa(q, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    logits, grads = _logits_and_grads(packed, input_ids=ids, position_ids=pos, **varlen)
    monkeypatch.setattr(F, "scaled_dot_product_attention", real_sdpa)
    # forward: one call per sequence and layer, never over the whole row
    assert seen_lengths == lengths * packed.config.num_hidden_layers

    ref_logits, ref_grads = _logits_and_grads(dense, input_ids=ids, position_ids=pos)
    assert (logits - ref_logits).abs().max() <= TOL
    for name, grad in grads.items():
        assert (grad - ref_grads[name]).abs().max() <= TOL, name

    with torch.no_grad():
        alone = torch.cat(
            [dense(input_ids=chunk, use_cache=False).logits for chunk in ids.split(lengths, dim=1)], dim=1
        )
    assert (logits - alone).abs().max() <= TOL


def test_padded_batch_is_plain_sdpa(tiny_model_dir):
    packed, dense = _models(tiny_model_dir)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, packed.config.vocab_size, (3, 8), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[2, :5] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        a = packed(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        b = dense(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    keep = mask.bool()
    assert torch.equal(a[keep], b[keep])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_row_gather_equals_indexing_forward_and_backward(dtype):
    """The attention's row gather (index_select in half precision) gives what x[index]
    gives, and the same gradient where an index repeats (a group's prompt keys are
    gathered once per response). Small integers keep bf16 sums exact."""
    from workers.packed_attention import _gather_rows

    torch.manual_seed(0)
    base = torch.randint(-4, 5, (12, 3, 4)).to(dtype)
    index = torch.tensor([[0, 1, 2, 3, 0], [5, 5, 0, 1, 11]])
    upstream = torch.randint(-3, 4, (2, 5, 3, 4)).to(dtype)
    results = []
    for gather in (_gather_rows, lambda x, i: x[i]):
        x = base.clone().requires_grad_(True)
        out = gather(x, index)
        out.backward(upstream)
        results.append((out.detach(), x.grad))
    (out_a, grad_a), (out_b, grad_b) = results
    assert out_a.dtype == dtype and out_a.shape == (2, 5, 3, 4)
    assert torch.equal(out_a, out_b) and torch.equal(grad_a, grad_b)
    assert torch.equal(grad_a[0], upstream[0, 0] + upstream[0, 4] + upstream[1, 2])  # row 0 gathered three times
