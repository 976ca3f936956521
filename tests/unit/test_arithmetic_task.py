"""The default task generator: seeded, disjoint splits, right answers, idempotent files."""

from __future__ import annotations

import os
import runpy
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hybrid.arithmetic_task import make_arithmetic_rows, write_arithmetic_parquet, write_default_arithmetic_dataset
from reward.scorers import default_compute_score

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data_preprocess"
MIX = {"digits": (1, 2, 3), "ops": ("+", "-", "*")}


def _questions(rows):
    return {r["extra_info"]["question"] for r in rows}


def test_same_seed_same_rows_other_seed_other_rows():
    a = make_arithmetic_rows(300, seed=5, split="train", **MIX)
    b = make_arithmetic_rows(300, seed=5, split="train", **MIX)
    c = make_arithmetic_rows(300, seed=6, split="train", **MIX)
    assert a == b
    assert a != c


def test_train_and_val_never_share_a_question():
    # Different seeds and sizes on purpose: the split is by question, not by draw.
    train = make_arithmetic_rows(3000, seed=1, split="train", digits=(1, 2), ops=("+", "-"))
    val = make_arithmetic_rows(500, seed=99, split="val", digits=(1, 2), ops=("+", "-"))
    assert _questions(train).isdisjoint(_questions(val))
    # Single-digit addition has only 100 questions; both sides still get some.
    one_digit = [r for r in val if r["extra_info"]["digits"] == 1]
    assert one_digit and len(_questions(one_digit)) < 100


def test_ground_truths_are_the_answers_and_score_1():
    rows = make_arithmetic_rows(400, seed=3, split="train", **MIX)
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    for r in rows:
        info = r["extra_info"]
        answer = ops[info["op"]](info["a"], info["b"])
        assert r["reward_model"] == {"style": "rule", "ground_truth": str(answer)}
        assert r["data_source"] == "arithmetic" and r["ability"] == "math" and info["split"] == "train"
        assert r["prompt"][0]["role"] == "user" and r["prompt"][0]["content"].startswith(info["question"])
        assert len(str(info["a"])) == info["digits"] or (info["digits"] == 1 and info["a"] < 10)
        response = f"{info['a']} {info['op']} {info['b']} = {answer}"
        assert default_compute_score("arithmetic", response, r["reward_model"]["ground_truth"]) == 1.0
    assert [r["extra_info"]["index"] for r in rows] == list(range(400))
    assert all(int(r["reward_model"]["ground_truth"]) >= 0 for r in rows)  # no negatives by default


def test_mix_weights_and_negative_subtraction():
    rows = make_arithmetic_rows(
        200, seed=0, split="train", digits=(1, 2), digit_weights=(0, 1), ops=("-",), allow_negative=True
    )
    assert {r["extra_info"]["digits"] for r in rows} == {2}
    assert any(int(r["reward_model"]["ground_truth"]) < 0 for r in rows)
    with pytest.raises(ValueError, match="unknown ops"):
        make_arithmetic_rows(1, seed=0, split="train", ops=("/",))
    with pytest.raises(ValueError, match="digit_weights"):
        make_arithmetic_rows(1, seed=0, split="train", digits=(1, 2), digit_weights=(1,))


def test_write_is_idempotent_and_rewrites_on_new_parameters(tmp_path):
    paths = write_arithmetic_parquet(tmp_path, 50, 20, 4, digits=(1, 2), ops=("+",))
    stamps = {k: os.stat(p).st_mtime_ns for k, p in paths.items()}
    again = write_arithmetic_parquet(tmp_path, 50, 20, 4, digits=(1, 2), ops=("+",))
    assert again == paths
    assert {k: os.stat(p).st_mtime_ns for k, p in paths.items()} == stamps
    train = pq.read_table(paths["train"]).to_pylist()
    val = pq.read_table(paths["val"]).to_pylist()
    assert len(train) == 50 and len(val) == 20
    assert _questions(train).isdisjoint(_questions(val))
    assert train == make_arithmetic_rows(50, 4, "train", digits=(1, 2), ops=("+",))

    write_arithmetic_parquet(tmp_path, 60, 20, 4, digits=(1, 2), ops=("+",))
    assert len(pq.read_table(paths["train"]).to_pylist()) == 60
    # A missing file is written again even with the same recorded parameters.
    os.remove(paths["val"])
    write_arithmetic_parquet(tmp_path, 60, 20, 4, digits=(1, 2), ops=("+",))
    assert len(pq.read_table(paths["val"]).to_pylist()) == 20
    assert sorted(os.listdir(tmp_path)) == ["arithmetic_params.json", "train.parquet", "val.parquet"]


def _held_out_side(digits, op="+"):
    """Every question of a kind that the hash puts on the held-out side, listed by brute force."""
    from hybrid.arithmetic_task import _is_val_question

    span = range(10) if digits == 1 else range(10 ** (digits - 1), 10**digits)
    return {q for a in span for b in span if _is_val_question(q := f"What is {a} {op} {b}?", 0.2)}


def test_default_validation_file_is_distinct_and_disjoint_from_training(tmp_path):
    paths = write_default_arithmetic_dataset(tmp_path / "default")
    train = pq.read_table(paths["train"]).to_pylist()
    val = pq.read_table(paths["val"]).to_pylist()
    val_questions = [r["extra_info"]["question"] for r in val]
    assert len(val) == 200 and len(set(val_questions)) == 200
    assert _questions(train).isdisjoint(val_questions)
    # Single-digit addition has too few held-out questions for half of 200: all of them
    # are used, two-digit questions make up the rest.
    one_digit = {r["extra_info"]["question"] for r in val if r["extra_info"]["subset"] == "1-digit"}
    assert one_digit == _held_out_side(1) and 0 < len(one_digit) < 100
    assert sum(r["extra_info"]["subset"] == "2-digit" for r in val) == 200 - len(one_digit)


def test_held_out_shares_follow_the_weights_where_the_pools_allow():
    rows = make_arithmetic_rows(400, seed=2, split="val", digits=(2, 3), ops=("+", "*"), op_weights=(3, 1))
    counts = {}
    for r in rows:
        counts[r["extra_info"]["subset"]] = counts.get(r["extra_info"]["subset"], 0) + 1
    # 400 x digit 1/2 x op 3/4 or 1/4, all pools large enough (3 digits are drawn, not listed).
    assert counts == {"2-digit-add": 150, "2-digit-mul": 50, "3-digit-add": 150, "3-digit-mul": 50}
    assert len(_questions(rows)) == 400
    too_many = len(_held_out_side(1)) + 1
    with pytest.raises(ValueError, match=f"only {too_many - 1} distinct held-out questions exist"):
        make_arithmetic_rows(too_many, seed=0, split="val", digits=(1,), ops=("+",))


def test_default_dataset_and_cli_function(tmp_path):
    paths = write_default_arithmetic_dataset(tmp_path / "default")
    rows = pq.read_table(paths["train"]).to_pylist()
    assert len(rows) == 2000 and len(pq.read_table(paths["val"]).to_pylist()) == 200
    assert {r["extra_info"]["op"] for r in rows} == {"+"} and {r["extra_info"]["digits"] for r in rows} == {1, 2}

    script = runpy.run_path(str(EXAMPLES / "arithmetic.py"))
    args = script["parse_args"](
        ["--local_dir", str(tmp_path / "cli"), "--digits", "2", "--ops", "*", "--n_train", "30", "--n_val", "10"]
    )
    out = script["write_dataset"](
        args.local_dir, n_train=args.n_train, n_val=args.n_val, digits=args.digits, ops=args.ops
    )
    cli_rows = pq.read_table(out["train"]).to_pylist()
    assert len(cli_rows) == 30 and all(r["extra_info"]["op"] == "*" for r in cli_rows)
