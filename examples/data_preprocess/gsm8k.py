"""Turn a local copy of GSM8K (`question`/`answer` rows) into verl-schema parquet files.

    python examples/data_preprocess/gsm8k.py --input_dir ~/data/gsm8k_raw --local_dir ~/data/gsm8k

`--input_dir` holds the `train` and `test` splits as JSON-lines or parquet files (the names
start with `train`/`test`, as in the dataset's own repository: `train.jsonl`,
`main/train-00000-of-00001.parquet`, ...). The output is `train.parquet` and
`test.parquet` with the prompt verl's GSM8K recipe uses and `ground_truth` = the number
after `####`.
"""

from __future__ import annotations

import argparse
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq

from hybrid.data import read_rows

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_FINAL = re.compile(r"#### (-?[0-9.,]+)")


def extract_solution(answer: str) -> str:
    """The number after `####` in a GSM8K answer, commas removed."""
    found = _FINAL.search(answer)
    if found is None:
        raise ValueError(f"GSM8K answer has no '#### <number>' line: {answer[-200:]!r}")
    return found.group(1).replace(",", "")


def make_row(question: str, answer: str, split: str, index: int) -> dict:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": extract_solution(answer)},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def process_gsm8k(input_path: str, out_path: str, split: str) -> int:
    """Convert one split file; returns the number of rows written."""
    rows = read_rows(input_path)
    out = []
    for i, row in enumerate(rows):
        missing = [k for k in ("question", "answer") if k not in row]
        if missing:
            raise ValueError(f"{input_path} row {i}: missing {missing}; columns present: {sorted(row)}")
        try:
            out.append(make_row(row["question"], row["answer"], split, i))
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
        n = process_gsm8k(find_split_file(input_dir, split), out, split)
        print(f"{split}: {n} rows -> {out}")
        paths[split] = out
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input_dir", required=True, help="folder with the train/test GSM8K files")
    parser.add_argument("--local_dir", default=os.path.expanduser("~/data/gsm8k"), help="output folder")
    args = parser.parse_args()
    process_dir(os.path.expanduser(args.input_dir), os.path.expanduser(args.local_dir))
