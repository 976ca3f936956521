"""SkyRL and ROLL keys on hybrid's command line (hybrid/config/dialects/): each mapping and
transform, the refusals (by name, with the reason, all in one error), the nearest-key hint
for typos, the SkyRL example of the reference docs and examples/roll_grpo_arithmetic.yaml
translating into a config that loads and validates, `--cfg job` through the real entry
point, and docs/config_dialects.md matching the rule tables. Nothing here loads a model."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from hybrid.config import ConfigError, load_config, validate_config
from hybrid.config.dialects import translate_argv
from hybrid.config.dialects import roll as roll_dialect
from hybrid.config.dialects import skyrl as skyrl_dialect
from hybrid.config.dialects.roll import parse_devices, translate_roll
from hybrid.config.dialects.skyrl import translate_skyrl
from hybrid.config.dialects.table import NO_DUAL_CLIP, Refusal, hydra_value

REPO = Path(__file__).resolve().parents[2]
ROLL_EXAMPLE = REPO / "examples" / "roll_grpo_arithmetic.yaml"
A = "actor_rollout_ref"

# The SkyRL configuration overview of the reference docs (seeds/000: data, placement,
# trainer, checkpoint, logging, policy, ref, algorithm, generator), key by key with its
# values, as a SkyRL user passes them on the command line.
SKYRL_SEED_EXAMPLE = [
    "data.train_data=['${oc.env:HOME}/data/gsm8k/train.parquet']",
    "data.val_data=['${oc.env:HOME}/data/gsm8k/validation.parquet']",
    "trainer.placement.colocate_all=true",
    "trainer.placement.colocate_policy_ref=true",
    "trainer.placement.colocate_critic_reward=false",
    "trainer.placement.policy_num_nodes=1",
    "trainer.placement.policy_num_gpus_per_node=4",
    "trainer.placement.critic_num_nodes=1",
    "trainer.placement.critic_num_gpus_per_node=4",
    "trainer.placement.ref_num_nodes=1",
    "trainer.placement.ref_num_gpus_per_node=4",
    "trainer.placement.reward_num_nodes=1",
    "trainer.placement.reward_num_gpus_per_node=4",
    "trainer.epochs=1",
    "trainer.update_epochs_per_batch=1",
    "trainer.train_batch_size=1024",
    "trainer.policy_mini_batch_size=256",
    "trainer.critic_mini_batch_size=256",
    "trainer.micro_train_batch_size_per_gpu=1",
    "trainer.micro_forward_batch_size_per_gpu=1",
    "trainer.update_ref_every_epoch=false",
    "trainer.num_warmup_steps=0",
    "trainer.use_sample_packing=true",
    "trainer.max_prompt_length=512",
    "trainer.gradient_checkpointing=true",
    "trainer.seed=42",
    "trainer.eval_batch_size=1024",
    "trainer.eval_before_train=true",
    "trainer.eval_interval=5",
    "trainer.resume_mode=latest",
    "trainer.resume_path=null",
    "trainer.ckpt_path=${oc.env:HOME}/ckpts/",
    "trainer.max_ckpts_to_keep=-1",
    "trainer.ckpt_interval=10",
    "trainer.hf_save_interval=-1",
    "trainer.export_path=${oc.env:HOME}/exports/",
    "trainer.project_name=skyrl",
    "trainer.run_name=test_run",
    "trainer.logger=wandb",
    "trainer.dump_data_batch=false",
    "trainer.dump_eval_results=true",
    "trainer.strategy=fsdp2",
    "trainer.policy.model.path=Qwen/Qwen2.5-1.5B-Instruct",
    "trainer.policy.optimizer_config.lr=1.0e-6",
    "trainer.policy.optimizer_config.adam_betas=[0.9,0.999]",
    "trainer.policy.optimizer_config.weight_decay=1e-2",
    "trainer.policy.optimizer_config.max_grad_norm=1.0",
    "trainer.policy.optimizer_config.offload_after_step=true",
    "trainer.policy.fsdp_config.cpu_offload=false",
    "trainer.policy.fsdp_config.reshard_after_forward=true",
    "trainer.policy.fsdp_config.fsdp_size=-1",
    "trainer.policy.sequence_parallel_size=1",
    "trainer.policy.use_torch_compile=false",
    "trainer.policy.record_memory=false",
    "trainer.ref.fsdp_config.cpu_offload=true",
    "trainer.ref.fsdp_config.reshard_after_forward=true",
    "trainer.ref.fsdp_config.fsdp_size=-1",
    "trainer.ref.sequence_parallel_size=1",
    "trainer.algorithm.advantage_estimator=grpo",
    "trainer.algorithm.use_kl_estimator_k3=true",
    "trainer.algorithm.use_abs_kl=false",
    "trainer.algorithm.use_kl_in_reward=false",
    "trainer.algorithm.use_kl_loss=true",
    "trainer.algorithm.kl_loss_coef=0.001",
    "trainer.algorithm.advantage_batch_normalize=false",
    "trainer.algorithm.value_head_prefix=value_head",
    "trainer.algorithm.ppo_loss_type=regular",
    "trainer.algorithm.lambd=1.0",
    "trainer.algorithm.gamma=1.0",
    "trainer.algorithm.eps_clip_low=0.2",
    "trainer.algorithm.eps_clip_high=0.2",
    "trainer.algorithm.clip_ratio_c=3.0",
    "trainer.algorithm.value_clip=0.2",
    "trainer.algorithm.normalize_reward=true",
    "generator.model_dtype=bfloat16",
    "generator.run_engines_locally=true",
    "generator.num_inference_engines=1",
    "generator.backend=vllm",
    "generator.weight_sync_backend=nccl",
    "generator.inference_engine_tensor_parallel_size=4",
    "generator.n_samples_per_prompt=5",
    "generator.async_engine=true",
    "generator.batched=true",
    "generator.max_input_length=${trainer.max_prompt_length}",
    "generator.enable_prefix_caching=true",
    "generator.enable_chunked_prefill=true",
    "generator.max_num_batched_tokens=8192",
    "generator.enforce_eager=false",
    "generator.gpu_memory_utilization=0.8",
    "generator.max_num_seqs=1024",
    "generator.remote_inference_engine_urls=['127.0.0.1:8001']",
    "generator.max_turns=1",
    "generator.override_existing_update_group=auto",
    "generator.sampling_params.max_generate_length=1024",
    "generator.sampling_params.temperature=1.0",
    "generator.sampling_params.top_p=1.0",
    "generator.sampling_params.min_p=0.0",
    "generator.sampling_params.top_k=-1",
    "generator.use_conversation_multi_turn=false",
    "generator.eval_sampling_params.max_generate_length=${generator.sampling_params.max_generate_length}",
    "generator.eval_sampling_params.temperature=1.0",
    "generator.eval_sampling_params.top_p=1.0",
    "generator.eval_sampling_params.min_p=0.0",
    "generator.eval_sampling_params.top_k=-1",
    "generator.eval_n_samples_per_prompt=1",
    "generator.zero_reward_on_non_stop=false",
    "environment.env_class=gsm8k",
]


def as_dict(overrides: list[str]) -> dict:
    parser = OverridesParser.create()
    return {o.key_or_group: o.value() for o in parser.parse_overrides(overrides)}


def skyrl(*overrides: str) -> dict:
    return as_dict(translate_skyrl(list(overrides)))


def skyrl_error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        translate_skyrl(list(overrides))
    return str(err.value)


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


# ---------------------------------------------------------------- the command line


def test_verl_is_the_default_and_passes_everything_through():
    argv = ["data.train_batch_size=4", "--cfg", "job", "hydra.run.dir=."]
    assert translate_argv(argv) == argv
    assert translate_argv(["--dialect", "verl", *argv]) == argv
    assert translate_argv(["--dialect=verl", *argv]) == argv


def test_skyrl_flags_and_hydra_overrides_pass_through():
    out = translate_argv(["--dialect", "skyrl", "trainer.seed=3", "--cfg", "job", "hydra.job.chdir=false", "-m"])
    assert out[:3] == ["--cfg", "job", "-m"]
    assert "trainer.seed=3" in out and "data.seed=3" in out
    assert out[-1] == "hydra.job.chdir=false"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dialect", "openrlhf"], "not a dialect hybrid speaks"),
        (["--dialect", "skyrl", "--roll-config", "x.yaml"], "cannot be combined with --dialect skyrl"),
        (["--dialect", "roll"], "needs --roll-config"),
        (["--dialect", "skyrl", "--dialect", "verl"], "more than once"),
        (["--roll-config", "/nonexistent/x.yaml"], "no such file"),
        (["--dialect", "skyrl", "+trainer.seed=1"], "set with key=value"),
    ],
)
def test_command_line_mistakes(argv, message):
    with pytest.raises(ConfigError, match=message):
        translate_argv(argv)


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, -1, 1e-06, 0.2, float("inf"), "vllm", "3", "null", "a b,c", "it's", "C:\\dir\\", "${x}",
     "/root/data/train.parquet", [1, 2], ["a", "b c"], {"x": 1, "y.z": [1, "q"]}],
)
def test_hydra_value_round_trips(value):
    parsed = OverridesParser.create().parse_override(f"k={hydra_value(value)}").value()
    if isinstance(value, str) and "${" in value:
        assert parsed == value.replace("${", "\\${")  # kept literal: OmegaConf unescapes it
    else:
        assert parsed == value


# ---------------------------------------------------------------- SkyRL mappings


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["trainer.policy.model.path=/models/q"], {f"{A}.model.path": "/models/q"}),
        (["trainer.algorithm.advantage_estimator=reinforce++"], {"algorithm.adv_estimator": "reinforce_plus_plus"}),
        (["trainer.algorithm.advantage_estimator=rloo"], {"algorithm.adv_estimator": "rloo"}),
        (["trainer.train_batch_size=16"], {"data.train_batch_size": 16}),
        # Both count prompts per optimizer step; the micro batches count samples per device.
        (["trainer.policy_mini_batch_size=4"], {f"{A}.actor.ppo_mini_batch_size": 4}),
        (["trainer.micro_train_batch_size_per_gpu=2"], {f"{A}.actor.ppo_micro_batch_size_per_gpu": 2}),
        (["trainer.micro_forward_batch_size_per_gpu=3"], {
            f"{A}.rollout.log_prob_micro_batch_size_per_gpu": 3,
            f"{A}.ref.log_prob_micro_batch_size_per_gpu": 3,
            "critic.forward_micro_batch_size_per_gpu": 3,
        }),
        (["trainer.epochs=2"], {"trainer.total_epochs": 2, "trainer.total_training_steps": None}),
        (["trainer.update_epochs_per_batch=2"], {f"{A}.actor.ppo_epochs": 2}),
        (["trainer.eval_interval=-1"], {"trainer.test_freq": -1}),
        (["trainer.ckpt_interval=10"], {"trainer.save_freq": 10}),
        (["trainer.ckpt_path=/ck"], {"trainer.default_local_dir": "/ck"}),
        (["trainer.seed=7"], {"trainer.seed": 7, "data.seed": 7}),
        (["trainer.logger=wandb"], {"trainer.logger": ["wandb", "file"]}),
        (["trainer.logger=['console','tensorboard']"], {"trainer.logger": ["console", "tensorboard", "file"]}),
        (["trainer.project_name=p", "trainer.run_name=r"], {"trainer.project_name": "p", "trainer.experiment_name": "r"}),
        (["trainer.policy.optimizer_config.lr=1e-6"], {f"{A}.actor.optim.lr": 1e-6}),
        (["trainer.policy.optimizer_config.weight_decay=0.1"], {f"{A}.actor.optim.weight_decay": 0.1}),
        (["trainer.policy.optimizer_config.max_grad_norm=0.5"], {f"{A}.actor.grad_clip": 0.5}),
        (["trainer.algorithm.use_kl_loss=true", "trainer.algorithm.kl_loss_coef=0.01"],
         {f"{A}.actor.use_kl_loss": True, f"{A}.actor.kl_loss_coef": 0.01, "algorithm.kl_ctrl.kl_coef": 0.01}),
        (["trainer.algorithm.use_kl_in_reward=true"], {"algorithm.use_kl_in_reward": True}),
        (["trainer.algorithm.kl_estimator_type=k3"], {f"{A}.actor.kl_loss_type": "low_var_kl", "algorithm.kl_penalty": "low_var_kl"}),
        (["trainer.algorithm.kl_estimator_type=k2"], {f"{A}.actor.kl_loss_type": "mse"}),
        (["trainer.algorithm.use_abs_kl=true"], {f"{A}.actor.kl_loss_type": "abs"}),
        (["trainer.algorithm.loss_reduction=sequence_mean"], {f"{A}.actor.loss_agg_mode": "seq-mean-token-mean"}),
        (["trainer.algorithm.loss_reduction=seq_mean_token_sum_norm"], {f"{A}.actor.loss_agg_mode": "seq-mean-token-sum-norm"}),
        (["trainer.algorithm.eps_clip_low=0.1", "trainer.algorithm.eps_clip_high=0.3"],
         {f"{A}.actor.clip_ratio_low": 0.1, f"{A}.actor.clip_ratio_high": 0.3}),
        # SkyRL's regular PPO clip: hybrid's dual-clip loss with a bound that never binds.
        (["trainer.algorithm.policy_loss_type=regular", "trainer.algorithm.clip_ratio_c=3.0"],
         {f"{A}.actor.policy_loss.loss_mode": "vanilla", f"{A}.actor.clip_ratio_c": NO_DUAL_CLIP}),
        (["trainer.algorithm.policy_loss_type=dual_clip", "trainer.algorithm.clip_ratio_c=5.0"],
         {f"{A}.actor.policy_loss.loss_mode": "vanilla", f"{A}.actor.clip_ratio_c": 5.0}),
        (["trainer.algorithm.ppo_loss_type=dual_clip"], {f"{A}.actor.clip_ratio_c": 3.0}),
        # cispo reads its own bounds, not eps_clip_*.
        (["trainer.algorithm.policy_loss_type=cispo", "trainer.algorithm.eps_clip_high=0.3"],
         {f"{A}.actor.policy_loss.loss_mode": "cispo", f"{A}.actor.clip_ratio_low": 0.0, f"{A}.actor.clip_ratio_high": 5.0}),
        (["trainer.algorithm.use_entropy_loss=true"], {f"{A}.actor.entropy_coeff": 0.01}),
        (["trainer.algorithm.entropy_loss_coef=0.2", "trainer.algorithm.use_entropy_loss=true"], {f"{A}.actor.entropy_coeff": 0.2}),
        (["trainer.algorithm.use_tis=true", "trainer.algorithm.tis_imp_ratio_cap=2.0"], {f"{A}.actor.tis_imp_ratio_cap": 2.0}),
        (["trainer.algorithm.off_policy_correction.tis_ratio_type=token"], {f"{A}.actor.tis_imp_ratio_cap": 2.0}),
        (["trainer.algorithm.dynamic_sampling.type=filter", "trainer.algorithm.dynamic_sampling.max_sample_batches=-1"],
         {"algorithm.filter_groups.enable": True, "algorithm.filter_groups.max_num_gen_batches": 0}),
        (["trainer.algorithm.kl_cov.kl_cov_frac=0.2"], {f"{A}.actor.policy_loss.kl_cov_ratio": 0.2}),
        (["trainer.algorithm.lambd=0.9", "trainer.algorithm.gamma=0.99"], {"algorithm.lam": 0.9, "algorithm.gamma": 0.99}),
        (["generator.n_samples_per_prompt=5"], {f"{A}.rollout.n": 5}),
        (["generator.sampling_params.temperature=0.7", "generator.sampling_params.top_p=0.9",
          "generator.sampling_params.top_k=20", "generator.sampling_params.min_p=0.05",
          "generator.sampling_params.max_generate_length=32"],
         {f"{A}.rollout.temperature": 0.7, f"{A}.rollout.top_p": 0.9, f"{A}.rollout.top_k": 20,
          f"{A}.rollout.min_p": 0.05, "data.max_response_length": 32}),
        (["generator.sampling_params.additional_kwargs.presence_penalty=0.5"], {f"{A}.rollout.presence_penalty": 0.5}),
        (["generator.eval_sampling_params.temperature=0", "generator.eval_sampling_params.top_p=0.5",
          "generator.eval_n_samples_per_prompt=2"],
         {f"{A}.rollout.val_kwargs.temperature": 0, f"{A}.rollout.val_kwargs.do_sample": False,
          f"{A}.rollout.val_kwargs.top_p": 0.5, f"{A}.rollout.val_kwargs.n": 2}),
        (["generator.max_input_length=100"], {"data.max_prompt_length": 100}),
        (["generator.max_turns=1", "environment.env_class=gsm8k", "trainer.placement.colocate_all=true"], {}),
        (["generator.backend=vllm"], {f"{A}.rollout.name": "vllm"}),
        (["generator.inference_engine.backend=vllm"], {f"{A}.rollout.name": "vllm"}),
        (["generator.inference_engine_tensor_parallel_size=2", "trainer.placement.policy_num_gpus_per_node=4",
          "generator.num_inference_engines=2"],
         {f"{A}.rollout.tensor_model_parallel_size": 2, "trainer.n_gpus_per_node": 4}),
        (["generator.weight_transfer_threshold_cuda_ipc_GB=0.25"], {f"{A}.rollout.update_weights_bucket_megabytes": 256}),
        (["generator.engine_init_kwargs.swap_space=2"], {f"{A}.rollout.engine_kwargs.vllm.swap_space": 2}),
        (["trainer.policy.model_config_kwargs.attention_dropout=0.1"], {f"{A}.model.override_config.attention_dropout": 0.1}),
        (["data.train_data=['/d/a.parquet','/d/b.parquet']", "data.val_data=/d/v.parquet"],
         {"data.train_files": ["/d/a.parquet", "/d/b.parquet"], "data.val_files": ["/d/v.parquet"]}),
        (["trainer.placement.policy_num_nodes=2", "trainer.placement.policy_num_gpus_per_node=8",
          "trainer.placement.ref_num_gpus_per_node=8"], {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 8}),
        (["trainer.resume_mode=none"], {"trainer.resume_mode": "disable"}),
        (["trainer.resume_mode=latest"], {"trainer.resume_mode": "auto"}),
        (["trainer.resume_mode=from_path", "trainer.resume_path=/ck/global_step_5"],
         {"trainer.resume_mode": "resume_path", "trainer.resume_from_path": "/ck/global_step_5"}),
        (["trainer.max_ckpts_to_keep=-1"], {"trainer.max_actor_ckpt_to_keep": None}),
        (["trainer.max_ckpts_to_keep=3"], {"trainer.max_actor_ckpt_to_keep": 3, "trainer.max_critic_ckpt_to_keep": 3}),
        (["trainer.ckpt_interval=5", "trainer.hf_save_interval=5"],
         {f"{A}.actor.checkpoint.save_contents": ["model", "optimizer", "extra", "hf_model"]}),
        (["trainer.policy.model.path=/m", "trainer.ref.model.path=/m"], {f"{A}.model.path": "/m"}),
        (["trainer.strategy=fsdp2"], {f"{A}.actor.strategy": "fsdp2", f"{A}.ref.strategy": "fsdp2", "critic.strategy": "fsdp2"}),
        # Interpolation among the SkyRL keys of one line, and oc.env.
        (["trainer.max_prompt_length=128", "generator.max_input_length=${trainer.max_prompt_length}"], {"data.max_prompt_length": 128}),
    ],
)
def test_skyrl_mapping(overrides, expected):
    out = skyrl(*overrides)
    for key, value in expected.items():
        assert key in out, (key, out)
        assert out[key] == value, (key, out[key], value)


def test_skyrl_always_turns_off_hybrid_only_extras():
    out = skyrl("trainer.seed=1")
    assert out["trainer.merge_on_finish"] is False and out["trainer.plot_on_finish"] is False


def test_skyrl_warmup_is_converted_from_optimizer_steps_to_training_steps():
    # 16 prompts / 4 per mini batch x 2 epochs = 8 optimizer steps per training step.
    base = ["trainer.train_batch_size=16", "trainer.policy_mini_batch_size=4", "trainer.update_epochs_per_batch=2"]
    assert skyrl(*base, "trainer.policy.optimizer_config.num_warmup_steps=24")[f"{A}.actor.optim.lr_warmup_steps"] == 3
    message = skyrl_error(*base, "trainer.policy.optimizer_config.num_warmup_steps=10")
    assert "num_warmup_steps=10" in message and "use a multiple of 8" in message


# SkyRL keys hybrid has no equivalent for, each with a value a user would give and a piece
# of the reason the refusal must give.
SKYRL_REFUSED = [
    ("trainer.placement.colocate_all=false", "hybrid always colocates training and generation on the same devices"),
    ("trainer.placement.colocate_policy_ref=false", "fused actor worker"),
    ("trainer.placement.ref_num_gpus_per_node=2", "same devices"),
    ("trainer.strategy=megatron", "Megatron"),
    ("trainer.policy.megatron_config.tensor_model_parallel_size=2", "Megatron"),
    ("deepspeed_config.train.zero_optimization.stage=3", "DeepSpeed"),
    ("trainer.policy.sequence_parallel_size=2", "not yet; see the issue on Ulysses"),
    ("trainer.ref.sequence_parallel_size=2", "Ulysses"),
    ("trainer.policy.use_torch_compile=true", "torch.compile"),
    ("trainer.update_ref_every_epoch=true", "reference stays the initial policy"),
    ("trainer.fully_async.max_staleness_steps=4", "synchronous and on-policy"),
    ("trainer.algorithm.dynamic_sampling.type=replace", "replace has no equivalent"),
    ("trainer.algorithm.zero_variance_filter=true", "zero-variance"),
    ("trainer.algorithm.advantage_batch_normalize=true", "normalise advantages over the batch"),
    ("trainer.algorithm.off_policy_correction.tis_ratio_type=sequence", "token-level truncated importance sampling"),
    ("trainer.algorithm.off_policy_correction.sequence_mask_metric=geometric", "sequence masking"),
    ("trainer.algorithm.max_seq_len=2048", "divisor"),
    ("trainer.algorithm.policy_loss_type=my_loss", "PolicyLossRegistry"),
    ("trainer.algorithm.temperature=0.5", "sampling temperature"),
    ("generator.step_wise_trajectories=true", "step-wise training"),
    ("generator.backend=sglang", "in-process vLLM"),
    ("generator.run_engines_locally=false", "remote engines"),
    ("generator.inference_engine.enable_http_endpoint=true", "HTTP endpoint"),
    ("generator.inference_engine_pipeline_parallel_size=2", "tensor parallelism only"),
    ("generator.zero_reward_on_non_stop=true", "truncated responses"),
    ("generator.apply_overlong_filtering=true", "overlong filter"),
    ("generator.chat_template.name_or_path=/t.jinja", "chat template"),
    ("generator.eval_sampling_params.min_p=0.1", "validation min_p"),
    ("environment.env_class=sokoban", "no environment of that name"),
    ("trainer.policy.model.lora.dropout=0.1", "dropout"),
    ("trainer.policy.record_memory=true", "memory-snapshot"),
    ("trainer.dump_data_batch=true", "batch dump"),
    ("trainer.ref.model.path=/other", "initial policy"),
    ("trainer.max_ckpts_to_keep=0", "keeps nothing"),
]


def test_skyrl_refusals_are_all_listed_at_once_by_name_with_the_reason():
    message = skyrl_error(*(o for o, _ in SKYRL_REFUSED))
    lines = message.splitlines()
    assert f"({len(SKYRL_REFUSED)} problems;" in lines[0]
    for override, reason in SKYRL_REFUSED:
        line = next((ln for ln in lines if ln.startswith(f"  - {override.split('=')[0]}=")), None)
        assert line is not None, override
        assert reason in line, (line, reason)
    assert "  - trainer.placement.colocate_all=false: hybrid always colocates training and generation on the same devices" in lines


@pytest.mark.parametrize(
    "override, reason",
    [
        ("trainer.strategy=deepspeed", "DeepSpeed"),
        ("environment.env_class=llm_as_a_judge", "entry point"),
        ("generator.max_turns=0", "a whole number >= 1"),
    ],
)
def test_skyrl_refused_values(override, reason):
    assert reason in skyrl_error(override)


def test_skyrl_documents_at_least_twenty_refused_keys():
    refused = [r for r in skyrl_dialect.RULES if r.kind == "refuse"]
    assert len(refused) >= 20
    assert all(r.note for r in refused)
    keys = {r.key for r in refused}
    for key in ("trainer.placement.colocate_all", "trainer.policy.sequence_parallel_size",
                "generator.step_wise_trajectories", "trainer.policy.megatron_config.*", "trainer.fully_async.*"):
        assert key in keys


def test_skyrl_accepts_the_values_hybrid_already_has():
    skyrl("trainer.placement.colocate_all=true", "trainer.policy.sequence_parallel_size=1", "generator.batched=true",
          "generator.max_turns=1", "generator.async_engine=true", "trainer.algorithm.normalize_reward=true")


def test_skyrl_typo_names_the_nearest_skyrl_key():
    message = skyrl_error("trainer.policy_mini_batch_sise=4", "generator.sampling_params.temprature=1.0")
    assert "trainer.policy_mini_batch_sise=4: not a SkyRL key hybrid knows; did you mean trainer.policy_mini_batch_size?" in message
    assert "did you mean generator.sampling_params.temperature?" in message


def test_skyrl_two_keys_for_one_verl_key_must_agree():
    message = skyrl_error("trainer.max_prompt_length=512", "generator.max_input_length=1024")
    assert "both set data.max_prompt_length, to different values (512 and 1024)" in message
    skyrl("trainer.max_prompt_length=512", "generator.max_input_length=512")


def test_skyrl_unresolvable_interpolation_is_reported():
    with pytest.raises(ConfigError, match="cannot resolve"):
        translate_skyrl(["generator.max_input_length=${trainer.max_prompt_length}"])


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


def test_skyrl_example_script_loads_and_validates(tmp_path):
    args_file = tmp_path / "argv"
    shim = tmp_path / "fake_python"
    shim.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > '{args_file}'\n")
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    done = subprocess.run(["bash", str(REPO / "examples" / "skyrl_grpo_arithmetic.sh"), "trainer.seed=5"],
                          env={**os.environ, "PYTHON": str(shim)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    argv = args_file.read_text().split("\0")[:-1]
    assert argv[:4] == ["-m", "hybrid.main_ppo", "--dialect", "skyrl"]
    cfg = load_config(translate_argv(argv[2:]))
    validate_config(cfg)
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.trainer.seed == 5
    assert cfg.actor_rollout_ref.actor.clip_ratio_high == 0.28


# ---------------------------------------------------------------- ROLL mappings

ROLL_BASE = """
rollout_batch_size: 8
num_return_sequences_in_group: 4
prompt_length: 64
response_length: 48
adv_estimator: grpo
"""


@pytest.mark.parametrize(
    "yaml_text, expected",
    [
        ("pretrain: /models/q\n", {f"{A}.model.path": "/models/q"}),
        ("actor_train:\n  model_args:\n    model_name_or_path: /m\n    dtype: bf16\n",
         {f"{A}.model.path": "/m", f"{A}.actor.fsdp_config.mixed_precision": "bf16"}),
        ("rollout_batch_size: 16\nnum_return_sequences_in_group: 8\n", {"data.train_batch_size": 16, f"{A}.rollout.n": 8}),
        ("prompt_length: 100\nresponse_length: 30\n", {"data.max_prompt_length": 100, "data.max_response_length": 30}),
        ("prompt_length: 100\nsequence_length: 300\n", {"data.max_response_length": 200}),
        ("max_steps: 7\nsave_steps: 5\neval_steps: 2\n",
         {"trainer.total_training_steps": 7, "trainer.save_freq": 5, "trainer.test_freq": 2, "trainer.val_before_train": True,
          f"{A}.actor.checkpoint.save_contents": ["model", "optimizer", "extra", "hf_model"]}),
        ("eval_steps: 0\n", {"trainer.test_freq": -1, "trainer.val_before_train": False}),
        ("logging_steps: 1\nexp_name: e\noutput_dir: /out\nseed: 3\n",
         {"trainer.experiment_name": "e", "trainer.default_local_dir": "/out", "trainer.seed": 3, "data.seed": 3}),
        ("track_with: wandb\ntracker_kwargs:\n  project: p\n", {"trainer.logger": ["wandb", "file"], "trainer.project_name": "p"}),
        ("resume_from_checkpoint: /ck/global_step_3\n",
         {"trainer.resume_mode": "resume_path", "trainer.resume_from_path": "/ck/global_step_3"}),
        ("resume_from_checkpoint: false\n", {"trainer.resume_mode": "disable"}),
        ("max_ckpt_to_keep: 0\n", {"trainer.max_actor_ckpt_to_keep": None}),
        ("adv_estimator: grpo\n", {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": True}),
        ("adv_estimator: gae\nwhiten_advantages: true\nreward_pretrain: /critic\nvalue_clip: 0.5\n",
         {"algorithm.adv_estimator": "gae", "critic.model.path": "/critic", "critic.cliprange_value": 0.5}),
        ("adv_estimator: reinforce\nnorm_mean_type: group\nnorm_std_type: group\n", {"algorithm.adv_estimator": "grpo"}),
        ("adv_estimator: reinforce\nnorm_mean_type: group\n",
         {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": False}),
        ("adv_estimator: reinforce\nnorm_mean_type: batch\nnorm_std_type: batch\nwhiten_advantages: true\n",
         {"algorithm.adv_estimator": "reinforce_plus_plus"}),
        ("init_kl_coef: 0.05\nadd_token_level_kl: true\ntarget_kl: 0.1\nkl_horizon: 500\nkl_penalty: k3\n",
         {"algorithm.kl_ctrl.kl_coef": 0.05, "algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "adaptive",
          "algorithm.kl_ctrl.target_kl": 0.1, "algorithm.kl_ctrl.horizon": 500, "algorithm.kl_penalty": "low_var_kl"}),
        ("use_kl_loss: true\nkl_loss_coef: 0.01\nentropy_loss_coef: 0.001\nppo_epochs: 2\n",
         {f"{A}.actor.use_kl_loss": True, f"{A}.actor.kl_loss_coef": 0.01, f"{A}.actor.entropy_coeff": 0.001,
          f"{A}.actor.ppo_epochs": 2}),
        ("pg_clip: 0.3\n", {f"{A}.actor.clip_ratio_low": 0.3, f"{A}.actor.clip_ratio_high": 0.3}),
        ("use_pg_clip_range: true\npg_clip_low: 0.2\npg_clip_high: 0.28\n",
         {f"{A}.actor.clip_ratio_low": 0.2, f"{A}.actor.clip_ratio_high": 0.28}),
        ("dual_clip_loss: false\n", {f"{A}.actor.clip_ratio_c": NO_DUAL_CLIP}),
        ("dual_clip_loss: true\n", {f"{A}.actor.clip_ratio_c": 3.0}),
        ("loss_agg_mode: seq-mean-token-mean\n", {f"{A}.actor.loss_agg_mode": "seq-mean-token-mean"}),
        ("use_policy_loss_type: PG\n", {f"{A}.actor.policy_loss.loss_mode": "gpg"}),
        ("actor_train:\n  training_args:\n    learning_rate: 1.0e-6\n    weight_decay: 0.1\n    max_grad_norm: 0.5\n"
         "    adam_beta2: 0.95\n    lr_scheduler_type: cosine\n",
         {f"{A}.actor.optim.lr": 1e-6, f"{A}.actor.optim.weight_decay": 0.1, f"{A}.actor.grad_clip": 0.5,
          f"{A}.actor.optim.betas": [0.9, 0.95], f"{A}.actor.optim.warmup_style": "cosine"}),
        # 2 x 4 x 2 devices = 16 samples per optimizer step = 4 prompts of 4 responses.
        ("actor_train:\n  training_args:\n    per_device_train_batch_size: 2\n    gradient_accumulation_steps: 4\n"
         "  device_mapping: list(range(0,2))\nactor_infer:\n  device_mapping: list(range(0,2))\n",
         {f"{A}.actor.ppo_mini_batch_size": 4, f"{A}.actor.ppo_micro_batch_size_per_gpu": 2,
          "trainer.nnodes": 1, "trainer.n_gpus_per_node": 2}),
        # 8 prompts x 4 = 32 samples, 16 per optimizer step: 2 optimizer steps per training step.
        ("actor_train:\n  training_args:\n    per_device_train_batch_size: 4\n    gradient_accumulation_steps: 4\n"
         "    warmup_steps: 6\n", {f"{A}.actor.optim.lr_warmup_steps": 3}),
        ("num_gpus_per_node: 8\nactor_train:\n  device_mapping: list(range(0,16))\n",
         {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 8}),
        ("actor_train:\n  infer_batch_size: 4\n  strategy_args:\n    strategy_name: fsdp2_train\n"
         "reference:\n  infer_batch_size: 2\n  strategy_args:\n    strategy_name: hf_infer\n",
         {f"{A}.rollout.log_prob_micro_batch_size_per_gpu": 4, f"{A}.ref.log_prob_micro_batch_size_per_gpu": 2,
          f"{A}.actor.strategy": "fsdp2"}),
        ("actor_infer:\n  generating_args:\n    max_new_tokens: ${response_length}\n    temperature: 0.9\n    top_p: 0.95\n"
         "    top_k: 50\n    num_return_sequences: ${num_return_sequences_in_group}\n"
         "  strategy_args:\n    strategy_name: vllm\n    strategy_config:\n      gpu_memory_utilization: 0.6\n"
         "      block_size: 16\n      max_model_len: 512\n",
         {"data.max_response_length": 48, f"{A}.rollout.temperature": 0.9, f"{A}.rollout.top_p": 0.95,
          f"{A}.rollout.top_k": 50, f"{A}.rollout.name": "vllm", f"{A}.rollout.gpu_memory_utilization": 0.6,
          f"{A}.rollout.engine_kwargs.vllm.block_size": 16, f"{A}.rollout.max_model_len": 512}),
        ("actor_infer:\n  strategy_args:\n    strategy_name: hf_infer\n", {f"{A}.rollout.name": "hf"}),
        ("actor_train:\n  data_args:\n    file_name: [/d/a.jsonl]\n    template: native\n    messages: messages\n"
         "validation:\n  data_args:\n    file_name: /d/v.jsonl\n  generating_args:\n    temperature: 0\n    top_p: 1.0\n",
         {"data.train_files": ["/d/a.jsonl"], "data.prompt_key": "messages", "data.val_files": ["/d/v.jsonl"],
          f"{A}.rollout.val_kwargs.temperature": 0}),
        ("rewards:\n  math_rule:\n    worker_cls: roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker\n"
         "    tag_included: [gsm8k]\n    world_size: 8\n", {}),
        ("train_infer_correction:\n  is_weight:\n    enabled: true\n    upper_bound: 2.0\n", {f"{A}.actor.tis_imp_ratio_cap": 2.0}),
        ("model_update_buffer_size_mb: 256\n", {f"{A}.rollout.update_weights_bucket_megabytes": 256}),
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
    [("list(range(0,4))", [0, 1, 2, 3]), ("list(range(8))", list(range(8))), ("list(range(0, 8, 2))", [0, 2, 4, 6]),
     ("[0, 1]", [0, 1]), ([2, 3], [2, 3])],
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
async_generation_ratio: 1
logging_steps: 5
reward_clip: 10
advantage_clip: 2.0
whiten_rewards: true
use_topr_loss: true
max_len_mask: true
difficulty_mask: true
importance_sampling: seq
is_use_additional_prompts: true
system_envs:
  USE_MODELSCOPE: '1'
actor_train:
  strategy_args:
    strategy_name: megatron_train
    strategy_config:
      tensor_model_parallel_size: 2
  device_mapping: list(range(0,8))
  model_args:
    ulysses_size: 2
actor_infer:
  strategy_args:
    strategy_name: sglang
  device_mapping: list(range(8,12))
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
    ("async_generation_ratio=1", "synchronous and on-policy"),
    ("logging_steps=5", "logs every step"),
    ("reward_clip=10", "reward clipping"),
    ("advantage_clip=2.0", "advantage clipping"),
    ("whiten_rewards=true", "reward whitening"),
    ("use_topr_loss=true", "TOPR"),
    ("max_len_mask=true", "truncated responses"),
    ("difficulty_mask=true", "difficulty mask"),
    ("importance_sampling=seq", "per token"),
    ("is_use_additional_prompts=true", "dynamic sampling"),
    ("system_envs.USE_MODELSCOPE=1", "environment variables"),
    ("actor_train.strategy_args.strategy_name=megatron_train", "Megatron"),
    ("actor_train.model_args.ulysses_size=2", "Ulysses"),
    ("actor_infer.strategy_args.strategy_name=sglang", "in-process vLLM"),
    ("actor_infer.device_mapping=list(range(8,12))", "colocated on the same devices"),
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
    for key in ("async_generation_ratio", "reward_clip", "advantage_clip", "logging_steps", "reward_model.*"):
        assert key in refused


@pytest.mark.parametrize(
    "yaml_text, reason",
    [
        ("adv_estimator: gae\n", "set whiten_advantages: true"),
        ("adv_estimator: grpo\nwhiten_advantages: true\n", "does not whiten the group-normalised advantages again"),
        ("adv_estimator: reinforce\n", "not this combination"),
        ("actor_train:\n  training_args:\n    per_device_train_batch_size: 3\n    gradient_accumulation_steps: 1\n",
         "not a whole number of groups of num_return_sequences_in_group=4"),
        ("actor_train:\n  data_args:\n    template: qwen2_5\n", "set template: native"),
        ("actor_train:\n  device_mapping: list(range(0,4))\nreference:\n  device_mapping: list(range(4,8))\n", "same device_mapping"),
        ("pretrain: /a\nreference:\n  model_args:\n    model_name_or_path: /b\n", "initial policy"),
        ("actor_train:\n  model_args:\n    dtype: fp16\n", "supported: bf16, fp32"),
        ("track_with: swanlab\n", "supported: tensorboard, wandb, stdout"),
    ],
)
def test_roll_transform_refusals(tmp_path, yaml_text, reason):
    assert reason in roll_error(tmp_path, yaml_text)


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


# ---------------------------------------------------------------- the entry point and the doc


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYBRID_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    (tmp_path / "run").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "hybrid.main_ppo", *args], cwd=tmp_path / "run", env=env,
                          capture_output=True, text=True, timeout=120)


def test_cfg_job_prints_the_skyrl_line_in_verl_keys(tmp_path):
    done = run_cli(tmp_path, "--dialect", "skyrl", "trainer.train_batch_size=16", "generator.n_samples_per_prompt=2",
                   "trainer.algorithm.advantage_estimator=rloo", "--cfg", "job", "trainer.policy_mini_batch_size=4")
    assert done.returncode == 0, done.stderr
    assert "train_batch_size: 16" in done.stdout
    assert "ppo_mini_batch_size: 4" in done.stdout
    assert "adv_estimator: rloo" in done.stdout
    assert "    'n': 2" in done.stdout  # YAML quotes the key n
    assert "merge_on_finish: false" in done.stdout
    assert "n_samples_per_prompt" not in done.stdout
    assert os.listdir(tmp_path / "run") == []


def test_cfg_job_prints_the_roll_file_in_verl_keys(tmp_path):
    done = run_cli(tmp_path, "--roll-config", str(ROLL_EXAMPLE), "--cfg", "job", "max_steps=3")
    assert done.returncode == 0, done.stderr
    assert "total_training_steps: 3" in done.stdout
    assert "experiment_name: roll_grpo_arithmetic" in done.stdout
    assert "ppo_mini_batch_size: 8" in done.stdout


def test_refusal_exits_2_with_every_problem_and_no_traceback(tmp_path):
    done = run_cli(tmp_path, "--dialect", "skyrl", "trainer.placement.colocate_all=false",
                   "generator.step_wise_trajectories=true")
    assert done.returncode == 2
    assert "trainer.placement.colocate_all=false: hybrid always colocates" in done.stderr
    assert "generator.step_wise_trajectories=true: step-wise training" in done.stderr
    assert "Traceback" not in done.stderr


def test_committed_doc_is_generated_from_the_tables():
    from scripts.gen_config_dialects_doc import DOC, render

    assert DOC.read_text() == render(), "docs/config_dialects.md is stale: run python -m scripts.gen_config_dialects_doc"
