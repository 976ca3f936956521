"""The rollout-engine registry (workers/rollout/engine.py): every engine implements the interface,
the config takes its names from the registry, and nothing outside the registry compares an
engine's name as a string."""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest

from workers.rollout.engine import (
    ENGINES,
    EngineSpec,
    RolloutEngine,
    engine_spec,
    engines_with,
    register_engine,
    unregister_engine,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
METHODS = ("generate_sequences", "generate_ids", "update_weights", "reset_caches", "sleep", "wake_up")


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_registered_engine_implements_the_interface(name):
    cls = engine_spec(name).engine_class()
    for method in METHODS:
        assert callable(getattr(cls, method, None)), f"{cls.__name__} lacks {method}"
    # The protocol's signatures: sleep(level), wake_up(tags=None).
    assert list(inspect.signature(cls.sleep).parameters) == ["self", "level"]
    assert inspect.signature(cls.wake_up).parameters["tags"].default is None
    assert {m for m in dir(RolloutEngine) if not m.startswith("_")} >= set(METHODS)


def test_specs_answer_what_the_config_asks():
    assert engines_with(agent_loops=True) == ("vllm",)
    assert engines_with(package=None) == ("hf",)
    assert set(engines_with(images=True)) == {"vllm", "hf"}
    assert engine_spec("hf").unsupported_sampling == ("presence_penalty", "frequency_penalty")
    with pytest.raises(ValueError) as unknown:
        engine_spec("sglang")
    assert str(unknown.value) == (
        "actor_rollout_ref.rollout.name='sglang' is not a registered rollout engine; registered: vllm, hf"
    )


def test_an_engine_registered_elsewhere_is_accepted_by_the_config():
    from hybrid.config import build_config

    spec = EngineSpec("my_engine", "workers.rollout.hf_rollout", "HFRollout", "my engine", agent_loops=False)
    register_engine(spec)
    try:
        config = build_config(["actor_rollout_ref.rollout.name=my_engine"])
        assert config.actor_rollout_ref.rollout.name == "my_engine"
        with pytest.raises(Exception, match="runs agent loops, which actor_rollout_ref.rollout.name='my_engine'"):
            build_config(["actor_rollout_ref.rollout.name=my_engine", "actor_rollout_ref.rollout.mode=async"])
        with pytest.raises(ValueError, match="already registered"):
            register_engine(EngineSpec("my_engine", "elsewhere", "Other", "another"))
    finally:
        unregister_engine("my_engine")
    with pytest.raises(Exception, match="my_engine"):
        build_config(["actor_rollout_ref.rollout.name=my_engine"])


# Peers' spellings translated to ours (SkyRL's backend, ROLL's strategy names) are tables, not tests
# of an engine; the registry itself declares the names.
NOT_SCANNED = ("hybrid/dialects/", "workers/rollout/engine.py")


# What an engine's name is read as (`rollout.name`, `engine`, ...); "hf" is also one of verl's
# load_format values, which a comparison with `load_format` is about.
NAME_LIKE = {"name", "engine", "engine_name", "backend"}


def _identifier(node) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)


def engine_name_comparisons(source: str, names: set[str]) -> list[int]:
    """Lines where a name is compared (==, !=, in, not in) with a registered engine's name as a string."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = (node.left, *node.comparators)
        if not any(_identifier(side) in NAME_LIKE for side in sides):
            continue
        for side in sides:
            consts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            if any(isinstance(c, ast.Constant) and c.value in names for c in consts):
                lines.append(node.lineno)
    return lines


def test_no_engine_name_is_compared_as_a_string_outside_the_registry():
    names = set(ENGINES)
    found = {}
    for folder in ("hybrid", "workers", "reward", "protocol"):
        for path in (ROOT / folder).rglob("*.py"):
            rel = str(path.relative_to(ROOT))
            if rel.startswith(NOT_SCANNED):
                continue
            lines = engine_name_comparisons(path.read_text(), names)
            if lines:
                found[rel] = lines
    assert found == {}, f"engine names compared as strings (ask workers.rollout.engine.engine_spec): {found}"


def test_the_scan_finds_a_planted_comparison():
    planted = (
        'def f(config, name):\n    if config.rollout.name == "vllm":\n        return 1\n'
        '    if config.load_format == "hf":\n        return 2\n    return name in ("hf", "x")\n'
    )
    assert engine_name_comparisons(planted, set(ENGINES)) == [2, 6]
