#!/usr/bin/env bash
# GRPO on GSM8K with your own model, in the style of verl's examples/grpo_trainer scripts.
#
# 1. Prepare the data once (the raw GSM8K train/test splits, JSON-lines or parquet):
#      python examples/data_preprocess/gsm8k.py --input_dir ~/data/gsm8k_raw --local_dir ~/data/gsm8k
# 2. Train:
#      MODEL_PATH=/path/to/hf_model DATA_DIR=~/data/gsm8k bash examples/gsm8k_grpo.sh [key=value ...]
#
# MODEL_PATH (required): a Hugging Face model folder (or hub id where the hub is reachable).
# DATA_DIR (default $HOME/data/gsm8k): holds train.parquet and test.parquet from step 1.
# N_GPUS (default 1) and NNODES (default 1): devices per node and nodes; with more than
# one node, start a Ray cluster first (`ray start --head`, `ray start --address=...`).
# Extra key=value overrides are appended and win over the ones below. Set PYTHON to the
# interpreter that has hybrid installed (e.g. PYTHON=.venv/bin/python).
set -euo pipefail

if [[ -z "${MODEL_PATH:-}" ]]; then
    echo "gsm8k_grpo.sh: MODEL_PATH is not set; set it to your model folder, e.g." >&2
    echo "  MODEL_PATH=/path/to/Qwen2.5-0.5B-Instruct DATA_DIR=~/data/gsm8k bash examples/gsm8k_grpo.sh" >&2
    exit 2
fi
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
for split in train test; do
    if [[ ! -f "$DATA_DIR/$split.parquet" ]]; then
        echo "gsm8k_grpo.sh: $DATA_DIR/$split.parquet not found; write it with" >&2
        echo "  python examples/data_preprocess/gsm8k.py --input_dir <raw gsm8k> --local_dir $DATA_DIR" >&2
        echo "or set DATA_DIR to the folder that holds train.parquet and test.parquet" >&2
        exit 2
    fi
done
N_GPUS=${N_GPUS:-1}
NNODES=${NNODES:-1}

"${PYTHON:-python}" -m hybrid.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=true \
    data.truncation='error' \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.use_remove_padding=true \
    actor_rollout_ref.model.enable_gradient_checkpointing=true \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=false \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=false \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.fsdp_config.param_offload=true \
    algorithm.use_kl_in_reward=false \
    trainer.critic_warmup=0 \
    trainer.logger='["console","file"]' \
    trainer.project_name=hybrid_gsm8k \
    trainer.experiment_name=gsm8k_grpo \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_training_steps=null \
    trainer.total_epochs=15 \
    "$@"
