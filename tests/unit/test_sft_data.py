"""SFT data: the loss mask of single- and multi-turn samples against hand-built token
lists (SmolLM2 tokenizer), dict-key columns, truncation, bad rows named by file and row,
and the config's refusals."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybrid.config.loading import ConfigError
from hybrid.config.sft_schema import load_sft_config, typed_sft_config
from hybrid.data import DataError
from hybrid.sft_data import SFTDataset, SFTTokenizer, make_collate, worked_answer

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def _data_config(*overrides: str):
    return typed_sft_config(load_sft_config(["model.partial_pretrain=/nowhere", *overrides])).data


def _write(path, rows) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _expected(tokenizer, segments):
    ids, mask = [], []
    for text, label in segments:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        mask += [label] * len(piece)
    return ids, mask


def test_multi_turn_loss_mask_is_exactly_the_assistant_tokens(tokenizer):
    messages = [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "2 + 3 = 5"},
        {"role": "user", "content": "And 5 + 1?"},
        {"role": "assistant", "content": "5 + 1 = 6"},
    ]
    ids, mask = SFTTokenizer(tokenizer).multi_turn(messages)
    # By hand: the template's text, cut where the model starts and stops generating.
    want_ids, want_mask = _expected(
        tokenizer,
        [
            ("<|im_start|>system\nYou add numbers.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n", 0),
            ("<|im_start|>assistant\n", 0),
            ("2 + 3 = 5<|im_end|>", 1),
            ("\n<|im_start|>user\nAnd 5 + 1?<|im_end|>\n<|im_start|>assistant\n", 0),
            ("5 + 1 = 6<|im_end|>", 1),
            ("\n", 0),
        ],
    )
    assert ids == want_ids
    assert mask == want_mask
    # The pieces tokenize as the whole conversation does, and the trained tokens read back.
    assert (
        ids == tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    )
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert trained == "2 + 3 = 5<|im_end|>5 + 1 = 6<|im_end|>"


def test_single_turn_trains_the_response_and_eos_with_dict_keys(tmp_path, tokenizer):
    path = _write(
        tmp_path / "t.parquet",
        [{"extra_info": {"question": "What is 1 + 1?", "answer": "2"}}],
    )
    cfg = _data_config(
        "data.prompt_key=extra_info",
        "data.response_key=extra_info",
        "data.prompt_dict_keys=[question]",
        "+data.response_dict_keys=[answer]",
    )
    item = SFTDataset(path, tokenizer, cfg)[0]
    want = _expected(tokenizer, [(SYSTEM + "<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n", 0)])
    want = (want[0] + tokenizer("2<|im_end|>", add_special_tokens=False)["input_ids"], want[1] + [1, 1])
    assert (item["input_ids"], item["loss_mask"]) == want


def test_truncation_error_left_right(tmp_path, tokenizer):
    path = _write(tmp_path / "t.parquet", [{"question": "hi", "answer": "ok"}, {"question": "x " * 50, "answer": "y"}])
    full = SFTDataset(path, tokenizer, _data_config())[1]["input_ids"]
    with pytest.raises(DataError, match=r"t\.parquet row 1: the sample is \d+ tokens, longer than data.max_length=40"):
        SFTDataset(path, tokenizer, _data_config("data.max_length=40"))
    left = SFTDataset(path, tokenizer, _data_config("data.max_length=40", "data.truncation=left"))[1]
    right = SFTDataset(path, tokenizer, _data_config("data.max_length=40", "data.truncation=right"))[1]
    assert left["input_ids"] == full[-40:] and left["loss_mask"][-2:] == [1, 1]
    assert right["input_ids"] == full[:40] and sum(right["loss_mask"]) == 0


def test_bad_rows_are_named_by_file_and_row(tmp_path, tokenizer):
    path = _write(tmp_path / "bad.parquet", [{"question": "a", "answer": "b"}, {"question": "a", "answer": None}])
    with pytest.raises(DataError, match=r"bad\.parquet row 1: answer is NoneType, not a string"):
        SFTDataset(path, tokenizer, _data_config())
    with pytest.raises(DataError, match=r"bad\.parquet row 0: no column 'prompt' \(data.prompt_key\)"):
        SFTDataset(path, tokenizer, _data_config("data.prompt_key=prompt"))
    chat = _write(tmp_path / "chat.parquet", [{"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(DataError, match=r"chat\.parquet row 0: the conversation has no assistant message"):
        SFTDataset(chat, tokenizer, _data_config("data.multiturn.enable=true"))


def test_collate_pads_right_and_restarts_positions():
    batch = make_collate(0)([{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, {"input_ids": [8], "loss_mask": [1]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]


def test_worked_answers_end_in_the_result():
    assert worked_answer(27, "+", 45, 72) == "27 + 45 = 20 + 40 + 7 + 5 = 60 + 12 = 72"
    assert worked_answer(3, "+", 4, 7) == "3 + 4 = 7"


def test_config_refuses_what_it_cannot_honour():
    with pytest.raises(ConfigError) as err:
        typed_sft_config(
            load_sft_config(
                [
                    "data.train_batch_size=6",
                    "model.fsdp_config.model_dtype=bf16",
                    "data.balance_dp_token=true",
                    "ulysses_sequence_parallel_size=2",
                    "optim.lr_scheduler=linear",
                    "trainer.default_hdfs_dir=hdfs://x",
                ]
            )
        )
    text = str(err.value)
    assert "invalid SFT configuration (6 problems)" in text
    assert "data.train_batch_size=6 gives 6 samples per rank, not a multiple of data.micro_batch_size_per_gpu=4" in text
    assert "model.fsdp_config.model_dtype='bf16' is not supported (hybrid keeps fp32 master weights" in text
    assert "data.balance_dp_token=True is not supported" in text
    assert "ulysses_sequence_parallel_size=2 does not divide the 1 ranks started" in text
    assert "optim.lr_scheduler='linear'" in text
    assert "trainer.default_hdfs_dir='hdfs://x' is not supported" in text
    with pytest.raises(ConfigError, match="did you mean data.train_batch_size"):
        load_sft_config(["data.train_batchsize=8"])


def test_config_splits_the_batch_over_data_parallel_ranks():
    """Ranks = world / ulysses size; each data-parallel rank runs whole micro-batches."""
    cfg = load_sft_config(["data.train_batch_size=12", "data.micro_batch_size_per_gpu=2"])
    assert typed_sft_config(cfg, world_size=3).data.train_batch_size == 12  # 4 per rank
    with pytest.raises(ConfigError, match=r"train_batch_size=12 gives 3 samples per rank, not a multiple of"):
        typed_sft_config(cfg, world_size=4)
    sp = load_sft_config(
        ["data.train_batch_size=6", "data.micro_batch_size_per_gpu=2", "ulysses_sequence_parallel_size=2"]
    )
    assert typed_sft_config(sp, world_size=6).ulysses_sequence_parallel_size == 2  # 3 groups of 2 rows
    with pytest.raises(ConfigError, match=r"ulysses_sequence_parallel_size=2 does not divide the 3 ranks started"):
        typed_sft_config(sp, world_size=3)
