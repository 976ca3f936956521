"""TRL's side of scripts/bench_vs_trl.py: runs inside TRL's own virtual environment.

    <trl-venv>/bin/python scripts/trl_worker_grpo.py SPEC.json

SPEC.json (written by bench_vs_trl.py) names the model folder, the prompts in the order
hybrid's dataloader draws them, and the shared settings. This file imports nothing of
hybrid except `reward.scorers.arithmetic` (standard library only), so the venv needs no
hybrid dependencies. It writes a JSON result: seconds per optimizer step (wall time
between `on_step_end` callbacks, the first measured from `on_train_begin`), seconds of
generation per step, and the mean reward of each step's 32 completions.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reward.scorers.arithmetic import compute_score  # noqa: E402  (after the path change)


def grpo_args(spec: dict):
    """TRL's GRPOConfig for the same job hybrid runs (the spec's shared settings)."""
    from trl import GRPOConfig

    n = int(spec["n"])
    prompts_per_step = int(spec["prompts_per_step"])
    micro = int(spec["micro_batch_size"])
    samples_per_step = prompts_per_step * n
    if samples_per_step % micro:
        raise ValueError(f"micro_batch_size {micro} must divide {samples_per_step} samples per step")
    return GRPOConfig(
        output_dir=spec["output_dir"],
        use_cpu=True,
        bf16=bool(spec["bf16"]),
        fp16=False,
        # One generation of prompts_per_step x n completions per optimizer step, one update on it
        # (num_iterations=1, steps_per_generation = gradient_accumulation_steps), in micro-batches
        # of the same size hybrid uses (ppo_micro_batch_size_per_gpu).
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=samples_per_step // micro,
        num_generations=n,
        num_iterations=1,
        max_completion_length=int(spec["max_new_tokens"]),
        temperature=float(spec["temperature"]),
        top_p=1.0,
        top_k=0,
        learning_rate=float(spec["lr"]),
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=float(spec["weight_decay"]),
        max_grad_norm=float(spec["grad_clip"]),
        beta=0.0,
        epsilon=float(spec["clip_ratio_low"]),
        epsilon_high=float(spec["clip_ratio_high"]),
        loss_type="dapo",  # token-mean over the batch, hybrid's loss_agg_mode=token-mean
        gradient_checkpointing=False,  # TRL defaults to True; hybrid does not checkpoint, and it is slower
        max_steps=int(spec["steps"]),
        shuffle_dataset=False,  # the rows already come in hybrid's order
        seed=int(spec["seed"]),
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_vllm=False,
    )


def build_result(
    spec, trainer, args, step_ends, gen_seconds, step_rewards, log_records, samples, started, loaded, finished
) -> dict:
    """The JSON result bench_vs_trl.py reads."""
    import torch
    import transformers
    import trl

    step_seconds = [b - a for a, b in zip(step_ends, step_ends[1:])]
    result = {
        "system": "trl",
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "bf16": bool(spec["bf16"]),
        "model_dtype": str(next(trainer.model.parameters()).dtype),
        "steps": len(step_seconds),
        "step_seconds": step_seconds,
        "gen_seconds": gen_seconds,
        "step_rewards": step_rewards,
        "setup_seconds": loaded - started,
        "train_seconds": finished - loaded,
        "logs": log_records,
        "samples": samples,
        "config": {
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "steps_per_generation": args.steps_per_generation,
            "generation_batch_size": args.generation_batch_size,
            "num_generations": args.num_generations,
            "num_iterations": args.num_iterations,
            "gradient_checkpointing": args.gradient_checkpointing,
            "learning_rate": args.learning_rate,
            "beta": args.beta,
        },
    }
    return result


def reward_function(step_rewards: list[float], samples: list[list[dict]]):
    """hybrid's arithmetic scorer as TRL's reward function; it records each step's mean reward
    and its first 4 completions."""

    def arithmetic_reward(prompts, completions, ground_truth, **kwargs):
        """hybrid's arithmetic scorer, one float per completion."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = [compute_score(text, gt) for text, gt in zip(texts, ground_truth, strict=True)]
        step_rewards.append(sum(scores) / len(scores))
        samples.append(
            [
                {"response": t, "ground_truth": gt, "score": sc}
                for t, gt, sc in list(zip(texts, ground_truth, scores))[:4]
            ]
        )
        return scores

    return arithmetic_reward


def timer_callback(spec: dict, step_ends: list[float], gen_seconds, step_rewards, log_records: list[dict]):
    """A TrainerCallback that records the step ends and the logs, and writes what is known
    so far after each step."""
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            step_ends.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            step_ends.append(time.perf_counter())
            # What is known so far, in case the run is stopped before the end.
            partial = {
                "partial": True,
                "step_seconds": [b - a for a, b in zip(step_ends, step_ends[1:])],
                "gen_seconds": gen_seconds,
                "step_rewards": step_rewards,
            }
            Path(spec["result_path"] + ".partial").write_text(json.dumps(partial))
            print(
                f"trl: step {state.global_step} {step_ends[-1] - step_ends[-2]:.1f}s "
                f"reward {step_rewards[-1] if step_rewards else float('nan'):.3f}",
                flush=True,
            )

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                record = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
                record["step"] = state.global_step
                log_records.append(record)

    return Timer()


def time_generation(trainer, gen_seconds: list[float]) -> None:
    """Time generation separately (the transformers `generate` call inside TRL's step)."""
    generate = trainer._generate_single_turn

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        out = generate(*a, **kw)
        gen_seconds.append(time.perf_counter() - t0)
        return out

    trainer._generate_single_turn = timed_generate


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    started = time.perf_counter()

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    rows = spec["rows"]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["ground_truth"]} for r in rows])

    step_rewards: list[float] = []
    samples: list[list[dict]] = []  # the first 4 completions of each step, to read
    args = grpo_args(spec)
    step_ends: list[float] = []
    gen_seconds: list[float] = []
    log_records: list[dict] = []

    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    trainer = GRPOTrainer(
        model=spec["model_path"],
        reward_funcs=reward_function(step_rewards, samples),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer_callback(spec, step_ends, gen_seconds, step_rewards, log_records)],
    )
    time_generation(trainer, gen_seconds)
    loaded = time.perf_counter()
    trainer.train()
    finished = time.perf_counter()

    result = build_result(
        spec, trainer, args, step_ends, gen_seconds, step_rewards, log_records, samples, started, loaded, finished
    )
    Path(spec["result_path"]).write_text(json.dumps(result, indent=2))
    print(f"trl: wrote {spec['result_path']}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: trl_worker_grpo.py SPEC.json")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(sys.argv[1])
