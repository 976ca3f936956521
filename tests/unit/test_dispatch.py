"""Dispatch modes: registration, splitting a call across ranks, and collecting the results."""

from __future__ import annotations

import pytest
import torch

from protocol.data_proto import DataProto
from protocol.dispatch import (
    MAGIC_ATTR,
    Dispatch,
    collect_from_ranks,
    dispatch_to_ranks,
    get_registration,
    register,
)


def make(rows: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(rows, dtype=torch.float32)},
        non_tensors={"uid": [f"u{i}" for i in range(rows)]},
        meta_info={"temperature": 0.5},
    )


def run_ranks(mode, world_size, fn, *args, **kwargs):
    """What a worker group does: split, run each rank in order, collect."""
    per_rank, context = dispatch_to_ranks(mode, world_size, args, kwargs)
    assert len(per_rank) == world_size
    outputs = [fn(rank, *rank_args, **rank_kwargs) for rank, (rank_args, rank_kwargs) in enumerate(per_rank)]
    return collect_from_ranks(mode, outputs, context)


# ---- registration ----------------------------------------------------------------------------


class Worker:
    def __init__(self, rank: int):
        self.rank = rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        """Doubles x."""
        return DataProto.from_dict(tensors={"doubled": data.batch["x"] * 2})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        return self.rank

    def helper(self):
        return None


def test_register_stores_mode_and_keeps_the_method():
    assert get_registration(Worker.double) == {"dispatch_mode": Dispatch.DP_COMPUTE_PROTO}
    assert get_registration(Worker.init_model) == {"dispatch_mode": Dispatch.ONE_TO_ALL}
    assert getattr(Worker.double, MAGIC_ATTR)["dispatch_mode"] is Dispatch.DP_COMPUTE_PROTO
    assert get_registration(Worker.helper) is None
    assert Worker.double.__name__ == "double" and Worker.double.__doc__ == "Doubles x."
    worker = Worker(rank=3)
    assert get_registration(worker.init_model)["dispatch_mode"] is Dispatch.ONE_TO_ALL  # bound method
    assert worker.init_model() == 3
    assert worker.double(make(2)).batch["doubled"].tolist() == [0.0, 2.0]


def test_register_default_and_bad_mode():
    @register()
    def fn():
        return 1

    assert get_registration(fn) == {"dispatch_mode": Dispatch.ALL_TO_ALL}
    with pytest.raises(TypeError, match="dispatch_mode must be a Dispatch member, got 'dp'"):
        register(dispatch_mode="dp")


# ---- ONE_TO_ALL, RANK_ZERO, ALL_TO_ALL --------------------------------------------------------


def test_one_to_all_sends_the_same_arguments_and_returns_the_list():
    per_rank, _ = dispatch_to_ranks(Dispatch.ONE_TO_ALL, 3, ("cfg",), {"lr": 0.1})
    assert per_rank == [(("cfg",), {"lr": 0.1})] * 3
    outputs = run_ranks(Dispatch.ONE_TO_ALL, 3, lambda rank, cfg, lr: (rank, cfg, lr), "cfg", lr=0.1)
    assert outputs == [(0, "cfg", 0.1), (1, "cfg", 0.1), (2, "cfg", 0.1)]


def test_rank_zero_runs_every_rank_and_returns_rank_zero_output():
    ran = []

    def fn(rank, path):
        ran.append(rank)
        return f"rank{rank}:{path}"

    assert run_ranks(Dispatch.RANK_ZERO, 4, fn, "/ckpt") == "rank0:/ckpt"
    assert ran == [0, 1, 2, 3]


def test_all_to_all_gives_rank_i_element_i():
    outputs = run_ranks(Dispatch.ALL_TO_ALL, 2, lambda rank, a, b=None: (rank, a, b), [10, 11], b=("x", "y"))
    assert outputs == [(0, 10, "x"), (1, 11, "y")]


def test_all_to_all_length_errors_name_the_argument():
    with pytest.raises(ValueError, match="ALL_TO_ALL argument 0 has length 3 but world_size is 2"):
        dispatch_to_ranks(Dispatch.ALL_TO_ALL, 2, ([1, 2, 3],), {})
    with pytest.raises(ValueError, match="ALL_TO_ALL argument 'seeds' has length 1 but world_size is 2"):
        dispatch_to_ranks(Dispatch.ALL_TO_ALL, 2, ([1, 2],), {"seeds": [0]})
    with pytest.raises(TypeError, match="argument 0 must be a list or tuple of length world_size=2, got int"):
        dispatch_to_ranks(Dispatch.ALL_TO_ALL, 2, (5,), {})


def test_world_size_must_be_positive():
    with pytest.raises(ValueError, match="world_size must be a positive int, got 0"):
        dispatch_to_ranks(Dispatch.ONE_TO_ALL, 0, (), {})
    with pytest.raises(ValueError, match="collect_from_ranks got no outputs"):
        collect_from_ranks(Dispatch.RANK_ZERO, [], {})


# ---- DP_COMPUTE_PROTO ------------------------------------------------------------------------


def double_rows(rank, data: DataProto, scale: float = 2.0) -> DataProto:
    return DataProto.from_dict(
        tensors={"y": data.batch["x"] * scale},
        non_tensors={"uid": list(data.non_tensor_batch["uid"]), "rank": [rank] * len(data)},
        meta_info={"rank": rank},
    )


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("rows", [4, 5, 7])
def test_dp_compute_proto_round_trip(world_size, rows):
    data = make(rows)
    per_rank, context = dispatch_to_ranks(Dispatch.DP_COMPUTE_PROTO, world_size, (data,), {"scale": 3.0})
    padded = rows + (-rows) % world_size
    assert context["pad_size"] == padded - rows
    assert [len(args[0]) for args, _ in per_rank] == [padded // world_size] * world_size
    assert all(kwargs == {"scale": 3.0} for _, kwargs in per_rank)
    # chunks are consecutive in rank order, padding repeats rows from the start
    sent = torch.cat([args[0].batch["x"] for args, _ in per_rank]).tolist()
    assert sent == [float(i % rows) for i in range(padded)]
    assert all(args[0].meta_info == {"temperature": 0.5} for args, _ in per_rank)

    result = run_ranks(Dispatch.DP_COMPUTE_PROTO, world_size, double_rows, data, scale=3.0)
    assert result.batch["y"].tolist() == (data.batch["x"] * 3.0).tolist()
    assert result.non_tensor_batch["uid"].tolist() == [f"u{i}" for i in range(rows)]
    chunk = padded // world_size
    assert result.non_tensor_batch["rank"].tolist() == [i // chunk for i in range(rows)]
    assert result.meta_info == {"rank": 0}  # concat keeps the first rank's meta_info


def test_dp_compute_proto_chunks_do_not_share_meta_info_with_the_caller():
    data = make(4)
    per_rank, _ = dispatch_to_ranks(Dispatch.DP_COMPUTE_PROTO, 2, (data,), {})
    per_rank[0][0][0].meta_info["micro_batch_size"] = 8
    assert data.meta_info == {"temperature": 0.5}


def test_dp_compute_proto_several_outputs_per_input_row():
    def two_samples(rank, data):
        return data.repeat(2, interleave=True)

    result = run_ranks(Dispatch.DP_COMPUTE_PROTO, 2, two_samples, make(3))
    assert result.batch["x"].tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]


def test_dp_compute_proto_non_proto_outputs_are_returned_as_a_list():
    result = run_ranks(Dispatch.DP_COMPUTE_PROTO, 3, lambda rank, data: {"loss": float(len(data)) + rank}, make(5))
    assert result == [{"loss": 2.0}, {"loss": 3.0}, {"loss": 4.0}]


def test_dp_compute_proto_meta_only_outputs_are_not_unpadded():
    def metrics(rank, data):
        return DataProto(meta_info={"metrics": {"rows": len(data), "rank": rank}})

    result = run_ranks(Dispatch.DP_COMPUTE_PROTO, 2, metrics, make(5))
    assert len(result) == 0 and result.meta_info == {"metrics": {"rows": 3, "rank": 0}}


def test_dp_compute_proto_multiple_protos_and_errors():
    per_rank, context = dispatch_to_ranks(Dispatch.DP_COMPUTE_PROTO, 2, (make(3),), {"other": make(3)})
    assert context["pad_size"] == 1
    assert [args[0].batch["x"].tolist() for args, _ in per_rank] == [[0.0, 1.0], [2.0, 0.0]]
    assert [kwargs["other"].batch["x"].tolist() for _, kwargs in per_rank] == [[0.0, 1.0], [2.0, 0.0]]
    with pytest.raises(ValueError, match="argument 0 has 3 rows, argument 'other' has 4 rows"):
        dispatch_to_ranks(Dispatch.DP_COMPUTE_PROTO, 2, (make(3),), {"other": make(4)})
    with pytest.raises(TypeError, match="rank 1 returned a dict while other ranks returned DataProto"):
        collect_from_ranks(Dispatch.DP_COMPUTE_PROTO, [make(2), {}], {"pad_size": 0, "padded_len": 4})
    with pytest.raises(ValueError, match="the ranks returned 5 rows for 4 padded input rows"):
        collect_from_ranks(Dispatch.DP_COMPUTE_PROTO, [make(2), make(3)], {"pad_size": 1, "padded_len": 4})


def test_dp_compute_proto_with_a_worker_method():
    workers = [Worker(rank) for rank in range(3)]
    mode = get_registration(Worker.double)["dispatch_mode"]
    per_rank, context = dispatch_to_ranks(mode, 3, (make(7),), {})
    outputs = [workers[rank].double(*args, **kwargs) for rank, (args, kwargs) in enumerate(per_rank)]
    result = collect_from_ranks(mode, outputs, context)
    assert result.batch["doubled"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
