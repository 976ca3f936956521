"""DAPO dynamic sampling (hybrid/rollouts.py): groups whose metric does not vary are dropped,
more batches are generated until the batch is full, and a run that can never fill a
batch stops with a message instead of looping forever."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from hybrid.rollouts import Rollouts
from protocol import DataProto


def _trainer(max_num_gen_batches: int, train_batch_size: int = 2, n: int = 2) -> Rollouts:
    trainer = Rollouts.__new__(Rollouts)
    trainer.config = OmegaConf.create(
        {
            "algorithm": {
                "filter_groups": {"enable": True, "metric": "score", "max_num_gen_batches": max_num_gen_batches}
            },
            "actor_rollout_ref": {"rollout": {"n": n}},
            "data": {"train_batch_size": train_batch_size},
        }
    )
    trainer.world_size = 1
    return trainer


def _scored_batch(group_scores: list[list[float]], tag: str) -> DataProto:
    """One row per sample; samples of a group share a uid; the score sits on one token."""
    scores = [s for group in group_scores for s in group]
    uids = [f"{tag}{g}" for g, group in enumerate(group_scores) for _ in group]
    token_level_scores = torch.zeros(len(scores), 3)
    token_level_scores[:, -1] = torch.tensor(scores)
    return DataProto.from_dict(
        tensors={"token_level_scores": token_level_scores},
        non_tensors={"uid": np.array(uids, dtype=object)},
    )


def _run(trainer, generated: list[DataProto]):
    queue = list(generated)
    calls = []

    def rollout_and_score(prompts, timing):
        calls.append(prompts)
        return queue.pop(0), {}

    trainer.rollout_and_score = rollout_and_score
    metrics: dict = {}
    prompts = iter([object() for _ in generated])
    return trainer.filtered_batch(prompts, {}, metrics), metrics, calls


def test_keeps_varying_groups_and_generates_until_full():
    trainer = _trainer(max_num_gen_batches=0)
    first = _scored_batch([[1, 1], [0, 1]], "a")  # group a0 all right: dropped
    second = _scored_batch([[0, 0], [1, 0]], "b")  # group b0 all wrong: dropped
    batch, metrics, calls = _run(trainer, [first, second])
    assert len(calls) == 2
    assert list(batch.non_tensor_batch["uid"]) == ["a1", "a1", "b1", "b1"]
    assert metrics["train/num_gen_batches"] == 2
    assert metrics["train/kept_group_fraction"] == pytest.approx(4 / 8)


def test_gives_up_with_a_message_when_no_group_ever_varies():
    trainer = _trainer(max_num_gen_batches=2)
    flat = [_scored_batch([[1, 1], [0, 0]], t) for t in "abc"]
    with pytest.raises(RuntimeError, match=r"2 generation batches in a row had no group whose 'score' varies"):
        _run(trainer, flat)


def test_end_of_data_with_nothing_kept_returns_none():
    trainer = _trainer(max_num_gen_batches=0)
    batch, _, calls = _run(trainer, [_scored_batch([[1, 1], [0, 0]], "a")])
    assert batch is None and len(calls) == 1
