"""Every config key has one home: code reads keys through the typed config's fields
(`config.actor_rollout_ref.rollout.n`), never by string. This lists each place outside the
typed config that names a key in a string to read it, and fails when there is any:

    OmegaConf.select(cfg, "trainer.seed")     cfg["trainer"]["seed"]     cfg.get("trainer")["seed"]
    getattr(config.trainer, "seed")           config.trainer.get("seed")

A string names a key when the expression it reads from, followed by the string, ends in (the
tail of) a dotted path of `ppo_trainer.yaml` with at least two parts (`x["critic"]` alone is as
likely a worker group or a data column). Exempt: hybrid/config and workers/config (the typed config and
its boundary, which build the fields from the tree) and hybrid/dialects (a front end that writes
keys for the config to read).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("hybrid", "workers", "reward", "protocol", "scripts")
EXEMPT = ("hybrid/config/", "workers/config/", "hybrid/dialects/")
READERS = {"get": 0, "pop": 0, "setdefault": 0, "getattr": 1, "hasattr": 1, "select": 1, "update": 1}


def config_key_paths() -> set[str]:
    """Every dotted path of the config and every tail of two or more parts of one
    (`rollout.temperature`: code holding the rollout section reads from there)."""
    from hybrid.config import config_paths, default_config

    paths, _ = config_paths(default_config())
    tails = set()
    for path in paths:
        parts = path.split(".")
        tails.update(".".join(parts[start:]) for start in range(len(parts) - 1))
    return tails


def _chain(node: ast.AST) -> list[str] | None:
    """The names of an expression like `self.config.trainer` or `cfg["trainer"]` (None: other)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        inner = _chain(node.value)
        return None if inner is None else inner + [node.attr]
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        inner = _chain(node.value)
        return None if inner is None else inner + node.slice.value.split(".")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        key = node.args[0]
        inner = _chain(node.func.value)
        if inner is not None and isinstance(key, ast.Constant) and isinstance(key.value, str):
            return inner + key.value.split(".")
    return None


def _read(node: ast.AST) -> tuple[list[str], str] | None:
    """(names of the object read from, the key string) when `node` reads a key by string."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return _chain(node.value) or [], node.slice.value
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name not in READERS or len(node.args) <= READERS[name]:
        return None
    key = node.args[READERS[name]]
    if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
        return None
    if READERS[name] == 1:  # getattr(obj, "k"), OmegaConf.select(obj, "a.b")
        return _chain(node.args[0]) or [], key.value
    return (_chain(func.value) if isinstance(func, ast.Attribute) else None) or [], key.value


def key_reads(source: str, paths: set[str]) -> list[tuple[int, str]]:
    """(line, key) of every read of a config key by string in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        read = _read(node)
        if read is None:
            continue
        names, key = read
        parts = names + key.split(".")
        # Any suffix of the expression's names plus the key that is a config path of 2+ parts.
        for start in range(len(parts) - 1):
            candidate = ".".join(parts[start:])
            if candidate.count(".") >= 1 and candidate in paths:
                found.append((node.lineno, candidate))
                break
    return sorted(set(found))


def test_no_config_key_is_read_by_string_outside_the_typed_config():
    paths = config_key_paths()
    offenders = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative.startswith(EXEMPT):
                continue
            offenders += [f"{relative}:{line}: {key}" for line, key in key_reads(path.read_text(), paths)]
    assert not offenders, "config keys read by string (read the typed field instead):\n" + "\n".join(offenders)


def test_reads_by_string_are_found():
    paths = config_key_paths()
    source = """
seed = OmegaConf.select(cfg, "trainer.seed")
n = cfg["actor_rollout_ref"]["rollout"]["n"]
lr = config.actor_rollout_ref.actor.optim.get("lr")
temperature = getattr(self.config.rollout, "temperature")
group = groups["critic"]  # a worker group, not a key
column = row["reward_model"]["ground_truth"]  # a data row's field
"""
    assert key_reads(source, paths) == [
        (2, "trainer.seed"),
        (3, "actor_rollout_ref.rollout"),
        (3, "actor_rollout_ref.rollout.n"),
        (4, "actor_rollout_ref.actor.optim.lr"),
        (5, "rollout.temperature"),
    ]
