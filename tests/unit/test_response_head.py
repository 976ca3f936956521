"""The fused, chunked output layer (workers/response_head.py) against plain autograd:
log-probs, entropy and the gradients of hidden states, weight and bias, for chunks of one
row, of several rows and of all rows, with temperature, and with the entropy unused."""

from __future__ import annotations

import pytest
import torch

import workers.response_head as response_head
from workers.response_head import _ChunkedLogProbs

N, H, V = 7, 5, 11


def _inputs(seed: int, bias: bool):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=gen, dtype=torch.float64, requires_grad=True) if bias else None
    labels = torch.randint(0, V, (N,), generator=gen)
    return hidden, weight, b, labels


def _reference(hidden, weight, bias, labels, temperature):
    z = torch.nn.functional.linear(hidden, weight, bias) / temperature
    log_softmax = z.log_softmax(-1)
    return log_softmax.gather(-1, labels[:, None]).squeeze(-1), -(log_softmax.exp() * log_softmax).sum(-1)


@pytest.mark.parametrize("chunk_rows", [1, 3, N])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("use_entropy", [False, True])
def test_chunked_log_probs_entropy_and_gradients_match_autograd(monkeypatch, chunk_rows, bias, use_entropy):
    monkeypatch.setattr(response_head, "_CHUNK_ELEMS", chunk_rows * V)
    temperature = 0.7
    gen = torch.Generator().manual_seed(9)
    w_lp, w_ent = torch.randn(N, generator=gen, dtype=torch.float64), torch.randn(N, generator=gen, dtype=torch.float64)
    results = []
    for fn in (lambda *args: _ChunkedLogProbs.apply(*args, True), _reference):
        hidden, weight, b, labels = _inputs(0, bias)
        log_probs, entropy = fn(hidden, weight, b, labels, temperature)
        loss = (log_probs.double() * w_lp).sum() + ((entropy.double() * w_ent).sum() if use_entropy else 0)
        loss.backward()
        grads = [hidden.grad, weight.grad] + ([b.grad] if bias else [])
        results.append((log_probs.detach().double(), entropy.detach().double(), grads))
    (lp, ent, grads), (ref_lp, ref_ent, ref_grads) = results
    # the forward keeps log-probs and entropy in fp32, as the trainer's log-probs always are
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    for got, want in zip(grads, ref_grads):  # fp32 arithmetic against fp64: 1e-5 of the largest entry
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert all(g.abs().sum() > 0 for g in grads)


def test_an_unused_output_gives_no_gradient_work():
    hidden, weight, bias, labels = _inputs(1, bias=False)
    log_probs, entropy = _ChunkedLogProbs.apply(hidden, weight, bias, labels, 1.0, True)
    entropy.sum().backward()  # log-probs unused: only the entropy's gradient flows
    _, ref_entropy = _reference(hidden.detach().requires_grad_(), weight, bias, labels, 1.0)
    assert hidden.grad is not None and torch.isfinite(hidden.grad).all()
    assert torch.allclose(entropy.double(), ref_entropy.double(), atol=1e-5)


@pytest.mark.parametrize("chunk_rows", [2, N])
def test_without_entropy_the_log_probs_and_their_gradients_are_unchanged(monkeypatch, chunk_rows):
    """Log-prob passes that do not report the entropy skip it: the same log-probs and
    gradients, and zeros where the entropy would be."""
    monkeypatch.setattr(response_head, "_CHUNK_ELEMS", chunk_rows * V)
    results = []
    for with_entropy in (True, False):
        hidden, weight, bias, labels = _inputs(3, bias=True)
        log_probs, entropy = _ChunkedLogProbs.apply(hidden, weight, bias, labels, 0.8, with_entropy)
        log_probs.sum().backward()
        results.append((log_probs.detach(), entropy.detach(), hidden.grad, weight.grad, bias.grad))
    with_ent, without = results
    for a, b in zip(with_ent[:1] + with_ent[2:], without[:1] + without[2:]):
        assert torch.equal(a, b)
    assert torch.equal(without[1], torch.zeros(N)) and with_ent[1].abs().min() > 0


def test_models_whose_logits_are_transformed_keep_the_full_logits():
    from types import SimpleNamespace

    from workers.response_head import fused_head_unsupported, uses_fused_head

    def model(head, **config):
        return SimpleNamespace(get_output_embeddings=lambda: head, config=SimpleNamespace(**config))

    plain = model(torch.nn.Linear(4, 8, bias=False))
    assert fused_head_unsupported(plain) is None and uses_fused_head(None, plain) and not uses_fused_head(False, plain)
    capped = model(torch.nn.Linear(4, 8), final_logit_softcapping=30.0)
    assert "final_logit_softcapping=30.0" in fused_head_unsupported(capped)
    assert not uses_fused_head(None, capped)
    with pytest.raises(
        ValueError,
        match=r"use_fused_kernels=True, but this model cannot use the fused output layer: "
        r"its config sets final_logit_softcapping",
    ):
        uses_fused_head(True, capped)
    assert "not a plain Linear" in fused_head_unsupported(model(torch.nn.Embedding(8, 4)))
