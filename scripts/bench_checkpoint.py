"""Time a checkpoint round trip of a real model on this machine, one rank:

    python -m scripts.bench_checkpoint [--model_path DIR] [--out DIR] [--lora_rank R]

Builds the FSDP2 actor as the worker does (default: the embedded SmolLM2-135M), takes one
AdamW step so the optimizer has state, then times the sharded save (per part), the
`hf_model` export, loading into a fresh model and optimizer, and the merger, and prints
the sizes on disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from scripts.bench_report import add_json_argument, write_report


def _size_mb(path: str) -> float:
    total = 0
    for folder, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    return total / 2**20


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_path", default=None)
    parser.add_argument("--out", default=None, help="scratch folder (default: a temporary one, removed after)")
    parser.add_argument("--lora_rank", type=int, default=0)
    add_json_argument(parser, "bench_checkpoint")
    return parser.parse_args(argv)


def _build(args, arr, tokenizer):
    """The actor as the worker builds it: the FSDP2 model, its optimizer and its checkpointer."""
    from transformers import AutoModelForCausalLM

    from workers.checkpoint import FSDPCheckpointer
    from workers.fsdp_utils import build_optimizer
    from workers.lora import merged_state
    from workers.model_loading import load_hf_model

    module, hf_config = load_hf_model(
        AutoModelForCausalLM,
        args.model_path,
        arr.actor.fsdp_config,
        seed=0,
        trainable=True,
        lora_config=arr.model if args.lora_rank > 0 else None,
    )
    optimizer = build_optimizer([p for p in module.parameters() if p.requires_grad], arr.actor.optim)
    hf_state = (lambda: merged_state(module)) if args.lora_rank > 0 else None
    ckpt = FSDPCheckpointer(
        module,
        optimizer,
        None,
        hf_config,
        tokenizer,
        args.model_path,
        hf_state_fn=hf_state,
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
    )
    return module, optimizer, ckpt


def _round_trip(args, arr, tokenizer, out: str) -> dict:
    """One AdamW step, then the timed save, `hf_model` export, load and merge: printed and returned."""
    import torch

    from hybrid.model_merge import merge

    module, optimizer, ckpt = _build(args, arr, tokenizer)
    ids = torch.randint(0, len(tokenizer), (2, 32))
    module(input_ids=ids, use_cache=False).logits.float().mean().backward()
    optimizer.step()
    params = sum(p.numel() for p in module.parameters())
    path = os.path.join(out, "global_step_1.partial", "actor")
    start = time.perf_counter()
    parts = ckpt.save(path, 1, ["model", "optimizer", "extra"])
    save_s = time.perf_counter() - start
    start = time.perf_counter()
    ckpt.save(os.path.join(out, "hf_export"), 1, ["hf_model"])
    export_s = time.perf_counter() - start
    del module, optimizer, ckpt
    _, _, fresh = _build(args, arr, tokenizer)
    start = time.perf_counter()
    load_parts = fresh.load(path, ["model", "optimizer", "extra"])
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    merge(path, os.path.join(out, "merged"), progress=False)
    merge_s = time.perf_counter() - start
    print(
        f"model {args.model_path} ({params / 1e6:.1f} M parameters, lora_rank={args.lora_rank}), "
        f"threads={torch.get_num_threads()}"
    )
    print(f"save  {save_s:6.2f} s  ({', '.join(f'{k} {v:.2f}' for k, v in parts.items())})  {_size_mb(path):.0f} MB")
    print(f"load  {load_s:6.2f} s  ({', '.join(f'{k} {v:.2f}' for k, v in load_parts.items())})")
    print(f"hf_model export {export_s:6.2f} s  {_size_mb(os.path.join(out, 'hf_export', 'huggingface')):.0f} MB")
    print(f"merge {merge_s:6.2f} s  {_size_mb(os.path.join(out, 'merged')):.0f} MB")
    return {
        "model_path": args.model_path,
        "parameters": params,
        "lora_rank": args.lora_rank,
        "threads": torch.get_num_threads(),
        "save_s": save_s,
        "save_parts_s": parts,
        "checkpoint_mb": _size_mb(path),
        "load_s": load_s,
        "load_parts_s": load_parts,
        "hf_export_s": export_s,
        "hf_export_mb": _size_mb(os.path.join(out, "hf_export", "huggingface")),
        "merge_s": merge_s,
        "merged_mb": _size_mb(os.path.join(out, "merged")),
    }


def main(argv=None) -> None:
    args = _parse_args(argv)

    import torch.distributed as dist
    from transformers import AutoTokenizer

    from hybrid.config import build_config
    from workers.base import Worker

    if args.model_path is None:
        from hybrid.defaults import default_model_path

        args.model_path = default_model_path()
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    Worker()  # joins a one-rank process group, as a local worker group does
    # The default job's actor sections, for this model and LoRA rank.
    arr = build_config(
        [f"actor_rollout_ref.model.path={args.model_path}", f"actor_rollout_ref.model.lora_rank={args.lora_rank}"]
    ).actor_rollout_ref
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    out = args.out or tempfile.mkdtemp(prefix="bench_ckpt_")
    try:
        write_report("bench_checkpoint", _round_trip(args, arr, tokenizer, out), args.json)
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
