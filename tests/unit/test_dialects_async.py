"""Placement and asynchronous training in the dialects (hybrid/dialects/asynchronous.py and the
rules that call it): SkyRL's `trainer.placement.colocate_all=false` and `trainer.fully_async.*`,
ROLL's `device_mapping` per worker and `async_generation_ratio`, each to the verl keys it sets
(actor_rollout_ref.hybrid_engine, rollout.*, async_training.*), the refusals with their reasons,
and translated lines that fit this machine (one training slot beside one engine slot) passing
typed validation. Nothing here loads a model."""

from __future__ import annotations

import pytest

from hybrid.config import ConfigError, build_config
from hybrid.dialects import translate_argv
from tests.unit.dialect_helpers import A, skyrl, skyrl_error
from tests.unit.test_dialects_roll import roll, roll_error, roll_yaml

AT = "async_training"
SYNC_APART = {f"{AT}.mode": "one_step_off", f"{AT}.max_staleness_steps": 0, f"{AT}.use_rollout_log_probs": False}
ASYNC_KEYS = ("actor_rollout_ref.hybrid_engine", "rollout.nnodes", "rollout.n_gpus_per_node")


def has(out: dict, expected: dict) -> None:
    for key, value in expected.items():
        assert key in out, (key, out)
        assert out[key] == value and type(out[key]) is type(value), (key, out[key], value)


# ---------------------------------------------------------------- SkyRL


def test_skyrl_colocated_writes_no_placement():
    out = skyrl("trainer.placement.colocate_all=true", "trainer.placement.policy_num_gpus_per_node=4")
    assert out["trainer.n_gpus_per_node"] == 4
    assert not any(k in out for k in ASYNC_KEYS) and not any(k.startswith(AT) for k in out)


def test_skyrl_apart_is_synchronous_training_beside_the_policy():
    # SkyRL's placement guide / async example: 4 policy GPUs, 4 engines of 1 GPU (older spellings).
    out = skyrl(
        "trainer.placement.colocate_all=false",
        "trainer.placement.colocate_policy_ref=true",
        "trainer.placement.policy_num_gpus_per_node=4",
        "trainer.placement.ref_num_gpus_per_node=4",
        "generator.num_inference_engines=4",
        "generator.inference_engine_tensor_parallel_size=1",
    )
    has(out, {"trainer.n_gpus_per_node": 4})  # the policy's devices: the training group
    has(out, {"actor_rollout_ref.hybrid_engine": False, "rollout.nnodes": 1, "rollout.n_gpus_per_node": 4})
    has(out, SYNC_APART)


def test_skyrl_engine_devices_are_engines_times_tensor_parallel_size():
    out = skyrl(
        "trainer.placement.colocate_all=false",
        "trainer.placement.policy_num_nodes=2",
        "trainer.placement.policy_num_gpus_per_node=8",
        "generator.inference_engine.num_engines=3",
        "generator.inference_engine.tensor_parallel_size=2",
    )
    has(out, {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 8, "rollout.n_gpus_per_node": 6})
    assert out[f"{A}.rollout.tensor_model_parallel_size"] == 2
    # SkyRL's default is one engine (hybrid has no engine-count key; the tensor-parallel size is hybrid's 1).
    assert skyrl("trainer.placement.colocate_all=false")["rollout.n_gpus_per_node"] == 1


def test_skyrl_fully_async_as_in_skyrls_example():
    # examples/fully_async/fully_async_run_gsm8k.sh's fully async keys, scaled down.
    out = skyrl(
        "trainer.fully_async.max_staleness_steps=4",
        "trainer.fully_async.num_parallel_generation_workers=40",
        "trainer.placement.colocate_all=false",
        "trainer.placement.policy_num_gpus_per_node=2",
        "trainer.placement.critic_num_gpus_per_node=2",
        "trainer.placement.ref_num_gpus_per_node=2",
        "generator.inference_engine.num_engines=2",
        "generator.inference_engine.tensor_parallel_size=1",
        "trainer.train_batch_size=8",
        "trainer.policy_mini_batch_size=8",
        "trainer.algorithm.use_tis=true",
        "trainer.algorithm.tis_imp_ratio_cap=2.0",
    )
    has(out, {"actor_rollout_ref.hybrid_engine": False, "rollout.nnodes": 1, "rollout.n_gpus_per_node": 2})
    has(
        out,
        {
            f"{AT}.mode": "fully_async",
            f"{AT}.max_staleness_steps": 4,
            f"{AT}.staleness_threshold": 4.0,  # SkyRL's capacity: (S + step) x mini batch groups
            f"{AT}.trigger_parameter_sync_step": 1,  # SkyRL syncs the weights after every step
            f"{AT}.require_batches": 1,  # a step takes policy_mini_batch_size groups
            f"{AT}.partial_rollout": True,  # a sync does not wait for the turns in flight
            f"{AT}.use_rollout_log_probs": False,  # SkyRL recomputes the anchor before training
            f"{AT}.max_groups_in_flight": 40,
            f"{A}.actor.tis_imp_ratio_cap": 2.0,
        },
    )


# SkyRL's fully async trainer needs train_batch_size = policy_mini_batch_size; SkyRL's defaults
# (1024 and 256) do not, so the lines below give both.
SIZES = ("trainer.train_batch_size=8", "trainer.policy_mini_batch_size=8")


def test_skyrl_fully_async_keys_given_alone():
    out = skyrl("trainer.placement.colocate_all=false", "trainer.fully_async.max_staleness_steps=1", *SIZES)
    has(out, {f"{AT}.mode": "fully_async", f"{AT}.max_staleness_steps": 1, f"{AT}.staleness_threshold": 1.0})
    assert f"{AT}.max_groups_in_flight" not in out  # hybrid's default: a sync window's worth
    # The workers alone: SkyRL's default max_staleness_steps (4) applies; 8 <= 20 <= 8 x 5.
    out = skyrl(
        "trainer.placement.colocate_all=false", "trainer.fully_async.num_parallel_generation_workers=20", *SIZES
    )
    has(out, {f"{AT}.max_staleness_steps": 4, f"{AT}.staleness_threshold": 4.0, f"{AT}.max_groups_in_flight": 20})


def test_skyrl_offload_after_step_is_read_only_when_colocated():
    key = f"{A}.actor.fsdp_config.optimizer_offload"
    assert skyrl("trainer.policy.optimizer_config.offload_after_step=true")[key] is True
    out = skyrl("trainer.placement.colocate_all=false", "trainer.policy.optimizer_config.offload_after_step=true")
    assert key not in out


@pytest.mark.parametrize(
    "overrides, reason",
    [
        (["trainer.fully_async.max_staleness_steps=2"], "requires trainer.placement.colocate_all=false"),
        (
            ["trainer.placement.colocate_all=true", "trainer.fully_async.num_parallel_generation_workers=8"],
            "requires trainer.placement.colocate_all=false",
        ),
        (
            [
                "trainer.placement.colocate_all=false",
                "trainer.fully_async.max_staleness_steps=2",
                "trainer.train_batch_size=16",
                "trainer.policy_mini_batch_size=4",
            ],
            "requires trainer.train_batch_size (16) to equal trainer.policy_mini_batch_size (4)",
        ),
        (
            [
                "trainer.placement.colocate_all=false",
                "trainer.fully_async.max_staleness_steps=1",
                "trainer.fully_async.num_parallel_generation_workers=17",
                *SIZES,
            ],
            "<= policy_mini_batch_size x (max_staleness_steps + 1), here 8..16 (given 17)",
        ),
        (
            ["trainer.placement.colocate_all=false", "trainer.fully_async.max_staleness_steps=-1"],
            "max_staleness_steps must be a whole number of steps >= 0 (here -1)",
        ),
        (
            ["trainer.placement.colocate_all=false", "generator.inference_engine.num_engines=0"],
            "num_engines must be a whole number >= 1 (here 0)",
        ),
        (["trainer.placement.colocate_all=sometimes"], "true or false"),
        (
            ["trainer.placement.colocate_all=false", "trainer.algorithm.dynamic_sampling.type=filter"],
            "cannot draw further batches for dynamic sampling",
        ),
        (
            ["trainer.placement.policy_num_gpus_per_node=4", "generator.inference_engine.num_engines=2"],
            "engines on devices of their own need colocate_all=false",
        ),
        (["trainer.placement.critic_num_gpus_per_node=2"], "in the training group, on the policy's devices"),
        (["trainer.fully_async.max_in_flight=3"], "not a SkyRL key hybrid knows; did you mean trainer.fully_async."),
    ],
)
def test_skyrl_async_refusals(overrides, reason):
    assert reason in skyrl_error(*overrides)


def test_skyrl_fully_async_problem_is_listed_once():
    message = skyrl_error(
        "trainer.fully_async.max_staleness_steps=2", "trainer.fully_async.num_parallel_generation_workers=8"
    )
    assert "(1 problem;" in message and message.count("requires trainer.placement.colocate_all=false") == 1


def test_skyrl_async_lines_pass_typed_validation():
    apart = build_config(translate_argv(["--dialect", "skyrl", "trainer.placement.colocate_all=false"]))
    assert apart.async_mode == "one_step_off" and apart.async_training.staleness_bound == 0
    assert apart.rollout.devices == 1 and apart.trainer.n_gpus_per_node == 1
    cfg = build_config(
        translate_argv(
            [
                "--dialect",
                "skyrl",
                "trainer.placement.colocate_all=false",
                "trainer.fully_async.max_staleness_steps=2",
                "trainer.fully_async.num_parallel_generation_workers=12",
                "trainer.train_batch_size=4",
                "trainer.policy_mini_batch_size=4",
                "generator.n_samples_per_prompt=2",
            ]
        )
    )
    at = cfg.async_training
    assert cfg.async_mode == "fully_async" and at.staleness_bound == 2 and at.staleness_threshold == 2.0
    assert at.trigger_parameter_sync_step == 1 and at.max_groups_in_flight == 12 and not at.use_rollout_log_probs


SIM_E2E = [  # examples/train/fully_async/sim_trainer/run_fully_async_sim_gsm8k_e2e.sh's keys, scaled to this machine
    "trainer.fully_async.enabled=true",
    "trainer.fully_async.simulate_training=true",
    "trainer.fully_async.simulate_training_step_seconds=5",
    "trainer.fully_async.simulate_weight_sync_seconds=0",
    "trainer.fully_async.max_staleness_steps=1",
    "trainer.fully_async.num_parallel_generation_workers=4",
    "trainer.placement.colocate_all=false",
    "trainer.train_batch_size=4",
    "trainer.policy_mini_batch_size=4",
    "generator.n_samples_per_prompt=2",
    "trainer.eval_before_train=false",
    "trainer.eval_interval=0",
    "trainer.ckpt_interval=-1",
    "trainer.hf_save_interval=-1",
    "trainer.resume_mode=none",
]


def test_skyrl_simulated_trainer_is_fully_async_with_simulated_steps():
    out = skyrl(*SIM_E2E)
    has(out, {f"{AT}.simulate_training": True, f"{AT}.simulate_training_step_seconds": 5})
    has(out, {f"{AT}.simulate_weight_sync_seconds": 0, f"{AT}.mode": "fully_async", f"{AT}.max_staleness_steps": 1})
    cfg = build_config(translate_argv(["--dialect", "skyrl", *SIM_E2E]))
    at = cfg.async_training
    assert cfg.async_mode == "fully_async" and at.simulate_training is True
    assert at.simulate_training_step_seconds == 5.0 and at.simulate_weight_sync_seconds == 0.0
    # SkyRL's own defaults (30 s a step, no sync pause) when the seconds are not given.
    at = build_config(translate_argv(["--dialect", "skyrl", *SIM_E2E[:2], *SIM_E2E[4:]])).async_training
    assert at.simulate_training_step_seconds == 30.0 and at.simulate_weight_sync_seconds == 0.0


def test_skyrl_simulated_trainer_outside_fully_async_is_refused():
    message = skyrl_error("trainer.fully_async.simulate_training=true", "trainer.placement.colocate_all=false")
    assert "simulate_training=true: SkyRL simulates the steps of its fully async trainer only" in message


def test_simulated_training_outside_fully_async_is_refused_in_one_line():
    with pytest.raises(ConfigError) as error:
        build_config([f"{AT}.simulate_training=true"])
    assert (
        f"{AT}.simulate_training=true simulates the steps of the fully async trainer only (here {AT}.mode=None): "
        f"set actor_rollout_ref.hybrid_engine=false and {AT}.mode=fully_async, or simulate_training=false"
    ) in str(error.value)


def test_simulated_training_refuses_what_needs_trainer_models():
    apart = ["actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1", f"{AT}.mode=fully_async"]
    with pytest.raises(ConfigError) as error:
        build_config([*apart, f"{AT}.simulate_training=true", "trainer.save_freq=2", "algorithm.adv_estimator=gae"])
    message = str(error.value)
    for needle in (
        "simulate_training=true with trainer.test_freq=5: set it to -1 (the weights never change",
        "simulate_training=true with trainer.val_before_train=true: set it to false",
        "simulate_training=true with trainer.save_freq=2: set it to -1 (nothing to save",
        "simulate_training=true with trainer.resume_mode='auto': set it to disable",
        "simulate_training=true with a critic (critic.enable or adv_estimator=gae): set it to none",
    ):
        assert needle in message, (needle, message)
    off = ["trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.resume_mode=disable"]
    assert build_config([*apart, f"{AT}.simulate_training=true", *off]).async_training.simulate_training is True


def test_simulated_training_needs_devices_for_the_engines_only(monkeypatch):
    import hybrid.config.rules_async as rules_async

    monkeypatch.setattr(rules_async.os, "cpu_count", lambda: 2)
    monkeypatch.setattr("workers.device.is_cuda_available", lambda: False)
    line = ["actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=2", f"{AT}.mode=fully_async"]
    line += ["trainer.n_gpus_per_node=2", "trainer.test_freq=-1", "trainer.val_before_train=false"]
    with pytest.raises(ConfigError, match="2 training ranks \\+ rollout.n_gpus_per_node=2 engine devices = 4, but"):
        build_config(line)
    # No training rank starts: the two engine devices fit the two cores.
    sim = build_config([*line, f"{AT}.simulate_training=true", "trainer.resume_mode=disable"])
    assert sim.async_training.simulate_training is True


def test_simulated_engines_read_the_model_folder():
    from hybrid.async_sim import engines_config

    cfg = build_config([])
    assert cfg.actor_rollout_ref.rollout.load_format == "dummy"
    assert engines_config(cfg).actor_rollout_ref.rollout.load_format == "auto"
    safetensors = build_config(["actor_rollout_ref.rollout.load_format=safetensors"])
    assert engines_config(safetensors) is safetensors


# ---------------------------------------------------------------- ROLL

APART = """
actor_train:
  device_mapping: list(range(0,1))
actor_infer:
  device_mapping: list(range(1,2))
"""


def test_roll_same_mapping_stays_colocated(tmp_path):
    out = roll(tmp_path, "actor_train:\n  device_mapping: '[0, 1]'\nactor_infer:\n  device_mapping: '[1, 0]'\n")
    has(out, {"trainer.nnodes": 1, "trainer.n_gpus_per_node": 2})
    assert not any(k in out for k in ASYNC_KEYS) and not any(k.startswith(AT) for k in out)


def test_roll_disjoint_mapping_is_synchronous_training_beside_the_trainer(tmp_path):
    # ROLL's device_mapping guide, disaggregated mode: actor_train [0, 4), actor_infer [4, 8).
    out = roll(
        tmp_path,
        "num_gpus_per_node: 8\nactor_train:\n  device_mapping: list(range(0,4))\n"
        "reference:\n  device_mapping: list(range(0,4))\nactor_infer:\n  device_mapping: list(range(4,8))\n",
    )
    has(out, {"trainer.nnodes": 1, "trainer.n_gpus_per_node": 4})
    has(out, {"actor_rollout_ref.hybrid_engine": False, "rollout.nnodes": 1, "rollout.n_gpus_per_node": 4})
    has(out, SYNC_APART)


def test_roll_disjoint_mapping_on_several_nodes(tmp_path):
    # ROLL's async RLVR example: actor_train on [0, 16), actor_infer on [16, 24), 8 per node.
    out = roll(
        tmp_path,
        "num_gpus_per_node: 8\nactor_train:\n  device_mapping: list(range(0,16))\n"
        "actor_infer:\n  device_mapping: list(range(16,24))\n",
    )
    has(out, {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 8, "rollout.nnodes": 1, "rollout.n_gpus_per_node": 8})


def test_roll_async_generation_ratio_streams_groups_ahead(tmp_path):
    # 2 per device x 4 accumulation x 2 devices = 16 samples = 4 prompts of 4: two mini batches per step.
    text = (
        "async_generation_ratio: 1\nactor_train:\n  device_mapping: list(range(0,2))\n  training_args:\n"
        "    per_device_train_batch_size: 2\n    gradient_accumulation_steps: 4\n"
        "actor_infer:\n  device_mapping: list(range(2,4))\n"
    )
    out = roll(tmp_path, text)
    has(
        out,
        {"actor_rollout_ref.hybrid_engine": False, "rollout.n_gpus_per_node": 2, f"{A}.actor.ppo_mini_batch_size": 4},
    )
    has(
        out,
        {
            f"{AT}.mode": "fully_async",
            f"{AT}.staleness_threshold": 1.0,  # generation one rollout_batch_size batch ahead
            f"{AT}.max_staleness_steps": 1,
            f"{AT}.trigger_parameter_sync_step": 1,  # ROLL updates actor_infer before every step
            f"{AT}.require_batches": 2,  # a step trains rollout_batch_size = 8 prompts = 2 mini batches
            f"{AT}.max_groups_in_flight": 16,  # ROLL's budget only: (1 + 1) x 8
            f"{AT}.partial_rollout": True,
            f"{AT}.use_rollout_log_probs": False,
        },
    )


def test_roll_fractional_ratio_keeps_the_budget_and_rounds_the_bound_up(tmp_path):
    out = roll(tmp_path, "async_generation_ratio: 1.5\n" + APART)
    has(
        out,
        {
            f"{AT}.staleness_threshold": 1.5,
            f"{AT}.max_staleness_steps": 2,
            f"{AT}.require_batches": 1,
            f"{AT}.max_groups_in_flight": 20,
        },
    )


def test_roll_ratio_zero_colocated_writes_nothing(tmp_path):
    out = roll(tmp_path, "async_generation_ratio: 0\nactor_train:\n  device_mapping: '[0]'\n")
    assert not any(k.startswith(AT) for k in out) and "actor_rollout_ref.hybrid_engine" not in out


@pytest.mark.parametrize(
    "yaml_text, reason",
    [
        (
            "actor_train:\n  device_mapping: list(range(0,4))\nactor_infer:\n  device_mapping: list(range(2,6))\n",
            "shares some of actor_train's devices (actor_train.device_mapping=list(range(0,4))) but not all",
        ),
        (
            "async_generation_ratio: 1\nactor_train:\n  device_mapping: '[0, 1]'\n"
            "actor_infer:\n  device_mapping: '[0, 1]'\n",
            "async_generation_ratio=1: hybrid generates ahead of training only with the engines on devices of their",
        ),
        ("async_generation_ratio: 2\n", "give actor_infer a device_mapping disjoint from actor_train's"),
        (
            "async_generation_ratio: 0.5\n" + APART,
            "requires async_generation_ratio >= 1 when it is asynchronous (0 is synchronous); here 0.5",
        ),
        ("async_generation_ratio: -1\n" + APART, "async_generation_ratio must be a number >= 0 (here -1)"),
        (
            "async_generation_ratio: 1.5\ntrain_env_manager:\n  tags: [x]\n" + APART,
            "reads async_generation_ratio as a whole number of steps; here 1.5",
        ),
        ("async_generation_ratio: 1\nrollout_batch_size: 12\n" + APART, "must be a multiple of the mini batch"),
        ("actor_train:\n  model_update_frequency: 2\n", "every N steps"),
        (
            "actor_train:\n  device_mapping: '[0, 1]'\ncritic:\n  device_mapping: '[2, 3]'\n",
            "in the training group, on actor_train's devices",
        ),
        ("actor_infer:\n  device_mapping: '[1]'\n", "give actor_train.device_mapping too"),
    ],
)
def test_roll_async_refusals(tmp_path, yaml_text, reason):
    assert reason in roll_error(tmp_path, yaml_text)


def test_roll_async_files_pass_typed_validation(tmp_path):
    path = roll_yaml(tmp_path, APART)
    apart = build_config(translate_argv(["--roll-config", str(path)]))
    assert apart.async_mode == "one_step_off" and apart.async_training.staleness_bound == 0
    assert apart.rollout.devices == 1 and apart.trainer.n_gpus_per_node == 1
    cfg = build_config(translate_argv(["--roll-config", str(path), "+async_generation_ratio=2"]))
    at = cfg.async_training
    assert cfg.async_mode == "fully_async" and at.staleness_bound == 2 and at.staleness_threshold == 2.0
    assert at.require_batches * cfg.actor_rollout_ref.actor.ppo_mini_batch_size == cfg.data.train_batch_size


# ---------------------------------------------------------------- verl


def test_verl_async_keys_are_native():
    argv = [
        "actor_rollout_ref.hybrid_engine=false",
        "rollout.n_gpus_per_node=1",
        f"{AT}.mode=fully_async",
        f"{AT}.staleness_threshold=0.5",
    ]
    assert translate_argv(argv) == argv
    assert build_config(argv).async_mode == "fully_async"
