"""SkyRL's off-policy keys and its step cap on hybrid's command line: policy_loss_type=rollout_is
(bypass mode), the sequence masks and sequence-level TIS of trainer.algorithm.off_policy_correction,
trainer.fully_async.clear_kv_cache_on_weight_sync and trainer.max_training_steps, from the
translation to the checked config the actor reads. The formulas themselves are checked against
SkyRL's code in test_skyrl_oracle_off_policy.py. Nothing here loads a model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hybrid.config import build_config
from hybrid.dialects import translate_argv
from hybrid.run_length import run_steps
from tests.unit.dialect_helpers import A, skyrl

ONE_STEP = ["trainer.train_batch_size=8", "trainer.policy_mini_batch_size=8", "trainer.update_epochs_per_batch=1"]
ROLLOUT_IS = [
    "trainer.algorithm.policy_loss_type=rollout_is",
    "trainer.algorithm.eps_clip_low=0.5",
    "trainer.algorithm.eps_clip_high=4.0",
    "trainer.algorithm.clip_ratio_c=10.0",
]


def test_rollout_is_runs_in_bypass_mode_with_the_clip_band():
    out = skyrl(*ROLLOUT_IS)
    assert out[f"{A}.actor.policy_loss.loss_mode"] == "rollout_is"
    assert out["algorithm.rollout_correction.bypass_mode"] is True
    assert out["algorithm.rollout_correction.loss_type"] == "ppo_clip"
    assert out[f"{A}.actor.clip_ratio_low"] == 0.5 and out[f"{A}.actor.clip_ratio_high"] == 4.0
    assert f"{A}.actor.clip_ratio_c" not in out  # rollout_is reads no dual clip


@pytest.mark.parametrize(
    "given, option, threshold",
    [
        (["sequence_mask_metric=geometric"], "seq_geo_ratio", "0.99_1.01"),  # SkyRL's default bounds
        (
            ["sequence_mask_metric=geometric", "geo_mask_low=0.98", "geo_mask_high=1.03"],
            "seq_geo_ratio",
            "0.98_1.03",
        ),
        (["sequence_mask_metric=product"], "seq_prod_ratio", "0.5_2.0"),
        (
            ["sequence_mask_metric=product", "product_mask_low=0.25", "product_mask_high=4"],
            "seq_prod_ratio",
            "0.25_4.0",
        ),
    ],
)
def test_sequence_masks_become_the_rejection_option_of_the_same_formula(given, option, threshold):
    opc = "trainer.algorithm.off_policy_correction."
    out = skyrl(*ROLLOUT_IS, *ONE_STEP, *(opc + g for g in given))
    assert out["algorithm.rollout_correction.rollout_rs"] == option
    assert out["algorithm.rollout_correction.rollout_rs_threshold"] == threshold


def test_the_fully_async_gsm8k_example_reaches_the_actor_as_bypass_with_the_geometric_mask():
    """SkyRL's examples/train/fully_async/fully_async_run_gsm8k.sh keys (sizes made small): the
    actor's settings are bypass mode with SkyRL's mask, and the run is hybrid's fully async."""
    argv = [
        "--dialect",
        "skyrl",
        "trainer.fully_async.enabled=true",
        "trainer.fully_async.max_staleness_steps=2",
        "trainer.fully_async.clear_kv_cache_on_weight_sync=false",
        "trainer.algorithm.policy_loss_type=rollout_is",
        "trainer.algorithm.off_policy_correction.sequence_mask_metric=geometric",
        "trainer.algorithm.off_policy_correction.geo_mask_high=1.01",
        "trainer.algorithm.off_policy_correction.geo_mask_low=0.99",
        "trainer.placement.colocate_all=false",
        "trainer.placement.policy_num_gpus_per_node=1",
        "generator.inference_engine.num_engines=1",
        "trainer.train_batch_size=4",
        "trainer.policy_mini_batch_size=4",
        "trainer.update_epochs_per_batch=1",
        "generator.n_samples_per_prompt=2",
        "trainer.micro_train_batch_size_per_gpu=2",
        "trainer.micro_forward_batch_size_per_gpu=2",
        "trainer.epochs=2",
        "trainer.max_training_steps=3",
    ]
    cfg = build_config(translate_argv(argv))
    correction = cfg.actor_rollout_ref.actor.correction
    assert cfg.async_mode == "fully_async"
    assert correction.bypass and correction.loss_type == "ppo_clip" and correction.rollout_is is None
    (option,) = correction.rejection
    assert (option.name, option.lower, option.upper) == ("seq_geo_ratio", 0.99, 1.01)
    assert option.estimator == "ratio" and option.bounds == (0.99, 1.01)
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "rollout_is"
    assert (cfg.trainer.max_training_steps, cfg.trainer.total_epochs, cfg.trainer.total_training_steps) == (3, 2, None)


def test_sequence_tis_is_rollout_is_sequence_truncated_at_the_cap():
    opc = "trainer.algorithm.off_policy_correction."
    out = skyrl(f"{opc}tis_ratio_type=sequence", f"{opc}sequence_tis_ratio_clip_high=3.5")
    assert out["algorithm.rollout_correction.rollout_is"] == "sequence"
    assert out["algorithm.rollout_correction.rollout_is_threshold"] == 3.5
    assert skyrl(f"{opc}tis_ratio_type=sequence")["algorithm.rollout_correction.rollout_is_threshold"] == 5.0
    cfg = build_config(translate_argv(["--dialect", "skyrl", f"{opc}tis_ratio_type=sequence"]))
    correction = cfg.actor_rollout_ref.actor.correction
    assert (correction.rollout_is, correction.is_upper, correction.is_lower, correction.bypass) == (
        "sequence",
        5.0,
        None,
        False,
    )


@pytest.mark.parametrize("value", ["true", "false"])
def test_clear_kv_cache_on_weight_sync_is_accepted_with_both_values(value):
    out = skyrl(
        "trainer.fully_async.enabled=true",
        "trainer.placement.colocate_all=false",
        *ONE_STEP,
        f"trainer.fully_async.clear_kv_cache_on_weight_sync={value}",
    )
    assert out["async_training.mode"] == "fully_async" and out["async_training.partial_rollout"] is True


def test_max_training_steps_caps_skyrls_epochs():
    assert skyrl("trainer.max_training_steps=20") == {
        **skyrl(),
        "trainer.max_training_steps": 20,
        "trainer.total_training_steps": None,
        "trainer.total_epochs": 1,  # SkyRL's default epochs, not hybrid's fixed-length default job
    }
    out = skyrl("trainer.epochs=3", "trainer.max_training_steps=20")
    assert (out["trainer.total_epochs"], out["trainer.max_training_steps"]) == (3, 20)


@pytest.mark.parametrize(
    "total, epochs, cap, per_epoch, expected",
    [
        # (steps the run trains, steps the learning-rate schedules span)
        (None, 3, 20, 5, (15, 15)),  # the epochs end first
        (None, 3, 10, 5, (10, 10)),  # the cap ends the third epoch early
        (None, 3, None, 5, (15, 15)),
        (30, 1, 20, 5, (5, 20)),  # the epoch ends first; the schedule spans the capped steps
        (30, 1, None, 5, (5, 30)),  # verl: total_training_steps shortens a run, never lengthens it
        (30, 1, None, 250, (30, 30)),  # hybrid's own default job: 2000 rows / 8 a step
        (30, 1, 20, 250, (20, 20)),  # a cap on total_training_steps too
    ],
)
def test_run_steps_is_the_smaller_of_the_run_and_the_cap(total, epochs, cap, per_epoch, expected):
    trainer = SimpleNamespace(total_training_steps=total, total_epochs=epochs)
    length = run_steps(trainer, lambda: per_epoch, cap)
    assert (length.steps, length.schedule_steps) == expected and length.steps_per_epoch == per_epoch
