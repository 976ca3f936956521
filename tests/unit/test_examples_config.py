"""The run scripts in examples/ without running a model: each script's command line, caught
by a stand-in interpreter (PYTHON), composes and validates as `python -m hybrid.main_ppo`
would, names the algorithm it promises, and passes extra overrides through last. The
GSM8K script refuses to start without MODEL_PATH or its data, saying what to set.
(tests/integration/test_examples.py runs each script for one real step.)"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hybrid.config import load_config, validate_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
ARITHMETIC_SCRIPTS = [
    "grpo_arithmetic.sh",
    "ppo_arithmetic.sh",
    "rloo_arithmetic.sh",
    "reinforce_plus_plus_arithmetic.sh",
    "dapo_arithmetic.sh",
]


@pytest.fixture
def capture_python(tmp_path):
    """An executable standing in for the interpreter: records its argv, NUL-separated."""
    args_file = tmp_path / "argv"
    shim = tmp_path / "fake_python"
    shim.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > '{args_file}'\n")
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return shim, args_file


def run_script(name, shim, *extra, env=None):
    full_env = {**os.environ, "PYTHON": str(shim), **(env or {})}
    return subprocess.run(
        ["bash", str(EXAMPLES / name), *extra], capture_output=True, text=True, env=full_env, timeout=60
    )


def captured_overrides(args_file: Path) -> list[str]:
    argv = args_file.read_text().split("\0")[:-1]
    assert argv[:2] == ["-m", "hybrid.main_ppo"], argv
    return argv[2:]


def script_config(name, shim, args_file, *extra, env=None):
    result = run_script(name, shim, *extra, env=env)
    assert result.returncode == 0, result.stderr
    overrides = captured_overrides(args_file)
    cfg = load_config(overrides)
    validate_config(cfg)
    return cfg, overrides


def test_every_example_is_checked():
    scripts = {p.name for p in EXAMPLES.glob("*.sh")}
    # The SkyRL-dialect script is checked in tests/unit/test_dialects_skyrl.py.
    assert scripts == set(ARITHMETIC_SCRIPTS) | {
        "gsm8k_grpo.sh",
        "skyrl_grpo_arithmetic.sh",
        "multi_turn_arithmetic_retry.sh",
        "openai_agent_arithmetic.sh",
        "judge_arithmetic.sh",
    }


@pytest.mark.parametrize(
    "name, estimator",
    [
        ("grpo_arithmetic.sh", "grpo"),
        ("ppo_arithmetic.sh", "gae"),
        ("rloo_arithmetic.sh", "rloo"),
        ("reinforce_plus_plus_arithmetic.sh", "reinforce_plus_plus"),
        ("dapo_arithmetic.sh", "grpo"),
    ],
)
def test_arithmetic_scripts_compose_and_validate(capture_python, name, estimator):
    shim, args_file = capture_python
    cfg, overrides = script_config(name, shim, args_file, "trainer.total_training_steps=7")
    assert cfg.algorithm.adv_estimator == estimator
    assert cfg.actor_rollout_ref.rollout.name == "vllm"
    # the default model and data: the scripts leave those keys to the defaults
    assert OmegaConf.to_container(cfg.actor_rollout_ref.model, resolve=False)["path"] == "${hybrid_default:model}"
    assert OmegaConf.to_container(cfg.data, resolve=False)["train_files"] == "${hybrid_default:train}"
    assert overrides[-1] == "trainer.total_training_steps=7" and cfg.trainer.total_training_steps == 7
    assert list(cfg.trainer.logger) == ["console", "file"]
    assert cfg.trainer.experiment_name == name.removesuffix(".sh")


def test_ppo_script_has_a_critic_on_the_actors_model(capture_python):
    shim, args_file = capture_python
    cfg, _ = script_config("ppo_arithmetic.sh", shim, args_file, "actor_rollout_ref.model.path=/models/tiny")
    assert cfg.critic.enable is True and cfg.actor_rollout_ref.rollout.n == 1
    assert cfg.critic.model.path == "/models/tiny"
    # the critic's batch sizes follow overrides of the actor's
    cfg, _ = script_config(
        "ppo_arithmetic.sh",
        shim,
        args_file,
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    )
    assert cfg.critic.ppo_mini_batch_size == 2 and cfg.critic.ppo_micro_batch_size_per_gpu == 2
    cfg, _ = script_config("ppo_arithmetic.sh", shim, args_file, env={"CRITIC_MODEL_PATH": "/models/critic"})
    assert cfg.critic.model.path == "/models/critic"


def test_kl_settings(capture_python):
    shim, args_file = capture_python
    cfg, _ = script_config("grpo_arithmetic.sh", shim, args_file)
    assert cfg.actor_rollout_ref.actor.use_kl_loss is True and cfg.actor_rollout_ref.actor.kl_loss_type == "low_var_kl"
    cfg, _ = script_config("rloo_arithmetic.sh", shim, args_file)
    assert cfg.algorithm.use_kl_in_reward is True and cfg.actor_rollout_ref.actor.use_kl_loss is False
    cfg, _ = script_config("reinforce_plus_plus_arithmetic.sh", shim, args_file)
    assert cfg.actor_rollout_ref.actor.kl_loss_type == "mse"


def test_dapo_script(capture_python):
    shim, args_file = capture_python
    cfg, _ = script_config("dapo_arithmetic.sh", shim, args_file, "data.max_response_length=40")
    assert cfg.algorithm.filter_groups.enable is True and cfg.algorithm.filter_groups.max_num_gen_batches == 10
    actor = cfg.actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode) == (0.2, 0.28, "token-mean")
    assert actor.use_kl_loss is False and cfg.algorithm.use_kl_in_reward is False
    assert cfg.reward_model.reward_manager == "dapo"
    buffer = cfg.reward_model.reward_kwargs.overlong_buffer
    assert buffer.enable is True and buffer.len == 16
    assert cfg.reward_model.reward_kwargs.max_resp_len == 40


def test_multi_turn_script(capture_python):
    shim, args_file = capture_python
    cfg, overrides = script_config("multi_turn_arithmetic_retry.sh", shim, args_file, "trainer.total_training_steps=3")
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    assert multi_turn.enable is True and multi_turn.env_class == "arithmetic_retry"
    assert (multi_turn.max_assistant_turns, multi_turn.max_tokens_per_turn, multi_turn.reward_placement) == (
        3,
        24,
        "final",
    )
    # three full turns and the two replies between them fit the episode's budget
    assert cfg.data.max_response_length >= 3 * 24 + 2 * 12
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.trainer.total_training_steps == 3
    assert cfg.trainer.experiment_name == "multi_turn_arithmetic_retry"


def test_openai_agent_script(capture_python):
    shim, args_file = capture_python
    cfg, _ = script_config("openai_agent_arithmetic.sh", shim, args_file, "trainer.total_training_steps=3")
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.mode == "async" and rollout.multi_turn.enable is True
    assert rollout.agent.enable_http_endpoint is True and rollout.agent.default_agent_loop == "arithmetic_agent"
    assert rollout.agent.agent_loop_config_path == str(EXAMPLES / "openai_agent" / "agents.yaml")
    from workers.rollout.agent_rollout import read_agent_loop_config

    ((name, cls, settings),) = read_agent_loop_config(rollout.agent.agent_loop_config_path)
    assert (name, cls.__name__, settings) == ("arithmetic_agent", "ArithmeticRetryAgent", {"max_attempts": 3})


def gsm8k_data(tmp_path) -> Path:
    data = tmp_path / "gsm8k"
    data.mkdir()
    for split in ("train", "test"):
        (data / f"{split}.parquet").write_bytes(b"")
    return data


def test_gsm8k_script_composes_with_the_users_model_and_data(capture_python, tmp_path):
    shim, args_file = capture_python
    data = gsm8k_data(tmp_path)
    env = {"MODEL_PATH": "/models/my-model", "DATA_DIR": str(data), "N_GPUS": "4"}
    cfg, _ = script_config("gsm8k_grpo.sh", shim, args_file, "trainer.total_epochs=2", env=env)
    assert cfg.actor_rollout_ref.model.path == "/models/my-model"
    assert cfg.data.train_files == str(data / "train.parquet") and cfg.data.val_files == str(data / "test.parquet")
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.trainer.n_gpus_per_node == 4
    # verl's recipe counts epochs, not steps
    assert cfg.trainer.total_training_steps is None and cfg.trainer.total_epochs == 2


def test_gsm8k_script_without_model_path_says_what_to_set(capture_python, tmp_path):
    shim, args_file = capture_python
    env = {k: v for k, v in os.environ.items() if k != "MODEL_PATH"}
    env.update(PYTHON=str(shim), DATA_DIR=str(gsm8k_data(tmp_path)))
    result = subprocess.run(
        ["bash", str(EXAMPLES / "gsm8k_grpo.sh")], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 2
    assert "MODEL_PATH is not set" in result.stderr
    assert not args_file.exists()  # nothing was started


def test_gsm8k_script_without_data_points_at_the_preprocess_script(capture_python, tmp_path):
    shim, args_file = capture_python
    result = run_script("gsm8k_grpo.sh", shim, env={"MODEL_PATH": "/m", "DATA_DIR": str(tmp_path / "none")})
    assert result.returncode == 2
    assert "train.parquet not found" in result.stderr and "examples/data_preprocess/gsm8k.py" in result.stderr
    assert not args_file.exists()


def test_judge_script_serves_the_judge_in_the_reward_loop(capture_python):
    shim, args_file = capture_python
    cfg, _ = script_config("judge_arithmetic.sh", shim, args_file)
    rm = cfg.reward_model
    assert rm.enable and rm.use_reward_loop and rm.enable_resource_pool and rm.combine == "rm_only"
    assert OmegaConf.to_container(rm.model, resolve=False)["path"] == "${hybrid_default:model}"
    assert cfg.actor_rollout_ref.rollout.mode == "async"
    cfg, _ = script_config("judge_arithmetic.sh", shim, args_file, env={"JUDGE_MODEL_PATH": "/models/judge"})
    assert cfg.reward_model.model.path == "/models/judge"
