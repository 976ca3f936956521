"""TRL's side of scripts/bench_sft.py: runs inside TRL's own virtual environment.

    <trl-venv>/bin/python scripts/trl_worker_sft.py SPEC.json

SPEC.json (written by bench_sft.py) names the model folder, the tokenized samples (input ids
and completion mask, exactly the tokens hybrid trains, in the order hybrid's data loader
draws them) and the shared settings. TRL's SFTTrainer trains on them as a pre-tokenized
dataset, in that order (its sampler replaced by a sequential one), with its defaults
otherwise. Imports nothing of hybrid. Writes a JSON result: seconds per optimizer step
(wall time between `on_step_end` callbacks, the first from `on_train_begin`) and the loss
TRL logs at each step.
"""

from __future__ import annotations

import json
import sys
import time


def main(spec_path: str) -> None:
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    spec = json.loads(open(spec_path).read())
    batch, micro = int(spec["batch_size"]), int(spec["micro_batch_size"])
    args = SFTConfig(
        output_dir=spec["output_dir"],
        use_cpu=True,
        bf16=bool(spec["bf16"]),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=batch // micro,
        learning_rate=float(spec["lr"]),
        lr_scheduler_type="cosine",
        warmup_steps=0,
        weight_decay=float(spec["weight_decay"]),
        adam_beta1=float(spec["betas"][0]),
        adam_beta2=float(spec["betas"][1]),
        max_grad_norm=float(spec["clip_grad"]),
        num_train_epochs=1,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        gradient_checkpointing=False,
        max_length=int(spec["max_length"]),
        completion_only_loss=True,
        padding_free=bool(spec["padding_free"]),
        seed=int(spec["seed"]),
        dataloader_num_workers=0,
    )
    samples = spec["samples"]
    dataset = Dataset.from_list([{"input_ids": s["input_ids"], "completion_mask": s["loss_mask"]} for s in samples])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=torch.float32)

    step_ends: list[float] = []
    losses: list[float] = []

    class Timer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            step_ends.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            step_ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    class InOrder(SFTTrainer):
        """hybrid's order: the samples arrive already shuffled by hybrid's sampler."""

        def _get_train_sampler(self, *args, **kwargs):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    trainer = InOrder(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=[Timer()])
    trainer.train()
    result = {
        "trl_version": trl.__version__,
        "step_seconds": [b - a for a, b in zip(step_ends, step_ends[1:])],
        "losses": losses,
    }
    with open(spec["result_path"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
