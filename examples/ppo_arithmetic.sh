#!/usr/bin/env bash
# PPO with a critic (GAE) on the arithmetic task with the default model and data. One
# response per prompt; the critic is a value head on a copy of the model and learns the
# per-token values GAE needs. Its batch sizes follow the actor's. It starts from the
# actor's model unless CRITIC_MODEL_PATH names another folder.
#
#   bash examples/ppo_arithmetic.sh [key=value ...]
#   CRITIC_MODEL_PATH=/path/to/model bash examples/ppo_arithmetic.sh
#
# Extra key=value overrides are appended and win over the ones below. Set PYTHON to the
# interpreter that has hybrid installed (e.g. PYTHON=.venv/bin/python).
set -euo pipefail

# Single quotes: Hydra, not the shell, resolves this interpolation to the actor's path.
CRITIC_MODEL_PATH=${CRITIC_MODEL_PATH:-'${actor_rollout_ref.model.path}'}

"${PYTHON:-python}" -m hybrid.main_ppo \
    algorithm.adv_estimator=gae \
    algorithm.gamma=1.0 \
    algorithm.lam=1.0 \
    algorithm.use_kl_in_reward=false \
    data.train_batch_size=32 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=1 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.actor.clip_ratio=0.2 \
    critic.enable=true \
    critic.model.path="$CRITIC_MODEL_PATH" \
    critic.model.enable_gradient_checkpointing=false \
    critic.optim.lr=1e-5 \
    critic.cliprange_value=0.5 \
    trainer.critic_warmup=0 \
    trainer.logger='["console","file"]' \
    trainer.project_name=hybrid_examples \
    trainer.experiment_name=ppo_arithmetic \
    "$@"
