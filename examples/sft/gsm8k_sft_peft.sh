#!/usr/bin/env bash
# verl's examples/sft/gsm8k/run_qwen_05_peft.sh with only the entry point, paths and sizes
# changed: LoRA SFT on GSM8K's worked solutions (prompt and response walked out of the
# `extra_info` column with prompt_dict_keys / response_dict_keys).
#
#   python examples/data_preprocess/gsm8k.py --input_dir ~/data/gsm8k_raw --local_dir ~/data/gsm8k
#   bash examples/sft/gsm8k_sft_peft.sh 1 checkpoints/gsm8k-sft [key=value ...]
#
# nproc_per_node ranks share each batch (FSDP2 over all of them; gloo on CPU). MODEL_PATH
# defaults to verl's model name; point it at a local folder (no hub downloads here). TORCHRUN
# is the launcher (default torchrun).
set -euo pipefail

if [ "$#" -lt 2 ]; then
    echo "Usage: gsm8k_sft_peft.sh <nproc_per_node> <save_path> [other_configs...]"
    exit 1
fi

nproc_per_node=$1
save_path=$2

# Shift the arguments so $@ refers to the rest
shift 2

"${TORCHRUN:-torchrun}" --standalone --nnodes=1 --nproc_per_node=$nproc_per_node \
     -m hybrid.fsdp_sft_trainer \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.prompt_key=extra_info \
    data.response_key=extra_info \
    optim.lr=1e-4 \
    data.prompt_dict_keys=['question'] \
    +data.response_dict_keys=['answer'] \
    data.micro_batch_size_per_gpu=4 \
    model.partial_pretrain=${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct} \
    trainer.default_local_dir=$save_path \
    trainer.project_name=gsm8k-sft \
    trainer.experiment_name=gsm8k-sft-qwen-2.5-0.5b-instruct \
    trainer.logger=console \
    trainer.total_epochs=1 "$@" \
    model.lora_rank=32\
    model.lora_alpha=16 \
    model.target_modules=all-linear
