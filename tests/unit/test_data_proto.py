"""DataProto: every operation on known values, and every error naming the offending key."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from protocol.data_proto import DataProto, DataProtoItem, pad_dataproto_to_divisor, unpad_dataproto


def obj(*values) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        array[i] = value
    return array


def make(rows: int = 4, meta=None) -> DataProto:
    """x = [[0,1],[2,3],...], y = [0,10,20,...], uid = ['u0','u1',...]."""
    return DataProto.from_dict(
        tensors={"x": torch.arange(rows * 2).view(rows, 2), "y": torch.arange(rows) * 10},
        non_tensors={"uid": [f"u{i}" for i in range(rows)]},
        meta_info=dict(meta or {"temperature": 1.0}),
    )


def uids(data: DataProto) -> list:
    return data.non_tensor_batch["uid"].tolist()


# ---- construction and consistency ----------------------------------------------------------


def test_from_dict_builds_batch_and_object_arrays():
    data = make(3)
    assert len(data) == 3
    assert data.batch.batch_size == torch.Size([3])
    assert data.non_tensor_batch["uid"].dtype == object
    assert uids(data) == ["u0", "u1", "u2"]
    assert data.meta_info == {"temperature": 1.0}


def test_from_dict_keeps_list_rows_as_single_objects():
    data = DataProto.from_dict(non_tensors={"ids": [[1, 2], [3, 4], [5, 6]]})
    assert data.non_tensor_batch["ids"].shape == (3,)
    assert data.non_tensor_batch["ids"][1] == [3, 4]
    assert data.batch is None and len(data) == 3


def test_from_dict_converts_numeric_arrays_to_object():
    data = DataProto.from_dict(non_tensors={"index": np.array([7, 8])})
    assert data.non_tensor_batch["index"].dtype == object
    assert data.non_tensor_batch["index"].tolist() == [7, 8]


def test_from_dict_num_batch_dims():
    data = DataProto.from_dict(tensors={"a": torch.zeros(2, 3, 4), "b": torch.ones(2, 3)}, num_batch_dims=2)
    assert data.batch.batch_size == torch.Size([2, 3]) and len(data) == 2


def test_from_dict_errors_name_the_key():
    with pytest.raises(ValueError, match=r"tensors\['b'\] has batch shape \(3,\) but tensors\['a'\] has \(2,\)"):
        DataProto.from_dict(tensors={"a": torch.zeros(2), "b": torch.zeros(3)})
    with pytest.raises(TypeError, match=r"tensors\['a'\] must be a torch.Tensor"):
        DataProto.from_dict(tensors={"a": [1, 2]})
    with pytest.raises(TypeError, match=r"non_tensor_batch\['uid'\] must be a list or a np.ndarray, got str"):
        DataProto.from_dict(non_tensors={"uid": "abc"})
    with pytest.raises(ValueError, match=r"non_tensor_batch\['uid'\] has 3 rows but batch has 4"):
        DataProto.from_dict(tensors={"x": torch.zeros(4)}, non_tensors={"uid": ["a", "b", "c"]})


def test_from_single_dict_splits_tensors_and_non_tensors():
    data = DataProto.from_single_dict(
        {
            "input_ids": torch.ones(2, 5, dtype=torch.long),
            "raw_prompt": ["a", "b"],
            "reward_model": np.array([{"ground_truth": "4"}, {"ground_truth": "5"}], dtype=object),
        },
        meta_info={"step": 3},
    )
    assert list(data.batch.keys()) == ["input_ids"]
    assert sorted(data.non_tensor_batch) == ["raw_prompt", "reward_model"]
    assert data.non_tensor_batch["reward_model"][1] == {"ground_truth": "5"}
    assert data.meta_info == {"step": 3}
    with pytest.raises(TypeError, match=r"data\['step'\] has unsupported type int"):
        DataProto.from_single_dict({"step": 3})


def test_constructor_rejects_non_object_arrays_and_mismatched_rows():
    with pytest.raises(TypeError, match=r"non_tensor_batch\['uid'\] must be a np.ndarray with dtype=object"):
        DataProto(non_tensor_batch={"uid": np.array(["a", "b"])})
    with pytest.raises(TypeError, match=r"non_tensor_batch\['uid'\] must be a np.ndarray with dtype=object, got list"):
        DataProto(non_tensor_batch={"uid": ["a", "b"]})
    with pytest.raises(ValueError, match=r"non_tensor_batch\['b'\] has 3 rows but non_tensor_batch\['a'\] has 2"):
        DataProto(non_tensor_batch={"a": obj(1, 2), "b": obj(1, 2, 3)})
    with pytest.raises(TypeError, match="batch must be a TensorDict"):
        DataProto(batch={"x": torch.zeros(2)})


def test_every_operation_checks_consistency_after_direct_edits():
    data = make(4)
    data.non_tensor_batch["uid"] = obj("a", "b", "c")
    message = r"non_tensor_batch\['uid'\] has 3 rows but batch has 4"
    for operation in (
        lambda: data.select(),
        lambda: data.slice(0, 2),
        lambda: data.chunk(2),
        lambda: data.repeat(2),
        lambda: data.select_idxs([0]),
        lambda: data.split(2),
        lambda: DataProto.concat([data]),
        lambda: data.union(make(4)),
        lambda: data[0],
        lambda: data.make_iterator(2, 1),
        lambda: data.reorder([0, 1, 2, 3]),
        lambda: data.pop(batch_keys=["x"]),
    ):
        with pytest.raises(ValueError, match=message):
            operation()


def test_meta_only_and_non_tensor_only():
    meta_only = DataProto(meta_info={"metrics": {"loss": 0.5}})
    assert len(meta_only) == 0 and meta_only.batch is None
    assert meta_only.select().meta_info == {"metrics": {"loss": 0.5}}
    rows = DataProto.from_dict(non_tensors={"uid": ["a", "b", "c"]})
    assert len(rows) == 3
    assert uids(rows.select(non_tensor_batch_keys=["uid"])) == ["a", "b", "c"]
    assert uids(DataProto.concat([rows, rows.slice(0, 1)])) == ["a", "b", "c", "a"]
    assert uids(rows[[2, 0]]) == ["c", "a"]
    assert DataProto.concat([meta_only, DataProto()]).meta_info == {"metrics": {"loss": 0.5}}


def test_repr_is_compact():
    text = repr(make(2))
    assert text == (
        "DataProto(len=2, batch={x: int64[2, 2], y: int64[2]}, "
        "non_tensor_batch={uid: object[2]}, meta_info_keys=['temperature'])"
    )


# ---- selecting keys ------------------------------------------------------------------------


def test_select_keys_and_copies():
    data = make(3, meta={"a": 1, "b": [1]})
    sub = data.select(batch_keys=["x"], non_tensor_batch_keys=[], meta_info_keys=["b"])
    assert list(sub.batch.keys()) == ["x"] and sub.non_tensor_batch == {} and sub.meta_info == {"b": [1]}
    assert sub.batch["x"].data_ptr() == data.batch["x"].data_ptr()  # tensors are shared, as in verl
    sub.meta_info["c"] = 2
    assert "c" not in data.meta_info
    deep = data.select(deepcopy=True)
    deep.meta_info["b"].append(2)
    assert data.meta_info["b"] == [1]
    assert len(data.select(batch_keys=[])) == 3  # an empty TensorDict keeps the row count


def test_select_missing_key_errors():
    data = make(2)
    with pytest.raises(KeyError, match=r"batch has no key 'z'"):
        data.select(batch_keys=["x", "z"])
    with pytest.raises(KeyError, match=r"non_tensor_batch has no key 'label'"):
        data.select(non_tensor_batch_keys=["label"])
    with pytest.raises(KeyError, match=r"meta_info has no key 'n'"):
        data.select(meta_info_keys=["n"])
    with pytest.raises(KeyError, match=r"batch has no key 'x'"):
        DataProto.from_dict(non_tensors={"uid": ["a"]}).select(batch_keys=["x"])


def test_pop_removes_keys_and_leaves_self_untouched_on_error():
    data = make(3, meta={"temperature": 1.0, "n": 2})
    with pytest.raises(KeyError, match=r"batch has no key 'missing'"):
        data.pop(batch_keys=["x", "missing"])
    assert sorted(data.batch.keys()) == ["x", "y"]
    popped = data.pop(batch_keys=["x"], non_tensor_batch_keys=["uid"], meta_info_keys=["n"])
    assert popped.batch["x"].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert uids(popped) == ["u0", "u1", "u2"] and popped.meta_info == {"n": 2}
    assert list(data.batch.keys()) == ["y"] and data.non_tensor_batch == {} and data.meta_info == {"temperature": 1.0}
    assert len(data) == 3


def test_rename():
    data = make(2)
    assert data.rename(["x", "uid"], ["input_ids", "sample_id"]) is data
    assert sorted(data.batch.keys()) == ["input_ids", "y"] and list(data.non_tensor_batch) == ["sample_id"]
    with pytest.raises(KeyError, match="cannot rename 'nope'"):
        data.rename("nope", "other")
    with pytest.raises(ValueError, match="'y' already exists"):
        data.rename("input_ids", "y")
    with pytest.raises(ValueError, match="2 old keys but 1 new keys"):
        data.rename(["y", "input_ids"], ["z"])


# ---- union ----------------------------------------------------------------------------------


def test_union_merges_in_place():
    data = make(3)
    other = DataProto.from_dict(
        tensors={"z": torch.tensor([1.0, 2.0, 3.0]), "y": torch.tensor([0, 10, 20])},
        non_tensors={"label": ["a", "b", "c"]},
        meta_info={"temperature": 1.0, "n": 1},
    )
    assert data.union(other) is data
    assert sorted(data.batch.keys()) == ["x", "y", "z"]
    assert data.batch["z"].tolist() == [1.0, 2.0, 3.0]
    assert data.non_tensor_batch["label"].tolist() == ["a", "b", "c"]
    assert data.meta_info == {"temperature": 1.0, "n": 1}


def test_union_into_empty_and_with_meta_only():
    rows = DataProto.from_dict(non_tensors={"uid": ["a", "b"]})
    rows.union(DataProto.from_dict(tensors={"x": torch.tensor([5, 6])}))
    assert rows.batch["x"].tolist() == [5, 6] and len(rows) == 2
    rows.union(DataProto(meta_info={"metrics": {"loss": 1.0}}))
    assert rows.meta_info == {"metrics": {"loss": 1.0}}


def test_union_conflicts_name_the_key_and_change_nothing():
    data = make(3)
    with pytest.raises(ValueError, match=r"union conflict: batch\['y'\] differs"):
        data.union(DataProto.from_dict(tensors={"y": torch.tensor([0, 10, 99]), "new": torch.zeros(3)}))
    assert "new" not in data.batch.keys()
    with pytest.raises(ValueError, match=r"union conflict: non_tensor_batch\['uid'\] differs"):
        data.union(DataProto.from_dict(non_tensors={"uid": ["u0", "u1", "other"]}))
    with pytest.raises(ValueError, match=r"union conflict: meta_info\['temperature'\] is 1.0 in self but 0.7 in other"):
        data.union(DataProto(meta_info={"temperature": 0.7}))
    with pytest.raises(ValueError, match="cannot union: self has 3 rows but other has 2"):
        data.union(make(2))


def test_union_treats_equal_values_with_nan_and_dicts_as_equal():
    values = torch.tensor([1.0, float("nan"), 3.0])
    data = DataProto.from_dict(tensors={"v": values}, non_tensors={"rm": [{"ground_truth": "4"}, None, 1.5]})
    same = DataProto.from_dict(tensors={"v": values.clone()}, non_tensors={"rm": [{"ground_truth": "4"}, None, 1.5]})
    data.union(same)
    assert len(data) == 3


# ---- rows: indexing, slicing, reordering ---------------------------------------------------------


def test_getitem_int_slice_and_indices():
    data = make(4)
    item = data[1]
    assert isinstance(item, DataProtoItem)
    assert item.batch["x"].tolist() == [2, 3] and item.non_tensor_batch["uid"] == "u1"
    assert data[-1].non_tensor_batch["uid"] == "u3"
    assert uids(data[1:3]) == ["u1", "u2"]
    assert uids(data[::2]) == ["u0", "u2"]
    assert data[[3, 0]].batch["y"].tolist() == [30, 0]
    assert data[np.array([2])].batch["y"].tolist() == [20]
    assert data[torch.tensor([1, 1])].batch["y"].tolist() == [10, 10]
    with pytest.raises(IndexError, match="index 4 is out of range for 4 rows"):
        data[4]
    with pytest.raises(TypeError, match="DataProto indices must be"):
        data["x"]
    assert [row.non_tensor_batch["uid"] for row in data] == ["u0", "u1", "u2", "u3"]


def test_slice_with_step():
    data = make(6)
    assert data.slice(1, 6, 2).batch["y"].tolist() == [10, 30, 50]
    assert uids(data.slice(end=2)) == ["u0", "u1"]
    assert len(data.slice(3, 3)) == 0


def test_select_idxs_with_mask_and_indices():
    data = make(4)
    picked = data.select_idxs(torch.tensor([True, False, True, True]))
    assert picked.batch["y"].tolist() == [0, 20, 30] and uids(picked) == ["u0", "u2", "u3"]
    assert data.select_idxs(np.array([False, True, False, False])).batch["x"].tolist() == [[2, 3]]
    assert data.select_idxs([True, False, False, False]).batch["y"].tolist() == [0]
    assert uids(data.select_idxs([3, 1])) == ["u3", "u1"]
    empty = data.select_idxs([])
    assert len(empty) == 0 and empty.non_tensor_batch["uid"].shape == (0,)
    assert picked.meta_info == data.meta_info and picked.meta_info is not data.meta_info
    with pytest.raises(ValueError, match="boolean mask has 3 entries but the DataProto has 4 rows"):
        data.select_idxs([True, False, True])
    with pytest.raises(IndexError, match="index 9 is out of range for 4 rows"):
        data.select_idxs([0, 9])
    with pytest.raises(TypeError, match="indices must be integers or booleans"):
        data.select_idxs([0.5])


def test_reorder_in_place():
    data = make(4)
    assert data.reorder(torch.tensor([2, 0, 3, 1])) is None
    assert data.batch["y"].tolist() == [20, 0, 30, 10]
    assert uids(data) == ["u2", "u0", "u3", "u1"]
    data.reorder([3, 2, 1, 0])
    assert uids(data) == ["u1", "u3", "u0", "u2"]
    with pytest.raises(ValueError, match=r"reorder needs a permutation of range\(4\)"):
        data.reorder([0, 0, 1, 2])
    with pytest.raises(TypeError, match="boolean mask is not an order"):
        data.reorder([True, True, False, False])


# ---- combining and splitting ------------------------------------------------------------


def test_concat_keeps_order_and_first_meta_info():
    first, second = make(2, meta={"n": 1}), make(3, meta={"n": 2})
    merged = DataProto.concat([first, second])
    assert merged.batch["y"].tolist() == [0, 10, 0, 10, 20]
    assert uids(merged) == ["u0", "u1", "u0", "u1", "u2"]
    assert merged.meta_info == {"n": 1}


def test_concat_errors_name_the_key():
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])
    other = make(2)
    other.batch["extra"] = torch.zeros(2)
    with pytest.raises(ValueError, match="concat: batch key 'extra' is in item 1 but not in item 0"):
        DataProto.concat([make(2), other])
    wide = DataProto.from_dict(
        tensors={"x": torch.zeros(2, 3, dtype=torch.long), "y": torch.zeros(2, dtype=torch.long)},
        non_tensors={"uid": ["a", "b"]},
    )
    with pytest.raises(ValueError, match=r"concat: batch\['x'\] has shape \[2, 3\] in item 1 but \[2, 2\] in item 0"):
        DataProto.concat([make(2), wide])
    labelled = make(2)
    labelled.non_tensor_batch["label"] = obj("a", "b")
    with pytest.raises(ValueError, match="concat: non_tensor_batch key 'label' is in item 0 but not in item 1"):
        DataProto.concat([labelled, make(2)])
    with pytest.raises(ValueError, match="concat: item 1 has no tensor batch"):
        DataProto.concat([make(2), DataProto.from_dict(non_tensors={"uid": ["a"]})])
    with pytest.raises(TypeError, match="concat: item 1 is a dict"):
        DataProto.concat([make(2), {}])


def test_chunk_equal_pieces_and_error():
    chunks = make(6).chunk(3)
    assert [c.batch["y"].tolist() for c in chunks] == [[0, 10], [20, 30], [40, 50]]
    assert [uids(c) for c in chunks] == [["u0", "u1"], ["u2", "u3"], ["u4", "u5"]]
    with pytest.raises(ValueError, match="cannot chunk a DataProto of 5 rows into 2 equal chunks"):
        make(5).chunk(2)
    assert [len(c) for c in DataProto(meta_info={"a": 1}).chunk(2)] == [0, 0]


def test_split_last_piece_shorter():
    pieces = make(5).split(2)
    assert [p.batch["y"].tolist() for p in pieces] == [[0, 10], [20, 30], [40]]
    assert [uids(p) for p in pieces] == [["u0", "u1"], ["u2", "u3"], ["u4"]]
    with pytest.raises(ValueError, match="split_size must be a positive int"):
        make(5).split(0)


def test_repeat_interleave_vs_tile():
    data = DataProto.from_dict(
        tensors={"x": torch.tensor([[1, 2], [3, 4]])},
        non_tensors={"uid": ["a", "b"], "rm": [{"ground_truth": "4"}, {"ground_truth": "5"}]},
        meta_info={"n": 3},
    )
    inter = data.repeat(repeat_times=3, interleave=True)
    assert inter.batch["x"].tolist() == [[1, 2], [1, 2], [1, 2], [3, 4], [3, 4], [3, 4]]
    assert uids(inter) == ["a", "a", "a", "b", "b", "b"]
    assert [r["ground_truth"] for r in inter.non_tensor_batch["rm"]] == ["4", "4", "4", "5", "5", "5"]
    tiled = data.repeat(repeat_times=3, interleave=False)
    assert tiled.batch["x"].tolist() == [[1, 2], [3, 4], [1, 2], [3, 4], [1, 2], [3, 4]]
    assert uids(tiled) == ["a", "b", "a", "b", "a", "b"]
    assert len(inter) == len(tiled) == 6 and inter.meta_info == {"n": 3}
    assert len(data) == 2  # repeat returns a new DataProto
    with pytest.raises(ValueError, match="repeat_times must be a positive int"):
        data.repeat(0)


def test_repeat_non_tensor_only():
    data = DataProto.from_dict(non_tensors={"uid": ["a", "b"]})
    assert uids(data.repeat(2)) == ["a", "a", "b", "b"]
    assert uids(data.repeat(2, interleave=False)) == ["a", "b", "a", "b"]


# ---- mini-batch iterator -----------------------------------------------------------------


def _orders(data, **kwargs):
    return [mini.batch["y"].tolist() for mini in data.make_iterator(**kwargs)]


def test_make_iterator_without_shuffle_is_in_order():
    assert _orders(make(6), mini_batch_size=2, epochs=2) == [[0, 10], [20, 30], [40, 50]] * 2


def test_make_iterator_shuffle_is_deterministic_for_a_seed():
    data = make(8, meta={"temperature": 0.5})
    kwargs = dict(mini_batch_size=4, epochs=3, dataloader_kwargs={"shuffle": True})
    first = _orders(data, seed=1, **kwargs)
    assert first == _orders(data, seed=1, **kwargs)
    assert first != _orders(data, seed=2, **kwargs)
    assert len(first) == 6  # 3 epochs x 2 mini-batches
    for epoch in range(3):  # each epoch is a permutation of all rows
        assert sorted(first[2 * epoch] + first[2 * epoch + 1]) == [0, 10, 20, 30, 40, 50, 60, 70]
    assert first[0:2] != first[2:4] or first[2:4] != first[4:6]  # epochs draw fresh permutations
    minis = list(data.make_iterator(mini_batch_size=4, epochs=1, seed=1, dataloader_kwargs={"shuffle": True}))
    assert all(mini.meta_info == {"temperature": 0.5} for mini in minis)
    # non-tensors follow their rows
    assert all(u == f"u{y // 10}" for mini in minis for u, y in zip(uids(mini), mini.batch["y"].tolist()))


def test_make_iterator_errors():
    with pytest.raises(ValueError, match="DataProto of 5 rows does not divide into mini-batches of 2"):
        make(5).make_iterator(mini_batch_size=2, epochs=1)
    with pytest.raises(TypeError, match=r"only dataloader_kwargs\['shuffle'\], got \['num_workers'\]"):
        make(4).make_iterator(2, 1, dataloader_kwargs={"num_workers": 2})
    assert list(make(4).make_iterator(2, epochs=0)) == []


# ---- padding --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rows, divisor, pad, padded_y",
    [
        (4, 2, 0, [0, 10, 20, 30]),
        (5, 4, 3, [0, 10, 20, 30, 40, 0, 10, 20]),
        (7, 3, 2, [0, 10, 20, 30, 40, 50, 60, 0, 10]),
        (1, 3, 2, [0, 0, 0]),  # shorter than the divisor: the first rows cycle
        (2, 5, 3, [0, 10, 0, 10, 0]),
    ],
)
def test_pad_and_unpad_round_trip(rows, divisor, pad, padded_y):
    data = make(rows)
    padded, pad_size = pad_dataproto_to_divisor(data, divisor)
    assert pad_size == pad
    assert padded.batch["y"].tolist() == padded_y
    assert uids(padded) == [f"u{y // 10}" for y in padded_y]
    restored = unpad_dataproto(padded, pad_size)
    assert restored.batch["y"].tolist() == data.batch["y"].tolist() and uids(restored) == uids(data)


def test_pad_errors():
    with pytest.raises(ValueError, match="size_divisor must be a positive int"):
        pad_dataproto_to_divisor(make(2), 0)
    with pytest.raises(ValueError, match="cannot remove 3 padding rows from a DataProto of 2 rows"):
        unpad_dataproto(make(2), 3)
    assert pad_dataproto_to_divisor(DataProto(meta_info={"a": 1}), 4)[1] == 0


# ---- devices and disk -----------------------------------------------------------------------


def test_to_device_returns_self():
    data = make(2)
    assert data.to("cpu") is data and data.batch.device == torch.device("cpu")


def test_save_load_round_trip(tmp_path):
    data = DataProto.from_dict(
        tensors={"input_ids": torch.tensor([[1, 2], [3, 4]]), "score": torch.tensor([0.5, float("nan")])},
        non_tensors={
            "reward_model": [{"ground_truth": "4"}, {"ground_truth": "5", "style": "rule"}],
            "raw_prompt_ids": [[1, 2, 3], [4]],
            "index": np.array([7, 8]),
            "note": [None, True],
        },
        meta_info={"global_steps": 3, "metrics": {"loss": np.float32(0.25)}},
    )
    path = tmp_path / "batch.pt"
    data.save_to_disk(path)
    torch.load(path, weights_only=True)  # the file itself must be weights_only safe
    loaded = DataProto.load_from_disk(path)
    assert loaded.batch["input_ids"].tolist() == [[1, 2], [3, 4]]
    assert torch.allclose(loaded.batch["score"], data.batch["score"], equal_nan=True)
    assert loaded.non_tensor_batch["reward_model"].tolist() == [
        {"ground_truth": "4"},
        {"ground_truth": "5", "style": "rule"},
    ]
    assert loaded.non_tensor_batch["raw_prompt_ids"].shape == (2,)
    assert loaded.non_tensor_batch["raw_prompt_ids"][0] == [1, 2, 3]
    assert loaded.non_tensor_batch["index"].tolist() == [7, 8]
    assert type(loaded.non_tensor_batch["index"][0]) is int  # numpy scalars come back as Python scalars
    assert loaded.non_tensor_batch["note"].tolist() == [None, True]
    assert loaded.meta_info == {"global_steps": 3, "metrics": {"loss": 0.25}}
    assert all(v.dtype == object for v in loaded.non_tensor_batch.values())


def test_save_load_non_tensor_only_and_2d_object_array(tmp_path):
    grid = np.empty((2, 2), dtype=object)
    grid[:] = [["a", "b"], ["c", "d"]]
    data = DataProto(non_tensor_batch={"grid": grid})
    data.save_to_disk(tmp_path / "grid.pt")
    loaded = DataProto.load_from_disk(tmp_path / "grid.pt")
    assert loaded.batch is None and loaded.non_tensor_batch["grid"].tolist() == [["a", "b"], ["c", "d"]]


def test_save_unstorable_value_names_the_key(tmp_path):
    data = DataProto.from_dict(non_tensors={"extra_info": [{"arr": np.zeros(2)}, {}]})
    with pytest.raises(TypeError, match=r"cannot save non_tensor_batch\['extra_info'\]: a value of type ndarray"):
        data.save_to_disk(tmp_path / "bad.pt")
    assert not (tmp_path / "bad.pt").exists()
    with pytest.raises(TypeError, match=r"cannot save meta_info\['fn'\]: a value of type function"):
        DataProto(meta_info={"fn": lambda: None}).save_to_disk(tmp_path / "bad.pt")


def test_load_rejects_foreign_files(tmp_path):
    torch.save({"x": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="is not a DataProto written by DataProto.save_to_disk"):
        DataProto.load_from_disk(tmp_path / "other.pt")


def test_nested_tensordict_batch_survives_save_and_repeat(tmp_path):
    batch = TensorDict(
        {"a": torch.arange(2), "inner": TensorDict({"b": torch.ones(2, 3)}, batch_size=[2])}, batch_size=[2]
    )
    data = DataProto(batch=batch)
    assert data.repeat(2).batch["inner", "b"].shape == (4, 3)
    data.save_to_disk(tmp_path / "nested.pt")
    assert DataProto.load_from_disk(tmp_path / "nested.pt").batch["inner", "b"].shape == (2, 3)
