"""Response-only log-probs and entropy through the vocabulary projection, chunk by chunk.

The model's output layer runs only on the hidden states that predict response tokens
(`logits_to_keep`), and instead of returning (tokens x vocabulary) logits it returns, per
token, the log-prob of the response token and the entropy, computed on chunks of rows: no
full [tokens x vocabulary] tensor is ever held, in the forward or the backward pass (which
recomputes each chunk's logits from the saved hidden states and the weight). verl calls
this `use_fused_kernels`; its `entropy_from_logits_with_chunking` and
`entropy_checkpointing` are what it does with the entropy.

It works by standing in for the output layer's forward for one model call
(`fused_response_head`), so FSDP2 (which gathers the layer's weight for the root module's
forward and backward) and LoRA see an ordinary call whose output is (..., 2):
log-prob and entropy. Models whose logits are more than `lm_head(hidden)` (soft-capped,
scaled) keep the plain path.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

# Rows per chunk keep one chunk's fp32 logits near this many elements (64 MiB).
_CHUNK_ELEMS = 1 << 24
# Config attributes that change logits after the output layer: those models keep the plain path.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier")


def fused_head_unsupported(model) -> str | None:
    """Why this model's logits cannot come from the fused head, or None."""
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        return f"its output layer is a {type(head).__name__}, not a plain Linear"
    config = model.config
    for name in _LOGIT_TRANSFORMS:
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            return f"its config sets {name}={value}, which transforms the logits after the output layer"
    return None


def uses_fused_head(use_fused_kernels: bool | None, model) -> bool:
    """`model.use_fused_kernels`: null means wherever the model allows; true insists."""
    reason = fused_head_unsupported(model)
    if use_fused_kernels is True and reason:
        raise ValueError(
            f"actor_rollout_ref.model.use_fused_kernels=True, but this model cannot use the fused output layer: {reason}; "
            f"set it to null (the full logits then) or false"
        )
    return use_fused_kernels is not False and reason is None


class _ChunkedLogProbs(torch.autograd.Function):
    """hidden (N, H), weight (V, H), bias (V,) or None, labels (N,) -> log-probs, entropy (N,) fp32."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature: float):
        ctx.set_materialize_grads(False)
        log_probs = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(log_probs)
        entropy = torch.empty_like(log_probs)
        for s, e in _chunks(hidden.shape[0], weight.shape[0]):
            z = F.linear(hidden[s:e], weight, bias).float() / temperature
            lse[s:e] = torch.logsumexp(z, dim=-1)
            log_probs[s:e] = z.gather(-1, labels[s:e].unsqueeze(-1)).squeeze(-1) - lse[s:e]
            entropy[s:e] = lse[s:e] - (torch.softmax(z, dim=-1) * z).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy)
        ctx.temperature = temperature
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, bias, labels, lse, entropy = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_bias else None
        if grad_log_probs is None and grad_entropy is None:
            return grad_hidden, grad_weight, grad_bias, None, None
        for s, e in _chunks(hidden.shape[0], weight.shape[0]):
            z = F.linear(hidden[s:e], weight, bias).float() / ctx.temperature
            probs = torch.exp(z - lse[s:e, None])
            grad_z = torch.zeros_like(z)
            if grad_log_probs is not None:  # d log p_y / dz = onehot(y) - p
                g = grad_log_probs[s:e, None].float()
                grad_z -= probs * g
                grad_z.scatter_add_(-1, labels[s:e, None], g)
            if grad_entropy is not None:  # dH / dz_j = -p_j (log p_j + H)
                grad_z -= grad_entropy[s:e, None].float() * probs * (z - lse[s:e, None] + entropy[s:e, None])
            grad_z = (grad_z / ctx.temperature).to(hidden.dtype)
            if need_hidden:
                grad_hidden[s:e] = grad_z @ weight
            if need_weight:
                grad_weight += (grad_z.t() @ hidden[s:e]).float()
            if need_bias:
                grad_bias += grad_z.float().sum(0)
        cast = lambda g: None if g is None else g.to(weight.dtype)  # noqa: E731
        return grad_hidden, cast(grad_weight), cast(grad_bias), None, None


def _chunks(rows: int, vocab: int) -> list[tuple[int, int]]:
    step = max(1, _CHUNK_ELEMS // max(1, vocab))
    return [(s, min(s + step, rows)) for s in range(0, rows, step)]


@contextmanager
def fused_response_head(model, labels: torch.Tensor, temperature: float):
    """For the model calls inside, the output layer returns (..., 2) where it would return
    logits (..., V): the log-prob of `labels` (one per position, flattened) and the entropy,
    at the positions `logits_to_keep` selects, tempered by `temperature`."""
    head = model.get_output_embeddings()

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1])
        if flat.shape[0] != labels.shape[0]:
            raise ValueError(f"the fused head got {flat.shape[0]} positions for {labels.shape[0]} response tokens")
        log_probs, entropy = _ChunkedLogProbs.apply(flat, head.weight, head.bias, labels, float(temperature))
        shape = hidden.shape[:-1]
        # A fresh tensor, not a view: FSDP2 hooks the root's output for its backward pass.
        return torch.stack([log_probs.view(shape), entropy.view(shape)], dim=-1)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward  # the class's own forward again
