"""The shared maths of the device-side losses: masked statistics, log-probs and entropy from
logits, loss aggregation, KL estimators, and the value and entropy losses. The policy losses
built on them are in workers/losses.py, which re-exports everything here.

Everything works on padded ``(batch, response_len)`` tensors with a ``response_mask`` and
imports only torch and the standard library, because workers must not import the driver.
Names and argument names follow verl's ``verl/trainer/ppo/core_algos.py`` and
``verl/utils/torch_functional.py``.

Differences from verl, on purpose:
  * masked statistics select with ``torch.where`` so NaN/inf in padding never leak in;
  * the ``seq-mean-*`` aggregations do not count rows without any loss token, and
    ``seq-mean-token-sum-norm`` is mean over sequences of the token sum divided by the
    horizon (current verl; older verl forgot the 1/B);
  * ``kl_penalty(..., "full")`` works when given full-vocabulary log-probs ``(B, T, V)``;
  * unknown aggregation modes and KL kinds raise ``ValueError`` listing the valid ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "logprobs_from_logits",
    "entropy_from_logits",
    "AGG_LOSS_MODES",
    "AGGREGATIONS",
    "AggregationSpec",
    "aggregation_spec",
    "agg_loss",
    "KL_PENALTY_KINDS",
    "kl_penalty",
    "compute_value_loss",
    "compute_entropy_loss",
]

# ----------------------------------------------------------------------------- masked stats


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero (weighted by ``mask``)."""
    mask = mask.to(values.dtype)
    # where() rather than a bare product: padding may hold inf/NaN (e.g. logits of pad tokens)
    # and inf * 0 = NaN would poison the whole sum.
    valid = torch.where(mask != 0, values, torch.zeros_like(values))
    total = valid * mask
    return total.sum() if axis is None else total.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the mask; 0 (not NaN) where the mask is empty, as verl."""
    mask_f = mask.to(values.dtype)
    count = mask_f.sum() if axis is None else mask_f.sum(dim=axis)
    return masked_sum(values, mask_f, axis) / (count + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the mask (Bessel-corrected when ``unbiased``)."""
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        mask_sum = mask.to(values.dtype).sum()
        if mask_sum == 0:
            raise ValueError("masked_var: the mask is empty; at least one element must be 1.")
        if mask_sum == 1:
            raise ValueError("masked_var: the mask has a single element; the unbiased variance divides by zero.")
        variance = variance * (mask_sum / (mask_sum - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` with statistics over the mask (unbiased var)."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


# ----------------------------------------------------------------------------- logits

# Rows per chunk are chosen so one chunk's temporaries stay near this many elements: the
# full (N, V) softmax of a 50k vocabulary over 16k tokens would be 3 GiB in fp32.
_CHUNK_ELEMS = 1 << 24


def _row_chunks(n_rows: int, vocab: int) -> list[tuple[int, int]]:
    step = max(1, _CHUNK_ELEMS // max(1, vocab))
    return [(s, min(s + step, n_rows)) for s in range(0, n_rows, step)]


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[labels], computed as ``gather - logsumexp`` chunk by chunk.

    ``logits`` is ``(..., V)`` and ``labels`` is ``(...)``. Never materialises a full
    ``(..., V)`` log-softmax. bf16/fp16 logits are upcast per chunk and the result is float32,
    because logsumexp in bf16 loses the precision the importance ratio needs.
    """
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    flat_labels = labels.reshape(-1)
    out = []
    for s, e in _row_chunks(flat.shape[0], vocab):
        chunk = flat[s:e]
        if chunk.dtype not in (torch.float32, torch.float64):
            chunk = chunk.float()
        picked = torch.gather(chunk, -1, flat_labels[s:e].unsqueeze(-1)).squeeze(-1)
        out.append(picked - torch.logsumexp(chunk, dim=-1))
    result = torch.cat(out) if out else flat.new_zeros(0, dtype=torch.float32)
    return result.reshape(labels.shape)


def chunk_entropy(chunk: torch.Tensor) -> torch.Tensor:
    """Entropy of each row of one chunk of float logits (verl's ``entropy_from_logits``)."""
    probs = F.softmax(chunk, dim=-1)
    return torch.logsumexp(chunk, dim=-1) - (probs * chunk).sum(dim=-1)


def entropy_from_logits(logits: torch.Tensor, chunk_fn=chunk_entropy) -> torch.Tensor:
    """Categorical entropy ``logsumexp(z) - sum(softmax(z) * z)`` over the last dim, chunked;
    `chunk_fn` computes one chunk (workers/compiled_entropy.py passes a torch.compiled one)."""
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    out = []
    for s, e in _row_chunks(flat.shape[0], vocab):
        chunk = flat[s:e]
        if chunk.dtype not in (torch.float32, torch.float64):
            chunk = chunk.float()
        out.append(chunk_fn(chunk))
    result = torch.cat(out) if out else flat.new_zeros(0, dtype=torch.float32)
    return result.reshape(logits.shape[:-1])


# ----------------------------------------------------------------------------- aggregation


class AggregationSpec(NamedTuple):
    """A ``loss_agg_mode``: how a ``(B, T)`` loss becomes a scalar, and what the update asks of it.

    ``seq_level``: a mean over sequences (rows with a loss token), each reduced by
    ``per_sequence(token_sum, token_count, scale)``; the update weighs micro-batches by their rows.
    Otherwise a reduction over tokens, weighed by tokens. ``summed``: a sum with no denominator,
    so the micro-batches' and ranks' losses add up instead of being averaged."""

    seq_level: bool
    summed: bool = False
    per_sequence: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None = None


AGGREGATIONS: dict[str, AggregationSpec] = {
    "token-mean": AggregationSpec(seq_level=False),
    "token-sum": AggregationSpec(seq_level=False, summed=True),
    "seq-mean-token-sum": AggregationSpec(seq_level=True, per_sequence=lambda seq_sum, tokens, scale: seq_sum),
    "seq-mean-token-mean": AggregationSpec(
        seq_level=True, per_sequence=lambda seq_sum, tokens, scale: seq_sum / tokens.clamp(min=1)
    ),
    "seq-mean-token-sum-norm": AggregationSpec(
        seq_level=True, per_sequence=lambda seq_sum, tokens, scale: seq_sum / scale
    ),
}
AGG_LOSS_MODES = tuple(AGGREGATIONS)


def aggregation_spec(loss_agg_mode: str) -> AggregationSpec:
    """The spec of ``loss_agg_mode``; an unknown mode raises naming the valid ones."""
    if loss_agg_mode not in AGGREGATIONS:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode!r}. Valid modes: {list(AGG_LOSS_MODES)}")
    return AGGREGATIONS[loss_agg_mode]


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a ``(B, T)`` loss matrix into a scalar.

    * ``token-mean``: sum over all valid tokens / number of valid tokens (DAPO).
    * ``token-sum``: sum over all valid tokens, not divided (verl 0.9); the update sums the
      micro-batches' and ranks' sums instead of averaging them (workers/optimizer_step.py).
    * ``seq-mean-token-sum``: per-sequence token sum, mean over sequences.
    * ``seq-mean-token-mean``: per-sequence token mean, mean over sequences (GRPO paper).
    * ``seq-mean-token-sum-norm``: per-sequence token sum / ``loss_scale_factor`` (default the
      horizon ``T``), mean over sequences (Dr. GRPO).

    Sequences without a single valid token (padding rows) are left out of the sequence mean.
    """
    spec = aggregation_spec(loss_agg_mode)
    if not spec.seq_level:
        if spec.summed:
            return masked_sum(loss_mat, loss_mask.to(loss_mat.dtype))
        return masked_mean(loss_mat, loss_mask)
    mask = loss_mask.to(loss_mat.dtype)
    seq_sum = masked_sum(loss_mat, mask, axis=-1)
    tokens = mask.sum(dim=-1)
    seq_valid = (tokens > 0).to(loss_mat.dtype)
    scale = float(loss_mask.shape[-1]) if loss_scale_factor is None else float(loss_scale_factor)
    return masked_mean(spec.per_sequence(seq_sum, tokens, scale), seq_valid)


# ----------------------------------------------------------------------------- KL

KL_PENALTY_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference (Schulman's k1/k2/k3).

    * ``kl``/``k1``: ``logp - ref``; ``abs``: ``|logp - ref|``; ``mse``/``k2``: ``0.5 (logp - ref)^2``;
    * ``low_var_kl``/``k3``: ``exp(ref - logp) - (ref - logp) - 1``, the log-ratio clamped to
      [-20, 20] and the result to [-10, 10] as verl;
    * ``full``: exact ``KL(p || ref) = sum_v p_v (log p_v - log ref_v)``; here ``logprob`` and
      ``ref_logprob`` must be full-vocabulary log-probabilities ``(B, T, V)`` (log_softmax
      outputs), and the result is ``(B, T)``. With per-token ``(B, T)`` inputs it raises
      ``NotImplementedError``, since the chosen-token log-prob alone cannot give it.
    * A trailing ``+`` (``k1+``, ``k3+``, ...) keeps the forward value of the base kind but takes
      the gradient of k2 (unbiased gradient of KL; verl's straight-through variant).
    """
    kind = kl_penalty
    if kind.endswith("+") and kind[:-1] in KL_PENALTY_KINDS and kind[:-1] != "full":
        forward = _kl_forward(logprob, ref_logprob, kind[:-1])
        backward = 0.5 * (logprob - ref_logprob).square()
        return backward - backward.detach() + forward.detach()
    return _kl_forward(logprob, ref_logprob, kind)


def _kl_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    if kind in ("kl", "k1"):
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kind in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    if kind == "full":
        if logprob.dim() < 3 or logprob.shape != ref_logprob.shape:
            raise NotImplementedError(
                "kl_penalty='full' needs full-vocabulary log-probs of shape (B, T, V) for both the policy "
                f"and the reference; got {tuple(logprob.shape)} and {tuple(ref_logprob.shape)}. The actor "
                "keeps only the chosen token's log-prob; use kl, abs, mse or low_var_kl instead."
            )
        return (logprob.exp() * (logprob - ref_logprob)).sum(dim=-1)
    raise ValueError(
        f"Unknown kl_penalty: {kind!r}. Valid kinds: {list(KL_PENALTY_KINDS)} (k1/kl/abs/k3/low_var_kl "
        "also take a trailing '+')"
    )


# ----------------------------------------------------------------------------- value, entropy


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss ``0.5 * agg(max((v - R)^2, (clip(v, V - c, V + c) - R)^2))``.

    Returns ``(vf_loss, vf_clipfrac)``, the latter the share of tokens where the clipped
    term was larger.
    """
    vpredclipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.max(vf_losses1, vf_losses2), response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).float(), response_mask)
    return vf_loss, vf_clipfrac


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Aggregated entropy of ``(B, T, V)`` logits (the actor subtracts ``entropy_coeff`` times it)."""
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)
