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
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier")


def fused_head_unsupported(model) -> str | None:
    """Why this model's logits cannot come from the fused head, or None."""
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        return f"its output layer is a {type(head).__name__}, not a plain Linear"
    return logit_transform(vars(model.config))


def logit_transform(model_config: dict) -> str | None:
    """The setting of a model config (its dict) that transforms logits after the output layer."""
    for name in LOGIT_TRANSFORMS:
        value = model_config.get(name)
        if value not in (None, 1, 1.0):
            return f"its config sets {name}={value}, which transforms the logits after the output layer"
    return None


def uses_fused_head(use_fused_kernels: bool | None, model) -> bool:
    """`model.use_fused_kernels`: null means wherever the model allows; true insists."""
    reason = fused_head_unsupported(model)
    if use_fused_kernels is True and reason:
        raise ValueError(
            f"actor_rollout_ref.model.use_fused_kernels=True, but this model cannot use the fused output layer: "
            f"{reason}; "
            f"set it to null (the full logits then) or false"
        )
    return use_fused_kernels is not False and reason is None


class _ChunkedLogProbs(torch.autograd.Function):
    """hidden (N, H), weight (V, H), bias (V,) or None, labels (N,) -> log-probs, entropy (N,) fp32.

    Each chunk's fp32 log-softmax is worked on in place: a chunk costs two (rows x V)
    buffers, forward and backward.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature: float, with_entropy: bool):
        ctx.set_materialize_grads(False)
        log_probs = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(log_probs)
        # Without entropy (log-prob passes that do not report it) it stays zero: two passes
        # over each chunk's logits fewer.
        entropy = torch.empty_like(log_probs) if with_entropy else torch.zeros_like(log_probs)
        for s, e in _chunks(hidden.shape[0], weight.shape[0]):
            z = _tempered_logits(hidden[s:e], weight, bias, temperature)
            chunk_lse = torch.logsumexp(z, dim=-1)
            lse[s:e] = chunk_lse
            log_probs[s:e] = z.gather(-1, labels[s:e].unsqueeze(-1)).squeeze(-1) - chunk_lse
            if with_entropy:  # H = lse - sum p z, as workers/losses.entropy_from_logits computes it
                entropy[s:e] = chunk_lse - (z - chunk_lse.unsqueeze(-1)).exp_().mul_(z).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy)
        ctx.temperature = temperature
        ctx.with_entropy = with_entropy
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, bias, labels, lse, entropy = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_bias else None
        if not ctx.with_entropy:
            grad_entropy = None  # the zeros stand for no entropy: nothing flows through them
        if grad_log_probs is None and grad_entropy is None:
            return grad_hidden, grad_weight, grad_bias, None, None, None
        scale = 1.0 / ctx.temperature  # z = logits / T: every gradient picks up 1/T
        g_lp = None if grad_log_probs is None else grad_log_probs.float() * scale
        g_ent = None if grad_entropy is None else grad_entropy.float() * scale
        for s, e in _chunks(hidden.shape[0], weight.shape[0]):
            grad_z = _grad_logits_chunk(
                hidden[s:e],
                weight,
                bias,
                ctx.temperature,
                lse[s:e],
                entropy[s:e],
                labels[s:e],
                None if g_lp is None else g_lp[s:e],
                None if g_ent is None else g_ent[s:e],
            )
            grad_z = grad_z.to(hidden.dtype)
            if need_hidden:
                grad_hidden[s:e] = grad_z @ weight
            if need_weight:
                grad_weight += (grad_z.t() @ hidden[s:e]).float()
            if need_bias:
                grad_bias += grad_z.float().sum(0)
        cast = lambda g: None if g is None else g.to(weight.dtype)  # noqa: E731
        return grad_hidden, cast(grad_weight), cast(grad_bias), None, None, None


def _tempered_logits(hidden, weight, bias, temperature: float) -> torch.Tensor:
    """One chunk's fp32 logits / temperature, in a fresh buffer the caller may overwrite."""
    z = F.linear(hidden, weight, bias).float()
    return z.div_(temperature) if temperature != 1.0 else z


def _grad_logits_chunk(hidden, weight, bias, temperature, lse, entropy, labels, g_lp, g_ent) -> torch.Tensor:
    """d(sum g_lp log p_y + g_ent H) / dz for one chunk, in fp32:
    d log p_y / dz = onehot(y) - p and dH / dz = -p (log p + H)."""
    log_p = _tempered_logits(hidden, weight, bias, temperature).sub_(lse.unsqueeze(-1))
    probs = log_p.exp()
    if g_ent is not None:  # log_p becomes g_lp + g_ent (log p + H), the factor of -p
        log_p.add_(entropy.unsqueeze(-1)).mul_(g_ent.unsqueeze(-1))
        if g_lp is not None:
            log_p.add_(g_lp.unsqueeze(-1))
        grad_z = probs.mul_(log_p).neg_()
    else:
        grad_z = probs.mul_(-g_lp.unsqueeze(-1))
    if g_lp is not None:
        grad_z.scatter_add_(-1, labels.unsqueeze(-1), g_lp.unsqueeze(-1))
    return grad_z


def _chunks(rows: int, vocab: int) -> list[tuple[int, int]]:
    step = max(1, _CHUNK_ELEMS // max(1, vocab))
    return [(s, min(s + step, rows)) for s in range(0, rows, step)]


@contextmanager
def fused_response_head(model, labels: torch.Tensor, temperature: float, with_entropy: bool = True):
    """For the model calls inside, the output layer returns (..., 2) where it would return
    logits (..., V): the log-prob of `labels` (one per position, flattened) and the entropy
    (zero when not `with_entropy`), at the positions `logits_to_keep` selects, tempered by
    `temperature`."""
    head = model.get_output_embeddings()

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1])
        if flat.shape[0] != labels.shape[0]:
            raise ValueError(f"the fused head got {flat.shape[0]} positions for {labels.shape[0]} response tokens")
        log_probs, entropy = _ChunkedLogProbs.apply(
            flat, head.weight, head.bias, labels, float(temperature), bool(with_entropy)
        )
        shape = hidden.shape[:-1]
        # A fresh tensor, not a view: FSDP2 hooks the root's output for its backward pass.
        return torch.stack([log_probs.view(shape), entropy.view(shape)], dim=-1)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward  # the class's own forward again
