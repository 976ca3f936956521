"""verl's `actor.use_torch_compile` / `ref.use_torch_compile` (workers/compiled_entropy.py): on
the tiny random Llama, the actor's entropy goes through torch.compile (dynamo compiles a frame)
and its log-probs and entropy equal the eager actor's within float tolerance. The gradient
through the compiled entropy (entropy_coeff) is not run here: its backward compile adds seconds
(equal to the eager gradients within 1e-4 when the hook was added)."""

from __future__ import annotations

import pytest
import torch

from workers.actor import DataParallelPPOActor

pytestmark = pytest.mark.integration


def _batch(vocab: int, rows: int = 3, prompt: int = 5, response: int = 6) -> dict:
    gen = torch.Generator().manual_seed(11)
    input_ids = torch.randint(3, vocab, (rows, prompt + response), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :2] = 0  # a left-padded prompt
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "responses": input_ids[:, prompt:],
    }


def _pass(model, micro: dict, use_torch_compile: bool):
    with torch.no_grad():  # compute_log_prob's pass
        actor = DataParallelPPOActor(model, False, use_torch_compile=use_torch_compile)
        return actor.forward_micro(micro, temperature=0.7, calculate_entropy=True)


def test_compiled_entropy_equals_the_eager_one(tiny_model_dir):
    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    micro = _batch(model.config.vocab_size)
    eager = _pass(model, micro, use_torch_compile=False)
    graphs = counters["stats"]["unique_graphs"]
    compiled = _pass(model, micro, use_torch_compile=True)
    assert counters["stats"]["unique_graphs"] > graphs  # the entropy went through dynamo
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=1e-6)  # log-probs: eager in both
    torch.testing.assert_close(compiled[1], eager[1], rtol=1e-5, atol=1e-5)
