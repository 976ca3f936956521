"""The default task: arithmetic questions generated from a seed, in verl's data schema.

Each row asks one question such as "What is 23 + 45?" and carries the answer as the
rule-based ground truth, so `reward.scorers.arithmetic` can score a response by its last
integer. Train and validation rows never share a question: every question belongs to one
side by a stable hash of its text, whatever the seed or the sizes, so two separate calls
cannot overlap. Validation questions are distinct; training questions repeat where the
small spaces run out (single-digit addition has 100 questions in all).

`write_arithmetic_parquet` writes both splits once; a json file beside them records the
parameters, and a second call with the same parameters leaves the files alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

DATA_SOURCE = "arithmetic"
# Greedy SmolLM2-135M-Instruct on 32 held-out questions: "Reply with only the number."
# 72% single-digit / 16% two-digit addition; "Give the final answer as a number." 78% / 3%.
INSTRUCTION = "Reply with only the number."
OPS = ("+", "-", "*")
PARAMS_FILE = "arithmetic_params.json"
# Bumped whenever the rows produced for the same parameters change, so cached files from
# an older version are rewritten rather than reused.
FORMAT_VERSION = 3

# The default job: single- and two-digit addition, sized for a 2-core CPU run.
DEFAULT_MIX = {"digits": (1, 2), "ops": ("+",)}
DEFAULT_SIZES = {"n_train": 2000, "n_val": 200, "seed": 1}

# How hard to look for a question not yet drawn in this split before accepting a repeat;
# small spaces (single-digit addition has 100 questions) run out of new ones.
_UNSEEN_TRIES = 20
# Draws allowed to land one question on the requested side before giving up.
_MAX_DRAWS = 10_000
# Kinds with at most this many operand pairs have their held-out questions listed (two
# digits: 8,100); larger ones are drawn at random, where repeats are rare.
_LISTABLE_PAIRS = 100_000


def _operand_range(digits: int) -> tuple[int, int]:
    if digits < 1:
        raise ValueError(f"digit counts must be >= 1, got {digits}")
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return low, 10**digits - 1


def _answer(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")


def _is_val_question(question: str, val_fraction: float) -> bool:
    # A hash of the text, not of the draw, decides the side: disjoint across any calls.
    digest = hashlib.blake2b(question.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < val_fraction


def _weights(values: Sequence, weights: Sequence[float] | None, name: str) -> np.ndarray:
    if weights is None:
        return np.full(len(values), 1.0 / len(values))
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(values),) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"{name} must be {len(values)} non-negative numbers with a positive sum, got {weights}")
    return w / w.sum()


def _ordered(a: int, op: str, b: int, allow_negative: bool) -> tuple[int, int, str]:
    if op == "-" and not allow_negative and a < b:
        a, b = b, a
    return a, b, f"What is {a} {op} {b}?"


_OP_NAMES = {"+": "add", "-": "sub", "*": "mul"}


def _subset(digits: int, op: str, ops: Sequence[str]) -> str:
    """The question type validation metrics are broken down by (`extra_info.subset`)."""
    return f"{digits}-digit" if len(ops) == 1 else f"{digits}-digit-{_OP_NAMES[op]}"


def _row(index: int, split: str, a: int, op: str, b: int, digits: int, subset: str, instruction: str) -> dict:
    question = f"What is {a} {op} {b}?"
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {instruction}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(_answer(a, op, b))},
        "extra_info": {
            "split": split,
            "index": index,
            "a": a,
            "b": b,
            "op": op,
            "digits": digits,
            "question": question,
            "subset": subset,
        },
    }


def _check_mix(n: int, digits, ops, val_fraction: float) -> None:
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not digits or not ops:
        raise ValueError(f"digits and ops must be non-empty, got digits={digits} ops={ops}")
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise ValueError(f"unknown ops {unknown}; known: {', '.join(OPS)}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")


def make_arithmetic_rows(
    n: int,
    seed: int,
    split: str,
    digits: Sequence[int] = (1, 2),
    ops: Sequence[str] = ("+",),
    digit_weights: Sequence[float] | None = None,
    op_weights: Sequence[float] | None = None,
    allow_negative: bool = False,
    val_fraction: float = 0.2,
    instruction: str = INSTRUCTION,
) -> list[dict]:
    """`n` verl-schema rows of the `split` side ("train" or anything else for held out).

    Each question has a digit count from `digits` (both operands get that many digits;
    one digit means 0-9) and an op from `ops`, with optional weights. With
    `allow_negative=False` subtraction puts the larger operand first. `val_fraction` is the
    share of all possible questions reserved for the held-out side.

    Training rows are drawn with the weights and may repeat a question once the small
    spaces run out of new ones. Held-out rows are all distinct: each kind (digits, op) gets
    its share of `n` by the weights, except that a kind with fewer held-out questions than
    its share gives all it has and the others make up the rest.
    """
    _check_mix(n, digits, ops, val_fraction)
    digits = [int(d) for d in digits]
    ops = list(ops)
    p_digits = _weights(digits, digit_weights, "digit_weights")
    p_ops = _weights(ops, op_weights, "op_weights")
    rng = np.random.default_rng(seed)
    if split == "train":
        drawn = _draw_train(n, rng, digits, ops, p_digits, p_ops, allow_negative, val_fraction)
    else:
        drawn = _draw_distinct_held_out(n, rng, digits, ops, p_digits, p_ops, allow_negative, val_fraction)
    return [
        _row(index, split, a, op, b, d, _subset(d, op, ops), instruction) for index, (a, op, b, d) in enumerate(drawn)
    ]


def _draw_train(n, rng, digits, ops, p_digits, p_ops, allow_negative, val_fraction) -> list[tuple]:
    seen: set[str] = set()
    drawn = []
    for _ in range(n):
        level = int(rng.choice(len(digits), p=p_digits))
        op = ops[int(rng.choice(len(ops), p=p_ops))]
        low, high = _operand_range(digits[level])
        fallback = None
        on_side = 0
        for _ in range(_MAX_DRAWS):
            a, b = (int(x) for x in rng.integers(low, high + 1, size=2))
            a, b, question = _ordered(a, op, b, allow_negative)
            if _is_val_question(question, val_fraction):
                continue
            fallback = (a, b, question)
            on_side += 1
            if question not in seen or on_side >= _UNSEEN_TRIES:
                break
        if fallback is None:
            raise ValueError(
                f"no train question found for {digits[level]}-digit {op!r}: the space is too small "
                f"for val_fraction={val_fraction}; use more digits or another val_fraction"
            )
        seen.add(fallback[2])
        drawn.append((fallback[0], op, fallback[1], digits[level]))
    return drawn


def _held_out_pool(digits: int, op: str, allow_negative: bool, val_fraction: float) -> list[tuple[int, int]] | None:
    """Every distinct held-out question of one kind, in a fixed order; None when the kind
    has too many questions to list (then distinct draws are easy to find at random)."""
    low, high = _operand_range(digits)
    if (high - low + 1) ** 2 > _LISTABLE_PAIRS:
        return None
    pool: dict[str, tuple[int, int]] = {}
    for a in range(low, high + 1):
        for b in range(low, high + 1):
            a2, b2, question = _ordered(a, op, b, allow_negative)
            if question not in pool and _is_val_question(question, val_fraction):
                pool[question] = (a2, b2)
    return list(pool.values())


def _shares(n: int, weights: np.ndarray, capacities: list[float]) -> list[int]:
    """`n` split by `weights` (largest remainders), no share above its capacity: what a full
    kind cannot take goes to the others by their weights."""
    shares = [0] * len(weights)
    left, open_kinds = n, [k for k in range(len(weights)) if weights[k] > 0 and capacities[k] > 0]
    while left > 0 and open_kinds:
        w = np.array([weights[k] for k in open_kinds]) / sum(weights[k] for k in open_kinds)
        exact = w * left
        add = np.floor(exact).astype(int)
        for i in np.argsort(-(exact - add), kind="stable")[: left - int(add.sum())]:
            add[i] += 1
        for i, k in enumerate(open_kinds):
            shares[k] += int(min(add[i], capacities[k] - shares[k]))
        left = n - sum(shares)
        open_kinds = [k for k in open_kinds if shares[k] < capacities[k]]
    if left > 0:
        raise ValueError(
            f"only {sum(shares)} distinct held-out questions exist for this mix, {n} asked for: "
            f"lower n_val, or add digits or ops"
        )
    return shares


def _draw_distinct_held_out(n, rng, digits, ops, p_digits, p_ops, allow_negative, val_fraction) -> list[tuple]:
    kinds = [(d, op) for d in digits for op in ops]
    weights = np.array([p_digits[i] * p_ops[j] for i in range(len(digits)) for j in range(len(ops))])
    pools = [_held_out_pool(d, op, allow_negative, val_fraction) for d, op in kinds]
    shares = _shares(n, weights, [float("inf") if pool is None else len(pool) for pool in pools])
    drawn = []
    for (d, op), pool, share in zip(kinds, pools, shares):
        if pool is not None:
            picks = [pool[i] for i in sorted(rng.choice(len(pool), size=share, replace=False).tolist())]
        else:
            picks = _draw_unlisted(share, rng, d, op, allow_negative, val_fraction)
        drawn.extend((a, op, b, d) for a, b in picks)
    return [drawn[i] for i in rng.permutation(len(drawn)).tolist()]


def _draw_unlisted(
    k: int, rng, digits: int, op: str, allow_negative: bool, val_fraction: float
) -> list[tuple[int, int]]:
    low, high = _operand_range(digits)
    picks: dict[str, tuple[int, int]] = {}
    for _ in range(_MAX_DRAWS * max(k, 1)):
        if len(picks) == k:
            break
        a, b = (int(x) for x in rng.integers(low, high + 1, size=2))
        a, b, question = _ordered(a, op, b, allow_negative)
        if _is_val_question(question, val_fraction):
            picks.setdefault(question, (a, b))
    return list(picks.values())


def _atomic_write(final: Path, write) -> None:
    """Call `write(tmp_path)` and rename the result into place only once it is complete."""
    fd, tmp = tempfile.mkstemp(prefix=final.name + ".tmp-", dir=final.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, final)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _write_rows(rows: list[dict], final: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    _atomic_write(final, lambda tmp: pq.write_table(pa.Table.from_pylist(rows), tmp))


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_arithmetic_parquet(out_dir, n_train: int, n_val: int, seed: int, **mix) -> dict[str, Path]:
    """Write `train.parquet` and `val.parquet` under `out_dir`; return their paths.

    `mix` takes the keyword arguments of `make_arithmetic_rows` (digits, ops, weights, ...).
    Nothing is written when both files exist and `arithmetic_params.json` beside them
    records the same parameters.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"train": out / "train.parquet", "val": out / "val.parquet"}
    params_path = out / PARAMS_FILE
    params = _jsonable({"format_version": FORMAT_VERSION, "n_train": n_train, "n_val": n_val, "seed": seed, "mix": mix})
    if params_path.is_file() and all(p.is_file() for p in paths.values()):
        with open(params_path) as f:
            if json.load(f) == params:
                return paths
    # The record goes first and comes back last: files without it are never trusted.
    if params_path.exists():
        params_path.unlink()
    # The held-out side uses a different stream so its draws do not mirror the train draws.
    _write_rows(make_arithmetic_rows(n_train, seed, "train", **mix), paths["train"])
    _write_rows(make_arithmetic_rows(n_val, seed + 1_000_003, "val", **mix), paths["val"])

    def write_params(tmp):
        with open(tmp, "w") as f:
            json.dump(params, f, indent=2)

    _atomic_write(params_path, write_params)
    return paths


def write_default_arithmetic_dataset(out_dir) -> dict[str, Path]:
    """The default job's data: single- and two-digit addition, 2000 train / 200 val, seed 1."""
    return write_arithmetic_parquet(out_dir, **DEFAULT_SIZES, **DEFAULT_MIX)
