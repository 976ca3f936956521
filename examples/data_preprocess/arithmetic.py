"""Write the arithmetic task's parquet files (hybrid/arithmetic_task.py) with a chosen mix.

    python examples/data_preprocess/arithmetic.py --local_dir ~/data/arithmetic \
        --digits 1 2 --ops + - --n_train 4000 --n_val 400 --seed 7

Train and validation never share a question. Without options this writes the default
job's data (single- and two-digit addition, 2000/200, seed 1).
"""

from __future__ import annotations

import argparse
import os

from hybrid.arithmetic_task import DEFAULT_MIX, DEFAULT_SIZES, OPS, write_arithmetic_parquet


def write_dataset(
    local_dir: str,
    n_train: int = DEFAULT_SIZES["n_train"],
    n_val: int = DEFAULT_SIZES["n_val"],
    seed: int = DEFAULT_SIZES["seed"],
    digits=DEFAULT_MIX["digits"],
    ops=DEFAULT_MIX["ops"],
    digit_weights=None,
    op_weights=None,
    allow_negative: bool = False,
) -> dict:
    mix = {"digits": tuple(digits), "ops": tuple(ops), "allow_negative": allow_negative}
    if digit_weights is not None:
        mix["digit_weights"] = tuple(digit_weights)
    if op_weights is not None:
        mix["op_weights"] = tuple(op_weights)
    return write_arithmetic_parquet(local_dir, n_train, n_val, seed, **mix)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", default=os.path.expanduser("~/data/arithmetic"), help="output folder")
    parser.add_argument("--n_train", type=int, default=DEFAULT_SIZES["n_train"])
    parser.add_argument("--n_val", type=int, default=DEFAULT_SIZES["n_val"])
    parser.add_argument("--seed", type=int, default=DEFAULT_SIZES["seed"])
    parser.add_argument(
        "--digits", type=int, nargs="+", default=list(DEFAULT_MIX["digits"]), help="operand digit counts"
    )
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(DEFAULT_MIX["ops"]))
    parser.add_argument("--digit_weights", type=float, nargs="+", default=None, help="one weight per --digits entry")
    parser.add_argument("--op_weights", type=float, nargs="+", default=None, help="one weight per --ops entry")
    parser.add_argument("--allow_negative", action="store_true", help="let subtraction go below zero")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    paths = write_dataset(
        os.path.expanduser(args.local_dir),
        n_train=args.n_train,
        n_val=args.n_val,
        seed=args.seed,
        digits=args.digits,
        ops=args.ops,
        digit_weights=args.digit_weights,
        op_weights=args.op_weights,
        allow_negative=args.allow_negative,
    )
    print(f"train: {paths['train']}\nval: {paths['val']}")
