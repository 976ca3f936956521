#!/usr/bin/env bash
# REINFORCE++ on the arithmetic task with the default model and data: discounted returns
# whitened over the whole batch (no critic, no per-prompt baseline), with verl's recipe
# of a KL loss (k2, `mse`) to the reference policy. For the variant that subtracts the
# group mean first, use algorithm.adv_estimator=reinforce_plus_plus_baseline.
#
#   bash examples/reinforce_plus_plus_arithmetic.sh [key=value ...]
#
# Extra key=value overrides are appended and win over the ones below. Set PYTHON to the
# interpreter that has hybrid installed (e.g. PYTHON=.venv/bin/python).
set -euo pipefail

"${PYTHON:-python}" -m hybrid.main_ppo \
    algorithm.adv_estimator=reinforce_plus_plus \
    algorithm.gamma=1.0 \
    algorithm.use_kl_in_reward=false \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=mse \
    actor_rollout_ref.actor.entropy_coeff=0 \
    trainer.critic_warmup=0 \
    trainer.logger='["console","file"]' \
    trainer.project_name=hybrid_examples \
    trainer.experiment_name=reinforce_plus_plus_arithmetic \
    "$@"
