#!/usr/bin/env bash
# GRPO on the arithmetic task, written with SkyRL's keys (--dialect skyrl): the same run as
# grpo_arithmetic.sh, for someone whose scripts speak skyrl-train's config. hybrid translates
# every key into its verl keys before it starts; docs/config_dialects.md lists each SkyRL
# key it maps, ignores or refuses, and why.
#
#   bash examples/skyrl_grpo_arithmetic.sh [SkyRL key=value ...]
#   bash examples/skyrl_grpo_arithmetic.sh --cfg job     # print the translated config, run nothing
#
# Extra arguments are SkyRL keys too and win over the ones below. No model path and no data
# files: hybrid's default model (SmolLM2-135M-Instruct) and its generated arithmetic parquet
# files are used (add trainer.policy.model.path=... and data.train_data="['...parquet']" for
# your own). SkyRL has no step limit, only trainer.epochs (250 steps of 8 prompts per epoch of
# the default data); without it hybrid's default of 30 training steps applies. Set PYTHON to
# the interpreter that has hybrid installed (e.g. PYTHON=.venv/bin/python).
set -euo pipefail

"${PYTHON:-python}" -m hybrid.main_ppo --dialect skyrl \
    trainer.algorithm.advantage_estimator=grpo \
    trainer.algorithm.grpo_norm_by_std=true \
    trainer.algorithm.use_kl_in_reward=false \
    trainer.algorithm.use_kl_loss=true \
    trainer.algorithm.kl_loss_coef=0.001 \
    trainer.algorithm.kl_estimator_type=k3 \
    trainer.algorithm.policy_loss_type=dual_clip \
    trainer.algorithm.eps_clip_low=0.2 \
    trainer.algorithm.eps_clip_high=0.28 \
    trainer.algorithm.loss_reduction=token_mean \
    trainer.train_batch_size=8 \
    trainer.policy_mini_batch_size=8 \
    trainer.micro_train_batch_size_per_gpu=8 \
    trainer.micro_forward_batch_size_per_gpu=16 \
    trainer.update_epochs_per_batch=1 \
    trainer.max_prompt_length=64 \
    trainer.policy.optimizer_config.lr=2.0e-5 \
    trainer.placement.colocate_all=true \
    trainer.placement.policy_num_gpus_per_node=1 \
    generator.backend=vllm \
    generator.n_samples_per_prompt=4 \
    generator.max_turns=1 \
    generator.sampling_params.max_generate_length=48 \
    generator.sampling_params.temperature=1.0 \
    generator.eval_sampling_params.temperature=0 \
    trainer.eval_interval=5 \
    trainer.eval_before_train=true \
    trainer.logger=console \
    trainer.project_name=hybrid_examples \
    trainer.run_name=skyrl_grpo_arithmetic \
    "$@"
