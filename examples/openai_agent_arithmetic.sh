#!/usr/bin/env bash
# GRPO on an agent written against the OpenAI client (examples/openai_agent/arithmetic_agent.py):
# each episode is the agent's conversation with the policy through an OpenAI-compatible
# endpoint on the rollout engine (127.0.0.1, port 8000 + rank); hybrid trains on exactly the
# tokens the engine produced for it, the agent's own messages masked out, with the reward the
# agent returns. The agent loops run every episode at its own pace (mode=async).
#
#   bash examples/openai_agent_arithmetic.sh [key=value ...]
#
# Set PYTHON to the interpreter that has hybrid installed (e.g. PYTHON=.venv/bin/python).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

"${PYTHON:-python}" -m hybrid.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.multi_turn.enable=true \
    actor_rollout_ref.rollout.agent.enable_http_endpoint=true \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$here/openai_agent/agents.yaml" \
    actor_rollout_ref.rollout.agent.default_agent_loop=arithmetic_agent \
    data.max_response_length=96 \
    trainer.total_training_steps=20 \
    trainer.test_freq=5 \
    trainer.logger='["console","file"]' \
    trainer.project_name=hybrid_examples \
    trainer.experiment_name=openai_agent_arithmetic \
    "$@"
