"""Where every bench writes its numbers: the `--json PATH` argument all of them take, and the
file it names (default `.bench/<bench>/<bench>-<time>.json`), stamped with the commit."""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def add_json_argument(parser: argparse.ArgumentParser, bench: str) -> None:
    parser.add_argument("--json", metavar="PATH", help=f"write the table's numbers here (default .bench/{bench}/...)")


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def write_report(bench: str, doc: dict, json_path: str | Path | None, bench_dir: Path | None = None) -> Path:
    """Write the bench's numbers to --json PATH (default <bench_dir>/<bench>-<time>.json)."""
    bench_dir = bench_dir or REPO / ".bench" / bench
    path = Path(json_path) if json_path else bench_dir / f"{bench}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"bench": bench, "commit": git_commit(), **doc}, indent=2, default=str))
    print(f"wrote {path}")
    return path
