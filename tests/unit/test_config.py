"""Configuration loading, override-key checking and validation rules (one test per rule).

Every config here is composed with `load_config` and never resolved as a whole, so no
test converts the default model.
"""

from __future__ import annotations

import re

import pytest

from hybrid.config import (
    ConfigError,
    check_override_keys,
    default_config,
    load_config,
    normalize_overrides,
    validate_config,
)

ARR = "actor_rollout_ref"


def validation_error(overrides: list[str], world_size: int | None = None) -> str:
    """The ConfigError message for a config built from `overrides` (fails if it validates)."""
    cfg = load_config(overrides)
    with pytest.raises(ConfigError) as info:
        validate_config(cfg, world_size=world_size)
    return str(info.value)


def assert_valid(overrides: list[str], world_size: int | None = None) -> None:
    validate_config(load_config(overrides), world_size=world_size)


@pytest.fixture
def no_gpu(monkeypatch):
    from workers import device

    monkeypatch.setattr(device, "is_cuda_available", lambda: False)


@pytest.fixture
def with_gpu(monkeypatch):
    from workers import device

    monkeypatch.setattr(device, "is_cuda_available", lambda: True)


# ---------------------------------------------------------------- defaults and loading


def test_default_config_passes_without_resolving_assets(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("HYBRID_CACHE_DIR", str(cache))
    cfg = load_config()
    assert cfg.algorithm.adv_estimator == "grpo"
    validate_config(cfg)
    # Resolving ${hybrid_default:...} would create the cache folder and convert the model.
    assert not cache.exists()


def test_hydra_section_keeps_runs_in_the_current_directory():
    from hydra import compose, initialize_config_dir

    from hybrid.config import CONFIG_DIR, CONFIG_NAME

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name=CONFIG_NAME, return_hydra_config=True)
    assert cfg.hydra.run.dir == "."
    assert cfg.hydra.output_subdir is None
    assert cfg.hydra.job.chdir is False
    # No file handler: Hydra's default job logging writes <job>.log into the run directory.
    assert "file" not in cfg.hydra.job_logging.handlers


def test_overrides_are_applied():
    cfg = load_config(["data.train_batch_size=16", f"{ARR}.rollout.n=2"])
    assert cfg.data.train_batch_size == 16
    assert cfg[ARR].rollout.n == 2


# ---------------------------------------------------------------- override keys


def test_unknown_key_suggests_nearest():
    with pytest.raises(ConfigError, match=re.escape("did you mean data.train_batch_size?")):
        load_config(["data.train_batch_sise=4"])


def test_unknown_nested_key_suggests_nearest():
    with pytest.raises(ConfigError, match=re.escape(f"did you mean {ARR}.actor.optim.lr?")):
        load_config([f"{ARR}.actor.optim.lrr=1e-6"])


def test_key_under_wrong_parent_suggests_same_name_elsewhere():
    with pytest.raises(ConfigError) as info:
        load_config(["trainer.ppo_mini_batch_size=4"])
    assert f"{ARR}.actor.ppo_mini_batch_size" in str(info.value)


def test_every_unknown_key_is_reported():
    with pytest.raises(ConfigError) as info:
        load_config(["data.train_batch_sise=4", "trainer.total_epoch=2"])
    assert "data.train_batch_size" in str(info.value)
    assert "trainer.total_epochs" in str(info.value)


def test_deleting_unknown_key_is_reported():
    with pytest.raises(ConfigError, match=re.escape("cannot delete 'data.shufle'")):
        check_override_keys(["~data.shufle"], default_config())


def test_plus_adds_new_keys():
    cfg = load_config(["+new.key=1"])
    assert cfg.new.key == 1


def test_free_form_dicts_accept_new_keys_without_plus():
    cfg = load_config(
        [
            f"{ARR}.rollout.engine_kwargs.vllm.swap_space=1",
            f"{ARR}.model.override_config.attention_dropout=0.1",
            "custom_reward_function.reward_kwargs.scale=2",
            "data.apply_chat_template_kwargs.enable_thinking=false",
        ]
    )
    assert cfg[ARR].rollout.engine_kwargs.vllm.swap_space == 1
    assert cfg[ARR].model.override_config.attention_dropout == 0.1
    assert cfg.custom_reward_function.reward_kwargs.scale == 2
    assert cfg.data.apply_chat_template_kwargs.enable_thinking is False


def test_plus_on_existing_key_overrides_it():
    # verl scripts write `+reward_model.reward_kwargs.max_resp_len=...`; here it exists already.
    cfg = load_config(["+reward_model.reward_kwargs.max_resp_len=7"])
    assert cfg.reward_model.reward_kwargs.max_resp_len == 7


def test_normalize_overrides_leaves_ordinary_overrides_alone():
    overrides = ["data.train_batch_size=4", "+x=1", "++y=2", "~data.seed", "hydra.verbose=true"]
    assert normalize_overrides(overrides, default_config()) == overrides


# ---------------------------------------------------------------- batch arithmetic


def test_train_batch_not_divisible_by_mini_batch():
    message = validation_error(["data.train_batch_size=12"])
    assert "data.train_batch_size=12" in message
    assert f"{ARR}.actor.ppo_mini_batch_size=8" in message
    assert f"{ARR}.rollout.n=4" in message


def test_mini_batch_per_device_not_divisible_by_micro_batch():
    message = validation_error([f"{ARR}.actor.ppo_micro_batch_size_per_gpu=5"])
    assert f"{ARR}.actor.ppo_micro_batch_size_per_gpu=5" in message
    assert "32 samples per device" in message


def test_dynamic_batch_size_skips_the_micro_batch_rule():
    assert_valid([f"{ARR}.actor.ppo_micro_batch_size_per_gpu=5", f"{ARR}.actor.use_dynamic_bsz=true"])


def test_dynamic_batch_token_budget_must_hold_one_sequence():
    message = validation_error([f"{ARR}.actor.use_dynamic_bsz=true", f"{ARR}.actor.ppo_max_token_len_per_gpu=100"])
    assert f"{ARR}.actor.ppo_max_token_len_per_gpu=100" in message
    assert "data.max_prompt_length=64" in message


def test_train_batch_not_divisible_by_world_size():
    message = validation_error(["trainer.n_gpus_per_node=3"])
    assert "data.train_batch_size=8" in message
    assert "world size 3 (trainer.nnodes=1 x trainer.n_gpus_per_node=3)" in message


def test_mini_batch_not_divisible_by_world_size():
    overrides = [
        f"{ARR}.rollout.n=1",
        f"{ARR}.actor.ppo_mini_batch_size=2",
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu=1",
    ]
    assert_valid(overrides, world_size=2)
    message = validation_error(overrides, world_size=4)
    assert f"{ARR}.actor.ppo_mini_batch_size=2" in message
    assert "world size 4" in message


def test_critic_batches_checked_when_gae():
    bad_critic = ["critic.ppo_micro_batch_size_per_gpu=5"]
    assert_valid(bad_critic)  # grpo: no critic
    message = validation_error(bad_critic + ["algorithm.adv_estimator=gae"])
    assert "critic.ppo_micro_batch_size_per_gpu=5" in message
    message = validation_error(bad_critic + ["critic.enable=true"])
    assert "critic.ppo_micro_batch_size_per_gpu=5" in message


def test_gae_with_disabled_critic():
    message = validation_error(["algorithm.adv_estimator=gae", "critic.enable=false"])
    assert "algorithm.adv_estimator='gae'" in message
    assert "critic.enable=False" in message


@pytest.mark.parametrize("role", ["rollout", "ref"])
def test_log_prob_micro_batch_must_be_positive(role):
    key = f"{ARR}.{role}.log_prob_micro_batch_size_per_gpu"
    with pytest.raises(ConfigError, match=re.escape(f"{key}=0 must be a positive integer")):
        validate_config(load_config([f"{key}=0"]))


@pytest.mark.parametrize(
    "old,new",
    [
        (f"{ARR}.actor.ppo_micro_batch_size", f"{ARR}.actor.ppo_micro_batch_size_per_gpu"),
        (f"{ARR}.rollout.log_prob_micro_batch_size", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu"),
        (f"{ARR}.ref.log_prob_micro_batch_size", f"{ARR}.ref.log_prob_micro_batch_size_per_gpu"),
    ],
)
def test_deprecated_micro_batch_key_with_per_gpu_key(old, new):
    message = validation_error([f"{old}=16"])
    assert f"{old}=16" in message
    assert f"use only {new}" in message


def test_deprecated_critic_micro_batch_key():
    message = validation_error(["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size=16"])
    assert "use only critic.ppo_micro_batch_size_per_gpu" in message


@pytest.mark.parametrize(
    "override,key",
    [
        ("data.train_batch_size=0", "data.train_batch_size=0"),
        (f"{ARR}.rollout.n=-1", f"{ARR}.rollout.n=-1"),
        ("data.max_response_length=1.5", "data.max_response_length=1.5"),
        (f"{ARR}.actor.ppo_mini_batch_size=true", f"{ARR}.actor.ppo_mini_batch_size=True"),
        ("trainer.n_gpus_per_node=0", "trainer.n_gpus_per_node=0"),
        ("trainer.total_training_steps=0", "trainer.total_training_steps=0"),
    ],
)
def test_positive_integers(override, key):
    message = validation_error([override])
    assert f"{key} must be a positive integer" in message


# ---------------------------------------------------------------- switches and options


def test_kl_loss_and_kl_in_reward_are_exclusive():
    message = validation_error([f"{ARR}.actor.use_kl_loss=true", "algorithm.use_kl_in_reward=true"])
    assert f"{ARR}.actor.use_kl_loss=True and algorithm.use_kl_in_reward=True are mutually exclusive" in message


@pytest.mark.parametrize("key", [f"{ARR}.actor.strategy", "critic.strategy"])
def test_megatron_not_supported(key):
    message = validation_error([f"{key}=megatron"])
    assert f"{key}='megatron' is not supported" in message
    assert "supported: fsdp, fsdp2" in message


def test_sglang_not_supported():
    message = validation_error([f"{ARR}.rollout.name=sglang"])
    assert f"{ARR}.rollout.name='sglang' is not supported" in message
    assert "supported: vllm, hf" in message


@pytest.mark.parametrize(
    "key",
    [
        "algorithm.adv_estimator",
        f"{ARR}.actor.loss_agg_mode",
        f"{ARR}.actor.policy_loss.loss_mode",
        "algorithm.kl_penalty",
        f"{ARR}.actor.kl_loss_type",
        "trainer.resume_mode",
        "data.truncation",
        "reward_model.reward_manager",
        f"{ARR}.actor.fsdp_config.mixed_precision",
        "trainer.worker_group",
        "trainer.device",
    ],
)
def test_unknown_option(key):
    message = validation_error([f"{key}=bogus"])
    assert f"{key}='bogus' is not supported; supported:" in message


def test_known_options_pass():
    assert_valid(
        [
            "algorithm.adv_estimator=rloo",
            "algorithm.kl_penalty=k3",
            f"{ARR}.actor.kl_loss_type=low_var_kl+",
            f"{ARR}.actor.policy_loss.loss_mode=gspo",
        ]
    )
    message = validation_error([f"{ARR}.actor.kl_loss_type=full+"])
    assert f"{ARR}.actor.kl_loss_type='full+' is not supported" in message


def test_unknown_logger():
    message = validation_error(["trainer.logger=[console,wandbb]"])
    assert "trainer.logger=['console', 'wandbb']: 'wandbb' not supported" in message
    assert "supported: console, file, tensorboard, wandb, mlflow" in message
    assert_valid(["trainer.logger=console"])


def test_resume_path_needs_a_path(tmp_path):
    message = validation_error(["trainer.resume_mode=resume_path"])
    assert "trainer.resume_mode='resume_path' needs trainer.resume_from_path" in message
    missing = tmp_path / "global_step_1"
    message = validation_error(["trainer.resume_mode=resume_path", f"trainer.resume_from_path={missing}"])
    assert f"trainer.resume_from_path: {missing} does not exist" in message
    (missing / "actor").mkdir(parents=True)
    (missing / "actor" / "fsdp_config.json").write_text("{}")
    (missing / "data.pt").write_bytes(b"")
    assert_valid(["trainer.resume_mode=resume_path", f"trainer.resume_from_path={missing}"])


def test_reward_model_needs_a_path():
    message = validation_error(["reward_model.enable=true"])
    assert "reward_model.enable=True needs reward_model.model.path" in message


def test_liger_needs_a_gpu(no_gpu):
    message = validation_error([f"{ARR}.model.use_liger=true"])
    assert f"{ARR}.model.use_liger=True needs a CUDA GPU" in message


def test_liger_passes_with_a_gpu(with_gpu):
    assert_valid([f"{ARR}.model.use_liger=true"])


def test_cuda_device_needs_a_gpu(no_gpu):
    message = validation_error(["trainer.device=cuda"])
    assert "trainer.device='cuda' needs a CUDA GPU" in message


def test_sequence_longer_than_max_model_len():
    message = validation_error([f"{ARR}.rollout.max_model_len=100"])
    assert "data.max_prompt_length=64 + data.max_response_length=48 = 112" in message
    assert f"{ARR}.rollout.max_model_len=100" in message
    assert_valid([f"{ARR}.rollout.max_model_len=112"])


def test_no_epochs_trains_nothing_whatever_the_steps():
    expected = (
        "trainer.total_epochs=0 trains nothing: a run is at most total_epochs passes over the training data, "
        "whatever trainer.total_training_steps says; set trainer.total_epochs >= 1"
    )
    for steps in ("null", "30"):
        message = validation_error([f"trainer.total_training_steps={steps}", "trainer.total_epochs=0"])
        assert expected in message
    assert_valid(["trainer.total_training_steps=null", "trainer.total_epochs=1"])


def test_negative_lora_rank():
    message = validation_error([f"{ARR}.model.lora_rank=-1"])
    assert f"{ARR}.model.lora_rank=-1 must be an integer >= 0" in message


def test_filter_groups_needs_groups():
    message = validation_error(["algorithm.filter_groups.enable=true", "algorithm.adv_estimator=gae"])
    assert "algorithm.filter_groups.enable=True" in message
    assert "algorithm.adv_estimator='gae' has no groups" in message
    message = validation_error(["algorithm.filter_groups.enable=true", f"{ARR}.rollout.n=1"])
    assert f"{ARR}.rollout.n=1" in message
    assert_valid(["algorithm.filter_groups.enable=true"])


def test_tensor_parallel_must_divide_world_size():
    message = validation_error([f"{ARR}.rollout.tensor_model_parallel_size=2"])
    assert f"{ARR}.rollout.tensor_model_parallel_size=2 does not divide world size 1" in message


def test_deleted_key_is_reported():
    message = validation_error(["~trainer.worker_group"])
    assert "trainer.worker_group is missing" in message


# ---------------------------------------------------------------- several at once


def test_all_problems_reported_together_one_line_each():
    message = validation_error(
        [
            "data.train_batch_size=12",
            f"{ARR}.actor.strategy=megatron",
            f"{ARR}.rollout.name=sglang",
            f"{ARR}.actor.use_kl_loss=true",
            "algorithm.use_kl_in_reward=true",
            f"{ARR}.model.lora_rank=-2",
        ]
    )
    lines = message.splitlines()
    assert lines[0] == "invalid configuration (5 problems):"
    assert len(lines) == 6
    for needle in ["data.train_batch_size=12", "megatron", "sglang", "mutually exclusive", "lora_rank=-2"]:
        assert sum(needle in line for line in lines[1:]) == 1, needle
