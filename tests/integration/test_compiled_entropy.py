"""verl's `actor.use_torch_compile` / `ref.use_torch_compile` (workers/compiled_entropy.py): on
the tiny random Llama, the actor's entropy goes through torch.compile (dynamo compiles a frame)
and its log-probs, entropy and the entropy's parameter gradients (the entropy_coeff term)
equal the eager actor's within float tolerance, in compute_log_prob's no-grad pass and in the
update's."""

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


def _pass(model, micro: dict, use_torch_compile: bool, grad: bool):
    model.zero_grad(set_to_none=True)
    actor = DataParallelPPOActor(model, False, use_torch_compile=use_torch_compile)
    with torch.set_grad_enabled(grad):  # no grad: compute_log_prob's pass
        log_probs, entropy = actor.forward_micro(micro, temperature=0.7, calculate_entropy=True)
    if not grad:
        return log_probs, entropy, {}
    entropy.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return log_probs.detach(), entropy.detach(), grads


@pytest.mark.parametrize("grad", [False, True])
def test_compiled_entropy_equals_the_eager_one(tiny_model_dir, grad):
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    micro = _batch(model.config.vocab_size)
    eager = _pass(model, micro, False, grad)
    compiled_before = counters["stats"]["unique_graphs"], counters["aot_autograd"]["total"]
    # Scalar C++ kernels: the inductor then skips building a probe program per vector
    # instruction set (about 7 of the 14 s a cold compile takes here); the values are the same.
    with inductor_config.patch({"cpp.vec_isa_ok": False}):
        compiled = _pass(model, micro, True, grad)
    # the entropy went through dynamo (a new graph, or the cached one again, through AOT autograd)
    assert (counters["stats"]["unique_graphs"], counters["aot_autograd"]["total"]) != compiled_before
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=1e-6)  # log-probs: eager in both
    torch.testing.assert_close(compiled[1], eager[1], rtol=1e-5, atol=1e-5)
    assert compiled[2].keys() == eager[2].keys() and bool(eager[2]) == grad
    for name, value in eager[2].items():
        torch.testing.assert_close(compiled[2][name], value, rtol=1e-4, atol=1e-6, msg=name)
