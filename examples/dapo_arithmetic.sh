#!/usr/bin/env bash
# DAPO on the arithmetic task with the default model and data:
# - dynamic sampling: groups whose responses are all right or all wrong teach nothing and
#   are dropped; more prompts are generated until the batch is full (at most
#   max_num_gen_batches generation batches per step);
# - clip-higher: a wider upper clip (clip_ratio_high) than lower (clip_ratio_low);
# - token-level loss aggregation (token-mean), so long responses count per token;
# - the soft overlong penalty (reward_manager=dapo): responses longer than
#   max_response_length - overlong_buffer.len lose up to penalty_factor;
# - no KL term at all.
#
#   bash examples/dapo_arithmetic.sh [key=value ...]
#
# Extra key=value overrides are appended and win over the ones below. Set PYTHON to the
# interpreter that has hybrid installed (e.g. PYTHON=.venv/bin/python).
set -euo pipefail

"${PYTHON:-python}" -m hybrid.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=false \
    algorithm.filter_groups.enable=true \
    algorithm.filter_groups.metric=acc \
    algorithm.filter_groups.max_num_gen_batches=10 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.actor.kl_loss_coef=0.0 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.clip_ratio_c=10.0 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.entropy_coeff=0 \
    reward_model.reward_manager=dapo \
    reward_model.reward_kwargs.overlong_buffer.enable=true \
    reward_model.reward_kwargs.overlong_buffer.len=16 \
    reward_model.reward_kwargs.overlong_buffer.penalty_factor=1.0 \
    reward_model.reward_kwargs.overlong_buffer.log=false \
    reward_model.reward_kwargs.max_resp_len='${data.max_response_length}' \
    trainer.critic_warmup=0 \
    trainer.logger='["console","file"]' \
    trainer.project_name=hybrid_examples \
    trainer.experiment_name=dapo_arithmetic \
    "$@"
