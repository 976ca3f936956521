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

Engines in other processes (asynchronous training: workers/rollout_engine_worker.py) get
the same pairs from `collect_full_weights`, gathered by every rank and kept by rank 0,
which the fused worker's `export_weights` places once in Ray's object store as
`SharedWeights`: each tensor's bytes as a numpy array, which Ray stores out of band in
its shared memory and hands to every reader as a view into it (a pickled torch tensor is
copied into a byte string on the way in and again on the way out). An engine on the same
node loads straight from that shared memory.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.distributed.tensor import DTensor

from workers.device import for_collective, host_device
from workers.lora import MergedLoraWeight


def _gather(tensor: torch.Tensor | MergedLoraWeight, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(tensor, MergedLoraWeight):
        return tensor.full(dtype)
    if isinstance(tensor, DTensor):
        if tensor.device_mesh.size() == 1:
            # One rank holds everything: skip the collective and its copy.
            return tensor.to_local().to(dtype)
        # A shard left on the host (offload_policy) goes to the device first: NCCL gathers
        # device tensors only (workers/device.for_collective; nothing moves on the CPU).
        return for_collective(tensor).to(dtype).full_tensor()
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


_NUMBERED_MODULE = re.compile(r"^(.*?\.\d+)\.")


def layer_of(name: str) -> str:
    """The module a weight is loaded with: its name up to its first numbered component
    (`model.layers.3`, `visual.blocks.0`), else its parent module (`model.embed_tokens`)."""
    numbered = _NUMBERED_MODULE.match(name)
    return numbered.group(1) if numbered else name.rpartition(".")[0]


def layer_buckets(
    pairs: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """`pairs` in lists of about `bucket_bytes`, each ending only where a layer ends.

    An engine in other processes loads each list as one in-place reload, and vLLM's reload
    processes a layer once all of its weights arrived in that reload (it fuses q/k/v and
    gate/up, and the CPU backend repacks the fused weight): a layer split over two lists would
    be processed half loaded. So a list closes only between layers, however large one layer is."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size, last = 0, None
    for name, tensor in pairs:
        layer = layer_of(name)
        if bucket and size >= bucket_bytes and layer != last:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        last = layer
    if bucket:
        yield bucket


class EngineWeightSync:
    """Pushes the actor's weights into the rollout engine.

    `state_fn` returns the HF-named state to send (the FSDP model's state dict, or the
    LoRA-merged one); `rename`, when given, maps each name to the engine's (a language model
    trained alone, sent to an engine started on its multimodal checkpoint). `synced` tells
    whether the engine holds weights sent since it was built (dummy ones before that). Waking
    the engine's memory for the load is the caller's (workers/colocation.py).
    """

    def __init__(
        self,
        rollout,
        state_fn: Callable[[], dict[str, torch.Tensor]],
        bucket_megabytes: int,
        tie_word_embeddings: bool,
        rename: Callable[[str], str] | None = None,
    ):
        self.rollout = rollout
        self.rename = rename
        self.state_fn = state_fn
        self.bucket_bytes = int(bucket_megabytes) * 1024 * 1024
        self.tie_word_embeddings = tie_word_embeddings
        self.synced = False

    @torch.no_grad()
    def sync(self) -> None:
        """Gather and load the current weights (a collective: every rank calls it); the engine
        resets its caches after the load."""
        weights = iter_full_weights(
            self.state_fn(), self.rollout.engine_dtype, self.bucket_bytes, self.tie_word_embeddings
        )
        if self.rename is not None:
            weights = ((self.rename(name), tensor) for name, tensor in weights)
        self.rollout.update_weights(weights)
        self.synced = True


def collect_full_weights(
    state: dict[str, torch.Tensor], dtype: torch.dtype, bucket_bytes: int, tie_word_embeddings: bool, keep: bool
) -> list[tuple[str, torch.Tensor]] | None:
    """Every full weight in `dtype` (a collective: every rank calls it, and every rank walks
    all of `iter_full_weights` so the gathers match); the pairs where `keep`, else None.

    A kept tensor never aliases the actor's live parameters (with one rank and the actor's
    own dtype the "gather" is the local tensor itself): the caller may hold the pairs across
    later updates. Each kept tensor is moved to the host as it is gathered
    (`workers.device.host_device`), so rank 0's GPU holds one gathered bucket at a time, not
    the whole model until the engines have loaded it."""
    live = {t.to_local().untyped_storage().data_ptr() for t in state.values() if isinstance(t, DTensor)}
    live |= {
        t.untyped_storage().data_ptr()
        for t in state.values()
        if isinstance(t, torch.Tensor) and not isinstance(t, DTensor)
    }
    pairs = []
    for name, tensor in iter_full_weights(state, dtype, bucket_bytes, tie_word_embeddings):
        if keep:
            tensor = tensor.detach().to(host_device())
            pairs.append((name, tensor.clone() if tensor.untyped_storage().data_ptr() in live else tensor))
    return pairs if keep else None


@dataclass
class SharedWeights:
    """Full (HF name, tensor) weights in the form Ray's object store shares without copies:
    each distinct tensor's bytes as a flat uint8 numpy array (stored out of band, read back
    as a view into the store's shared memory), with the dtype and shape to view it as.
    Iterating yields (name, tensor) pairs, as `VLLMRollout.update_weights` takes them; the
    tensors are read-only views (an engine copies them into its own parameters).

    `same_as` names a weight that is another's (tied embeddings: `lm_head.weight` is
    `model.embed_tokens.weight`): it is sent under both names and stored once."""

    names: list[str] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)  # names[i]'s tensor is arrays[slots[i]]
    arrays: list[np.ndarray] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)  # per array: torch dtype name ("bfloat16")
    shapes: list[tuple[int, ...]] = field(default_factory=list)

    @classmethod
    def from_pairs(
        cls, pairs: Iterable[tuple[str, torch.Tensor]], same_as: dict[str, str] | None = None
    ) -> SharedWeights:
        """Views of the pairs' tensors (moved to the host); `ray.put` copies them into the store."""
        shared, slot_of = cls(), {}
        for name, tensor in pairs:
            twin = (same_as or {}).get(name)
            if twin in slot_of and tuple(tensor.shape) == shared.shapes[slot_of[twin]]:
                slot_of[name] = slot_of[twin]
            else:
                flat = tensor.detach().to("cpu").contiguous().reshape(-1)
                slot_of[name] = len(shared.arrays)
                shared.arrays.append(flat.view(torch.uint8).numpy())
                shared.dtypes.append(str(tensor.dtype).removeprefix("torch."))
                shared.shapes.append(tuple(tensor.shape))
            shared.names.append(name)
            shared.slots.append(slot_of[name])
        return shared

    def tensor(self, slot: int) -> torch.Tensor:
        with warnings.catch_warnings():
            # Read from the object store the array is read-only; torch warns that its tensor
            # would not be. The engine only reads it (copies it into its parameters).
            warnings.filterwarnings("ignore", message=".*not writable.*")
            raw = torch.from_numpy(self.arrays[slot])
        return raw.view(getattr(torch, self.dtypes[slot])).reshape(self.shapes[slot])

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, slot in zip(self.names, self.slots):
            yield name, self.tensor(slot)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def nbytes(self) -> int:
        """Bytes stored (a tied weight once)."""
        return sum(int(a.nbytes) for a in self.arrays)
