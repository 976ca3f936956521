"""hybrid's SFT trainer vs TRL's SFTTrainer: training tokens per second on the same SFT job.

    .venv/bin/python -m scripts.bench_sft [--samples 256] [--skip-trl] [--trl-padding-free] [--json PATH]

Both sides train the default model (SmolLM2-135M-Instruct) for one epoch on the same
samples: the first `--samples` rows of the default SFT data (worked arithmetic answers,
hybrid/sft_data.py), tokenized once by hybrid and handed to TRL as a pre-tokenized dataset
with its completion mask, so both train exactly the same tokens with the same loss mask, in
the same order (hybrid's sampler order; TRL's sampler is made sequential over it), with
the same batch (32 samples per optimizer step, micro-batches of 16, gradient accumulation),
learning rate and cosine schedule, AdamW settings, gradient clip and dtype (bf16 compute
where the CPU has fast bf16, as hybrid's `auto`), and no gradient checkpointing on either.
TRL otherwise runs with its defaults (padded batches; `--trl-padding-free` turns on its
padding-free mode), in its own virtual environment (.bench/trl-venv, made by
scripts/bench_vs_trl.py's helper). hybrid runs as `python -m hybrid.sft_trainer` with packed
micro-batches (`use_remove_padding=true`) and is read back from its metrics.jsonl.

Tokens per second = the epoch's real (non-padding) tokens / the summed optimizer-step times.
Prints one table (and both loss curves) and writes it to `--json` with
`ratio_tokens_per_s_vs_trl` (hybrid / TRL; the goal is >= 1.5) at the top level.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from scripts.bench_vs_trl import BENCH_DIR, REPO, LoadSampler, _env, ensure_trl_venv, machine_info

WORKER = REPO / "scripts" / "trl_worker_sft.py"
GOAL_RATIO = 1.5
SETTINGS = {
    "batch_size": 32,
    "micro_batch_size": 16,
    "lr": 5e-5,
    "weight_decay": 0.01,
    "betas": [0.9, 0.95],
    "clip_grad": 1.0,
    "max_length": 256,
    "seed": 1,
}


def job_samples(count: int) -> tuple[str, list[dict]]:
    """The default model folder and the epoch's samples in hybrid's order, as hybrid tokenizes them."""
    from hybrid.config.sft_schema import load_sft_config, typed_sft_config
    from hybrid.data_loader import RLSampler
    from hybrid.defaults import default_model_path, default_sft_data_paths
    from hybrid.sft_data import SFTDataset
    from workers.model_loading import load_tokenizer

    model = default_model_path()
    train = default_sft_data_paths()["train"]
    cfg = typed_sft_config(load_sft_config(hybrid_overrides(count, model, train, Path("/unused"))))
    dataset = SFTDataset(train, load_tokenizer(model, False), cfg.data, count)
    order = RLSampler(len(dataset), shuffle=True, seed=SETTINGS["seed"]).indices_for_epoch(0)
    return model, [dataset[i] for i in order]


def hybrid_overrides(count: int, model: str, train: str, run_dir: Path) -> list[str]:
    s = SETTINGS
    return [
        f"model.partial_pretrain={model}",
        f"data.train_files={train}",
        "data.val_files=null",
        f"data.train_max_samples={count}",
        f"data.train_batch_size={s['batch_size']}",
        f"data.micro_batch_size_per_gpu={s['micro_batch_size']}",
        f"data.max_length={s['max_length']}",
        "use_remove_padding=true",
        "model.enable_gradient_checkpointing=false",
        f"optim.lr={s['lr']}",
        "optim.lr_warmup_steps_ratio=0",
        f"optim.weight_decay={s['weight_decay']}",
        f"optim.betas=[{s['betas'][0]},{s['betas'][1]}]",
        f"optim.clip_grad={s['clip_grad']}",
        "trainer.total_epochs=1",
        f"trainer.seed={s['seed']}",
        "trainer.logger=[file]",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir}",
    ]


def run_hybrid(count: int, model: str, threads: int) -> dict:
    from hybrid.defaults import default_sft_data_paths

    run_dir = BENCH_DIR / "sft-hybrid"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    overrides = hybrid_overrides(count, model, default_sft_data_paths()["train"], run_dir)
    cmd = [sys.executable, "-m", "hybrid.sft_trainer", *overrides]
    print("bench: hybrid SFT ...", flush=True)
    with open(run_dir / "log.txt", "w") as log, LoadSampler() as load:
        proc = subprocess.run(cmd, cwd=REPO, env=_env(threads), stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        log = run_dir / "log.txt"
        raise RuntimeError(f"hybrid's SFT run failed; log {log}:\n{log.read_text()[-3000:]}")
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return {
        "name": "hybrid (packed)",
        "step_seconds": [r["train/time(s)"] for r in rows],
        "losses": [r["train/loss"] for r in rows],
        **load.summary(),
    }


def run_trl(python: Path, model: str, samples: list[dict], bf16: bool, padding_free: bool, threads: int) -> dict:
    out_dir = BENCH_DIR / "sft-trl"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    spec = {
        **SETTINGS,
        "samples": samples,
        "model_path": model,
        "bf16": bf16,
        "padding_free": padding_free,
        "output_dir": str(out_dir / "trainer"),
        "result_path": str(out_dir / "result.json"),
    }
    (out_dir / "spec.json").write_text(json.dumps(spec))
    print(f"bench: TRL SFTTrainer ({'padding-free' if padding_free else 'padded'}) ...", flush=True)
    with open(out_dir / "log.txt", "w") as log, LoadSampler() as load:
        cmd = [str(python), str(WORKER), str(out_dir / "spec.json")]
        proc = subprocess.run(cmd, cwd=REPO, env=_env(threads), stderr=log)
    if proc.returncode != 0:
        log = out_dir / "log.txt"
        raise RuntimeError(f"the TRL worker failed; log {log}:\n{log.read_text()[-3000:]}")
    result = json.loads((out_dir / "result.json").read_text())
    result["name"] = f"TRL {result['trl_version']} SFTTrainer ({'padding-free' if padding_free else 'padded'})"
    result.update(load.summary())
    return result


def summarize(result: dict, tokens: int) -> dict:
    seconds = sum(result["step_seconds"])
    result["tokens"] = tokens
    result["seconds"] = seconds
    result["tokens_per_s"] = tokens / seconds if seconds else float("nan")
    return result


def print_table(results: dict, ratio: float | None) -> None:
    print(f"\n{'run':<40} {'steps':>5} {'s/step':>7} {'tokens/s':>9} {'loss first -> last':>20}")
    for r in results.values():
        steps = len(r["step_seconds"])
        loss = f"{r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}" if r["losses"] else "-"
        print(f"{r['name']:<40} {steps:>5} {r['seconds'] / steps:>7.2f} {r['tokens_per_s']:>9.0f} {loss:>20}")
    if ratio is not None:
        print(f"hybrid / TRL tokens per second: {ratio:.2f}x (goal >= {GOAL_RATIO}x)")
    if "trl" in results:
        pairs = zip(results["hybrid"]["losses"], results["trl"]["losses"])
        print("loss per step (hybrid, TRL): " + ", ".join(f"{h:.3f}/{t:.3f}" for h, t in pairs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=256, help="samples in the epoch (a multiple of 32)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--trl-padding-free", action="store_true")
    parser.add_argument("--json", help="write the table here")
    args = parser.parse_args(argv)
    from workers.device import supports_bf16

    model, samples = job_samples(args.samples)
    tokens = sum(len(s["input_ids"]) for s in samples)
    bf16 = supports_bf16()
    started = time.time()
    results = {"hybrid": summarize(run_hybrid(args.samples, model, args.threads), tokens)}
    if not args.skip_trl:
        python = ensure_trl_venv()
        results["trl"] = summarize(run_trl(python, model, samples, bf16, args.trl_padding_free, args.threads), tokens)
    ratio = results["hybrid"]["tokens_per_s"] / results["trl"]["tokens_per_s"] if "trl" in results else None
    print_table(results, ratio)
    if args.json:
        out = {
            "ratio_tokens_per_s_vs_trl": ratio,
            "goal_ratio": GOAL_RATIO,
            "settings": {**SETTINGS, "samples": args.samples, "tokens": tokens, "bf16": bf16, "threads": args.threads},
            "machine": machine_info(),
            "started": started,
            "runs": results,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
