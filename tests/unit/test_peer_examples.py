"""What the peers' own example scripts need beyond their documented keys: a logger package
missing is refused before anything starts, in one line."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from hybrid.config import build_config
from hybrid.errors import InputError
from hybrid.preflight import check_inputs
from hybrid.tracking import missing_logger_packages


def test_a_logger_whose_package_is_missing_is_refused_before_anything_starts(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert missing_logger_packages(["console", "file"]) == []
    (message,) = missing_logger_packages(["console", "wandb", "wandb"])
    assert message == (
        "trainer.logger includes 'wandb' but the package 'wandb' is not installed: pip install wandb "
        "(or the loggers extra, pip install -e '.[loggers]'), or remove 'wandb' from trainer.logger"
    )
    with pytest.raises(InputError) as err:
        check_inputs(build_config(["trainer.logger=[console,wandb]"]))
    assert err.value.problems == [message]
    assert str(err.value) == message  # one line


def test_a_json_dict_on_the_command_line_is_read_or_refused_in_one_line():
    from hybrid.config import ConfigError
    from hybrid.dialects import translate_argv

    # SkyRL's launch scripts: engine_init_kwargs="$ENGINE_INIT_KWARGS" holding a JSON object
    argv = translate_argv(
        [
            "--dialect",
            "skyrl",
            'generator.inference_engine.engine_init_kwargs={"max_model_len": 4096, "served_model_name": ["a", "b"]}',
        ]
    )
    config = build_config(argv)
    assert config.actor_rollout_ref.rollout.engine_kwargs.vllm == {
        "max_model_len": 4096,
        "served_model_name": ["a", "b"],
    }
    # the same in verl keys, and Hydra's own grammar for a whole free-form dict
    for value in ('{"cpu_offload_gb": 4}', "{cpu_offload_gb: 4}"):
        vllm = build_config([f"actor_rollout_ref.rollout.engine_kwargs.vllm={value}"]).actor_rollout_ref.rollout
        assert vllm.engine_kwargs.vllm == {"cpu_offload_gb": 4}
    for argv in (
        ["--dialect", "skyrl", 'generator.inference_engine.engine_init_kwargs={"a": 1'],
        ['actor_rollout_ref.rollout.engine_kwargs.vllm={"a": 1'],
    ):
        with pytest.raises(ConfigError) as err:
            build_config(translate_argv(argv))
        (line,) = [x for x in str(err.value).splitlines() if "engine" in x]
        assert "is neither Hydra's grammar" in line and "nor JSON" in line


def test_truncated_responses_leave_the_losses_and_come_back_for_the_metrics():
    import torch

    from hybrid.batch_ops import mask_truncated_responses, restore_response_mask
    from protocol.data_proto import DataProto

    eos, pad = 2, 0
    # width 4: row 0 ends in EOS early, row 1 fills the budget without EOS (truncated),
    # row 2 fills the budget ending in EOS (finished), row 3 is a multi-turn row whose
    # observation token (mask 0) is inside a full budget without EOS (truncated).
    responses = torch.tensor([[5, 2, pad, pad], [5, 6, 7, 8], [5, 6, 7, eos], [5, 9, 6, 7]])
    attention = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 1]])
    prompts = torch.ones(4, 2, dtype=torch.long)
    batch = DataProto.from_dict(
        {
            "responses": responses,
            "response_mask": mask,
            "attention_mask": torch.cat([prompts, attention], -1),
        }
    )
    assert mask_truncated_responses(batch, {eos}) == 0.5
    assert batch.batch["response_mask"].tolist() == [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    batch.reorder(torch.tensor([3, 2, 1, 0]))  # balance_batch / PF-PPO reorder rows in between
    restore_response_mask(batch)
    assert batch.batch["response_mask"].tolist() == mask.flip(0).tolist()
    assert "full_response_mask" not in batch.batch.keys()


def _skyrl(*overrides: str):
    from hybrid.dialects import translate_argv

    return build_config(translate_argv(["--dialect", "skyrl", *overrides]))


def test_skyrl_dapo_example_keys():
    # examples/train/algorithms/dapo/run_dapo_gsm8k.sh, its DAPO block as written
    config = _skyrl(
        "trainer.algorithm.policy_loss_type=dual_clip",
        "trainer.algorithm.overlong_buffer_len=512",
        "trainer.algorithm.overlong_buffer_penalty_factor=1.0",
        "trainer.algorithm.loss_reduction=token_mean_legacy",
        "generator.apply_overlong_filtering=true",
        "generator.sampling_params.max_generate_length=1024",
    )
    assert config.reward_model.reward_manager == "dapo"
    buffer = config.reward_model.reward_kwargs["overlong_buffer"]
    assert (buffer["enable"], buffer["len"], buffer["penalty_factor"]) == (True, 512, 1.0)
    assert config.actor_rollout_ref.actor.loss_agg_mode == "token-mean"
    assert config.algorithm.mask_truncated_responses is True
    # only one of the two DAPO keys: SkyRL's DAPOAlgorithmConfig default for the other
    assert (
        _skyrl("trainer.algorithm.overlong_buffer_penalty_factor=0.5").reward_model.reward_kwargs["overlong_buffer"][
            "len"
        ]
        == 512
    )


def test_skyrl_loss_estimator_and_packing_values():
    actor = _skyrl("trainer.algorithm.policy_loss_type=importance_sampling").actor_rollout_ref.actor
    assert actor.policy_loss.loss_mode == "vanilla" and min(actor.clip_ratio_low, actor.clip_ratio_c) >= 1e9
    assert _skyrl("trainer.algorithm.policy_loss_type=reinforce").actor_rollout_ref.actor.policy_loss.loss_mode == "gpg"
    for name in ("maxrl", "simple_baseline"):
        assert _skyrl(f"trainer.algorithm.advantage_estimator={name}").algorithm.adv_estimator == name
    assert _skyrl("trainer.remove_microbatch_padding=false").actor_rollout_ref.model.use_remove_padding is False
    assert _skyrl("trainer.use_sample_packing=false").actor_rollout_ref.model.use_remove_padding is False
    assert _skyrl("trainer.critic.model.lora.rank=0", "trainer.critic.model.lora.alpha=16").critic.enable is not True


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.num_dummy_steps=0"], "full-context trainer with no dummy step runs nothing"),
        (["trainer.critic.model.lora.rank=8", "trainer.critic.model.lora.dropout=0.1"], "LoRA has no dropout key"),
        (["trainer.algorithm.policy_loss_type=dppo"], "no DPPO loss"),
        (["trainer.algorithm.policy_loss_type=cross_entropy"], "hybrid.sft_trainer"),
        (["trainer.use_sample_packing=true", "trainer.remove_microbatch_padding=false"], "give one of them"),
    ],
)
def test_skyrl_keys_hybrid_lacks_are_refused_in_one_line(overrides, message):
    from hybrid.config import ConfigError

    with pytest.raises(ConfigError) as err:
        _skyrl(*overrides)
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and message in lines[1]


def test_skyrl_estimators_by_hand():
    import numpy as np
    import torch

    from hybrid.core_algos import compute_maxrl_advantage, compute_simple_baseline_advantage

    rewards = torch.zeros(4, 3)
    rewards[:, 1] = torch.tensor([1.0, 0.0, 0.5, 2.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]])
    adv, _ = compute_maxrl_advantage(rewards, mask, np.array(["a", "a", "b", "c"]))
    # group a: mean 0.5 -> (1 - 0.5) / 0.5 = 1, (0 - 0.5) / 0.5 = -1; b and c alone keep their score
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, -1.0, 0.5, 2.0]), atol=1e-5, rtol=0)
    adv, _ = compute_simple_baseline_advantage(rewards, mask)
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, 0.0, 0.5, 2.0]) - 0.875)
    assert adv[0, 2] == 0 and adv[1, 2] != 0


def test_skyrl_max_seq_len_is_dr_grpos_constant():
    actor = _skyrl(
        "trainer.algorithm.loss_reduction=seq_mean_token_sum_norm", "trainer.algorithm.max_seq_len=2048"
    ).actor_rollout_ref.actor
    assert (actor.loss_agg_mode, actor.loss_scale_factor) == ("seq-mean-token-sum-norm", 2048)


def test_dump_data_batch_writes_each_steps_training_input(tmp_path):
    from types import SimpleNamespace

    import torch

    from hybrid.trainer import PPOTrainer
    from protocol.data_proto import DataProto

    config = _skyrl("trainer.dump_data_batch=true", f"trainer.ckpt_path={tmp_path}")
    assert config.trainer.dump_data_batch is True
    batch = DataProto.from_dict({"advantages": torch.arange(6.0).reshape(2, 3)})
    trainer = SimpleNamespace(config=config, state=SimpleNamespace(global_step=3))
    path = PPOTrainer.dump_batch(trainer, batch)
    assert path == str(tmp_path / "dumped_data" / "global_step_3_training_input.pt")
    torch.testing.assert_close(DataProto.load_from_disk(path).batch["advantages"], batch.batch["advantages"])


def test_roll_clips_and_length_mask(tmp_path):
    from hybrid.dialects import translate_argv

    path = tmp_path / "rlvr.yaml"
    path.write_text("adv_estimator: grpo\nreward_clip: 10\nadvantage_clip: 2.0\nmax_len_mask: true\n")
    algorithm = build_config(translate_argv(["--roll-config", str(path)])).algorithm
    assert (algorithm.reward_clip, algorithm.advantage_clip, algorithm.mask_truncated_responses) == (10, 2.0, True)
    path.write_text("adv_estimator: grpo\nreward_clip: 0\n")
    assert build_config(translate_argv(["--roll-config", str(path)])).algorithm.reward_clip is None


def test_reward_and_advantage_clips_by_hand():
    import torch

    from hybrid.batch_ops import clip_rewards_and_advantages
    from protocol.data_proto import DataProto

    # GRPO over one group of two: rewards 30 and -1 clipped to 10 and -1 -> advantages
    # (10 - 4.5) / std and (-1 - 4.5) / std with std = sqrt(60.5), then clamped to [-0.5, 0.5].
    scores = torch.tensor([[0.0, 30.0], [-1.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    batch = DataProto.from_dict(
        {"token_level_rewards": scores.clone(), "response_mask": mask},
        non_tensors={"uid": np.array(["a", "a"], dtype=object)},
    )
    algorithm = build_config(["algorithm.reward_clip=10", "algorithm.advantage_clip=0.5"]).algorithm
    metrics = {}
    clip_rewards_and_advantages(batch, algorithm, metrics)
    assert batch.batch["token_level_rewards"].tolist() == [[0.0, 10.0], [-1.0, 0.0]]
    std = (2 * 5.5**2) ** 0.5
    assert 5.5 / std > 0.5  # both advantages clipped
    torch.testing.assert_close(batch.batch["advantages"], torch.tensor([[0.5, 0.5], [-0.5, 0.0]]))
    assert metrics == pytest.approx({"critic/token_reward_clip_frac": 1 / 3, "critic/advantage_clip_frac": 1.0})


def test_roll_fsdp2_strategy_config_onto_hybrids_fsdp_settings(tmp_path):
    from hybrid.config import ConfigError
    from hybrid.dialects import translate_argv

    # the strategy_config block of ROLL's FSDP2 examples (examples/*/..._fsdp2.yaml), as written
    path = tmp_path / "rlvr.yaml"
    path.write_text(
        "adv_estimator: grpo\n"
        "actor_train:\n  strategy_args:\n    strategy_name: fsdp2_train\n    strategy_config:\n"
        "      param_dtype: fp32\n      reduce_dtype: bf16\n      reshard_after_forward: false\n"
        "      offload_policy: true\n      fsdp_size: 8\n      use_batched_model_update: false\n"
        "reference:\n  strategy_args:\n    strategy_name: fsdp2_infer\n    strategy_config:\n"
        "      param_dtype: bf16\n      offload_policy: true\n"
    )
    arr = build_config(translate_argv(["--roll-config", str(path)])).actor_rollout_ref
    fsdp = arr.actor.fsdp_config
    assert (fsdp.mixed_precision, fsdp.reshard_after_forward, fsdp.offload_policy) == ("fp32", False, True)
    assert (arr.ref.fsdp_config.mixed_precision, arr.ref.fsdp_config.param_offload) == ("bf16", True)
    # which modules are FSDP units: the same computation, sharded at another granularity
    translate_argv(
        ["--roll-config", str(path), "+actor_train.strategy_args.strategy_config.wrap_policy.wrap_embeddings=true"]
    )
    with pytest.raises(ConfigError) as err:
        translate_argv(["--roll-config", str(path), "+actor_train.strategy_args.strategy_config.save_only_model=true"])
    assert "save_only_model=true: hybrid's checkpoints are resumable" in str(err.value)


def test_roll_domain_interleave_probs_is_read_as_one_mapping(tmp_path):
    from hybrid.config import ConfigError
    from hybrid.dialects import translate_argv

    path = tmp_path / "rlvr.yaml"
    path.write_text(
        "adv_estimator: grpo\nactor_train:\n  data_args:\n    domain_interleave_probs:\n      math_rule: 1.0\n"
    )
    one = translate_argv(["--roll-config", str(path)])  # one domain: every row drawn, nothing written
    assert not [o for o in one if "domain" in o]
    two = translate_argv(
        ["--roll-config", str(path), "+actor_train.data_args.domain_interleave_probs.code_sandbox=0.5"]
    )
    assert [o for o in two if o.startswith("data.domain_quotas.")] == [
        "data.domain_quotas.math_rule=1.0",
        "data.domain_quotas.code_sandbox=0.5",
    ]
    with pytest.raises(ConfigError) as err:  # a whole mapping on the command line must be a mapping
        translate_argv(["--roll-config", str(path), "actor_train.data_args.domain_interleave_probs='a,b'"])
    assert "give the domains as a mapping {domain: probability}" in str(err.value)


def test_roll_system_envs_reach_the_driver_and_every_worker(tmp_path):
    from hybrid.config import ConfigError
    from hybrid.dialects import translate_argv
    from hybrid.roles import worker_env

    path = tmp_path / "rlvr.yaml"
    path.write_text(
        "adv_estimator: grpo\nsystem_envs:\n  USE_MODELSCOPE: '1'\n  NCCL_TIMEOUT: 30\n"
        "actor_train:\n  system_envs:\n    FOO: bar\nactor_infer:\n  system_envs:\n    FOO: baz\n"
    )
    with pytest.raises(ConfigError) as err:  # one fused worker group: one value per variable
        translate_argv(["--roll-config", str(path)])
    assert "both set trainer.worker_env_vars.FOO, to different values (bar and baz)" in str(err.value)
    config = build_config(translate_argv(["--roll-config", str(path), "actor_infer.system_envs.FOO=bar"]))
    assert worker_env(config) == {"USE_MODELSCOPE": "1", "NCCL_TIMEOUT": "30", "FOO": "bar"}


def test_skyrl_dataset_rows_load_as_they_are(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hybrid.data import reward_model_from_spec

    # the columns of SkyRL's gsm8k_dataset.py: reward_spec instead of verl's reward_model, env_class
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "1 + 1?"}],
        "env_class": "gsm8k",
        "reward_spec": {"method": "rule", "ground_truth": "2"},
        "extra_info": {"split": "train", "index": 0},
    }
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([row] * 16), path)
    monkeypatch.chdir(tmp_path)
    check_inputs(build_config([f"data.train_files=[{path}]", f"data.val_files=[{path}]", "data.train_batch_size=8"]))
    assert reward_model_from_spec(dict(row))["reward_model"] == {"method": "rule", "ground_truth": "2"}
    verl_row = {**row, "reward_model": {"ground_truth": "3"}}
    assert reward_model_from_spec(verl_row)["reward_model"] == {"ground_truth": "3"}  # verl's column wins
