"""SkyRL's defaults for the keys a SkyRL line does not give (hybrid/dialects/skyrl_defaults.py):
the table is SkyRL's config.py (as tests/data/peer_config_keys.json extracted it from SkyRL's
repository), a line with no sampling or algorithm keys composes to SkyRL's values, given keys
win, and the keys left at hybrid's defaults are named with a reason."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hybrid.config import load_config
from hybrid.dialects import translate_argv
from hybrid.dialects.skyrl import DIALECT
from hybrid.dialects.skyrl_default_values import COMMIT
from hybrid.dialects.skyrl_default_values import DEFAULTS as FIELD_DEFAULTS
from hybrid.dialects.skyrl_defaults import DEFAULTS, UNFILLED
from hybrid.dialects.table import NO_DUAL_CLIP
from tests.unit.dialect_helpers import REPO, skyrl_error

KEYS = json.loads((REPO / "tests" / "data" / "peer_config_keys.json").read_text())["skyrl"]
SKYRL = KEYS["SkyRLTrainConfig"]  # SkyRL's config classes, walked: key -> field default
MIRROR = Path("/work/.mirror/NovaSky-AI+SkyRL/repo")


def test_the_table_is_skyrls_config_classes():
    assert COMMIT == KEYS["commit"]
    expected = {k: v for k, v in SKYRL.items() if not (isinstance(v, str) and v.startswith("<"))}
    assert FIELD_DEFAULTS == expected
    # Every key left unfilled names a key (or a section) of the table.
    for key in UNFILLED:
        assert key in DEFAULTS or (key.endswith(".*") and any(k.startswith(key[:-1]) for k in DEFAULTS)), key


@pytest.mark.skipif(not MIRROR.exists(), reason="no SkyRL mirror here")
def test_the_table_reads_as_config_py_does():
    text = subprocess.run(
        ["git", "-C", str(MIRROR), "show", f"{COMMIT}:skyrl/train/config/config.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for field, key in [
        ("n_samples_per_prompt: int", "generator.n_samples_per_prompt"),
        ("use_kl_loss: bool", "trainer.algorithm.use_kl_loss"),
        ("eps_clip_high: float", "trainer.algorithm.eps_clip_high"),
        ("policy_mini_batch_size: int", "trainer.policy_mini_batch_size"),
        ("cispo_eps_clip_low: float", "trainer.algorithm.cispo.cispo_eps_clip_low"),
    ]:
        literal = re.search(rf"\n\s+{re.escape(field)} = ([^\n]+)", text).group(1)
        assert eval(literal) == DEFAULTS[key], (field, literal)  # noqa: S307 - a literal of SkyRL's source


def _compose(*line: str):
    return load_config(translate_argv(["--dialect", "skyrl", "trainer.policy.model.path=/m", *line]))


def test_a_line_with_no_sampling_or_algorithm_keys_composes_to_skyrls_defaults():
    cfg = _compose()
    arr, actor, rollout = cfg.actor_rollout_ref, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    algorithm = "trainer.algorithm"
    assert rollout.n == SKYRL["generator.n_samples_per_prompt"] == 5
    assert rollout.temperature == SKYRL["generator.sampling_params.temperature"] == 1.0
    assert rollout.top_p == SKYRL["generator.sampling_params.top_p"] and rollout.top_k == -1
    assert rollout.calculate_log_probs is True  # SkyRL's logprobs=1: the sampled token's log-prob
    # Validation: SkyRL's eval_sampling_params default None becomes temperature 0 (GeneratorConfig.__post_init__).
    assert rollout.val_kwargs.temperature == 0.0 and rollout.val_kwargs.do_sample is False
    assert actor.use_kl_loss is SKYRL[f"{algorithm}.use_kl_loss"] is True
    assert actor.kl_loss_coef == SKYRL[f"{algorithm}.kl_loss_coef"] == 0.001
    assert SKYRL[f"{algorithm}.kl_estimator_type"] == "k3" and actor.kl_loss_type == "low_var_kl"
    assert actor.clip_ratio_low == SKYRL[f"{algorithm}.eps_clip_low"] == 0.2
    assert actor.clip_ratio_high == SKYRL[f"{algorithm}.eps_clip_high"] == 0.2
    assert SKYRL[f"{algorithm}.policy_loss_type"] == "regular" and actor.clip_ratio_c == NO_DUAL_CLIP
    assert SKYRL[f"{algorithm}.loss_reduction"] == "token_mean" and actor.loss_agg_mode == "token-mean"
    assert cfg.algorithm.adv_estimator == SKYRL[f"{algorithm}.advantage_estimator"] == "grpo"
    assert actor.optim.lr == SKYRL["trainer.policy.optimizer_config.lr"] == 1e-6
    assert actor.optim.weight_decay == SKYRL["trainer.policy.optimizer_config.weight_decay"] == 0.01
    assert actor.optim.lr_warmup_steps == 0
    assert cfg.data.train_batch_size == SKYRL["trainer.train_batch_size"] == 1024
    assert actor.ppo_mini_batch_size == SKYRL["trainer.policy_mini_batch_size"] == 256
    assert actor.ppo_micro_batch_size_per_gpu == SKYRL["trainer.micro_train_batch_size_per_gpu"] == 1
    assert rollout.log_prob_micro_batch_size_per_gpu == SKYRL["trainer.micro_forward_batch_size_per_gpu"] == 1
    assert cfg.data.max_prompt_length == SKYRL["trainer.max_prompt_length"] == 512
    assert cfg.data.max_response_length == SKYRL["generator.sampling_params.max_generate_length"] == 1024
    # Run length: SkyRL's trainer.epochs=1, no step limit.
    assert cfg.trainer.total_epochs == SKYRL["trainer.epochs"] == 1 and cfg.trainer.total_training_steps is None
    assert cfg.trainer.save_freq == SKYRL["trainer.ckpt_interval"] == 10
    assert cfg.trainer.test_freq == SKYRL["trainer.eval_interval"] == 5
    assert cfg.trainer.val_before_train is SKYRL["trainer.eval_before_train"] is True
    assert cfg.trainer.seed == SKYRL["trainer.seed"] == 42
    assert arr.model.enable_gradient_checkpointing is SKYRL["trainer.gradient_checkpointing"] is True
    # Left at hybrid's defaults (UNFILLED): the logger, and the data paths of SkyRL's machines.
    assert list(cfg.trainer.logger) == ["console", "file"]
    assert "/root/data" not in str(cfg.data.train_files)


def test_every_filled_same_value_key_writes_skyrls_default():
    cfg = OmegaConf.create(OmegaConf.to_container(_compose(), resolve=True))
    checked = 0
    for key, value in DIALECT.filled_keys(["trainer.policy.model.path"]).items():
        rule = DIALECT.rule_for(key)
        if rule.how != "same value":
            continue
        for verl_key in rule.verl:
            assert OmegaConf.select(cfg, verl_key) == value, (key, verl_key)
            checked += 1
    assert checked > 30


def test_given_keys_win_over_skyrls_defaults():
    cfg = _compose("generator.n_samples_per_prompt=2", "trainer.algorithm.use_kl_loss=false", "trainer.seed=3")
    actor = cfg.actor_rollout_ref.actor
    assert cfg.actor_rollout_ref.rollout.n == 2 and actor.use_kl_loss is False and cfg.trainer.seed == 3
    # The legacy KL flag given writes the estimator; SkyRL's default kl_estimator_type (k3) does not override it.
    assert _compose("trainer.algorithm.use_abs_kl=true").actor_rollout_ref.actor.kl_loss_type == "abs"


def test_a_default_that_does_not_fit_the_given_sizes_is_named_as_skyrls_default():
    message = skyrl_error("trainer.train_batch_size=16")
    assert "trainer.policy_mini_batch_size=256 (SkyRL's default; the key is not given)" in message
    assert "SkyRL's own check (validate_batch_sizes) refuses these sizes too" in message


def test_the_remote_server_examples_sizes_divide_with_skyrls_five_samples():
    # examples/train/remote_inference_server/run_remote.sh: 64 prompts, mini batch 64, micro 20 on
    # 4 ranks, n_samples_per_prompt not given. SkyRL's 5: 320 samples, 80 per rank = 4 micro
    # batches of 20. hybrid's own n (4) would give 64 per rank, which 20 does not divide.
    sizes = (
        "trainer.train_batch_size=64",
        "trainer.policy_mini_batch_size=64",
        "trainer.placement.policy_num_gpus_per_node=4",
        "trainer.micro_train_batch_size_per_gpu=20",
    )
    cfg = _compose(*sizes)
    assert cfg.actor_rollout_ref.rollout.n == 5 and cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 20
    assert "is 64 per GPU (rounded down), which must be a positive multiple of micro_train_batch_size_per_gpu 20" in (
        skyrl_error(*sizes, "generator.n_samples_per_prompt=4")
    )
