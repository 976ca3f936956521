"""What the dialect tests share (tests/unit/test_dialects*.py, tests/e2e/test_dialects_e2e.py): the
repository root, the ROLL and SkyRL reference examples, and translating SkyRL overrides into a
dict of verl keys or the one ConfigError they raise. Not a test module: pytest imports test files
by basename, so no test file imports another."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from hybrid.config import ConfigError
from hybrid.dialects.skyrl import translate_skyrl

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
