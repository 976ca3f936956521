"""No advantage estimator or loss-aggregation mode is compared by its name outside its registry
(issue 37: facts about a plug-in live in its spec): the driver (hybrid/) and the workers
(workers/) ask `estimator_spec(name)` and `aggregation_spec(mode)`. The check runs on the
source (ast): a comparison (`==`, `!=`, `in`, `not in`) against a registered name, a literal
table of such names (a tuple, list, set or dict keyed by them), `AdvantageEstimator.X` in a
comparison, or `mode.startswith("seq-mean")`-style prefix tests of a mode.

Left out: the registries themselves (hybrid/core_algos.py, workers/losses.py,
workers/loss_math.py) and hybrid/dialects/, which translate other projects' configs (SkyRL's,
ROLL's): the names compared there are those projects' spellings, mapped onto hybrid's keys."""

from __future__ import annotations

import ast
from pathlib import Path

from hybrid.core_algos import ADV_ESTIMATOR_REGISTRY, AdvantageEstimator
from workers.losses import AGG_LOSS_MODES

REPO = Path(__file__).resolve().parents[2]
REGISTRIES = {"hybrid/core_algos.py", "workers/losses.py", "workers/loss_math.py"}
FOREIGN = ("hybrid/dialects/",)
NAMES = frozenset(ADV_ESTIMATOR_REGISTRY) | frozenset(AGG_LOSS_MODES)


def _named(node: ast.AST, names: frozenset[str]) -> bool:
    """A registered name as a literal, inside a literal collection, or AdvantageEstimator.X."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_named(e, names) for e in node.elts)
    if isinstance(node, ast.Dict):
        return any(k is not None and _named(k, names) for k in node.keys)
    while isinstance(node, ast.Attribute):  # AdvantageEstimator.GAE, AdvantageEstimator.GAE.value
        node = node.value
        if isinstance(node, ast.Name) and node.id == AdvantageEstimator.__name__:
            return True
    return False


def name_comparisons(source: str, names: frozenset[str] = NAMES) -> list[str]:
    """'line: code' of every comparison of a registered name, and every literal table of them."""
    found = []
    prefixes = {name[:i] for name in names if "-" in name for i in range(4, len(name)) if name[i - 1] != "-"}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_named(n, names) for n in (node.left, *node.comparators)):
            found.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            if isinstance(node.value, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and _named(node.value, names):
                found.append(node)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith")
            and any(isinstance(a, ast.Constant) and a.value in prefixes | names for a in node.args)
        ):
            found.append(node)
    return [f"{n.lineno}: {ast.get_source_segment(source, n)}" for n in found]


def test_no_estimator_or_aggregation_name_is_compared_outside_its_registry():
    found = {}
    for package in ("hybrid", "workers"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel in REGISTRIES or rel.startswith(FOREIGN):
                continue
            hits = name_comparisons(path.read_text())
            if hits:
                found[rel] = hits
    assert found == {}, "ask estimator_spec(name) / aggregation_spec(mode) instead:\n" + "\n".join(
        f"{rel}:{hit}" for rel, hits in found.items() for hit in hits
    )


def test_the_check_finds_planted_comparisons():
    planted = """
if config.algorithm.adv_estimator == "remax":
    pass
if "gae" != name:
    pass
GROUPLESS = ("gae", "no_op")
if name in ("grpo", "rloo"):
    pass
REASONS = {"opo": "lengths"}
if name == AdvantageEstimator.GAE.value:
    pass
seq_level = cfg.loss_agg_mode.startswith("seq-mean")
summed = cfg.loss_agg_mode == "token-sum"
"""
    assert sorted(int(hit.split(":")[0]) for hit in name_comparisons(planted)) == [2, 4, 6, 7, 9, 10, 12, 13]
    clean = """
spec = estimator_spec(config.algorithm.adv_estimator)
if spec.greedy_baseline and name == "vanilla" and key.startswith("token_level"):
    message = f"algorithm.adv_estimator=gae ({name})"
register("gae")
"""
    assert name_comparisons(clean) == []
