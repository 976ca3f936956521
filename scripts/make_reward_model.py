"""Make a sequence-classification reward model folder from a causal LM folder: the LM's body
with a new one-output score head (seeded), saved with its tokenizer. For trying the reward
model paths (verl's reward-model scripts, the reward loop's engine) without downloading one;
its scores are not trained to mean anything.

    python -m scripts.make_reward_model OUT_DIR [--model PATH] [--seed 0]
"""

from __future__ import annotations

import argparse

import torch


def make_reward_model(out_dir: str, model_path: str | None = None, seed: int = 0) -> str:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from hybrid.defaults import default_model_path

    path = model_path or default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=1, pad_token_id=tokenizer.pad_token_id, dtype=torch.float32
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--model", default=None, help="a causal LM folder (default: the default model)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(make_reward_model(args.out_dir, args.model, args.seed))


if __name__ == "__main__":
    main()
