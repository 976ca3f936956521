"""Shared by the tests that read ROLL's own example files (tests/data/peer_examples/roll.json,
extracted by scripts/peer_examples/roll.py): an example written into a folder with the files its
Hydra `defaults` pull in, and the ROLL overrides that put its workers on one device."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KEPT = REPO / "tests" / "data" / "peer_examples" / "roll.json"

# ROLL's own keys: one node of one device shared by the trainer, the engine and the reference,
# no sequence parallelism, one engine rank.
ONE_DEVICE = [
    "num_gpus_per_node=1",
    "actor_train.device_mapping=[0]",
    "actor_infer.device_mapping=[0]",
    "reference.device_mapping=[0]",
    "actor_train.model_args.ulysses_size=1",
    "reference.model_args.ulysses_size=1",
    "actor_infer.strategy_args.strategy_config.tensor_parallel_size=1",
]


def kept_example(path: str) -> dict:
    """The kept record of one selected example (its text and the defaults files it pulls in)."""
    example = next(e for e in json.loads(KEPT.read_text())["examples"] if e["path"] == path)
    assert example["selected"], example["why_not"]
    return example


def write_example(root: Path, path: str) -> Path:
    """Write the example and its defaults files under `root` at their repository paths; returns the example's."""
    example = kept_example(path)
    for rel, text in [(example["path"], example["text"]), *example["defaults_files"].items()]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / example["path"]
