#!/usr/bin/env bash
# RLOO on the arithmetic task with the default model and data: each response's baseline is
# the mean reward of the other responses to the same prompt (leave-one-out), and, as in
# verl's RLOO recipe, the KL to the reference policy is folded into the reward.
#
#   bash examples/rloo_arithmetic.sh [key=value ...]
#
# Extra key=value overrides are appended and win over the ones below. Set PYTHON to the
# interpreter that has hybrid installed (e.g. PYTHON=.venv/bin/python).
set -euo pipefail

"${PYTHON:-python}" -m hybrid.main_ppo \
    algorithm.adv_estimator=rloo \
    algorithm.use_kl_in_reward=true \
    algorithm.kl_penalty=kl \
    algorithm.kl_ctrl.type=fixed \
    algorithm.kl_ctrl.kl_coef=0.001 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.actor.entropy_coeff=0 \
    trainer.critic_warmup=0 \
    trainer.logger='["console","file"]' \
    trainer.project_name=hybrid_examples \
    trainer.experiment_name=rloo_arithmetic \
    "$@"
