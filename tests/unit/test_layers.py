"""The import rule, written once: packages form layers, and a module imports only from its
own layer and the layers below it (docs/architecture.md draws them):

    scripts   tools: benchmarks, the merge tool's command line, the soak run
    hybrid    the driver: entry point, config, trainer, algorithms (hybrid.dialects above
              hybrid.config: a front end that emits config keys)
    workers   the device side: FSDP models, rollout engines, each worker's config sections
    reward    scoring and environments (the rollout's environments, the reward loop's scorers)
    protocol  the contract: DataProto, dispatch modes, how a config section is declared

Every import counts, also one inside a function: a lazy import still ties the layers; only
imports under `if TYPE_CHECKING:` (annotations, never run) do not. And no module takes part
in an import cycle. The checks run on the source (ast), so they also hold
for code that no test imports."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("scripts", "hybrid", "workers", "reward", "protocol")  # top to bottom
# Inside a layer, sub-packages that must not import the ones above them: (lower, upper).
INNER_RULES = (("hybrid.config", "hybrid.dialects"),)


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the layered packages under `root`."""
    modules = {}
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports, anywhere in the file (the longest known prefix of
    each imported name; `from pkg import mod` counts as pkg.mod when that is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            for end in range(len(parts), 0, -1):
                candidate = ".".join(parts[:end])
                if candidate in modules:
                    if candidate != name:
                        found.add(candidate)
                    break
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_files(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for every import of a module from a layer above a's own (or across INNER_RULES)."""
    rank = {package: index for index, package in enumerate(LAYERS)}
    wrong = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            if rank[target.split(".")[0]] < rank[source.split(".")[0]]:
                wrong.append(f"{source} -> {target}")
            for lower, upper in INNER_RULES:
                if _inside(source, lower) and _inside(target, upper):
                    wrong.append(f"{source} -> {target}")
    return wrong


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_module_imports_from_a_layer_above_its_own():
    wrong = upward_imports(import_graph(REPO))
    assert not wrong, "imports against the layers (docs/architecture.md):\n" + "\n".join(wrong)


def test_no_import_cycles():
    cycles = import_cycles(import_graph(REPO))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for package in LAYERS:
        (tmp_path / package).mkdir(exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_planted_upward_import_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "protocol/contract.py": "def f():\n    from workers.engine import Engine\n",  # lazy: still counts
            "protocol/typing_only.py": (  # annotations only: not counted
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import hybrid.trainer\n"
            ),
            "workers/engine.py": "from protocol.contract import f\nclass Engine: ...\n",
            "reward/score.py": "import hybrid.trainer\n",
            "hybrid/trainer.py": "from . import config\nfrom workers import engine\n",
            "hybrid/config/__init__.py": "from ..dialects import skyrl\n",
            "hybrid/dialects/__init__.py": "",
            "hybrid/dialects/skyrl.py": "from hybrid.config import x\n",
        },
    )
    graph = import_graph(root)
    assert graph["hybrid.trainer"] == {"hybrid.config", "workers.engine"}
    assert upward_imports(graph) == [
        "hybrid.config -> hybrid.dialects.skyrl",
        "protocol.contract -> workers.engine",
        "reward.score -> hybrid.trainer",
    ]
    assert import_cycles(graph) == [
        ["hybrid.config", "hybrid.dialects.skyrl"],
        ["protocol.contract", "workers.engine"],
    ]
