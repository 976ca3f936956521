"""How long a mistake takes to be reported, against the time to import what the check needs:

    python -m scripts.bench_fail_fast [--repeats 3] [--json PATH]

Runs `python -m hybrid.main_ppo` on three kinds of mistake (a configuration value, a missing
data file, a prompt longer than data.max_prompt_length on the tiny test model) and, as the
baseline in the same command, `python -c "import torch, transformers"`. Each is run
`--repeats` times; the table gives the median wall and CPU seconds (user + system of the
child) and the ratio of each to the baseline's. tests/unit/test_errors.py holds that these
mistakes are found before Ray, vLLM or a model's weights are touched; this measures the cost.

JSON keys: rows[].{case, wall_s, cpu_s, wall_ratio, cpu_ratio, returncode}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROW = {"prompt": "What is 1 + 1?", "data_source": "arithmetic", "reward_model": {"ground_truth": "2"}}


def _timed(cmd: list[str], cwd: Path, env: dict) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), result.returncode


def _cases(work: Path) -> dict[str, list[str]]:
    from transformers import AutoTokenizer

    from hybrid.defaults import default_model_path
    from tests.conftest import build_tiny_model_dir

    rows = [ROW] * 7 + [{**ROW, "prompt": "word " * 80}] + [ROW] * 8
    (work / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tiny = build_tiny_model_dir(work / "tiny_model", AutoTokenizer.from_pretrained(default_model_path()))
    cli = [sys.executable, "-m", "hybrid.main_ppo"]
    return {
        "baseline: import torch, transformers": [sys.executable, "-c", "import torch, transformers"],
        "config value (rollout.temperature=-1)": [*cli, "actor_rollout_ref.rollout.temperature=-1"],
        "missing data file": [*cli, "data.train_files=missing.parquet"],
        "prompt too long (tokenizer read)": [
            *cli,
            f"actor_rollout_ref.model.path={tiny}",
            "data.train_files=train.jsonl",
            "data.val_files=null",
            "data.max_prompt_length=32",
        ],
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the table's numbers here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = dict(os.environ, HYBRID_CACHE_DIR=str(work / "cache"), OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        rows = []
        for case, cmd in _cases(work).items():
            runs = [_timed(cmd, work, env) for _ in range(args.repeats)]
            rows.append(
                {
                    "case": case,
                    "wall_s": statistics.median(r[0] for r in runs),
                    "cpu_s": statistics.median(r[1] for r in runs),
                    "returncode": runs[-1][2],
                }
            )
    base = rows[0]
    for row in rows:
        row["wall_ratio"] = row["wall_s"] / base["wall_s"]
        row["cpu_ratio"] = row["cpu_s"] / base["cpu_s"]
    print(f"{'case':42} {'wall s':>8} {'cpu s':>8} {'wall x':>7} {'cpu x':>7} {'exit':>5}")
    for row in rows:
        print(
            f"{row['case']:42} {row['wall_s']:8.2f} {row['cpu_s']:8.2f} "
            f"{row['wall_ratio']:7.2f} {row['cpu_ratio']:7.2f} {row['returncode']:5d}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"bench": "bench_fail_fast", "repeats": args.repeats, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
