"""DataProto: the batch that every call between the driver and the workers carries.

Tensors live in a TensorDict (`batch`), per-row Python objects (prompts, ground truths,
uids) in numpy object arrays (`non_tensor_batch`), and per-call settings in `meta_info`.
Method names and semantics follow verl's `verl/protocol.py`; every operation first checks
that all row-indexed fields agree in length and names the key that does not (the argument
checks are in protocol/data_proto_checks.py). The file format of `save_to_disk` /
`load_from_disk` is in protocol/data_proto_disk.py.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from tensordict import TensorDict

from protocol.data_proto_checks import (
    as_object_array,
    check_concat,
    index_arrays,
    key_list,
    require_keys,
    tensor_batch_size,
    values_equal,
)
from protocol.data_proto_disk import load_fields, save_fields

__all__ = ["DataProto", "DataProtoItem", "pad_dataproto_to_divisor", "unpad_dataproto"]


@dataclass(eq=False)
class DataProtoItem:
    """One row of a DataProto: `batch` has no batch dimension, non-tensors are the row's objects."""

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


@dataclass(eq=False)  # field-wise == on TensorDicts returns a TensorDict, not a bool
class DataProto:
    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __post_init__(self):
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(
        cls,
        tensors: dict | None = None,
        non_tensors: dict | None = None,
        meta_info: dict | None = None,
        num_batch_dims: int = 1,
    ) -> DataProto:
        """Tensors must agree on their first `num_batch_dims` dimensions; lists and arrays
        in `non_tensors` become object arrays."""
        tensors = dict(tensors or {})
        batch_size = tensor_batch_size(tensors, num_batch_dims)
        batch = TensorDict(source=tensors, batch_size=batch_size) if tensors else None
        non_tensor_batch = {key: as_object_array(key, value) for key, value in (non_tensors or {}).items()}
        return cls(batch=batch, non_tensor_batch=non_tensor_batch, meta_info=dict(meta_info or {}))

    @classmethod
    def from_single_dict(cls, data: dict, meta_info: dict | None = None) -> DataProto:
        """Split a collated dict: tensors go to `batch`, lists and arrays to `non_tensor_batch`."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, (np.ndarray, list, tuple)):
                non_tensors[key] = value
            else:
                raise TypeError(
                    f"data[{key!r}] has unsupported type {type(value).__name__}; "
                    "expected a torch.Tensor, a np.ndarray or a list"
                )
        return cls.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)

    # ------------------------------------------------------------------ checks and info
    def check_consistency(self) -> None:
        if self.batch is not None:
            if not isinstance(self.batch, TensorDict):
                raise TypeError(f"batch must be a TensorDict or None, got {type(self.batch).__name__}")
            if len(self.batch.batch_size) == 0:
                raise ValueError("batch has no batch dimension (batch_size=[])")
        if not isinstance(self.non_tensor_batch, dict):
            raise TypeError(f"non_tensor_batch must be a dict, got {type(self.non_tensor_batch).__name__}")
        if not isinstance(self.meta_info, dict):
            raise TypeError(f"meta_info must be a dict, got {type(self.meta_info).__name__}")
        reference, rows = ("batch", self.batch.batch_size[0]) if self.batch is not None else (None, None)
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray) or value.dtype != object:
                kind = f"np.ndarray of dtype {value.dtype}" if isinstance(value, np.ndarray) else type(value).__name__
                raise TypeError(
                    f"non_tensor_batch[{key!r}] must be a np.ndarray with dtype=object, got {kind}; "
                    "use np.array(values, dtype=object) or DataProto.from_dict"
                )
            if value.ndim == 0:
                raise ValueError(f"non_tensor_batch[{key!r}] is a 0-d array; it needs a batch dimension")
            if rows is None:
                reference, rows = f"non_tensor_batch[{key!r}]", value.shape[0]
            elif value.shape[0] != rows:
                raise ValueError(f"non_tensor_batch[{key!r}] has {value.shape[0]} rows but {reference} has {rows}")

    def _has_rows(self) -> bool:
        return self.batch is not None or bool(self.non_tensor_batch)

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        for value in self.non_tensor_batch.values():
            return int(value.shape[0])
        return 0

    def get_data_info(self) -> str:
        parts = []
        if self.batch is not None:
            fields = []
            for key, value in self.batch.items():
                if isinstance(value, torch.Tensor):
                    fields.append(f"{key}: {str(value.dtype).removeprefix('torch.')}{list(value.shape)}")
                else:
                    fields.append(f"{key}: {type(value).__name__}{list(value.batch_size)}")
            parts.append("batch={" + ", ".join(fields) + "}")
        if self.non_tensor_batch:
            fields = [f"{key}: object{list(value.shape)}" for key, value in self.non_tensor_batch.items()]
            parts.append("non_tensor_batch={" + ", ".join(fields) + "}")
        if self.meta_info:
            parts.append(f"meta_info_keys={sorted(map(str, self.meta_info))}")
        return ", ".join([f"len={len(self)}"] + parts)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.get_data_info()})"

    # ------------------------------------------------------------------ row selection
    def _rows_like(self, batch: TensorDict | None, non_tensor_batch: dict) -> DataProto:
        # meta_info is copied, not shared, so a worker that sets keys on its chunk leaves
        # the driver's batch alone (under Ray the pickling makes that copy anyway).
        return type(self)(batch=batch, non_tensor_batch=non_tensor_batch, meta_info=dict(self.meta_info))

    def _index_arrays(self, idxs, allow_mask: bool) -> tuple[torch.Tensor, np.ndarray]:
        device = self.batch.device if self.batch is not None else None
        return index_arrays(idxs, len(self), device, allow_mask)

    def select_idxs(self, idxs) -> DataProto:
        """Rows by integer indices or by a boolean mask of length len(self)."""
        self.check_consistency()
        idx_torch, idx_np = self._index_arrays(idxs, allow_mask=True)
        batch = self.batch[idx_torch] if self.batch is not None else None
        return self._rows_like(batch, {key: value[idx_np] for key, value in self.non_tensor_batch.items()})

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        self.check_consistency()
        window = slice(start, end, step)
        batch = self.batch[window] if self.batch is not None else None
        return self._rows_like(batch, {key: value[window] for key, value in self.non_tensor_batch.items()})

    def __getitem__(self, item):
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, torch.Tensor) and item.dim() == 0 and not item.is_floating_point():
            item = int(item)
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            self.check_consistency()
            rows = len(self)
            if not -rows <= item < rows:
                raise IndexError(f"index {item} is out of range for {rows} rows")
            batch = self.batch[int(item)] if self.batch is not None else None
            non_tensors = {key: value[item] for key, value in self.non_tensor_batch.items()}
            return DataProtoItem(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(self.meta_info))
        if isinstance(item, (list, np.ndarray, torch.Tensor)):
            return self.select_idxs(item)
        raise TypeError(
            f"DataProto indices must be int, slice, list, np.ndarray or torch.Tensor, got {type(item).__name__}"
        )

    def __iter__(self) -> Iterator[DataProtoItem]:
        for i in range(len(self)):
            yield self[i]

    def reorder(self, indices) -> None:
        """Permute the rows in place (like verl); `indices` must be a permutation of range(len)."""
        self.check_consistency()
        idx_torch, idx_np = self._index_arrays(indices, allow_mask=False)
        rows = len(self)
        # Reordering with a repeated or missing index would silently duplicate or drop samples.
        if idx_np.shape[0] != rows or not np.array_equal(np.sort(idx_np % max(rows, 1)), np.arange(rows)):
            raise ValueError(
                f"reorder needs a permutation of range({rows}), got {idx_np.shape[0]} indices "
                f"that are not one: {idx_np[:10].tolist()}"
            )
        if self.batch is not None:
            self.batch = self.batch[idx_torch]
        self.non_tensor_batch = {key: value[idx_np] for key, value in self.non_tensor_batch.items()}

    # ------------------------------------------------------------------ key selection
    def select(
        self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None, deepcopy: bool = False
    ) -> DataProto:
        """A DataProto with the given keys (None: all). Tensors are shared with self; with
        `deepcopy`, non-tensors and meta_info are deep-copied (as in verl)."""
        self.check_consistency()
        batch = None
        if self.batch is not None:
            keys = list(self.batch.keys()) if batch_keys is None else key_list(batch_keys, "batch_keys")
            require_keys("batch", keys, self.batch.keys())
            batch = self.batch.select(*keys)
        elif batch_keys:
            require_keys("batch", key_list(batch_keys, "batch_keys"), [])
        if non_tensor_batch_keys is None:
            non_tensors = dict(self.non_tensor_batch)
        else:
            keys = key_list(non_tensor_batch_keys, "non_tensor_batch_keys")
            require_keys("non_tensor_batch", keys, self.non_tensor_batch.keys())
            non_tensors = {key: self.non_tensor_batch[key] for key in keys}
        if meta_info_keys is None:
            meta_info = dict(self.meta_info)
        else:
            keys = key_list(meta_info_keys, "meta_info_keys")
            require_keys("meta_info", keys, self.meta_info.keys())
            meta_info = {key: self.meta_info[key] for key in keys}
        if deepcopy:
            non_tensors, meta_info = copy.deepcopy(non_tensors), copy.deepcopy(meta_info)
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=meta_info)

    def pop(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None) -> DataProto:
        """Remove the given keys from self and return them as a new DataProto."""
        self.check_consistency()
        batch_keys = key_list(batch_keys, "batch_keys")
        non_tensor_keys = key_list(non_tensor_batch_keys, "non_tensor_batch_keys")
        meta_keys = key_list(meta_info_keys, "meta_info_keys")
        # Check every key before removing any, so a typo leaves self untouched.
        require_keys("batch", batch_keys, self.batch.keys() if self.batch is not None else [])
        require_keys("non_tensor_batch", non_tensor_keys, self.non_tensor_batch.keys())
        require_keys("meta_info", meta_keys, self.meta_info.keys())
        batch = None
        if batch_keys:
            tensors = {key: self.batch.pop(key) for key in batch_keys}
            batch = TensorDict(source=tensors, batch_size=self.batch.batch_size, device=self.batch.device)
        non_tensors = {key: self.non_tensor_batch.pop(key) for key in non_tensor_keys}
        meta_info = {key: self.meta_info.pop(key) for key in meta_keys}
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=meta_info)

    def rename(self, old_keys=None, new_keys=None) -> DataProto:
        """Rename tensor or non-tensor keys in place; returns self."""
        old_keys = key_list(old_keys, "old_keys")
        new_keys = key_list(new_keys, "new_keys")
        if len(old_keys) != len(new_keys):
            raise ValueError(f"rename got {len(old_keys)} old keys but {len(new_keys)} new keys")
        batch_keys = list(self.batch.keys()) if self.batch is not None else []
        for old, new in zip(old_keys, new_keys):
            if new in batch_keys or new in self.non_tensor_batch:
                raise ValueError(f"cannot rename {old!r} to {new!r}: {new!r} already exists")
            if old in batch_keys:
                self.batch.rename_key_(old, new)
                batch_keys = list(self.batch.keys())
            elif old in self.non_tensor_batch:
                self.non_tensor_batch[new] = self.non_tensor_batch.pop(old)
            else:
                raise KeyError(f"cannot rename {old!r}: no such key in batch or non_tensor_batch")
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge other's keys into self in place (returns self). A key present in both must
        hold equal values; a conflict names the key and changes nothing."""
        if not isinstance(other, DataProto):
            raise TypeError(f"union needs a DataProto, got {type(other).__name__}")
        self.check_consistency()
        other.check_consistency()
        if self._has_rows() and other._has_rows() and len(self) != len(other):
            raise ValueError(f"cannot union: self has {len(self)} rows but other has {len(other)}")
        if self.batch is not None and other.batch is not None:
            for key in other.batch.keys():
                if key in self.batch.keys() and not values_equal(self.batch[key], other.batch[key]):
                    raise ValueError(f"union conflict: batch[{key!r}] differs between the two DataProtos")
        for key, value in other.non_tensor_batch.items():
            if key in self.non_tensor_batch and not values_equal(self.non_tensor_batch[key], value):
                raise ValueError(f"union conflict: non_tensor_batch[{key!r}] differs between the two DataProtos")
        for key, value in other.meta_info.items():
            if key in self.meta_info and not values_equal(self.meta_info[key], value):
                raise ValueError(
                    f"union conflict: meta_info[{key!r}] is {self.meta_info[key]!r} in self but {value!r} in other"
                )
        if other.batch is not None:
            if self.batch is None:
                self.batch = other.batch.select(*other.batch.keys())
            else:
                for key in other.batch.keys():
                    self.batch[key] = other.batch[key]
        self.non_tensor_batch.update(other.non_tensor_batch)
        self.meta_info.update(other.meta_info)
        self.check_consistency()
        return self

    # ------------------------------------------------------------------ combining and splitting
    @staticmethod
    def concat(data: list[DataProto]) -> DataProto:
        """Rows of all items in order; meta_info is the first item's."""
        data = list(data)
        if not data:
            raise ValueError("DataProto.concat needs at least one DataProto")
        for i, item in enumerate(data):
            if not isinstance(item, DataProto):
                raise TypeError(f"concat: item {i} is a {type(item).__name__}, not a DataProto")
            item.check_consistency()
        check_concat(data)
        first = data[0]
        batch = torch.cat([item.batch for item in data], dim=0) if first.batch is not None else None
        non_tensors = {
            key: np.concatenate([item.non_tensor_batch[key] for item in data], axis=0) for key in first.non_tensor_batch
        }
        return type(first)(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(first.meta_info))

    def chunk(self, chunks: int) -> list[DataProto]:
        """`chunks` equal consecutive pieces; the length must divide (pad first otherwise)."""
        if not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"chunks must be a positive int, got {chunks!r}")
        self.check_consistency()
        rows = len(self)
        if rows % chunks:
            raise ValueError(
                f"cannot chunk a DataProto of {rows} rows into {chunks} equal chunks; "
                "pad it first with pad_dataproto_to_divisor"
            )
        size = rows // chunks
        return [self.slice(i * size, (i + 1) * size) for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive pieces of `split_size` rows; the last one may be shorter."""
        if not isinstance(split_size, int) or split_size < 1:
            raise ValueError(f"split_size must be a positive int, got {split_size!r}")
        self.check_consistency()
        return [self.slice(start, start + split_size) for start in range(0, len(self), split_size)]

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """interleave=True: a a b b; interleave=False: a b a b."""
        if not isinstance(repeat_times, int) or repeat_times < 1:
            raise ValueError(f"repeat_times must be a positive int, got {repeat_times!r}")
        self.check_consistency()
        batch = None
        if self.batch is not None:
            if interleave:

                def expand(tensor):
                    return tensor.repeat_interleave(repeat_times, dim=0)
            else:

                def expand(tensor):
                    return tensor.repeat(repeat_times, *([1] * (tensor.dim() - 1)))

            size = [len(self) * repeat_times, *self.batch.batch_size[1:]]
            batch = self.batch.apply(expand, batch_size=size)
        non_tensors = {}
        for key, value in self.non_tensor_batch.items():
            if interleave:
                non_tensors[key] = np.repeat(value, repeat_times, axis=0)
            else:
                non_tensors[key] = np.tile(value, (repeat_times,) + (1,) * (value.ndim - 1))
        return self._rows_like(batch, non_tensors)

    def make_iterator(
        self, mini_batch_size: int, epochs: int, seed: int | None = None, dataloader_kwargs: dict | None = None
    ) -> Iterator[DataProto]:
        """Mini-batches for `epochs` passes. With dataloader_kwargs={"shuffle": True} each epoch
        is a fresh permutation drawn from one torch.Generator seeded with `seed`, so a seed
        fixes the whole sequence. The length must be a multiple of mini_batch_size."""
        dataloader_kwargs = dict(dataloader_kwargs or {})
        unknown = sorted(set(dataloader_kwargs) - {"shuffle"})
        if unknown:
            raise TypeError(f"make_iterator supports only dataloader_kwargs['shuffle'], got {unknown}")
        shuffle = bool(dataloader_kwargs.get("shuffle", False))
        if not isinstance(mini_batch_size, int) or mini_batch_size < 1:
            raise ValueError(f"mini_batch_size must be a positive int, got {mini_batch_size!r}")
        if not isinstance(epochs, int) or epochs < 0:
            raise ValueError(f"epochs must be a non-negative int, got {epochs!r}")
        self.check_consistency()
        rows = len(self)
        if rows % mini_batch_size:
            raise ValueError(f"DataProto of {rows} rows does not divide into mini-batches of {mini_batch_size}")
        generator = None
        if seed is not None:
            generator = torch.Generator()
            generator.manual_seed(int(seed))

        def mini_batches():
            for _ in range(epochs):
                order = torch.randperm(rows, generator=generator) if shuffle else torch.arange(rows)
                for start in range(0, rows, mini_batch_size):
                    yield self.select_idxs(order[start : start + mini_batch_size])

        return mini_batches()

    # ------------------------------------------------------------------ devices and disk
    def to(self, device) -> DataProto:
        """Move the tensors in place; returns self."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def save_to_disk(self, path: str | os.PathLike) -> None:
        """Write a file that torch.load(weights_only=True) can read: tensors on CPU, non-tensor
        rows as Python lists. Numpy scalars are stored as Python scalars."""
        self.check_consistency()
        save_fields(path, self.batch, self.non_tensor_batch, self.meta_info)

    @classmethod
    def load_from_disk(cls, path: str | os.PathLike) -> DataProto:
        batch, non_tensors, meta_info = load_fields(path)
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta_info)


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Append copies of the first rows (cycling when the batch is short) until len divides
    `size_divisor`; returns the padded data and how many rows were added."""
    if not isinstance(data, DataProto):
        raise TypeError(f"pad_dataproto_to_divisor needs a DataProto, got {type(data).__name__}")
    if not isinstance(size_divisor, int) or size_divisor < 1:
        raise ValueError(f"size_divisor must be a positive int, got {size_divisor!r}")
    rows = len(data)
    if rows % size_divisor == 0:
        return data, 0
    pad_size = size_divisor - rows % size_divisor
    pieces, remaining = [data], pad_size
    while remaining > 0:
        take = min(remaining, rows)
        pieces.append(data[:take])
        remaining -= take
    return DataProto.concat(pieces), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last `pad_size` rows added by pad_dataproto_to_divisor."""
    if not isinstance(pad_size, int) or pad_size < 0:
        raise ValueError(f"pad_size must be a non-negative int, got {pad_size!r}")
    if pad_size > len(data):
        raise ValueError(f"cannot remove {pad_size} padding rows from a DataProto of {len(data)} rows")
    return data[: len(data) - pad_size] if pad_size else data
