"""How a worker group turns one call into one call per rank and the ranks' results back into one.

A worker method declares its mode with `@register(dispatch_mode=...)`; the worker group
reads it with `get_registration`, splits the arguments with `dispatch_to_ranks`, runs every
rank, and merges the outputs with `collect_from_ranks`. Nothing here knows about Ray or
processes, so the same split/collect runs in-process and in tests.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import Enum
from typing import Any

from protocol.data_proto import DataProto, pad_dataproto_to_divisor, unpad_dataproto

__all__ = ["MAGIC_ATTR", "Dispatch", "register", "get_registration", "dispatch_to_ranks", "collect_from_ranks"]

# verl's attribute name, so that code inspecting registered methods finds them the same way.
MAGIC_ATTR = "attrs_3141562937"


class Dispatch(Enum):
    ONE_TO_ALL = "one_to_all"  # every rank gets the same arguments; result: list of outputs
    ALL_TO_ALL = "all_to_all"  # rank i gets element i of every argument; result: list of outputs
    RANK_ZERO = "rank_zero"  # every rank runs (collectives need all); result: rank 0's output
    DP_COMPUTE_PROTO = "dp_compute_proto"  # DataProtos split by rank, outputs concatenated


def register(dispatch_mode: Dispatch = Dispatch.ALL_TO_ALL) -> Callable:
    """Mark a worker method with how its group call is dispatched and collected."""
    if not isinstance(dispatch_mode, Dispatch):
        raise TypeError(f"dispatch_mode must be a Dispatch member, got {dispatch_mode!r}")

    def decorator(func: Callable) -> Callable:
        @functools.wraps(func)
        def inner(*args, **kwargs):
            return func(*args, **kwargs)

        setattr(inner, MAGIC_ATTR, {"dispatch_mode": dispatch_mode})
        return inner

    return decorator


def get_registration(fn: Any) -> dict | None:
    """The {"dispatch_mode": Dispatch} a method was registered with, or None."""
    attrs = getattr(fn, MAGIC_ATTR, None)
    return dict(attrs) if attrs is not None else None


def _argument_name(position: int | str) -> str:
    return f"argument {position}" if isinstance(position, int) else f"argument {position!r}"


def _dispatch_all_to_all(world_size: int, args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
    named = list(enumerate(args)) + list(kwargs.items())
    for position, value in named:
        if not isinstance(value, (list, tuple)):
            raise TypeError(
                f"ALL_TO_ALL {_argument_name(position)} must be a list or tuple of length "
                f"world_size={world_size}, got {type(value).__name__}"
            )
        if len(value) != world_size:
            raise ValueError(
                f"ALL_TO_ALL {_argument_name(position)} has length {len(value)} but world_size is {world_size}"
            )
    return [
        (tuple(arg[rank] for arg in args), {key: value[rank] for key, value in kwargs.items()})
        for rank in range(world_size)
    ]


def _dispatch_dp_proto(world_size: int, args: tuple, kwargs: dict) -> tuple[list[tuple[tuple, dict]], dict]:
    named = list(enumerate(args)) + list(kwargs.items())
    protos = [(position, value) for position, value in named if isinstance(value, DataProto)]
    lengths = {position: len(value) for position, value in protos}
    if len(set(lengths.values())) > 1:
        described = ", ".join(f"{_argument_name(position)} has {rows} rows" for position, rows in lengths.items())
        raise ValueError(f"DP_COMPUTE_PROTO needs DataProto arguments of equal length: {described}")
    pad_size, padded_len = 0, 0
    chunks: dict[int | str, list[DataProto]] = {}
    for position, value in protos:
        padded, pad_size = pad_dataproto_to_divisor(value, world_size)
        padded_len = len(padded)
        chunks[position] = padded.chunk(world_size)
    per_rank = []
    for rank in range(world_size):
        rank_args = tuple(chunks[i][rank] if i in chunks else arg for i, arg in enumerate(args))
        rank_kwargs = {key: chunks[key][rank] if key in chunks else value for key, value in kwargs.items()}
        per_rank.append((rank_args, rank_kwargs))
    return per_rank, {"pad_size": pad_size, "padded_len": padded_len}


def dispatch_to_ranks(
    mode: Dispatch, world_size: int, args: tuple, kwargs: dict
) -> tuple[list[tuple[tuple, dict]], dict]:
    """One (args, kwargs) per rank, and the context `collect_from_ranks` needs."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    args, kwargs = tuple(args), dict(kwargs)
    if mode in (Dispatch.ONE_TO_ALL, Dispatch.RANK_ZERO):
        return [(args, dict(kwargs)) for _ in range(world_size)], {}
    if mode is Dispatch.ALL_TO_ALL:
        return _dispatch_all_to_all(world_size, args, kwargs), {}
    if mode is Dispatch.DP_COMPUTE_PROTO:
        return _dispatch_dp_proto(world_size, args, kwargs)
    raise ValueError(f"unknown dispatch mode {mode!r}")


def _collect_dp_proto(outputs: list, context: dict) -> Any:
    are_protos = [isinstance(output, DataProto) for output in outputs]
    if not any(are_protos):
        return list(outputs)  # e.g. per-rank metric dicts
    if not all(are_protos):
        rank = are_protos.index(False)
        raise TypeError(
            f"DP_COMPUTE_PROTO: rank {rank} returned a {type(outputs[rank]).__name__} "
            "while other ranks returned DataProto"
        )
    merged = DataProto.concat(outputs)
    pad_size, padded_len = context.get("pad_size", 0), context.get("padded_len", 0)
    rows = len(merged)
    if pad_size == 0 or rows == 0:
        # rows == 0: outputs that carry only meta_info (e.g. metrics) have no padding rows.
        return merged
    # A method may return several rows per input row (n samples per prompt, interleaved);
    # the padding inputs are the last ones, so their outputs are the last rows.
    if rows % padded_len:
        raise ValueError(
            f"DP_COMPUTE_PROTO: the ranks returned {rows} rows for {padded_len} padded input rows; "
            f"cannot tell which of them belong to the {pad_size} padding rows"
        )
    return unpad_dataproto(merged, pad_size * (rows // padded_len))


def collect_from_ranks(mode: Dispatch, outputs: list, context: dict) -> Any:
    """Merge the ranks' outputs (in rank order) the way `mode` says."""
    outputs = list(outputs)
    if not outputs:
        raise ValueError("collect_from_ranks got no outputs")
    if mode in (Dispatch.ONE_TO_ALL, Dispatch.ALL_TO_ALL):
        return outputs
    if mode is Dispatch.RANK_ZERO:
        return outputs[0]
    if mode is Dispatch.DP_COMPUTE_PROTO:
        return _collect_dp_proto(outputs, context or {})
    raise ValueError(f"unknown dispatch mode {mode!r}")
