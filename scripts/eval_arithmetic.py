"""Held-out greedy accuracy of a model on the default arithmetic task (before/after SFT).

    python -m scripts.eval_arithmetic --model default            # the base model
    python -m scripts.eval_arithmetic --model checkpoints/hybrid-sft/arithmetic --json out.json

`--model` is a Hugging Face folder, `default` (the converted SmolLM2-135M-Instruct), or an
SFT/PPO run folder (`trainer.default_local_dir`), whose newest checkpoint's merged model
(`global_step_N/actor/huggingface`) is used. The questions are the PPO job's validation rows
(the same generator and seed; hybrid/arithmetic_task.py), rendered with the chat template as
the PPO validation renders them, answered greedily by transformers' generate, and scored by
the scorer the PPO validation's reward manager calls for this data source
(reward/scorers: the last integer of the response against the ground truth).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def resolve_model(path: str) -> str:
    """A Hugging Face folder from `path` (see the module docstring)."""
    from hybrid.checkpoint_folders import latest_checkpoint
    from hybrid.defaults import default_model_path

    if path == "default":
        return default_model_path()
    if os.path.isfile(os.path.join(path, "config.json")) and any(
        name.endswith(".safetensors") for name in os.listdir(path)
    ):
        return path
    checkpoint = latest_checkpoint(path)
    merged = os.path.join(checkpoint or path, "actor", "huggingface")
    if checkpoint is None or not os.path.isfile(os.path.join(merged, "config.json")):
        raise SystemExit(
            f"eval_arithmetic: {path} is neither a Hugging Face model folder nor a run folder whose newest checkpoint "
            f"holds a merged model (actor/huggingface; saved at the last step when trainer.save_freq > 0)"
        )
    return merged


def evaluate(model_dir: str, n: int, batch_size: int, max_new_tokens: int, dtype: str = "float32") -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybrid.data import read_rows
    from hybrid.defaults import default_data_paths
    from reward.scorers import default_compute_score

    rows = read_rows(default_data_paths()["val"])[:n]
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    correct, samples, start = 0, [], time.perf_counter()
    for first in range(0, len(rows), batch_size):
        chunk = rows[first : first + batch_size]
        texts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in chunk]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        for row, ids in zip(chunk, out[:, inputs["input_ids"].shape[1] :]):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            truth = row["reward_model"]["ground_truth"]
            correct += default_compute_score(row["data_source"], text, truth) >= 1.0
            samples.append({"question": row["extra_info"]["question"], "response": text, "answer": truth})
    return {
        "model": model_dir,
        "n": len(rows),
        "dtype": dtype,
        "accuracy": correct / max(len(rows), 1),
        "seconds": round(time.perf_counter() - start, 1),
        "samples": samples[:5],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--n", type=int, default=200, help="held-out questions (the PPO job's validation rows)")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the dtype the model runs in; the PPO validation's engine runs in bfloat16 where the CPU or GPU has "
        "fast bf16 (rollout.dtype=auto), and greedy answers differ between the two",
    )
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    result = evaluate(resolve_model(args.model), args.n, args.batch_size, args.max_new_tokens, args.dtype)
    print(
        f"eval_arithmetic: {result['model']} ({args.dtype}): greedy accuracy {result['accuracy']:.3f} "
        f"on {result['n']} held-out"
    )
    for sample in result["samples"][:3]:
        print(f"  {sample['question']} -> {sample['response']!r} (answer {sample['answer']})")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
