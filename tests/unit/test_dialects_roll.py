"""ROLL pipeline files on hybrid's command line (hybrid/dialects/roll.py and its
siblings): each mapping and transform, ROLL overrides applied onto the file, device_mapping
forms, the refusals (by name, with the reason, all in one error), the nearest-key hint for
typos, and examples/roll_grpo_arithmetic.yaml translating into a config that loads and
validates. Nothing here loads a model."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hybrid.config import ConfigError, load_config, validate_config
from hybrid.dialects import roll as roll_dialect
from hybrid.dialects import translate_argv
from hybrid.dialects.roll import parse_devices, translate_roll
from hybrid.dialects.table import NO_DUAL_CLIP, Refusal
from tests.unit.dialect_helpers import ROLL_EXAMPLE, A, as_dict

# ---------------------------------------------------------------- ROLL mappings

ROLL_BASE = """
rollout_batch_size: 8
num_return_sequences_in_group: 4
prompt_length: 64
response_length: 48
adv_estimator: grpo
"""


def roll_yaml(tmp_path: Path, text: str) -> Path:
    """`text` over ROLL_BASE (its keys win), as a pipeline file."""
    merged = OmegaConf.merge(OmegaConf.create(ROLL_BASE), OmegaConf.create(text))
    path = tmp_path / "pipeline.yaml"
    path.write_text(OmegaConf.to_yaml(merged))
    return path


def roll(tmp_path: Path, text: str, *overrides: str) -> dict:
    return as_dict(translate_roll(str(roll_yaml(tmp_path, text)), list(overrides)))


def roll_error(tmp_path: Path, text: str, *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        translate_roll(str(roll_yaml(tmp_path, text)), list(overrides))
    return str(err.value)


@pytest.mark.parametrize(
    "yaml_text, expected",
    [
        ("pretrain: /models/q\n", {f"{A}.model.path": "/models/q"}),
        (
            "actor_train:\n  model_args:\n    model_name_or_path: /m\n    dtype: bf16\n",
            {f"{A}.model.path": "/m", f"{A}.actor.fsdp_config.mixed_precision": "bf16"},
        ),
        (
            "rollout_batch_size: 16\nnum_return_sequences_in_group: 8\n",
            {"data.train_batch_size": 16, f"{A}.rollout.n": 8},
        ),
        ("prompt_length: 100\nresponse_length: 30\n", {"data.max_prompt_length": 100, "data.max_response_length": 30}),
        ("prompt_length: 100\nsequence_length: 300\n", {"data.max_response_length": 200}),
        (
            "max_steps: 7\nsave_steps: 5\neval_steps: 2\n",
            {
                "trainer.total_training_steps": 7,
                "trainer.total_epochs": 7,  # ROLL starts the data over until max_steps
                "trainer.save_freq": 5,
                "trainer.test_freq": 2,
                "trainer.val_before_train": True,
                f"{A}.actor.checkpoint.save_contents": ["model", "optimizer", "extra", "hf_model"],
            },
        ),
        ("eval_steps: 0\n", {"trainer.test_freq": -1, "trainer.val_before_train": False}),
        (
            "logging_steps: 1\nexp_name: e\noutput_dir: /out\nseed: 3\n",
            {"trainer.experiment_name": "e", "trainer.default_local_dir": "/out", "trainer.seed": 3, "data.seed": 3},
        ),
        (
            "track_with: wandb\ntracker_kwargs:\n  project: p\n",
            {"trainer.logger": ["wandb", "file"], "trainer.project_name": "p"},
        ),
        (
            "resume_from_checkpoint: /ck/global_step_3\n",
            {"trainer.resume_mode": "resume_path", "trainer.resume_from_path": "/ck/global_step_3"},
        ),
        ("resume_from_checkpoint: false\n", {"trainer.resume_mode": "disable"}),
        ("max_ckpt_to_keep: 0\n", {"trainer.max_actor_ckpt_to_keep": None}),
        ("adv_estimator: grpo\n", {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": True}),
        (
            "adv_estimator: gae\nwhiten_advantages: true\nreward_pretrain: /critic\nvalue_clip: 0.5\n",
            {"algorithm.adv_estimator": "gae", "critic.model.path": "/critic", "critic.cliprange_value": 0.5},
        ),
        (
            "adv_estimator: reinforce\nnorm_mean_type: group\nnorm_std_type: group\n",
            {"algorithm.adv_estimator": "grpo"},
        ),
        (
            "adv_estimator: reinforce\nnorm_mean_type: group\n",
            {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": False},
        ),
        (
            "adv_estimator: reinforce\nnorm_mean_type: batch\nnorm_std_type: batch\nwhiten_advantages: true\n",
            {"algorithm.adv_estimator": "reinforce_plus_plus"},
        ),
        (
            "init_kl_coef: 0.05\nadd_token_level_kl: true\ntarget_kl: 0.1\nkl_horizon: 500\nkl_penalty: k3\n",
            {
                "algorithm.kl_ctrl.kl_coef": 0.05,
                "algorithm.use_kl_in_reward": True,
                "algorithm.kl_ctrl.type": "adaptive",
                "algorithm.kl_ctrl.target_kl": 0.1,
                "algorithm.kl_ctrl.horizon": 500,
                "algorithm.kl_penalty": "low_var_kl",
            },
        ),
        (
            "use_kl_loss: true\nkl_loss_coef: 0.01\nentropy_loss_coef: 0.001\nppo_epochs: 2\n",
            {
                f"{A}.actor.use_kl_loss": True,
                f"{A}.actor.kl_loss_coef": 0.01,
                f"{A}.actor.entropy_coeff": 0.001,
                f"{A}.actor.ppo_epochs": 2,
            },
        ),
        ("pg_clip: 0.3\n", {f"{A}.actor.clip_ratio_low": 0.3, f"{A}.actor.clip_ratio_high": 0.3}),
        (
            "use_pg_clip_range: true\npg_clip_low: 0.2\npg_clip_high: 0.28\n",
            {f"{A}.actor.clip_ratio_low": 0.2, f"{A}.actor.clip_ratio_high": 0.28},
        ),
        ("dual_clip_loss: false\n", {f"{A}.actor.clip_ratio_c": NO_DUAL_CLIP}),
        ("dual_clip_loss: true\n", {f"{A}.actor.clip_ratio_c": 3.0}),
        ("loss_agg_mode: seq-mean-token-mean\n", {f"{A}.actor.loss_agg_mode": "seq-mean-token-mean"}),
        ("use_policy_loss_type: PG\n", {f"{A}.actor.policy_loss.loss_mode": "gpg"}),
        (
            "actor_train:\n  training_args:\n    learning_rate: 1.0e-6\n    weight_decay: 0.1\n    max_grad_norm: 0.5\n"
            "    adam_beta2: 0.95\n    lr_scheduler_type: cosine\n",
            {
                f"{A}.actor.optim.lr": 1e-6,
                f"{A}.actor.optim.weight_decay": 0.1,
                f"{A}.actor.grad_clip": 0.5,
                f"{A}.actor.optim.betas": [0.9, 0.95],
                f"{A}.actor.optim.warmup_style": "cosine",
            },
        ),
        # 2 x 4 x 2 devices = 16 samples per optimizer step = 4 prompts of 4 responses.
        (
            "actor_train:\n  training_args:\n    per_device_train_batch_size: 2\n    gradient_accumulation_steps: 4\n"
            "  device_mapping: list(range(0,2))\nactor_infer:\n  device_mapping: list(range(0,2))\n",
            {
                f"{A}.actor.ppo_mini_batch_size": 4,
                f"{A}.actor.ppo_micro_batch_size_per_gpu": 2,
                "trainer.nnodes": 1,
                "trainer.n_gpus_per_node": 2,
            },
        ),
        # 8 prompts x 4 = 32 samples, 16 per optimizer step: 2 optimizer steps per training step.
        (
            "actor_train:\n  training_args:\n    per_device_train_batch_size: 4\n    gradient_accumulation_steps: 4\n"
            "    warmup_steps: 6\n",
            {f"{A}.actor.optim.lr_warmup_steps": 3},
        ),
        (
            "num_gpus_per_node: 8\nactor_train:\n  device_mapping: list(range(0,16))\n",
            {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 8},
        ),
        (
            "actor_train:\n  infer_batch_size: 4\n  strategy_args:\n    strategy_name: fsdp2_train\n"
            "reference:\n  infer_batch_size: 2\n  strategy_args:\n    strategy_name: hf_infer\n",
            {
                f"{A}.rollout.log_prob_micro_batch_size_per_gpu": 4,
                f"{A}.ref.log_prob_micro_batch_size_per_gpu": 2,
                f"{A}.actor.strategy": "fsdp2",
            },
        ),
        (
            "actor_infer:\n  generating_args:\n    max_new_tokens: ${response_length}\n    temperature: 0.9\n"
            "    top_p: 0.95\n"
            "    top_k: 50\n    num_return_sequences: ${num_return_sequences_in_group}\n"
            "  strategy_args:\n    strategy_name: vllm\n    strategy_config:\n      gpu_memory_utilization: 0.6\n"
            "      block_size: 16\n      max_model_len: 512\n",
            {
                "data.max_response_length": 48,
                f"{A}.rollout.temperature": 0.9,
                f"{A}.rollout.top_p": 0.95,
                f"{A}.rollout.top_k": 50,
                f"{A}.rollout.name": "vllm",
                f"{A}.rollout.gpu_memory_utilization": 0.6,
                f"{A}.rollout.engine_kwargs.vllm.block_size": 16,
                f"{A}.rollout.max_model_len": 512,
            },
        ),
        ("actor_infer:\n  strategy_args:\n    strategy_name: hf_infer\n", {f"{A}.rollout.name": "hf"}),
        (
            "actor_train:\n  data_args:\n    file_name: [/d/a.jsonl]\n    template: native\n    messages: messages\n"
            "validation:\n  data_args:\n    file_name: /d/v.jsonl\n  generating_args:\n    temperature: 0\n"
            "    top_p: 1.0\n",
            {
                "data.train_files": ["/d/a.jsonl"],
                "data.prompt_key": "messages",
                "data.val_files": ["/d/v.jsonl"],
                f"{A}.rollout.val_kwargs.temperature": 0,
            },
        ),
        (
            "rewards:\n  math_rule:\n"
            "    worker_cls: roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker\n"
            "    tag_included: [gsm8k]\n    world_size: 8\n",
            {},
        ),
        (
            "train_infer_correction:\n  is_weight:\n    enabled: true\n    upper_bound: 2.0\n",
            {f"{A}.actor.tis_imp_ratio_cap": 2.0},
        ),
        ("model_update_buffer_size_mb: 256\n", {f"{A}.rollout.update_weights_bucket_megabytes": 256}),
        # Ulysses sequence parallelism per trained role; the reference's size must be actor_train's.
        (
            "actor_train:\n  model_args:\n    ulysses_size: 2\nreference:\n  model_args:\n    ulysses_size: 2\n"
            "critic:\n  model_args:\n    ulysses_size: 4\n",
            {
                f"{A}.actor.ulysses_sequence_parallel_size": 2,
                f"{A}.ref.ulysses_sequence_parallel_size": 2,
                "critic.ulysses_sequence_parallel_size": 4,
            },
        ),
        ("actor_train:\n  model_args:\n    ulysses_size: 1\n", {f"{A}.actor.ulysses_sequence_parallel_size": 1}),
        ("val_greedy: true\n", {f"{A}.rollout.val_kwargs.do_sample": False, f"{A}.rollout.val_kwargs.temperature": 0}),
        ("val_greedy: false\n", {f"{A}.rollout.val_kwargs.do_sample": True}),
        # the reference splits sequences as the actor does whatever its own size: the same log-probs
        (
            "actor_train:\n  model_args:\n    ulysses_size: 4\nreference:\n  model_args:\n    ulysses_size: 2\n",
            {f"{A}.actor.ulysses_sequence_parallel_size": 4, f"{A}.ref.ulysses_sequence_parallel_size": 4},
        ),
        # a reference on devices of its own: computed in the training group (4 devices), the same log-probs
        (
            "actor_train:\n  device_mapping: list(range(0,4))\nreference:\n  device_mapping: list(range(4,8))\n",
            {"trainer.n_gpus_per_node": 4, "trainer.nnodes": 1},
        ),
        # ROLL's qwen2_5 template is its native one; qwen3 adds enable_thinking=True
        ("actor_train:\n  data_args:\n    template: qwen2_5\n", {}),
        (
            "actor_train:\n  data_args:\n    template: qwen3\nvalidation:\n  data_args:\n    template: qwen2_5\n",
            {"data.apply_chat_template_kwargs.enable_thinking": True},
        ),
        # ROLL encodes prompts with global_template when given, actor_train's template else
        (
            "global_template: qwen3\nactor_train:\n  data_args:\n    template: base\n",
            {"data.apply_chat_template_kwargs.enable_thinking": True},
        ),
        (
            "difficulty_mask: true\ndifficulty_low_threshold: 0.1\ndifficulty_high_threshold: 0.95\n",
            {
                "algorithm.difficulty_mask.enable": True,
                "algorithm.difficulty_mask.low": 0.1,
                "algorithm.difficulty_mask.high": 0.95,
            },
        ),
        (
            "difficulty_mask: true\n",
            {
                "algorithm.difficulty_mask.enable": True,
                "algorithm.difficulty_mask.low": 0.0,
                "algorithm.difficulty_mask.high": 1.0,
            },
        ),
        ("difficulty_mask: false\ndifficulty_low_threshold: 0.1\n", {"algorithm.difficulty_mask.enable": False}),
        (
            "track_with: tensorboard\ntracker_kwargs:\n  log_dir: /tb/run\n  project: p\n",
            {"trainer.worker_env_vars.TENSORBOARD_DIR": "/tb/run", "trainer.project_name": "p"},
        ),
        (
            "track_with: wandb\ntracker_kwargs:\n  log_dir: /w\n  api_key: k1\n  notes: n\n  tags: [a, b]\n",
            {
                "trainer.worker_env_vars.WANDB_DIR": "/w",
                "trainer.worker_env_vars.WANDB_API_KEY": "k1",
                "trainer.worker_env_vars.WANDB_NOTES": "n",
                "trainer.worker_env_vars.WANDB_TAGS": "a,b",
            },
        ),
        # ROLL's own vLLM settings, popped before the engine starts
        (
            "actor_infer:\n  strategy_args:\n    strategy_name: vllm\n    strategy_config:\n      sleep_level: 2\n"
            "      VLLM_USE_V1: 1\n      block_size: 16\n",
            {f"{A}.rollout.free_cache_engine": True, f"{A}.rollout.engine_kwargs.vllm.block_size": 16},
        ),
        # the agentic pipeline: max_new_tokens caps each turn with max_tokens_per_step (the smaller wins)
        (
            "actor_infer:\n  generating_args:\n    max_new_tokens: 32\n"
            "reward_normalization:\n  grouping: traj_group_id\n  method: mean_std\n"
            "custom_envs:\n  R:\n    env_type: arithmetic_retry\n    max_steps: 2\n    max_tokens_per_step: 64\n",
            {f"{A}.rollout.multi_turn.max_tokens_per_turn": 32, "data.max_response_length": 48},
        ),
        (
            "actor_infer:\n  generating_args:\n    max_new_tokens: 32\n"
            "reward_normalization:\n  grouping: traj_group_id\n  method: mean_std\n"
            "custom_envs:\n  R:\n    env_type: arithmetic_retry\n    max_steps: 2\n",
            {f"{A}.rollout.multi_turn.max_tokens_per_turn": 32},
        ),
        ("actor_infer:\n  generating_args:\n    max_new_tokens: 48\n", {"data.max_response_length": 48}),
        # ROLL's FSDP2 shard layout settings compute the same values
        (
            "actor_train:\n  strategy_args:\n    strategy_name: fsdp2_train\n    strategy_config:\n"
            "      apply_tiled_mlp: true\n      ep_size: 8\n      wrap_policy:\n"
            "        transformer_layer_cls_to_wrap: [Qwen3MoeAttention]\n        wrap_embeddings: true\n",
            {f"{A}.actor.strategy": "fsdp2"},
        ),
    ],
)
def test_roll_mapping(tmp_path, yaml_text, expected):
    out = roll(tmp_path, yaml_text)
    for key, value in expected.items():
        assert key in out, (key, out)
        assert out[key] == value, (key, out[key], value)


def test_roll_overrides_apply_onto_the_file(tmp_path):
    out = roll(tmp_path, "max_steps: 5\n", "max_steps=2", "+seed=9", "~adv_estimator")
    assert out["trainer.total_training_steps"] == 2 and out["trainer.seed"] == 9
    assert "algorithm.adv_estimator" not in out


@pytest.mark.parametrize(
    "value, ids",
    [
        ("list(range(0,4))", [0, 1, 2, 3]),
        ("list(range(8))", list(range(8))),
        ("list(range(0, 8, 2))", [0, 2, 4, 6]),
        ("[0, 1]", [0, 1]),
        ([2, 3], [2, 3]),
    ],
)
def test_roll_device_mapping_forms(value, ids):
    assert parse_devices(value) == ids


def test_roll_device_mapping_rejects_nonsense():
    with pytest.raises(Refusal):
        parse_devices("os.system('x')")


# ROLL keys hybrid has no equivalent for, with a piece of the reason.
ROLL_REFUSED_YAML = """
rollout_batch_size: 8
num_return_sequences_in_group: 4
response_length: 48
adv_estimator: gigpo
async_generation_ratio: 0.5
logging_steps: 5
whiten_rewards: true
use_topr_loss: true
error_max_len_clip: true
importance_sampling: seq
is_use_additional_prompts: true
actor_train:
  strategy_args:
    strategy_name: megatron_train
    strategy_config:
      tensor_model_parallel_size: 2
  device_mapping: list(range(0,8))
actor_infer:
  model_args:
    ulysses_size: 2
  strategy_args:
    strategy_name: sglang
  device_mapping: list(range(4,12))
  generating_args:
    num_beams: 4
reference:
  strategy_args:
    strategy_name: deepspeed_infer
  device_mapping: list(range(0,8))
critic:
  strategy_args:
    strategy_name: deepspeed_train
rewards:
  code:
    worker_cls: roll.pipeline.rlvr.rewards.code_sandbox_reward_worker.CodeSandboxRewardWorker
"""
ROLL_REFUSED = [
    ("adv_estimator=gigpo", "step-wise estimator"),
    ("async_generation_ratio=0.5", "requires async_generation_ratio >= 1 when it is asynchronous"),
    ("logging_steps=5", "logs every step"),
    ("whiten_rewards=true", "reward whitening"),
    ("use_topr_loss=true", "TOPR"),
    ("error_max_len_clip=true", "no such mask"),
    ("importance_sampling=seq", "per token"),
    ("is_use_additional_prompts=true", "dynamic sampling"),
    ("actor_train.strategy_args.strategy_name=megatron_train", "Megatron"),
    ("actor_infer.model_args.ulysses_size=2", "tensor parallelism only"),
    ("actor_infer.strategy_args.strategy_name=sglang", "in-process vLLM"),
    ("actor_infer.device_mapping=list(range(4,12))", "shares some of actor_train's devices"),
    ("actor_infer.generating_args.num_beams=4", "beam search"),
    ("reference.strategy_args.strategy_name=deepspeed_infer", "DeepSpeed"),
    ("critic.strategy_args.strategy_name=deepspeed_train", "DeepSpeed"),
    ("rewards.code.worker_cls=", "sandbox"),
]


def test_roll_refusals_are_all_listed_at_once_by_name_with_the_reason(tmp_path):
    message = roll_error(tmp_path, ROLL_REFUSED_YAML)
    lines = message.splitlines()
    for start, reason in ROLL_REFUSED:
        line = next((ln for ln in lines if ln.startswith(f"  - {start}")), None)
        assert line is not None, (start, message)
        assert reason in line, (line, reason)
    # The megatron strategy_config settings are not reported again on top of the strategy.
    assert not any("strategy_config.tensor_model_parallel_size" in ln for ln in lines)
    assert f"({len(ROLL_REFUSED)} problems;" in lines[0]


def test_roll_documents_at_least_ten_refused_keys():
    refused = {r.key for r in roll_dialect.RULES if r.kind == "refuse"}
    assert len(refused) >= 10
    for key in (
        "actor_train.model_update_frequency",
        "logging_steps",
        "reward_model.*",
    ):
        assert key in refused


@pytest.mark.parametrize(
    "yaml_text, reason",
    [
        ("adv_estimator: gae\n", "set whiten_advantages: true"),
        ("adv_estimator: grpo\nwhiten_advantages: true\n", "does not whiten the group-normalised advantages again"),
        ("adv_estimator: reinforce\n", "not this combination"),
        (
            "actor_train:\n  training_args:\n    per_device_train_batch_size: 3\n    gradient_accumulation_steps: 1\n",
            "not a whole number of groups of num_return_sequences_in_group=4",
        ),
        ("actor_train:\n  data_args:\n    template: chatml\n", "chatml renders prompts its own way"),
        ("validation:\n  data_args:\n    template: mine\n", "not one of ROLL's chat templates"),
        ("global_template: base\n", "base renders prompts its own way"),
        ("tag_to_template:\n  math: qwen3\n", "ROLL's per-tag templates"),
        (
            "track_with: wandb\ntracker_kwargs:\n  api_key: ${oc.env:ROLL_TEST_UNSET_KEY}\n",
            "tracker_kwargs.api_key=${oc.env:ROLL_TEST_UNSET_KEY}: the environment variable ROLL_TEST_UNSET_KEY "
            "is not set",
        ),
        (
            "actor_train:\n  device_mapping: list(range(0,4))\ncritic:\n  device_mapping: list(range(4,8))\n",
            "runs the critic in the training group, on actor_train's devices; give it actor_train's device_mapping",
        ),
        ("pretrain: /a\nreference:\n  model_args:\n    model_name_or_path: /b\n", "initial policy"),
        (
            "actor_infer:\n  strategy_args:\n    strategy_name: vllm\n    strategy_config:\n      VLLM_USE_V1: 0\n",
            "hybrid's vLLM engine is V1",
        ),
        ("actor_train:\n  model_args:\n    dtype: fp16\n", "supported: bf16, fp32"),
        ("track_with: swanlab\n", "supported: tensorboard, wandb, stdout"),
    ],
)
def test_roll_transform_refusals(tmp_path, yaml_text, reason):
    assert reason in roll_error(tmp_path, yaml_text)


def test_roll_freeze_module_prefix(tmp_path):
    """ROLL splits the prefixes at commas and freezes by them only without LoRA (lora_target)."""
    text = "actor_train:\n  model_args:\n    freeze_module_prefix: model.visual, lm_head\n"
    assert roll(tmp_path, text)["actor_rollout_ref.actor.freeze_module_prefix"] == ["model.visual", "lm_head"]
    lora = roll(tmp_path, text + "    lora_target: q_proj\n")
    assert "actor_rollout_ref.actor.freeze_module_prefix" not in lora


def test_roll_tracker_keys_that_the_tracker_in_use_does_not_read(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    # wandb reads WANDB_API_KEY itself when it starts: an unset ${oc.env:WANDB_API_KEY} is not an error here
    out = roll(tmp_path, "track_with: wandb\ntracker_kwargs:\n  api_key: ${oc.env:WANDB_API_KEY}\n")
    assert not any(key.startswith("trainer.worker_env_vars") for key in out)
    out = roll(tmp_path, "track_with: tensorboard\ntracker_kwargs:\n  api_key: k\n  notes: n\n")
    assert not any(key.startswith("trainer.worker_env_vars") for key in out)


def test_difficulty_mask_bounds_in_the_wrong_order_are_refused(tmp_path):
    from hybrid.config import build_config

    path = roll_yaml(tmp_path, "difficulty_mask: true\ndifficulty_low_threshold: 0.9\ndifficulty_high_threshold: 0.1\n")
    with pytest.raises(ConfigError) as err:
        build_config(translate_argv(["--roll-config", str(path)]))
    assert (
        "algorithm.difficulty_mask.low=0.9 must be below algorithm.difficulty_mask.high=0.1 "
        "(groups are kept when low < mean score < high)"
    ) in str(err.value)


def test_difficulty_mask_drops_the_groups_outside_the_bounds_from_the_losses():
    import numpy as np
    import torch

    from hybrid.batch_ops import mask_by_difficulty, restore_response_mask
    from protocol.data_proto import DataProto

    # three groups of two (uids a, b, c, rows interleaved); scores per response: a 1,1 (mean 1),
    # b 0,1 (mean 0.5), c 0,0 (mean 0); the score sits on the last token.
    scores = torch.zeros(6, 3)
    scores[[0, 3, 4], -1] = 1.0
    mask = torch.ones(6, 3, dtype=torch.long)
    batch = DataProto.from_dict({"token_level_scores": scores, "response_mask": mask})
    batch.non_tensor_batch["uid"] = np.array(["a", "b", "c", "a", "b", "c"], dtype=object)
    assert mask_by_difficulty(batch, 0.0, 1.0) == pytest.approx(2 / 6)
    assert batch.batch["response_mask"][:, 0].tolist() == [0, 1, 0, 0, 1, 0]
    restore_response_mask(batch)
    assert batch.batch["response_mask"].sum() == 18
    assert mask_by_difficulty(batch, -0.5, 0.75) == pytest.approx(4 / 6)  # a (mean 1) leaves
    assert batch.batch["response_mask"][:, 0].tolist() == [0, 1, 1, 0, 1, 1]


def test_roll_typo_names_the_nearest_roll_key(tmp_path):
    message = roll_error(tmp_path, "rollout_batch_sise: 4\nactor_train:\n  training_args:\n    learning_rat: 1.0\n")
    assert "rollout_batch_sise=4: not a ROLL key hybrid knows; did you mean rollout_batch_size?" in message
    assert "did you mean actor_train.training_args.learning_rate?" in message


def test_roll_example_loads_and_validates():
    overrides = translate_argv(["--roll-config", str(ROLL_EXAMPLE)])
    cfg = load_config(overrides)
    validate_config(cfg)
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.data.train_batch_size == 8 and cfg.actor_rollout_ref.rollout.n == 4
    # 8 per device x 4 accumulation x 1 device = 32 samples = 8 prompts of 4.
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 8
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8
    assert cfg.trainer.total_training_steps == 30 and cfg.trainer.test_freq == 5
    assert cfg.actor_rollout_ref.rollout.val_kwargs.do_sample is False


def test_a_step_whose_masks_leave_no_response_trains_nothing():
    import torch

    from hybrid.batch_ops import FULL_RESPONSE_MASK
    from hybrid.trainer import PPOTrainer
    from protocol.data_proto import DataProto

    scores = torch.tensor([[0.0, 1.0], [0.0, 0.5]])
    full = torch.ones(2, 2, dtype=torch.long)
    batch = DataProto.from_dict(
        {"token_level_scores": scores, "response_mask": torch.zeros_like(full), FULL_RESPONSE_MASK: full}
    )
    metrics = {}
    assert PPOTrainer._skip_if_all_masked(batch, metrics) is True
    assert metrics == {"mask/final_mask_sum_eq_0": 1.0}
    assert batch.batch["advantages"].abs().sum() == 0 and batch.batch["returns"].abs().sum() == 0
    assert batch.batch["response_mask"].tolist() == [[1, 1], [1, 1]]  # the data metrics see every response
    kept = DataProto.from_dict({"token_level_scores": scores, "response_mask": torch.tensor([[0, 0], [1, 0]])})
    metrics = {}
    assert PPOTrainer._skip_if_all_masked(kept, metrics) is False
    assert metrics == {"mask/final_mask_sum_eq_0": 0.0} and "advantages" not in kept.batch.keys()


def _fsdp2(role: str, size, devices: str = "list(range(0,8))") -> str:
    return (
        f"{role}:\n  device_mapping: {devices}\n  strategy_args:\n    strategy_name: fsdp2_train\n"
        f"    strategy_config:\n      fsdp_size: {size}\n"
    )


@pytest.mark.parametrize(
    "size, expected",
    [(1, -1), (8, -1), (16, -1), (4, 4), (2, 2)],  # ROLL's mesh: <= 1 or >= the devices is global sharding
)
def test_roll_fsdp_size_is_the_shard_group(tmp_path, size, expected):
    out = roll(tmp_path, _fsdp2("actor_train", size))
    assert out[f"{A}.actor.fsdp_config.fsdp_size"] == expected


def test_roll_fsdp_size_refusals(tmp_path):
    assert "does not divide actor_train's 8 devices into shard groups" in roll_error(tmp_path, _fsdp2("actor_train", 3))
    text = _fsdp2("actor_train", 4) + _fsdp2("reference", 2)
    assert "hybrid's reference runs in actor_train's workers, sharded over its shard groups" in roll_error(
        tmp_path, text
    )
    out = roll(tmp_path, _fsdp2("actor_train", 4) + _fsdp2("reference", 4))
    assert out[f"{A}.actor.fsdp_config.fsdp_size"] == 4
