#!/usr/bin/env bash
# Multi-turn GRPO with the default model and data: each question is an episode of up to
# three attempts. A wrong answer gets the user reply "Incorrect, try again." and another
# turn; a right one ends the episode with reward 1 (the `arithmetic_retry` environment,
# reward/environments/arithmetic_retry.py; no network, no files). The whole episode is
# one sample: the model's tokens of every turn are trained on, the environment's replies
# are masked out of the loss, and the episode's reward sits on its last model token
# (reward_placement=final, as verl does). Validation plays whole episodes greedily:
# val-core/arithmetic/reward/mean@1 is the held-out episode success rate,
# val-aux/multi_turn/first_turn_reward/mean the first-attempt accuracy.
#
#   bash examples/multi_turn_arithmetic_retry.sh [key=value ...]
#
# Token budgets: each turn may write up to max_tokens_per_turn tokens; the episode
# (model turns + replies) fits data.max_response_length. Extra key=value overrides are
# appended and win over the ones below. Set PYTHON to the interpreter that has hybrid
# installed (e.g. PYTHON=.venv/bin/python).
set -euo pipefail

"${PYTHON:-python}" -m hybrid.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.multi_turn.enable=true \
    actor_rollout_ref.rollout.multi_turn.env_class=arithmetic_retry \
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3 \
    actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=24 \
    actor_rollout_ref.rollout.multi_turn.reward_placement=final \
    data.max_response_length=96 \
    trainer.total_training_steps=20 \
    trainer.test_freq=5 \
    trainer.logger='["console","file"]' \
    trainer.project_name=hybrid_examples \
    trainer.experiment_name=multi_turn_arithmetic_retry \
    "$@"
