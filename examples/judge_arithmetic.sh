#!/usr/bin/env bash
# GRPO on the arithmetic task rewarded by an LLM judge instead of the exact scorer: the reward
# loop (reward_model.use_reward_loop) serves the judge (by default the default model itself,
# SmolLM2-135M-Instruct) with vLLM; the agent loops hand each trajectory to a reward-loop
# worker as soon as it finishes (reward_model.enable_resource_pool=true), and the worker asks
# the judge with reward_model.judge.prompt_template and reads "Score: 0/1" from its verdict.
# The exact scorer still runs beside it: reward_loop/judge_agrees_with_reward_fn is how often
# the two agree, and combine=rm_only trains on the judge alone.
#
#   bash examples/judge_arithmetic.sh [key=value ...]
#   JUDGE_MODEL_PATH=/models/judge bash examples/judge_arithmetic.sh    # another judge model
#   bash examples/judge_arithmetic.sh reward_model.judge.base_url=http://host:8000/v1 \
#        reward_model.judge.model=my-judge                              # a judge behind an OpenAI-compatible API
#
# Extra key=value overrides are appended and win over the ones below. Set PYTHON to the
# interpreter that has hybrid installed (e.g. PYTHON=.venv/bin/python).
set -euo pipefail

"${PYTHON:-python}" -m hybrid.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.n=4 \
    reward_model.enable=true \
    reward_model.use_reward_loop=true \
    reward_model.enable_resource_pool=true \
    reward_model.num_workers=2 \
    reward_model.model.path="${JUDGE_MODEL_PATH:-\${hybrid_default:model\}}" \
    reward_model.combine=rm_only \
    reward_model.rollout.prompt_length=512 \
    reward_model.rollout.response_length=16 \
    reward_model.judge.temperature=0 \
    reward_model.judge.timeout_s=120 \
    trainer.logger='["console","file"]' \
    trainer.project_name=hybrid_examples \
    trainer.experiment_name=judge_arithmetic \
    "$@"
