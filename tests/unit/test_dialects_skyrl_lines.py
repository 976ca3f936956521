"""Whole SkyRL command lines and example scripts on hybrid's command line (the dialect's
mappings one key at a time are in test_dialects_skyrl.py): the reference docs' example, sequence
parallelism, hybrid sharding, the one-step-off and fully asynchronous lines, and
examples/skyrl_grpo_arithmetic.sh, each translating into a config that loads and validates or is
refused naming the size or key. Nothing here loads a model."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from hybrid.config import ConfigError, load_config, validate_config
from hybrid.dialects import translate_argv
from hybrid.dialects.table import NO_DUAL_CLIP
from tests.unit.dialect_helpers import REPO, SKYRL_SEED_EXAMPLE, A, skyrl, skyrl_error


def test_skyrl_seed_example_loads_and_validates():
    overrides = translate_argv(["--dialect", "skyrl", *SKYRL_SEED_EXAMPLE])
    cfg = load_config(overrides)
    validate_config(cfg)
    assert cfg.data.train_batch_size == 1024
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 256
    assert cfg.actor_rollout_ref.rollout.n == 5
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 4
    assert cfg.actor_rollout_ref.actor.clip_ratio_c == NO_DUAL_CLIP
    assert cfg.trainer.resume_mode == "auto"
    assert cfg.data.max_prompt_length == 512 and cfg.data.max_response_length == 1024
    assert cfg.data.train_files == [os.path.expanduser("~/data/gsm8k/train.parquet")]


def test_skyrl_sequence_parallel_loads_and_validates():
    overrides = translate_argv(
        [
            "--dialect",
            "skyrl",
            "trainer.placement.policy_num_gpus_per_node=2",
            "trainer.policy.sequence_parallel_size=2",
            "trainer.critic.sequence_parallel_size=2",
            "trainer.sequence_parallel_backend=ulysses",
        ]
    )
    cfg = load_config(overrides)
    validate_config(cfg)
    arr = cfg.actor_rollout_ref
    assert arr.actor.ulysses_sequence_parallel_size == 2 and arr.ref.ulysses_sequence_parallel_size == 2
    assert cfg.critic.ulysses_sequence_parallel_size == 2


def test_skyrl_hybrid_sharding_loads_and_validates_or_names_the_size_that_does_not_divide():
    def config(size):
        argv = [
            "--dialect",
            "skyrl",
            "trainer.placement.policy_num_nodes=2",
            "trainer.placement.policy_num_gpus_per_node=8",
            "trainer.micro_train_batch_size_per_gpu=2",
            f"trainer.policy.fsdp_config.fsdp_size={size}",
        ]
        cfg = load_config(translate_argv(argv))
        validate_config(cfg)
        return cfg

    assert config(8).actor_rollout_ref.actor.fsdp_config.fsdp_size == 8  # 2 groups of 8 of the 16 ranks
    with pytest.raises(ConfigError) as info:
        config(6)
    assert (
        f"{A}.actor.fsdp_config.fsdp_size=6 does not divide world size 16 (trainer.nnodes=2 x "
        "trainer.n_gpus_per_node=8): hybrid-sharded groups of 6 ranks must tile the ranks (-1 shards over all of them)"
    ) in str(info.value)


def test_skyrl_mini_batch_refusal_speaks_for_skyrl_only_with_the_sizes_skyrl_reads_given():
    # Without n_samples_per_prompt, train_batch_size and micro_train_batch_size_per_gpu on the line,
    # SkyRL would use its own defaults: the dialect passes the size on and hybrid's check judges it.
    line = ("trainer.placement.policy_num_gpus_per_node=8", "trainer.policy_mini_batch_size=4")
    assert skyrl(*line)[f"{A}.actor.ppo_mini_batch_size"] == 4


ENGINES_APART = [
    "trainer.placement.colocate_all=false",
    "trainer.placement.policy_num_gpus_per_node=1",
    "generator.inference_engine.num_engines=1",  # 1 + 1 devices: CPU cores on a 2-core machine
]


def test_skyrl_one_step_off_trainer_is_hybrids_one_step_off_at_lag_one():
    # SkyRL's one-step-off trainer is chosen by its entry module; the line says it in hybrid's key,
    # which replaces the lag 0 that colocate_all=false alone writes (SkyRL's synchronous trainer).
    cfg = load_config(translate_argv(["--dialect", "skyrl", *ENGINES_APART, "async_training.max_staleness_steps=1"]))
    validate_config(cfg)
    at = cfg.async_training
    assert (at.mode, at.max_staleness_steps, at.use_rollout_log_probs) == ("one_step_off", 1, False)
    assert cfg.actor_rollout_ref.hybrid_engine is False and cfg.rollout.n_gpus_per_node == 1
    synchronous = load_config(translate_argv(["--dialect", "skyrl", *ENGINES_APART]))
    assert synchronous.async_training.max_staleness_steps == 0


def test_skyrl_line_with_hybrids_async_keys_needs_the_engines_apart():
    message = skyrl_error("async_training.max_staleness_steps=1")
    assert (
        "  - async_training.max_staleness_steps=1: hybrid's asynchronous schedules run the engines apart, and "
        "SkyRL's asynchronous trainers assert so too: add trainer.placement.colocate_all=false"
    ) in message.splitlines()


def test_skyrl_example_script_loads_and_validates(tmp_path):
    args_file = tmp_path / "argv"
    shim = tmp_path / "fake_python"
    shim.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > '{args_file}'\n")
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    done = subprocess.run(
        ["bash", str(REPO / "examples" / "skyrl_grpo_arithmetic.sh"), "trainer.seed=5"],
        env={**os.environ, "PYTHON": str(shim)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    argv = args_file.read_text().split("\0")[:-1]
    assert argv[:4] == ["-m", "hybrid.main_ppo", "--dialect", "skyrl"]
    cfg = load_config(translate_argv(argv[2:]))
    validate_config(cfg)
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.trainer.seed == 5
    assert cfg.actor_rollout_ref.actor.clip_ratio_high == 0.28
