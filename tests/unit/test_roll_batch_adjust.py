"""algorithm.batch_adjust (hybrid/batch_ops.py), ROLL's agentic adjust_batch: the rows each mode
keeps or copies, checked against counts worked out by hand from ROLL's code, the config rules it
relaxes, and the ROLL dialect setting it for the agentic Sokoban example (roll_batches.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from hybrid.batch_ops import adjust_batch, adjusted_rows
from hybrid.config import ConfigError, build_config
from hybrid.dialects import translate_argv
from protocol.data_proto import DataProto
from tests.integration.roll_helpers import ONE_DEVICE, write_example


def _rows(size, multiple, mode, seed=0):
    return adjusted_rows(size, multiple, mode, torch.Generator().manual_seed(seed))


def test_a_batch_that_divides_is_left_alone():
    for mode in ("copy", "delete", "auto", "random_sample"):
        assert _rows(8, 4, mode) == (list(range(8)), 0, 0)


def test_copy_appends_the_missing_rows_drawn_from_the_batch():
    # The Sokoban example at its own sizes: 128 trajectories, a multiple of 256: 128 - 0 = 128 copies,
    # drawn without replacement (128 is not more than the batch), so every trajectory exactly twice.
    rows, added, removed = _rows(128, 256, "copy")
    assert (added, removed, rows[:128]) == (128, 0, list(range(128)))
    assert set(Counter(rows).values()) == {2}
    # 6 rows to a multiple of 4: 4 - 6 % 4 = 2 copies of two different rows
    rows, added, _ = _rows(6, 4, "copy")
    assert added == 2 and rows[:6] == list(range(6)) and len(set(rows[6:])) == 2
    # 2 rows to 8: 6 copies, more than the batch, drawn with replacement
    rows, added, _ = _rows(2, 8, "copy")
    assert added == 6 and len(rows) == 8 and set(rows) <= {0, 1}


def test_delete_auto_and_random_sample():
    # delete: 6 % 4 = 2 rows dropped, the rest in order
    rows, added, removed = _rows(6, 4, "delete")
    assert (added, removed, len(rows)) == (0, 2, 4) and rows == sorted(set(rows))
    # delete with fewer rows than the multiple would leave none: ROLL copies instead
    assert _rows(3, 4, "delete")[1:] == (1, 0)
    # auto: copy when the remainder is at least half the batch or the batch is smaller than the multiple
    assert _rows(7, 4, "auto")[1:] == (0, 3)  # 3 < 3.5: delete
    assert _rows(3, 4, "auto")[1:] == (1, 0)  # 3 // 4 == 0: copy
    # random_sample keeps `multiple` rows (not the largest multiple), in order
    rows, added, removed = _rows(10, 4, "random_sample")
    assert (added, removed, len(rows)) == (0, 6, 4) and rows == sorted(set(rows))
    assert _rows(3, 4, "random_sample")[1:] == (1, 0)  # too few rows: copy
    with pytest.raises(ValueError, match="algorithm.batch_adjust.mode='drop' is not one of"):
        _rows(5, 4, "drop")


def test_adjust_batch_copies_whole_samples_with_their_group():
    batch = DataProto.from_dict(
        tensors={"token_level_scores": torch.tensor([[1.0], [2.0], [3.0]])},
        non_tensors={"uid": np.array(["a", "a", "b"], dtype=object)},
    )
    out, metrics = adjust_batch(batch, 4, "copy", torch.Generator().manual_seed(0))
    assert metrics == {"batch_adjust/added": 1.0, "batch_adjust/removed": 0.0}
    copy = int(out.batch["token_level_scores"][3, 0].item()) - 1  # the row copied
    assert out.non_tensor_batch["uid"][3] == ["a", "a", "b"][copy]
    assert out.batch["token_level_scores"][:3, 0].tolist() == [1.0, 2.0, 3.0]


SIZES = ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_mini_batch_size=32"]


def test_the_config_takes_a_batch_of_part_of_a_mini_batch_with_batch_adjust():
    with pytest.raises(ConfigError, match=r"= 128 samples is not divisible by .* = 256 samples per mini-batch"):
        build_config(SIZES)
    config = build_config([*SIZES, "algorithm.batch_adjust.multiple=256"])
    assert config.actor_rollout_ref.actor.on_policy_update  # copied to one mini batch: one optimizer step
    config = build_config([*SIZES, "algorithm.batch_adjust.multiple=512"])
    assert not config.actor_rollout_ref.actor.on_policy_update  # two mini batches
    with pytest.raises(ConfigError, match=r"algorithm.batch_adjust.multiple=100 samples is not divisible by"):
        build_config([*SIZES, "algorithm.batch_adjust.multiple=100"])


EXAMPLE = "examples/qwen3-30BA3B-agentic_fsdp2/agentic_val_sokoban_30a3.yaml"


def _translated(path: Path, *extra: str) -> dict[str, str]:
    return dict(item.partition("=")[::2] for item in translate_argv(["--roll-config", str(path), *extra]))


def test_the_agentic_example_at_its_own_sizes_copies_to_its_optimizer_step(tmp_path):
    path = write_example(tmp_path, EXAMPLE)
    out = _translated(path)
    # 16 groups x 8 = 128 trajectories; 32 devices / ulysses 2 = 16 ranks: optimizer step 1 x 16 x 16 = 256,
    # log-prob passes 1 x 16 (actor_train and reference): lcm 256
    assert (out["data.train_batch_size"], out["actor_rollout_ref.rollout.n"]) == ("16", "8")
    assert out["algorithm.batch_adjust.multiple"] == "256" and out["algorithm.batch_adjust.mode"] == "'copy'"
    assert out["actor_rollout_ref.actor.optim.lr_warmup_steps"] == "10"  # 256 samples: one optimizer step
    assert build_config(translate_argv(["--roll-config", str(path)])).algorithm.batch_adjust.multiple == 256
    # an actor_train log-prob batch of 48: 48 x 16 = 768 = 3 x 256 is the lcm, and 768 samples are 3 optimizer
    # steps per training step (ROLL's 30 warm-up steps are 10 of hybrid's)
    bigger = ["actor_train.infer_batch_size=48", "actor_train.training_args.warmup_steps=30"]
    out = _translated(path, *bigger, "+batch_adjust_mode=random_sample")  # fewer rows than 768: a copy
    assert out["algorithm.batch_adjust.multiple"] == "768" and out["algorithm.batch_adjust.mode"] == "'random_sample'"
    assert out["actor_rollout_ref.actor.optim.lr_warmup_steps"] == "10"
    with pytest.raises(ConfigError, match=r"warmup_steps=10: .* which here is 3 optimizer steps; use a multiple of 3"):
        translate_argv(["--roll-config", str(path), "actor_train.infer_batch_size=48"])
    # at the one-device sizes of the tests the batch divides: nothing to adjust
    out = _translated(path, *ONE_DEVICE, "actor_train.training_args.gradient_accumulation_steps=128")
    assert "algorithm.batch_adjust.multiple" not in out
    with pytest.raises(ConfigError, match=r"batch_adjust_mode=drop: one of copy, delete, auto, random_sample"):
        translate_argv(["--roll-config", str(path), "+batch_adjust_mode=drop"])
