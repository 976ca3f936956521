"""RLHFDataset, collate_fn and the resumable loader: errors that name the file and row,
truncation, padding, filtering, custom dataset classes, and sampler state round trips."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hybrid.data import RLHFDataset, collate_fn, create_rl_dataset, truncate_ids
from hybrid.data_loader import create_dataloader, create_rl_sampler


def _chat(text):
    return [{"role": "user", "content": text}]


def _rows(n, prefix="What is"):
    return [
        {
            "data_source": "arithmetic",
            "prompt": _chat(f"{prefix} {i} + 1?"),
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(n)
    ]


def _parquet(path: Path, rows) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _jsonl(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def data_config(**changes):
    """The default `data` section with `changes` (no validation: tests feed bad values on purpose)."""
    from hybrid.config.schema import CustomClsConfig

    base = dataclasses.replace(_DEFAULT_DATA, max_prompt_length=64, truncation="error")
    if isinstance(changes.get("custom_cls"), dict):
        changes["custom_cls"] = CustomClsConfig(**changes["custom_cls"])
    return dataclasses.replace(base, **changes)


def _default_data():
    from hybrid.config import build_config

    return build_config().data


_DEFAULT_DATA = _default_data()
CONFIG = data_config()


# ---- errors -----------------------------------------------------------------------------


def test_missing_file_is_named(tmp_path, tokenizer):
    missing = tmp_path / "nope.parquet"
    with pytest.raises(FileNotFoundError, match="nope.parquet.*does not exist"):
        RLHFDataset(str(missing), tokenizer, CONFIG)


def test_empty_files_are_named(tmp_path, tokenizer):
    zero = tmp_path / "zero.parquet"
    zero.write_bytes(b"")
    with pytest.raises(ValueError, match=r"zero.parquet is empty \(0 bytes\)"):
        RLHFDataset(str(zero), tokenizer, CONFIG)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    with pytest.raises(ValueError, match="blank.jsonl has no rows"):
        RLHFDataset(str(blank), tokenizer, CONFIG)
    no_rows = _parquet(tmp_path / "norows.parquet", [])
    with pytest.raises(ValueError, match="norows.parquet has no rows"):
        RLHFDataset(no_rows, tokenizer, CONFIG)


def test_missing_prompt_key_names_key_file_and_columns(tmp_path, tokenizer):
    path = _parquet(tmp_path / "train.parquet", _rows(3))
    with pytest.raises(
        ValueError,
        match=r"train.parquet row 0: no column 'question' \(data.prompt_key\); columns present: "
        r"\['ability', 'data_source', 'extra_info', 'prompt', 'reward_model'\]",
    ):
        RLHFDataset(path, tokenizer, data_config(**{"prompt_key": "question"}))


def test_bad_json_line_and_bad_prompt_are_named(tmp_path, tokenizer):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(ValueError, match="bad.jsonl line 2: not valid JSON"):
        RLHFDataset(str(bad), tokenizer, CONFIG)
    odd = _jsonl(tmp_path / "odd.jsonl", [{"prompt": "fine"}, {"prompt": 42}])
    with pytest.raises(ValueError, match="odd.jsonl row 1: the prompt must be a string or a list"):
        RLHFDataset(odd, tokenizer, CONFIG)


def test_overlong_prompt_with_truncation_error_names_row_and_keys(tmp_path, tokenizer):
    rows = _rows(5)
    rows[3]["prompt"] = _chat("very long " * 100)
    path = _parquet(tmp_path / "long.parquet", rows)
    with pytest.raises(
        ValueError,
        match=r"long.parquet row 3: prompt is \d+ tokens, longer than data.max_prompt_length=64 "
        r".*data.filter_overlong_prompts=true.*data.truncation",
    ):
        RLHFDataset(path, tokenizer, CONFIG)


def test_unknown_truncation_mode(tmp_path, tokenizer):
    path = _parquet(tmp_path / "t.parquet", _rows(2))
    with pytest.raises(ValueError, match="unknown data.truncation 'sideways'"):
        RLHFDataset(path, tokenizer, data_config(**{"truncation": "sideways"}))


# ---- tokens -----------------------------------------------------------------------------


def test_truncation_modes_on_a_concrete_sequence():
    ids = list(range(10))
    assert truncate_ids(ids, 4, "left") == [6, 7, 8, 9]
    assert truncate_ids(ids, 4, "right") == [0, 1, 2, 3]
    assert truncate_ids(ids, 4, "middle") == [0, 1, 8, 9]
    assert truncate_ids(ids, 5, "middle") == [0, 1, 7, 8, 9]
    assert truncate_ids(ids, 1, "middle") == [9]
    assert truncate_ids(ids, 10, "error") == ids
    with pytest.raises(ValueError, match="row 7: prompt is 10 tokens, longer than data.max_prompt_length=4"):
        truncate_ids(ids, 4, "error", where="row 7: ")


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_dataset_truncates_plain_prompts(tmp_path, tokenizer, mode):
    text = " ".join(f"w{i}" for i in range(40))
    full = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(full) > 16
    path = _jsonl(tmp_path / "plain.jsonl", [{"prompt": text, "data_source": "x"}])
    item = RLHFDataset(path, tokenizer, data_config(max_prompt_length=16, truncation=mode))[0]
    expected = {"left": full[-16:], "right": full[:16], "middle": full[:8] + full[-8:]}[mode]
    assert item["raw_prompt_ids"] == expected
    assert item["input_ids"].tolist() == expected
    assert item["attention_mask"].tolist() == [1] * 16
    assert item["position_ids"].tolist() == list(range(16))


def test_left_padding_positions_and_item_fields(tmp_path, tokenizer):
    path = _parquet(tmp_path / "train.parquet", _rows(3))
    ds = RLHFDataset(path, tokenizer, data_config(**{"return_raw_chat": True, "return_full_prompt": True}))
    item = ds[1]
    text = tokenizer.apply_chat_template(_chat("What is 1 + 1?"), add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    n_pad = 64 - len(ids)
    assert n_pad > 0
    assert item["input_ids"].tolist() == [tokenizer.pad_token_id] * n_pad + ids
    assert item["attention_mask"].tolist() == [0] * n_pad + [1] * len(ids)
    assert item["position_ids"].tolist() == [0] * n_pad + list(range(len(ids)))
    assert item["input_ids"].dtype == torch.long and item["input_ids"].shape == (64,)
    assert item["raw_prompt_ids"] == ids
    assert item["raw_prompt"] == _chat("What is 1 + 1?")
    assert item["full_prompts"] == text
    assert item["reward_model"] == {"style": "rule", "ground_truth": "2"}
    assert item["data_source"] == "arithmetic" and item["ability"] == "math" and item["index"] == 1
    assert "prompt" not in item
    plain = RLHFDataset(path, tokenizer, CONFIG)[1]
    assert "raw_prompt" not in plain and "full_prompts" not in plain


def test_chat_template_kwargs_and_plain_string_prompts(tmp_path, tokenizer):
    path = _jsonl(tmp_path / "mixed.jsonl", [{"prompt": _chat("hello")}, {"prompt": "Q: 2+2=? A:"}])
    template = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"
    ds = RLHFDataset(
        path,
        tokenizer,
        data_config(**{"return_full_prompt": True, "apply_chat_template_kwargs": {"chat_template": template}}),
    )
    assert ds[0]["full_prompts"] == "<<hello>>"
    assert ds[1]["full_prompts"] == "Q: 2+2=? A:"  # used as is, no template, no added tokens
    assert ds[1]["raw_prompt_ids"] == tokenizer("Q: 2+2=? A:", add_special_tokens=False)["input_ids"]
    assert ds[1]["index"] == 1  # no extra_info.index: the row position


def test_many_files_mixed_formats_and_filtering(tmp_path, tokenizer):
    a = _parquet(tmp_path / "a.parquet", _rows(4))
    long_rows = _rows(3, prefix="Tell me " + "at length " * 60 + "what is")
    b = _jsonl(tmp_path / "b.jsonl", _rows(2) + long_rows)
    ds = RLHFDataset([a, b], tokenizer, data_config(**{"filter_overlong_prompts": True}))
    assert len(ds) == 6
    assert all(int(ds[i]["attention_mask"].sum()) <= 64 for i in range(len(ds)))
    with pytest.raises(ValueError, match="all 3 prompts .* are longer"):
        RLHFDataset(
            _jsonl(tmp_path / "c.jsonl", long_rows), tokenizer, data_config(**{"filter_overlong_prompts": True})
        )


def test_filter_with_worker_processes_matches_in_process(tmp_path, tokenizer):
    rows = _rows(600)
    for i in range(0, 600, 50):
        rows[i]["prompt"] = _chat("long " * 80)
    path = _parquet(tmp_path / "many.parquet", rows)
    config = data_config(**{"filter_overlong_prompts": True})
    one = RLHFDataset(path, tokenizer, dataclasses.replace(config, **{"filter_overlong_prompts_workers": 1}))
    two = RLHFDataset(path, tokenizer, dataclasses.replace(config, **{"filter_overlong_prompts_workers": 2}))
    assert len(one) == len(two) == 588
    assert one.origins == two.origins


def test_collate_makes_stacked_tensors_and_object_arrays(tmp_path, tokenizer):
    path = _parquet(tmp_path / "train.parquet", _rows(4))
    ds = RLHFDataset(path, tokenizer, data_config(**{"return_raw_chat": True}))
    batch = collate_fn([ds[i] for i in range(4)])
    assert batch["input_ids"].shape == (4, 64) and batch["position_ids"].shape == (4, 64)
    for key in ("raw_prompt_ids", "raw_prompt", "reward_model", "extra_info", "data_source", "index"):
        assert isinstance(batch[key], np.ndarray) and batch[key].dtype == object and batch[key].shape == (4,)
    assert batch["reward_model"][2] == {"style": "rule", "ground_truth": "3"}
    assert batch["raw_prompt"][0] == _chat("What is 0 + 1?")

    from protocol.data_proto import DataProto

    proto = DataProto.from_single_dict(batch)
    assert len(proto) == 4
    assert proto.batch["input_ids"].shape == (4, 64)
    assert proto.non_tensor_batch["reward_model"][3]["ground_truth"] == "4"


# ---- custom dataset classes --------------------------------------------------------------


def test_custom_dataset_class_and_its_errors(tmp_path, tokenizer):
    path = _parquet(tmp_path / "train.parquet", _rows(3))
    module = tmp_path / "my_dataset.py"
    module.write_text(
        "from hybrid.data import RLHFDataset\n"
        "class Doubled(RLHFDataset):\n"
        "    def __len__(self):\n"
        "        return 2 * super().__len__()\n"
        "    def __getitem__(self, i):\n"
        "        return super().__getitem__(i % len(self.rows))\n"
        "class NotADataset:\n"
        "    pass\n"
    )
    ds = create_rl_dataset(path, data_config(**{"custom_cls": {"path": str(module), "name": "Doubled"}}), tokenizer)
    assert type(ds).__name__ == "Doubled" and len(ds) == 6
    assert isinstance(
        create_rl_dataset(path, data_config(**{"custom_cls": {"path": None, "name": None}}), tokenizer), RLHFDataset
    )
    with pytest.raises(
        AttributeError,
        match=r"class 'Missing' not found in .*my_dataset.py; classes there: \['Doubled', 'NotADataset'\]",
    ):
        create_rl_dataset(path, data_config(**{"custom_cls": {"path": str(module), "name": "Missing"}}), tokenizer)
    with pytest.raises(
        TypeError, match="NotADataset in .*my_dataset.py must be a subclass of torch.utils.data.Dataset"
    ):
        create_rl_dataset(path, data_config(**{"custom_cls": {"path": str(module), "name": "NotADataset"}}), tokenizer)
    with pytest.raises(FileNotFoundError, match="data.custom_cls.path: dataset file .*nowhere.py"):
        create_rl_dataset(
            path, data_config(**{"custom_cls": {"path": str(tmp_path / "nowhere.py"), "name": "X"}}), tokenizer
        )


# ---- sampler and loader state -------------------------------------------------------------


class _Indexed(torch.utils.data.Dataset):
    """Items that are their own index: batches compare cheaply."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.tensor([i]), "index": i}


def _take(iterator, k):
    return [next(iterator)["x"].flatten().tolist() for _ in range(k)]


def _loader(n=10, batch_size=3, shuffle=True, seed=7):
    dataset = _Indexed(n)
    sampler = create_rl_sampler(data_config(shuffle=shuffle, seed=seed), dataset)
    return create_dataloader(dataset, batch_size, sampler, collate_fn)


def test_same_seed_same_order_and_sequential_without_shuffle():
    first = [b["x"].flatten().tolist() for b in _loader(seed=3)]
    again = [b["x"].flatten().tolist() for b in _loader(seed=3)]
    other = [b["x"].flatten().tolist() for b in _loader(seed=4)]
    assert first == again and first != other
    assert len(first) == 3 and len({i for b in first for i in b}) == 9  # drop_last: 3 batches of 3
    seq = [b["x"].flatten().tolist() for b in _loader(shuffle=False)]
    assert seq == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert isinstance(_loader(shuffle=False).__iter__().__next__()["index"], np.ndarray)


def test_epochs_reshuffle_and_continue():
    loader = _loader()
    epoch0 = [b["x"].flatten().tolist() for b in loader]
    epoch1 = [b["x"].flatten().tolist() for b in loader]
    assert epoch0 != epoch1 and len(epoch1) == len(loader) == 3
    assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["batches_consumed"] == 0


@pytest.mark.parametrize("consumed", [1, 3, 4, 7])
def test_restored_loader_yields_the_same_next_batches(consumed):
    """Saved mid-epoch (1), at the epoch's end (3), and after an epoch boundary (4, 7)."""
    original = _loader()
    stream = iter(())
    taken = 0

    def next_batch():
        nonlocal stream, taken
        while True:
            for batch in stream:
                return batch
            stream = iter(original)  # the trainer's "for epoch ...: for batch in loader"

    for _ in range(consumed):
        next_batch()
    state = original.state_dict()
    expected = [next_batch()["x"].flatten().tolist() for _ in range(5)]

    restored = _loader(seed=123)  # a different configured seed: the saved one wins
    restored.load_state_dict(state)
    got = []
    while len(got) < 5:
        for batch in restored:
            got.append(batch["x"].flatten().tolist())
            if len(got) == 5:
                break
    assert got == expected


def test_state_must_match_the_data():
    state = _loader(n=10).state_dict()
    with pytest.raises(ValueError, match="dataset_len=10, this loader has 12"):
        _loader(n=12).load_state_dict(state)
    with pytest.raises(ValueError, match="fewer than one batch of 3"):
        _loader(n=2)


def test_loader_over_the_real_dataset_round_trips(tmp_path, tokenizer):
    path = _parquet(tmp_path / "train.parquet", _rows(20))
    ds = RLHFDataset(path, tokenizer, CONFIG)
    config = data_config(shuffle=True, seed=1)
    loader = create_dataloader(ds, 4, create_rl_sampler(config, ds), collate_fn)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    expected = [list(next(it)["index"]) for _ in range(2)]
    restored = create_dataloader(ds, 4, create_rl_sampler(config, ds), collate_fn)
    restored.load_state_dict(state)
    it2 = iter(restored)
    assert [list(next(it2)["index"]) for _ in range(2)] == expected
