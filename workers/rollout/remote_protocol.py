"""What travels between the trainer and remote engine servers (`python -m hybrid.serve`):
the wire formats and the routes, shared by the server (remote_server.py), the router
(remote_router.py) and the client (remote_engine.py).

Routes of an engine server (the router serves the same ones: `/generate` to one server,
the control routes to every server):

- `GET /health`: {"status": "ok", "version", "tensor_parallel_size", "dtype", "model", "engine", "mode", "servers"}
- `GET /version`: {"version"}: the policy version the engine serves (-1: no weights yet)
- `GET /stats`: the engine's counters (version, loads, load_s, busy_s)
- `POST /pause` {"abort": bool}, `POST /resume`: generation held (SkyRL's pause/resume)
- `POST /update_weights?version=V&abort=0|1`: the body is the whole model in safetensors
  format (name -> tensor, in the engine's dtype); the engine loads it in place and serves it
  as version V. safetensors because it is a flat, self-describing tensor file any process
  reads back without pickle; the HTTP body because it reaches a server on another machine
  with nothing shared (no file system, no collective group).
- `POST /simulate_sync` {"version", "seconds", "abort"}: a push without weights (SkyRL's simulated trainer)
- `POST /adopt_sampling`: the trainer's `actor_rollout_ref.rollout` section (pickled): the
  server samples as the trainer says, after checking the engine settings it was started with match
- `POST /generate`: a pickled DataProto in, a pickled DataProto out (the fused worker's
  `generate_sequences` contract). Pickle because the batch carries arbitrary per-row Python
  objects (reward specs, environment extras): the servers are the trainer's own processes and
  must be reachable by it alone, as Ray's are.

Errors: a JSON body {"error": "..."} with status 4xx (the request) or 500 (the engine).
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Iterable

import torch

# A whole model in one body: aiohttp's default request limit (1 MiB) is far too small.
MAX_BODY_BYTES = 1 << 40
URL_SCHEMES = ("http://", "https://")


def pack(obj) -> bytes:
    """A DataProto or config section as request/response bytes."""
    buffer = io.BytesIO()
    pickle.dump(obj, buffer, protocol=pickle.HIGHEST_PROTOCOL)
    return buffer.getvalue()


def unpack(data: bytes):
    return pickle.loads(data)  # noqa: S301 - the trainer's own servers only (see the module doc)


def weights_to_bytes(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> bytes:
    """(name, tensor) pairs as one safetensors blob. Tensors that share memory (tied embeddings:
    embed_tokens and lm_head are one tensor) are copied, since safetensors refuses shared storage,
    and both names are kept: the engine needs both (see /work/shared/ENVIRONMENT.md)."""
    from safetensors.torch import save

    tensors, seen = {}, set()
    for name, tensor in named_tensors:
        tensor = tensor.detach().to("cpu").contiguous()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen or tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
            tensor = tensor.clone()
        seen.add((tensor.untyped_storage().data_ptr(), tensor.storage_offset()))
        if name in tensors:
            raise ValueError(f"weights_to_bytes: the weight {name!r} is given twice")
        tensors[name] = tensor
    # safetensors stores the tensors in its own order; the trainer's order is kept beside them.
    return save(tensors, metadata={"order": json.dumps(list(tensors))})


def weights_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """The (name -> tensor) dict of `weights_to_bytes`, in the order the trainer sent."""
    from safetensors.torch import load

    tensors = load(data)
    # The format: an 8-byte little-endian header length, then the JSON header with __metadata__.
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    order = json.loads(header.get("__metadata__", {}).get("order", "null")) or list(tensors)
    return {name: tensors[name] for name in order}


def check_url(url, key: str) -> str:
    """`url` as given, or ValueError naming `key` when it is not an http(s) URL."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"{key} is empty: set it to the URL `python -m hybrid.serve` printed")
    if not url.startswith(URL_SCHEMES):
        raise ValueError(f"{key}={url!r} is not an http:// or https:// URL")
    return url.rstrip("/")


__all__ = ["MAX_BODY_BYTES", "check_url", "pack", "unpack", "weights_from_bytes", "weights_to_bytes"]
