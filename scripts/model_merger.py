"""Turn a sharded checkpoint into a Hugging Face model folder, or check one against another.

    python -m scripts.model_merger merge --backend fsdp \\
        --local_dir checkpoints/<project>/<experiment>/global_step_N/actor --target_dir <out>
    python -m scripts.model_merger test --backend fsdp --local_dir <ckpt actor or HF folder> --test_hf_dir <reference>

The command line of hybrid/model_merge.py (which says what `merge` and `test` do); a checkpoint
is checked against its manifest first. Mistakes in the arguments and damaged checkpoints end
in one `model_merger: ...` line and exit status 2, without a traceback
(hybrid/errors.py; HYBRID_DEBUG=1 shows it).
"""

from __future__ import annotations

import argparse
import sys
import time

from hybrid.errors import exit_on_error
from hybrid.model_merge import DTYPES, compare, merge, verify_against_manifest


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.model_merger", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="operation", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", required=True, choices=["fsdp"], help="checkpoint format (FSDP2 shards)")
    common.add_argument("--local_dir", required=True, help="global_step_N/actor (or /critic) folder")
    common.add_argument(
        "--hf_model_path", default=None, help="config/tokenizer source (default: <local_dir>/huggingface)"
    )
    merge_parser = sub.add_parser("merge", parents=[common], help="write a Hugging Face folder")
    merge_parser.add_argument("--target_dir", required=True)
    merge_parser.add_argument("--max_shard_size", default="5GB", help="largest safetensors file, e.g. 5GB, 500MB")
    merge_parser.add_argument(
        "--dtype", choices=sorted(DTYPES), default=None, help="cast the weights (default: as trained)"
    )
    merge_parser.add_argument(
        "--save_lora_adapter",
        action="store_true",
        help="write the LoRA adapter as a peft folder instead of merging it into the weights",
    )
    test_parser = sub.add_parser("test", parents=[common], help="compare with a reference Hugging Face folder")
    test_parser.add_argument("--test_hf_dir", required=True)
    test_parser.add_argument("--atol", type=float, default=1e-6)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Run the command; raises on a mistake (`cli` turns that into a message and a status)."""
    args = parse_args(argv)
    start = time.perf_counter()
    verify_against_manifest(args.local_dir)
    if args.operation == "merge":
        files = merge(
            args.local_dir, args.target_dir, args.max_shard_size, args.save_lora_adapter, args.dtype, args.hf_model_path
        )
        print(
            f"model_merger: wrote {len(files)} weight file(s) to {args.target_dir} in "
            f"{time.perf_counter() - start:.1f} s"
        )
        return 0
    ok, lines = compare(args.local_dir, args.test_hf_dir, args.atol)
    print("\n".join(lines))
    print(f"model_merger test: {'PASS' if ok else 'FAIL'} ({time.perf_counter() - start:.1f} s)")
    return 0 if ok else 1


def cli(argv=None) -> int:
    """The command line: `main`, with any failure reported as one message (exit status 2
    for a wrong argument, hybrid/errors.py)."""
    with exit_on_error(prog="model_merger"):
        return main(argv)


if __name__ == "__main__":
    sys.exit(cli())
