"""Every bench takes `--json PATH` and writes its numbers there (scripts/bench_report.py)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _takes_json(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name == "add_json_argument":
            return True
        if name == "add_argument" and any(isinstance(a, ast.Constant) and a.value == "--json" for a in node.args):
            return True
    return False


def test_every_bench_takes_json():
    benches = sorted((REPO / "scripts").glob("bench_*.py"))
    assert len(benches) >= 12
    missing = [p.name for p in benches if p.name != "bench_report.py" and not _takes_json(p)]
    assert not missing, f"benches without --json PATH: {missing}"


def test_write_report_writes_the_numbers_where_json_says(tmp_path, capsys):
    from scripts.bench_report import write_report

    path = write_report("bench_x", {"rows": [{"case": "a", "ratio": 1.5}]}, tmp_path / "sub" / "x.json")
    doc = json.loads(path.read_text())
    assert path == tmp_path / "sub" / "x.json"
    assert doc["bench"] == "bench_x" and doc["rows"] == [{"case": "a", "ratio": 1.5}]
    assert len(doc["commit"]) >= 7
    assert capsys.readouterr().out.strip() == f"wrote {path}"
    default = write_report("bench_x", {"rows": []}, None, tmp_path / "bench_dir")
    assert default.parent == tmp_path / "bench_dir" and default.name.startswith("bench_x-")
