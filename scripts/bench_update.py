"""The actor update on one recorded batch, with each optimisation of prompt-once training off and on.

    .venv/bin/python -m scripts.bench_update [--record] [--prompts 8] [--n 4] [--repeats 3]
                                             [--variants baseline,shared_prompts,chunked_logits,both]
                                             [--mixed-precision auto|bf16|fp32]

The batch is recorded once (or again with `--record`) from a real step of the default job:
the trainer itself (hybrid.trainer.PPOTrainer, in-process worker, vLLM engine, the default
model SmolLM2-135M-Instruct and the default arithmetic prompts in dataloader order, GRPO
advantages from reward.scorers.arithmetic) runs one `train_step` whose `update_actor` call
is replaced by a hook that saves the batch it would have sent: input_ids (left-padded
prompt + right-padded response), attention_mask, position_ids, responses, response_mask,
rollout_log_probs, advantages, ... into `.bench/update_batch-<hash of the settings>.pt`
(loaded with weights_only=True). `--prompts` x `--n` samples, max_response_length 48,
temperature 1, as the default job.

Each variant then runs in its own subprocess (so its peak resident memory is its own): the
actor as the trainer builds it (ActorRolloutRefWorker, role actor, world size 1, FSDP2,
mixed_precision auto, micro-batches of 8 samples, use_remove_padding, one mini-batch), its
DataParallelPPOActor rebuilt with the variant's keyword flags (`share_prompts`,
`chunk_logits`); one untimed warm-up update, then `--repeats` timed `update_policy` calls
on the same batch (the median is reported). A variant whose flag the constructor does not
accept is skipped and marked so in the table.

Columns: seconds per update and the ratio to the baseline of the same command; tokens
through the decoder layers (counted by a hook on the first layer during the warm-up;
baseline: all real tokens of all rows, prompt-once: each group's prompt once per
micro-batch + every response token); positions through the vocabulary projection (a hook
on lm_head; the actor computes logits at the positions predicting response tokens); peak
RSS of the subprocess; the grad norm of the warm-up update (the same weights and batch in
every variant, so it should agree); the cores other processes kept busy during the timed
updates ("others", from /proc/stat: 0 on a quiet machine, and timings taken beside other
work are not comparable); and the matrix-product floor: 6 x (decoder-layer
weights) x decoder tokens + 6 x (vocabulary weights) x vocabulary positions FLOPs, at the
rates torch.mm reaches here on the update's shapes in its compute dtype. Everything goes to
`.bench/bench_update-<timestamp>.json` too.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts.bench_report import add_json_argument, write_report
from scripts.update_counts import (
    cpu_snapshot,
    format_table,
    logit_positions,
    matmul_floor_seconds,
    measure_rates,
    others_cores,
    padded_row_tokens,
    prompt_once_tokens,
    ratio,
    weight_counts,
)

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / ".bench"

# variant -> the keyword flags of DataParallelPPOActor.__init__ it turns on
VARIANTS = {
    "baseline": {},
    "shared_prompts": {"share_prompts": True},
    "chunked_logits": {"chunk_logits": True},
    "both": {"share_prompts": True, "chunk_logits": True},
}
RESPONSE_LENGTH = 48  # the default job's data.max_response_length
TEMPERATURE = 1.0  # the default job's rollout.temperature


# ----------------------------------------------------------------------------- pure helpers
def batch_settings(prompts: int, n: int) -> dict:
    """What the recorded batch depends on (its file name carries their hash)."""
    return {"prompts": prompts, "n": n, "response_length": RESPONSE_LENGTH, "temperature": TEMPERATURE, "seed": 1}


def settings_hash(settings: dict) -> str:
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]


def batch_path(settings: dict) -> Path:
    return BENCH_DIR / f"update_batch-{settings_hash(settings)}.pt"


def missing_flags(accepted: set[str], flags: dict) -> list[str]:
    """The variant's flags that the actor's constructor does not take."""
    return sorted(name for name in flags if name not in accepted)


def actor_kwargs(accepted: set[str], flags: dict) -> dict[str, bool]:
    """Every optimisation flag the constructor takes, set explicitly: the variant's on, the
    others off (whatever the constructor's or the worker's defaults are)."""
    known = {name for variant in VARIANTS.values() for name in variant}
    return {name: bool(flags.get(name, False)) for name in sorted(known) if name in accepted}


# ----------------------------------------------------------------------------- config
def job_config(settings: dict, run_dir: Path, mixed_precision: str = "auto"):
    """The default job's typed config with this batch's size (one mini-batch of all rows)."""
    from hybrid.config import build_config
    from hybrid.defaults import resolve_default_assets

    config = build_config(
        [
            f"data.train_batch_size={settings['prompts']}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={settings['prompts']}",
            f"actor_rollout_ref.rollout.n={settings['n']}",
            f"data.max_response_length={settings['response_length']}",
            f"actor_rollout_ref.rollout.temperature={settings['temperature']}",
            f"data.seed={settings['seed']}",
            "trainer.worker_group=local",
            "trainer.val_before_train=false",
            f"trainer.default_local_dir={run_dir}",
            f"actor_rollout_ref.actor.fsdp_config.mixed_precision={mixed_precision}",
        ]
    )
    config = resolve_default_assets(config)
    return config.with_schedule_steps(config.trainer.total_training_steps)


# ----------------------------------------------------------------------------- recording
class _Captured(Exception):
    pass


def record_batch(settings: dict, path: Path) -> dict:
    """One real train_step of the default job up to update_actor; its batch goes to `path`."""
    import random

    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from hybrid.run import build_dataloaders
    from hybrid.trainer import PPOTrainer
    from protocol.data_proto import DataProto
    from reward.loader import load_reward_manager
    from workers.engine_logs import ENGINE_LOG_DIR_ENV

    run_dir = BENCH_DIR / "update_record_run"
    config = job_config(settings, run_dir)
    seed = config.trainer.seed
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    os.environ[ENGINE_LOG_DIR_ENV] = str(run_dir)
    tokenizer = AutoTokenizer.from_pretrained(config.actor_rollout_ref.model.tokenizer)
    train_dl, _ = build_dataloaders(config, tokenizer)
    trainer = PPOTrainer(config, tokenizer, train_dl, None, load_reward_manager(config, tokenizer, num_examine=0), None)
    trainer.init_workers()
    captured = {}

    def capture(batch):
        captured["batch"] = batch
        raise _Captured

    try:
        trainer.update_rollout_weights({})
        trainer.actor_rollout_wg.update_actor = capture
        trainer.state.global_step = 1
        try:
            trainer.train_step(DataProto.from_single_dict(next(iter(train_dl))), None, {}, {})
        except _Captured:
            pass
    finally:
        trainer.shutdown()
    arr = config.actor_rollout_ref
    extra = {"model_path": arr.model.path, "micro_batch_size": arr.actor.ppo_micro_batch_size_per_gpu}
    return _save_batch(captured["batch"], settings, path, extra)


def _save_batch(batch, settings: dict, path: Path, extra: dict) -> dict:
    import torch

    tensors = {key: batch.batch[key].contiguous() for key in batch.batch.keys()}
    plain = (int, float, str, bool)
    meta_info = {k: v for k, v in batch.meta_info.items() if isinstance(v, plain)}
    scores = tensors["token_level_scores"].sum(-1)
    lengths = tensors["response_mask"].sum(-1)
    meta = {
        "settings": settings,
        "meta_info": meta_info,
        "rows": len(batch),
        "mean_score": float(scores.mean()),
        "mean_response_tokens": float(lengths.float().mean()),
        "mean_prompt_tokens": float(
            tensors["attention_mask"][:, : -settings["response_length"]].sum(-1).float().mean()
        ),
        "recorded": time.strftime("%Y-%m-%d %H:%M:%S"),
        **extra,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"tensors": tensors, "meta": meta}, tmp)
    os.replace(tmp, path)
    return meta


def load_batch(path: Path) -> dict:
    import torch

    return torch.load(path, weights_only=True)


# ----------------------------------------------------------------------------- one variant
def _build_actor(config, flags: dict):
    """The actor as the fused worker builds it (role actor), rebuilt with `flags` on and
    every other optimisation flag off."""
    from hybrid.controller.local_worker_group import LocalWorkerGroup
    from workers.actor import DataParallelPPOActor
    from workers.actor_rollout_ref_worker import ActorRolloutRefWorker
    from workers.roles import Role

    group = LocalWorkerGroup(ActorRolloutRefWorker, config.actor_rollout_ref, role=Role.ACTOR, name="actor")
    group.init_model()
    worker = group.worker
    old = worker.actor
    worker.actor = DataParallelPPOActor(
        old.module,
        old.use_remove_padding,
        old.config,
        old.optimizer,
        old.lr_scheduler,
        **actor_kwargs(accepted_actor_flags(), flags),
    )
    return worker


def _counting_hooks(module, counts: dict):
    """Hooks that add the tokens entering the first decoder layer and lm_head to `counts`."""
    from workers.fsdp_utils import decoder_layers

    hidden = module.config.hidden_size

    def on_layer(_mod, args, kwargs):
        states = args[0] if args else kwargs["hidden_states"]
        counts["decoder"] += states.numel() // hidden

    def on_head(_mod, args):
        counts["vocab"] += args[0].numel() // hidden

    first = decoder_layers(module)[0]
    head = module.get_output_embeddings()
    return [first.register_forward_pre_hook(on_layer, with_kwargs=True), head.register_forward_pre_hook(on_head)]


def run_variant(name: str, path: Path, repeats: int, mixed_precision: str) -> dict:
    """Warm-up update (counted, untimed), then `repeats` timed updates; peak RSS."""
    from protocol.data_proto import DataProto

    saved = load_batch(path)
    settings = saved["meta"]["settings"]
    config = job_config(settings, BENCH_DIR / "update_variant_run", mixed_precision)
    worker = _build_actor(config, VARIANTS[name])
    rss_loaded = _peak_rss_gb()
    arr = config.actor_rollout_ref

    def update() -> tuple[float, dict]:
        data = DataProto.from_dict(tensors=dict(saved["tensors"]), meta_info=dict(saved["meta"]["meta_info"]))
        with worker._actor_on_device(optimizer=True):
            before = cpu_snapshot()
            start = time.perf_counter()
            metrics = worker.actor.update_policy(data, arr.rollout.temperature)
            seconds = time.perf_counter() - start
            others.append(others_cores(before, cpu_snapshot()))
            return seconds, metrics

    counts = {"decoder": 0, "vocab": 0}
    others: list[float] = []
    hooks = _counting_hooks(worker.actor.module, counts)
    warm_s, warm_metrics = update()
    for hook in hooks:
        hook.remove()
    seconds = [update()[0] for _ in range(repeats)]
    return {
        "variant": name,
        "seconds": statistics.median(seconds),
        "all_seconds": seconds,
        "warmup_seconds": warm_s,
        "decoder_tokens_seen": counts["decoder"],
        "vocab_tokens_seen": counts["vocab"],
        "grad_norm": float(warm_metrics["actor/grad_norm"]),
        "pg_loss": float(warm_metrics["actor/pg_loss"]),
        "peak_rss_gb": _peak_rss_gb(),
        "rss_after_load_gb": rss_loaded,
        "other_cores": statistics.mean(others[1:]) if others[1:] else None,
        "other_cores_each": others,
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")),
    }


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: KiB


# ----------------------------------------------------------------------------- the driver
def _child(args: list[str]) -> dict:
    cmd = [sys.executable, "-m", "scripts.bench_update", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"bench_update: {' '.join(args)} failed (exit {proc.returncode})")
    marker = next(line for line in reversed(proc.stdout.splitlines()) if line.startswith("RESULT "))
    return json.loads(marker[len("RESULT ") :])


def accepted_actor_flags() -> set[str]:
    from workers.actor import DataParallelPPOActor

    return set(inspect.signature(DataParallelPPOActor.__init__).parameters)


def batch_counts(saved: dict, micro_batch_size: int) -> dict[str, int]:
    t = saved["tensors"]
    r = t["responses"].shape[1]
    return {
        "padded_rows": padded_row_tokens(t["attention_mask"]),
        "prompt_once": prompt_once_tokens(t["input_ids"], t["attention_mask"], r, micro_batch_size),
        "logit_positions": logit_positions(t["attention_mask"][:, -r:]),
        "response_tokens": int(t["response_mask"].sum()),
    }


def _row(name: str, result: dict, expected: dict, weights: dict, rates: dict) -> dict:
    flags = VARIANTS[name]
    decoder = expected["prompt_once"] if flags.get("share_prompts") else expected["padded_rows"]
    seen_decoder, seen_vocab = result["decoder_tokens_seen"], result["vocab_tokens_seen"]
    notes = []
    if seen_decoder and seen_decoder != decoder:
        notes.append(f"expected {decoder} decoder tokens")
    if not seen_vocab:
        notes.append("lm_head not called as a module: vocab tokens computed")
    vocab = seen_vocab or expected["logit_positions"]
    decoder = seen_decoder or decoder
    row = dict(result, decoder_tokens=decoder, vocab_tokens=vocab, note="; ".join(notes))
    row["floor_s"] = matmul_floor_seconds(weights, decoder, vocab, rates)
    return row


def run_all(args, path: Path, saved: dict) -> dict:
    from workers.fsdp_utils import resolve_mixed_precision

    with open(Path(saved["meta"]["model_path"]) / "config.json") as f:
        hf = json.load(f)
    micro = saved["meta"]["micro_batch_size"]
    expected = batch_counts(saved, micro)
    weights = weight_counts(hf)
    dtype = str(resolve_mixed_precision(args.mixed_precision)).replace("torch.", "")
    rows_per_micro = max(saved["meta"]["rows"] // micro, 1)
    before = cpu_snapshot()
    rates = measure_rates(
        dtype,
        hf["hidden_size"],
        hf["intermediate_size"],
        hf["vocab_size"],
        expected["padded_rows"] // rows_per_micro,
        expected["logit_positions"] // rows_per_micro,
    )
    rates_others = others_cores(before, cpu_snapshot())
    accepted = accepted_actor_flags()
    rows = []
    for name in args.variants:
        missing = missing_flags(accepted, VARIANTS[name])
        if missing:
            rows.append({"variant": name, "skipped": f"skipped: DataParallelPPOActor takes no {', '.join(missing)}"})
            continue
        result = _child(
            [
                "--child-variant",
                name,
                "--batch",
                str(path),
                "--repeats",
                str(args.repeats),
                "--mixed-precision",
                args.mixed_precision,
            ]
        )
        rows.append(_row(name, result, expected, weights, rates))
    base = next((r for r in rows if r["variant"] == "baseline" and not r.get("skipped")), None)
    for r in rows:
        if not r.get("skipped"):
            r["ratio"] = ratio(r["seconds"], base["seconds"] if base else None)
    ideal = matmul_floor_seconds(weights, expected["prompt_once"], expected["response_tokens"], rates)
    return {
        "rows": rows,
        "expected_tokens": expected,
        "weights": weights,
        "rates_flops": rates,
        "dtype": dtype,
        "floor_tokens_that_matter_s": ideal,
        "rates_other_cores": rates_others,
    }


def _ensure_batch(args) -> tuple[Path, dict]:
    settings = batch_settings(args.prompts, args.n)
    path = batch_path(settings)
    if args.record or not path.is_file():
        print(
            f"bench_update: recording a rollout of the default job ({args.prompts} prompts x {args.n}) into {path}",
            flush=True,
        )
        _child(["--child-record", json.dumps(settings)])
    return path, load_batch(path)


def _print_report(report: dict, saved: dict, load: tuple) -> None:
    meta = saved["meta"]
    e = report["expected_tokens"]
    print(
        f"\nactor update on one recorded batch: {meta['rows']} samples ({meta['settings']['prompts']} prompts x "
        f"{meta['settings']['n']}), mean prompt {meta['mean_prompt_tokens']:.1f} tokens, mean response "
        f"{meta['mean_response_tokens']:.1f}, mean score {meta['mean_score']:.2f}; compute dtype {report['dtype']}, "
        f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, {platform.processor() or platform.machine()} with "
        f"{os.cpu_count()} cores, load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(format_table(report["rows"]))
    rates = report["rates_flops"]
    print(
        f"matmul rates ({report['dtype']}): layers {rates['layers'] / 1e9:.0f} GFLOP/s, vocabulary "
        f"{rates['vocab'] / 1e9:.0f} GFLOP/s (others {report['rates_other_cores']:.2f} cores); "
        f"floor for the tokens that matter (each prompt once: "
        f"{e['prompt_once']} decoder tokens, {e['response_tokens']} response tokens): "
        f"{report['floor_tokens_that_matter_s']:.2f} s"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_update", description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help="record the batch again even if it exists")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per variant (median reported)")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS)
    )
    parser.add_argument(
        "--mixed-precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="the actor's fsdp_config.mixed_precision (default: auto, as the default job)",
    )
    add_json_argument(parser, "bench_update")
    parser.add_argument("--child-record", help=argparse.SUPPRESS)
    parser.add_argument("--child-variant", choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--batch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    if args.child_record:
        settings = json.loads(args.child_record)
        meta = record_batch(settings, batch_path(settings))
        print("RESULT " + json.dumps(meta), flush=True)
        return 0
    if args.child_variant:
        print(
            "RESULT "
            + json.dumps(run_variant(args.child_variant, Path(args.batch), args.repeats, args.mixed_precision)),
            flush=True,
        )
        return 0
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    path, saved = _ensure_batch(args)
    load = os.getloadavg()
    report = run_all(args, path, saved)
    _print_report(report, saved, load)
    report.update(
        {
            "batch": str(path),
            "batch_meta": saved["meta"],
            "load_before": load,
            "load_after": os.getloadavg(),
            "threads": os.environ["OMP_NUM_THREADS"],
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "repeats": args.repeats,
            "mixed_precision": args.mixed_precision,
        }
    )
    write_report("bench_update", report, args.json, BENCH_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
