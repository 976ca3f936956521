#!/usr/bin/env bash
# GRPO on the arithmetic task with the default model (SmolLM2-135M-Instruct, converted on
# first use) and the default generated data: a group of rollout.n responses per prompt,
# advantages normalized within the group, and a low-variance KL loss to the reference
# policy as in verl's GRPO recipes (the default job, `make run`, trains without it).
#
#   bash examples/grpo_arithmetic.sh [key=value ...]
#
# Extra key=value overrides are appended and win over the ones below. Sizes not named here
# (batch, lengths, learning rate) come from hybrid/config/ppo_trainer.yaml. Set PYTHON to
# the interpreter that has hybrid installed (e.g. PYTHON=.venv/bin/python).
set -euo pipefail

"${PYTHON:-python}" -m hybrid.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.norm_adv_by_std_in_grpo=true \
    algorithm.use_kl_in_reward=false \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    trainer.critic_warmup=0 \
    trainer.logger='["console","file"]' \
    trainer.project_name=hybrid_examples \
    trainer.experiment_name=grpo_arithmetic \
    "$@"
