"""FSDP2 -> rollout engine: gather the trained shards and load them into the engine in place.

The fused worker's `update_rollout_weights` runs a sync (the driver calls it after the
worker is built or loads a checkpoint, and after every actor update). Every
parameter's DTensor is cast to the engine's dtype on the shard — halving what crosses the
wire for bf16 engines — and gathered with `full_tensor()`, bucket by bucket, into a lazy
iterator the engine consumes while loading; no rank ever holds the whole gathered model
unless one bucket is that large. All ranks walk the parameters in the same order, since
each gather is a collective. Tied embeddings are sent under both names: the vLLM CPU
backend repacks a layer only when a weight for it arrives. With LoRA the state holds
`MergedLoraWeight`s (workers/lora.py): base, A and B are gathered and merged in fp32, then
cast, so the engine samples from exactly what the adapted actor computes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.distributed.tensor import DTensor

from workers.lora import MergedLoraWeight


def _gather(tensor: torch.Tensor | MergedLoraWeight, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(tensor, MergedLoraWeight):
        return tensor.full(dtype)
    if isinstance(tensor, DTensor):
        if tensor.device_mesh.size() == 1:
            # One rank holds everything: skip the collective and its copy.
            return tensor.to_local().to(dtype)
        return tensor.to(dtype).full_tensor()
    return tensor.to(dtype)


def iter_full_weights(
    state: dict[str, torch.Tensor], dtype: torch.dtype, bucket_bytes: int, tie_word_embeddings: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor in `dtype`) pairs, gathered `bucket_bytes` at a time."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in state.items():
        bucket.append((name, tensor))
        size += tensor.numel() * dtype.itemsize
        if size >= bucket_bytes:
            yield from ((n, _gather(t, dtype)) for n, t in bucket)
            bucket, size = [], 0
    yield from ((n, _gather(t, dtype)) for n, t in bucket)
    if tie_word_embeddings and "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        yield "lm_head.weight", _gather(state["model.embed_tokens.weight"], dtype)


class EngineWeightSync:
    """Pushes the actor's weights into the rollout engine.

    `state_fn` returns the HF-named state to send (the FSDP model's state dict, or the
    LoRA-merged one). `synced` tells whether the engine holds weights sent since it was
    built (dummy ones before that); the worker clears it when a checkpoint replaces the
    actor's weights.
    """

    def __init__(
        self, rollout, state_fn: Callable[[], dict[str, torch.Tensor]], bucket_megabytes: int, tie_word_embeddings: bool
    ):
        self.rollout = rollout
        self.state_fn = state_fn
        self.bucket_bytes = int(bucket_megabytes) * 1024 * 1024
        self.tie_word_embeddings = tie_word_embeddings
        self.synced = False

    @torch.no_grad()
    def sync(self) -> None:
        """Gather and load the current weights (a collective: every rank calls it). The
        engine is woken for it and stays awake until it generates."""
        self.rollout.wake_up()
        weights = iter_full_weights(
            self.state_fn(), self.rollout.engine_dtype, self.bucket_bytes, self.tie_word_embeddings
        )
        self.rollout.update_weights(weights)
        self.synced = True
