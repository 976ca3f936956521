"""The argument checks of DataProto's operations (protocol/data_proto.py), each naming the key,
item or index at fault: non-tensor rows as object arrays, key-list arguments, missing keys,
the tensors' shared batch shape, row indices and masks, the equality `union` requires of a
key both sides hold, and the shapes `concat` requires of its items.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = [
    "as_object_array",
    "check_concat",
    "index_arrays",
    "key_list",
    "require_keys",
    "tensor_batch_size",
    "values_equal",
]


def as_object_array(key: str, value: Any) -> np.ndarray:
    """Lists and numpy arrays of any dtype become object arrays with one row per entry."""
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            raise ValueError(f"non_tensor_batch[{key!r}] is a 0-d array; it needs a batch dimension")
        return value if value.dtype == object else value.astype(object)
    if isinstance(value, (list, tuple)):
        # Filled one by one so that rows which are themselves lists stay single objects
        # instead of numpy turning them into a second dimension.
        array = np.empty(len(value), dtype=object)
        for i, item in enumerate(value):
            array[i] = item
        return array
    raise TypeError(f"non_tensor_batch[{key!r}] must be a list or a np.ndarray, got {type(value).__name__}")


def key_list(keys, argument: str) -> list:
    if keys is None:
        return []
    if isinstance(keys, str):
        return [keys]
    if not isinstance(keys, (list, tuple, set)):
        raise TypeError(f"{argument} must be a list of keys, got {type(keys).__name__}")
    return list(keys)


def require_keys(where: str, wanted: list, available) -> None:
    available = list(available)
    for key in wanted:
        if key not in available:
            raise KeyError(f"{where} has no key {key!r}; available: {sorted(map(str, available))}")


def values_equal(a: Any, b: Any) -> bool:
    """Equality for union conflicts: tensors and arrays by value, NaN equal to NaN."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        b = b.to(a.device)
        if a.is_floating_point() or a.is_complex():
            return bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
        return bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        if a.dtype == object or b.dtype == object:
            return all(values_equal(x, y) for x, y in zip(a.reshape(-1), b.reshape(-1)))
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc" and b.dtype.kind in "fc"))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return bool(a == b)


def tensor_batch_size(tensors: dict, num_batch_dims: int) -> tuple | None:
    """The first `num_batch_dims` dimensions, which every tensor must share (None: no tensors)."""
    if not isinstance(num_batch_dims, int) or num_batch_dims < 1:
        raise ValueError(f"num_batch_dims must be a positive int, got {num_batch_dims!r}")
    pivot_key, batch_size = None, None
    for key, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensors[{key!r}] must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() < num_batch_dims:
            raise ValueError(f"tensors[{key!r}] has {tensor.dim()} dims but num_batch_dims is {num_batch_dims}")
        shape = tuple(tensor.shape[:num_batch_dims])
        if batch_size is None:
            pivot_key, batch_size = key, shape
        elif shape != batch_size:
            raise ValueError(f"tensors[{key!r}] has batch shape {shape} but tensors[{pivot_key!r}] has {batch_size}")
    return batch_size


def index_arrays(idxs, rows: int, device, allow_mask: bool) -> tuple[torch.Tensor, np.ndarray]:
    """Row indices (or, with `allow_mask`, a boolean mask of `rows` entries) checked, as a
    tensor on `device` (None: the CPU) and as a numpy array."""
    if isinstance(idxs, torch.Tensor):
        idx_np = idxs.detach().cpu().numpy()
    elif isinstance(idxs, (list, tuple, np.ndarray)):
        idx_np = np.asarray(idxs)
        if idx_np.size == 0:
            idx_np = idx_np.astype(np.int64)
    else:
        raise TypeError(f"indices must be a list, np.ndarray or torch.Tensor, got {type(idxs).__name__}")
    if idx_np.ndim != 1:
        raise ValueError(f"indices must be 1-D, got shape {idx_np.shape}")
    if idx_np.dtype == np.bool_:
        if not allow_mask:
            raise TypeError("a boolean mask is not an order; pass integer indices")
        if idx_np.shape[0] != rows:
            raise ValueError(f"boolean mask has {idx_np.shape[0]} entries but the DataProto has {rows} rows")
    elif np.issubdtype(idx_np.dtype, np.integer):
        idx_np = idx_np.astype(np.int64)
        out_of_range = idx_np[(idx_np < -rows) | (idx_np >= rows)]
        if out_of_range.size:
            raise IndexError(f"index {int(out_of_range[0])} is out of range for {rows} rows")
    else:
        raise TypeError(f"indices must be integers or booleans, got dtype {idx_np.dtype}")
    idx_torch = torch.from_numpy(idx_np)
    if device is not None:
        idx_torch = idx_torch.to(device)
    return idx_torch, idx_np


def _odd_key(kind: str, keys: set, other_keys: set, i: int) -> ValueError:
    odd = sorted(keys ^ other_keys)[0]
    return ValueError(
        f"concat: {kind} key {odd!r} is in {'item 0' if odd in keys else f'item {i}'} "
        f"but not in {f'item {i}' if odd in keys else 'item 0'}"
    )


def check_concat(data: list) -> None:
    """The items of `DataProto.concat` hold the same keys, and tensors of the same shapes
    beyond the rows, as item 0 (tensor batches in all or in none)."""
    first = data[0]
    if first.batch is not None:
        keys = set(first.batch.keys())
        for i, item in enumerate(data[1:], start=1):
            if item.batch is None:
                raise ValueError(f"concat: item {i} has no tensor batch but item 0 has {sorted(keys)}")
            if set(item.batch.keys()) != keys:
                raise _odd_key("batch", keys, set(item.batch.keys()), i)
            if item.batch.batch_size[1:] != first.batch.batch_size[1:]:
                raise ValueError(
                    f"concat: item {i} has batch_size {list(item.batch.batch_size)} but item 0 has "
                    f"{list(first.batch.batch_size)}"
                )
            for key in keys:
                if item.batch[key].shape[1:] != first.batch[key].shape[1:]:
                    raise ValueError(
                        f"concat: batch[{key!r}] has shape {list(item.batch[key].shape)} in item {i} "
                        f"but {list(first.batch[key].shape)} in item 0"
                    )
    else:
        for i, item in enumerate(data[1:], start=1):
            if item.batch is not None:
                raise ValueError(f"concat: item {i} has a tensor batch but item 0 has none")
    keys = set(first.non_tensor_batch)
    for i, item in enumerate(data[1:], start=1):
        if set(item.non_tensor_batch) != keys:
            raise _odd_key("non_tensor_batch", keys, set(item.non_tensor_batch), i)
