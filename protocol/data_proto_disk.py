"""DataProto's file format (`DataProto.save_to_disk` / `DataProto.load_from_disk`): a payload
that torch.load(weights_only=True) reads back, so loading a file never runs pickled code.

Tensors are stored on CPU as a plain dict, non-tensor rows as flat Python lists with their
array's shape, and meta_info as it is; numpy scalars become Python scalars, and any value
the weights_only unpickler would reject is refused when saving, naming the field.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["save_fields", "load_fields"]

_SAVE_FORMAT = "hybrid.DataProto/1"
# Exact types, not isinstance: np.float64 and np.str_ subclass float and str, and the
# weights_only unpickler rejects them.
_PRIMITIVE_TYPES = (type(None), bool, int, float, str, bytes)


def _to_storable(value: Any, where: str) -> Any:
    """Convert a value to what torch.load(weights_only=True) accepts, or say which one cannot be."""
    if isinstance(value, (np.bool_, np.integer, np.floating, np.str_)):
        return value.item()  # same value as a Python scalar; numpy scalars are not weights_only safe
    if type(value) in _PRIMITIVE_TYPES:
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if type(value) in (list, tuple):
        items = [_to_storable(item, where) for item in value]
        return items if type(value) is list else tuple(items)
    if type(value) is dict:
        stored = {}
        for key, item in value.items():
            if type(key) not in _PRIMITIVE_TYPES:
                raise TypeError(f"cannot save {where}: dict key {key!r} of type {type(key).__name__} is not storable")
            stored[key] = _to_storable(item, where)
        return stored
    raise TypeError(
        f"cannot save {where}: a value of type {type(value).__name__} cannot be loaded with "
        "torch.load(weights_only=True); convert it to str/int/float/bool/None/list/dict first"
    )


def save_fields(path: str | os.PathLike, batch: TensorDict | None, non_tensor_batch: dict, meta_info: dict) -> None:
    """Write a DataProto's three fields to `path` (its caller checked their consistency)."""
    stored_batch = None
    if batch is not None:
        stored_batch = {"batch_size": list(batch.batch_size), "tensors": batch.to("cpu").to_dict()}
    non_tensors = {}
    for key, value in non_tensor_batch.items():
        values = [_to_storable(row, f"non_tensor_batch[{key!r}]") for row in value.reshape(-1)]
        non_tensors[key] = {"shape": list(value.shape), "values": values}
    stored_meta = {key: _to_storable(value, f"meta_info[{key!r}]") for key, value in meta_info.items()}
    payload = {"format": _SAVE_FORMAT, "batch": stored_batch, "non_tensor_batch": non_tensors, "meta_info": stored_meta}
    # Written beside and renamed, so a crash never leaves a half-written file at `path`.
    tmp_path = f"{os.fspath(path)}.tmp"
    torch.save(payload, tmp_path)
    os.replace(tmp_path, path)


def load_fields(path: str | os.PathLike) -> tuple[TensorDict | None, dict, dict]:
    """The (batch, non_tensor_batch, meta_info) that `save_fields` wrote to `path`."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != _SAVE_FORMAT:
        raise ValueError(f"{os.fspath(path)} is not a DataProto written by DataProto.save_to_disk")
    batch = None
    if payload["batch"] is not None:
        batch = TensorDict(source=payload["batch"]["tensors"], batch_size=payload["batch"]["batch_size"])
    non_tensors = {}
    for key, stored in payload["non_tensor_batch"].items():
        flat = np.empty(len(stored["values"]), dtype=object)
        for i, row in enumerate(stored["values"]):
            flat[i] = row
        non_tensors[key] = flat.reshape(stored["shape"])
    return batch, non_tensors, payload["meta_info"]
