"""Rules of the code's shape that a reviewer would otherwise check by eye: config read only
through the typed fields below the entry point, and functions short enough to read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("hybrid", "workers", "reward", "protocol", "scripts")
MAX_FUNCTION_LINES = 80

# Code below the entry point reads the typed config; `.get("key", default)` on a config
# section would be a second copy of the yaml's defaults. Plain dicts (meta_info, rows,
# results) still use `.get`: the names below are what config sections are called.
CONFIG_NAMES = (
    r"(config|cfg|section|model_cfg|model_config|fsdp|fsdp_config|optim|optim_config|actor_cfg|rollout_cfg"
    r"|data_config|trainer_cfg|kw|val_kwargs|reward_model|custom|algorithm_config|kl_ctrl_config)"
)
GET_ON_CONFIG = re.compile(CONFIG_NAMES + r"(\.[a-z_]+)*\.get\(\s*\"[a-z_]+\"\s*,")


def test_no_config_get_with_default_below_the_entry_point():
    offenders = []
    for folder in ("hybrid", "workers", "reward", "protocol"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.parts[-2] == "config" or path.name == "main_ppo.py":
                continue  # the boundary itself builds the typed config
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if GET_ON_CONFIG.search(line):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "config read with .get (use the typed field):\n" + "\n".join(offenders)


def test_no_function_is_longer_than_80_lines():
    long = []
    for folder in PACKAGES:
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, "split these functions:\n" + "\n".join(long)


def test_test_files_have_unique_basenames():
    # pytest imports test files by basename (rootdir-relative packages are not used here): two
    # test files of one name in different folders stop the whole run at collection.
    seen: dict[str, list[str]] = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(path.relative_to(REPO).as_posix())
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
