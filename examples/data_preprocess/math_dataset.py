"""Turn a local copy of MATH (`problem`/`solution` rows) into verl-schema parquet files.

    python examples/data_preprocess/math_dataset.py --input_dir ~/data/math_raw --local_dir ~/data/math

`--input_dir` holds `train*` and `test*` JSON-lines or parquet files (e.g. the
`DigitalLearningGmbH/MATH-lighteval` layout). The ground truth is the last `\\boxed{}`
answer of each solution; `level` and `type` are kept in `extra_info` when present.
"""

from __future__ import annotations

import argparse
import os

import pyarrow as pa
import pyarrow.parquet as pq

from hybrid.data import read_rows
from reward.scorers.math import extract_boxed_answer

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def make_row(problem: str, solution: str, split: str, index: int, extra: dict | None = None) -> dict:
    answer = extract_boxed_answer(solution)
    if answer is None:
        raise ValueError(f"solution has no \\boxed{{}} answer: {solution[-200:]!r}")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, **(extra or {})},
    }


def process_math(input_path: str, out_path: str, split: str) -> int:
    """Convert one split file; returns the number of rows written."""
    rows = read_rows(input_path)
    out = []
    for i, row in enumerate(rows):
        missing = [k for k in ("problem", "solution") if k not in row]
        if missing:
            raise ValueError(f"{input_path} row {i}: missing {missing}; columns present: {sorted(row)}")
        extra = {k: str(row[k]) for k in ("level", "type") if k in row}
        try:
            out.append(make_row(row["problem"], row["solution"], split, i, extra))
        except ValueError as e:
            raise ValueError(f"{input_path} row {i}: {e}") from e
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(out), out_path)
    return len(out)


def find_split_file(input_dir: str, split: str) -> str:
    candidates = []
    for root, _, files in os.walk(input_dir):
        for name in files:
            if name.startswith(split) and name.endswith((".jsonl", ".json", ".parquet")):
                candidates.append(os.path.join(root, name))
    if len(candidates) != 1:
        raise FileNotFoundError(
            f"expected one {split}*.jsonl/.json/.parquet file under {input_dir}, found {sorted(candidates) or 'none'}"
        )
    return candidates[0]


def process_dir(input_dir: str, local_dir: str) -> dict[str, str]:
    paths = {}
    for split in ("train", "test"):
        out = os.path.join(local_dir, f"{split}.parquet")
        n = process_math(find_split_file(input_dir, split), out, split)
        print(f"{split}: {n} rows -> {out}")
        paths[split] = out
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input_dir", required=True, help="folder with the train/test MATH files")
    parser.add_argument("--local_dir", default=os.path.expanduser("~/data/math"), help="output folder")
    args = parser.parse_args()
    process_dir(os.path.expanduser(args.input_dir), os.path.expanduser(args.local_dir))
