"""trainer.pad_mini_batches (hybrid/batch_ops.py pad_mini_batches, SkyRL's MeshDispatch.stage_chunks):
the rows each rank gets, worked out by hand, with the dummy rows' response masks zeroed; the batch
the trainer hands each update; the config rules the option relaxes and the combinations it refuses.
The update on padded rows equals the unpadded one in tests/integration/test_padded_update_ranks.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybrid.batch_ops import pad_mini_batches
from hybrid.config import ConfigError, build_config
from hybrid.trainer import PPOTrainer
from protocol.data_proto import DataProto

A = "actor_rollout_ref"


def _batch(rows: int) -> DataProto:
    ids = torch.arange(rows).unsqueeze(-1).repeat(1, 3)  # row i holds i
    return DataProto.from_dict(
        tensors={"input_ids": ids, "response_mask": torch.ones(rows, 3, dtype=torch.long)},
        non_tensors={"uid": np.array([f"u{i}" for i in range(rows)], dtype=object)},
    )


def _rows_and_dummies(padded: DataProto) -> tuple[list[int], list[bool]]:
    return padded.batch["input_ids"][:, 0].tolist(), (padded.batch["response_mask"].sum(-1) == 0).tolist()


def test_mini_batches_of_three_on_two_ranks():
    # minis [0 1 2] [3 4 5] -> [0 1 2 d0] [3 4 5 d3]; rank 0 takes slots 0-1 of each, rank 1 slots 2-3
    padded, dummies = pad_mini_batches(_batch(6), 3, 2)
    rows, is_dummy = _rows_and_dummies(padded)
    assert dummies == 2
    assert rows == [0, 1, 3, 4, 2, 0, 5, 3]
    assert is_dummy == [False, False, False, False, False, True, False, True]
    assert padded.non_tensor_batch["uid"].tolist() == [f"u{i}" for i in rows]


def test_mini_batches_of_four_on_three_ranks():
    # [0 1 2 3 d0 d0] [4 5 6 7 d4 d4], two slots per rank: the last rank gets only dummies
    padded, dummies = pad_mini_batches(_batch(8), 4, 3)
    rows, is_dummy = _rows_and_dummies(padded)
    assert dummies == 4
    assert rows == [0, 1, 4, 5, 2, 3, 6, 7, 0, 0, 4, 4]
    assert is_dummy == [False] * 8 + [True] * 4


def test_the_callers_mask_is_left_alone():
    batch = _batch(6)
    pad_mini_batches(batch, 3, 2)
    assert bool(batch.batch["response_mask"].all())


def test_mini_batches_that_split_are_not_touched():
    batch = _batch(8)
    assert pad_mini_batches(batch, 4, 2) == (batch, 0)


def test_a_batch_of_partial_mini_batches_is_an_error():
    with pytest.raises(ValueError, match="a batch of 7 samples is not a whole number of mini-batches of 3"):
        pad_mini_batches(_batch(7), 3, 2)


SIZES = [
    "trainer.n_gpus_per_node=8",
    "data.train_batch_size=16",
    f"{A}.actor.ppo_mini_batch_size=4",
    f"{A}.rollout.n=5",
    f"{A}.actor.ppo_micro_batch_size_per_gpu=2",
]


def test_the_trainer_pads_each_update_with_its_own_sizes():
    config = build_config([*SIZES, "trainer.pad_mini_batches=true"])
    trainer = object.__new__(PPOTrainer)  # only the config: _padded reads nothing else
    trainer.config = config
    metrics = {}
    padded = trainer._padded(_batch(80), config.actor_rollout_ref.actor, "actor", metrics)
    assert len(padded) == 96 and metrics == {"actor/dummy_rows": 16.0}  # 4 mini-batches of 20 + 4
    assert config.actor_rollout_ref.actor.mini_batch_samples_per_rank == 3  # 24 rows over 8 ranks
    trainer.config = build_config(SIZES[1:])  # one rank, option off
    assert trainer._padded(padded, config.actor_rollout_ref.actor, "actor", metrics) is padded


def test_uneven_mini_batches_are_refused_unless_padded():
    with pytest.raises(ConfigError) as err:
        build_config(SIZES)
    assert (
        f"{A}.actor.ppo_mini_batch_size=4 x {A}.rollout.n=5 = 20 samples per mini-batch do not split evenly over "
        "world size 8 (trainer.nnodes=1 x trainer.n_gpus_per_node=8); set trainer.pad_mini_batches=true to pad each "
        "with dummy rows (loss mask 0)"
    ) in str(err.value)
    # Padded: 3 rows per rank, which micro-batches of 2 cut into 2 + 1 (token-share weights: same loss).
    assert build_config([*SIZES, "trainer.pad_mini_batches=true"]).trainer.pad_mini_batches is True


@pytest.mark.parametrize(
    "extra, reason",
    [
        (f"{A}.actor.policy_loss.loss_mode=geo_mean", "GMPO averages its loss over a micro-batch's rows"),
        ("algorithm.rollout_correction.rollout_is=token", "its metrics count rows whatever their mask"),
        (f"{A}.actor.tis_imp_ratio_cap=2.0", "its metrics count rows whatever their mask"),
    ],
)
def test_padding_refuses_what_counts_rows(extra, reason):
    with pytest.raises(ConfigError) as err:
        build_config([*SIZES, "trainer.pad_mini_batches=true", extra])
    assert reason in str(err.value)
