"""Count how many of SkyRL's and ROLL's own FSDP/vLLM examples hybrid understands.

    python -m scripts.count_peer_examples --extract skyrl=/path/to/SkyRL/.git --extract roll=/path/to/ROLL/.git
        read each repository (a git directory; no work tree needed) and keep its examples in
        tests/data/peer_examples/<name>.json (so counting needs no network and no checkout)
    python -m scripts.count_peer_examples [--only skyrl] [--write-doc] [--json PATH]
        check every selected example as `python -m hybrid.main_ppo` would before starting and
        print one table: understood (every key does what the peer's docs say, or is a
        documented no-op here), refused (one message naming the key and why), error (a traceback)

`--write-doc` replaces the count section of docs/config_dialects.md. The dialect modules are in
scripts/peer_examples/ (that package's docstring gives their interface).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from scripts.peer_examples import ERROR, REFUSED, UNDERSTOOD

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "tests" / "data" / "peer_examples"
DOC = ROOT / "docs" / "config_dialects.md"
DOC_BEGIN = "<!-- peer-example-count:begin (scripts/count_peer_examples.py --write-doc) -->"
DOC_END = "<!-- peer-example-count:end -->"
COUNT_HEADING = "## The peers' own examples, counted"
DIALECT_MODULES = {"skyrl": "scripts.peer_examples.skyrl", "roll": "scripts.peer_examples.roll"}


def dialect_module(name: str):
    return importlib.import_module(DIALECT_MODULES[name])


def extract(name: str, git_dir: Path) -> Path:
    """Read the repository's examples and keep them in tests/data; returns the file written."""
    found = dialect_module(name).extract(git_dir)
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    path = DATA_DIR / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def count(name: str) -> dict:
    """Check every selected example of one dialect; returns its row of the table."""
    module = dialect_module(name)
    kept = json.loads((DATA_DIR / f"{name}.json").read_text())
    selected = [example for example in kept["examples"] if example["selected"]]
    results = []
    for example in selected:
        with tempfile.TemporaryDirectory(prefix=f"peer-{name}-") as workdir:
            status, reason = module.check(example, Path(workdir))
        results.append({"path": example["path"], "status": status, "reason": reason})
    statuses = Counter(result["status"] for result in results)
    not_selected = Counter(example["why_not"] for example in kept["examples"] if not example["selected"])
    return {
        "repository": module.REPOSITORY,
        "commit": kept["commit"],
        "examples": len(kept["examples"]),
        "selected": len(selected),
        UNDERSTOOD: statuses[UNDERSTOOD],
        REFUSED: statuses[REFUSED],
        ERROR: statuses[ERROR],
        "understood_fraction": statuses[UNDERSTOOD] / len(selected) if selected else 0.0,
        "not_selected": dict(sorted(not_selected.items())),
        "results": results,
    }


def table(rows: dict[str, dict]) -> str:
    lines = [
        "| repository | commit | example files | FSDP/vLLM examples | understood | refused | errors | understood % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows.values():
        lines.append(
            f"| {row['repository']} | `{row['commit'][:12]}` | {row['examples']} | {row['selected']} | "
            f"{row[UNDERSTOOD]} | {row[REFUSED]} | {row[ERROR]} | {100 * row['understood_fraction']:.1f} |"
        )
    return "\n".join(lines)


COUNT_INTRO = """Every example launch file of each repository (at the commit named), read without running it
(SkyRL's shell scripts with their own variable defaults, ROLL's YAML files with the files their
Hydra `defaults` pull in; kept in tests/data/peer_examples/ so the count needs no network), the
FSDP/vLLM training launches selected by the rule in scripts/peer_examples/skyrl.py or roll.py,
and each checked as `python -m hybrid.main_ppo` checks it before anything starts: understood
(every key does what the peer's docs say, or is a documented no-op here), refused (one message
naming the key and why), error (a traceback; none). Judged as configurations, not against this
machine: the examples are written for 8-GPU nodes. Regenerate with
`python -m scripts.count_peer_examples --write-doc`; tests/unit/test_peer_examples_*.py keep the
counts from falling."""


def doc_section(rows: dict[str, dict]) -> str:
    parts = [DOC_BEGIN, "", COUNT_INTRO, "", table(rows), ""]
    for row in rows.values():
        parts.append(f"{row['repository']}: examples not counted (not FSDP/vLLM training launches):")
        parts += [f"- {why}: {n}" for why, n in row["not_selected"].items()] or ["- none"]
        parts.append("")
        missed = [result for result in row["results"] if result["status"] != UNDERSTOOD]
        parts.append(f"{row['repository']}: examples not understood ({len(missed)}):")
        parts += [f"- `{r['path']}` ({r['status']}): {r['reason'][:300]}" for r in missed] or ["- none"]
        parts.append("")
    parts.append(DOC_END)
    return "\n".join(parts)


def write_doc(rows: dict[str, dict]) -> None:
    text = DOC.read_text()
    section = doc_section(rows)
    if DOC_BEGIN in text and DOC_END in text:
        head, rest = text.split(DOC_BEGIN, 1)
        text = head + section + rest.split(DOC_END, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n{COUNT_HEADING}\n\n" + section + "\n"
    tmp = DOC.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(DOC)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--extract", action="append", default=[], metavar="NAME=GIT_DIR")
    parser.add_argument("--only", choices=sorted(DIALECT_MODULES), action="append")
    parser.add_argument("--write-doc", action="store_true")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the table's numbers here")
    args = parser.parse_args(argv)
    for item in args.extract:
        name, _, git_dir = item.partition("=")
        if name not in DIALECT_MODULES or not git_dir:
            parser.error(f"--extract {item}: give NAME=GIT_DIR with NAME one of {', '.join(DIALECT_MODULES)}")
        print(f"{name}: examples kept in {extract(name, Path(git_dir)).relative_to(ROOT)}")
    if args.extract and not (args.only or args.write_doc or args.json):
        return 0
    rows = {name: count(name) for name in args.only or DIALECT_MODULES}
    print(table(rows))
    for row in rows.values():
        for result in row["results"]:
            if result["status"] != UNDERSTOOD:
                print(f"{row['repository']} {result['path']} ({result['status']}): {result['reason'][:300]}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.write_doc:
        write_doc(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
