"""Rollout throughput: the fused hybrid worker against a standalone `vllm.LLM.generate`.

    python -m scripts.bench_rollout [--prompts 32] [--n 4] [--tokens 64] [--rounds 2]
        [--override KEY=VALUE ...] [--fused-only]

Both sides generate the same prompts (the default arithmetic validation prompts, chat
template applied) with the same engine settings (dtype, eager mode, batched-token
budget, KV cache size) and `ignore_eos`, so both produce exactly prompts x n x tokens
tokens. The fused side is `generate_sequences` of the hybrid worker (its engine started
with dummy weights and filled by the in-memory sync), measured end to end: engine call,
log-prob extraction and the DataProto assembly. Each side runs in its own subprocess
(two vLLM engines do not share a process), alternating, `--rounds` times; every
subprocess warms up once before it is timed; both processes have the worker's malloc
tuning (workers/host_memory.py). The table gives the best round of each and
the ratio fused / standalone (goal >= 0.9). `--override` passes config overrides to both
sides (e.g. `actor_rollout_ref.rollout.cpu_kvcache_space_gb=4` or
`actor_rollout_ref.rollout.engine_kwargs.vllm.enable_prefix_caching=true`; the standalone
engine takes `engine_kwargs.vllm` as the worker does); `--fused-only` skips the standalone
runs when only fused configurations are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from scripts.bench_report import add_json_argument, write_report


def _settings(args) -> dict:
    return {
        "prompts": args.prompts,
        "n": args.n,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "overrides": list(args.override),
    }


def _prompt_batch(config, count: int):
    from transformers import AutoTokenizer

    from hybrid.run import build_dataloaders
    from protocol import DataProto

    tokenizer = AutoTokenizer.from_pretrained(config.actor_rollout_ref.model.path)
    _, val_dl = build_dataloaders(config, tokenizer)
    batch = DataProto.from_single_dict(next(iter(val_dl)))
    if len(batch) < count:
        raise SystemExit(f"bench_rollout: the validation set has {len(batch)} prompts, fewer than --prompts {count}")
    return batch[:count]


def _config(settings: dict):
    from hybrid.config import build_config
    from hybrid.defaults import resolve_default_assets

    config = build_config(
        [
            f"actor_rollout_ref.rollout.n={settings['n']}",
            f"data.max_response_length={settings['tokens']}",
            f"data.val_batch_size={settings['prompts']}",
            "actor_rollout_ref.rollout.ignore_eos=true",
            "actor_rollout_ref.rollout.free_cache_engine=false",
            "trainer.worker_group=local",
            *settings.get("overrides", []),
        ]
    )
    return resolve_default_assets(config)


def _engine_kwargs(rollout_cfg, model_path: str) -> dict:
    """What the fused worker passes to vllm.LLM, minus the dummy load (workers/rollout/vllm_rollout.py)."""
    from workers.device import resolve_dtype_name
    from workers.rollout.base import plain

    max_model_len = int(rollout_cfg.prompt_length) + int(rollout_cfg.response_length)
    kwargs = dict(
        model=model_path,
        dtype=resolve_dtype_name(str(rollout_cfg.dtype)),
        enforce_eager=bool(rollout_cfg.enforce_eager),
        max_model_len=max_model_len,
        max_num_seqs=int(rollout_cfg.max_num_seqs),
        max_num_batched_tokens=max(int(rollout_cfg.max_num_batched_tokens), max_model_len),
        enable_prefix_caching=False,
        seed=0,
    )
    kwargs.update(plain(rollout_cfg.engine_kwargs.vllm or {}))
    return kwargs


def run_standalone(settings: dict) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from workers.host_memory import keep_freed_host_memory

    keep_freed_host_memory()  # the fused worker's process has it: compare engines, not malloc settings
    config = _config(settings)
    rollout_cfg = config.actor_rollout_ref.rollout
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(rollout_cfg.cpu_kvcache_space_gb))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from workers.rollout.base import prompt_token_lists

    batch = _prompt_batch(config, settings["prompts"])
    llm = LLM(**_engine_kwargs(rollout_cfg, config.actor_rollout_ref.model.path))
    requests = [
        TokensPrompt(prompt_token_ids=ids)
        for ids in prompt_token_lists(batch.batch["input_ids"], batch.batch["attention_mask"])
    ]
    params = SamplingParams(n=settings["n"], temperature=1.0, max_tokens=settings["tokens"], ignore_eos=True)
    llm.generate(requests, params, use_tqdm=False)  # warm-up
    times, tokens = [], 0
    for _ in range(settings["repeats"]):
        start = time.perf_counter()
        outputs = llm.generate(requests, params, use_tqdm=False)
        times.append(time.perf_counter() - start)
        tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {
        "seconds": min(times),
        "tokens": tokens,
        "dtype": _engine_kwargs(rollout_cfg, "")["dtype"],
        "libraries": _loaded_libraries(),
    }


def run_fused(settings: dict) -> dict:
    config = _config(settings)
    from hybrid.roles import build_worker_groups

    batch = _prompt_batch(config, settings["prompts"])
    group = build_worker_groups(config)["actor_rollout"]
    group.init_model()
    prompts = batch.select(batch_keys=["input_ids", "attention_mask", "position_ids"])
    group.update_rollout_weights()  # the engine starts with dummy weights
    group.generate_sequences(prompts)  # warm-up
    times, engine_times, tokens = [], [], 0
    for _ in range(settings["repeats"]):
        start = time.perf_counter()
        out = group.generate_sequences(prompts)
        times.append(time.perf_counter() - start)
        engine_times.append(out.meta_info["timing"]["generate"])
        # With ignore_eos the engine always generates max_tokens; response_mask stops at the
        # first EOS, so it would undercount the work done.
        tokens = int(out.batch["responses"].numel())
    return {
        "seconds": min(times),
        "engine_seconds": min(engine_times),
        "tokens": tokens,
        "dtype": _engine_kwargs(config.actor_rollout_ref.rollout, "")["dtype"],
        "libraries": _loaded_libraries(),
    }


def _child(mode: str, settings: dict) -> dict:
    cmd = [sys.executable, "-m", "scripts.bench_rollout", "--child", mode, "--settings", json.dumps(settings)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"bench_rollout: the {mode} run failed (exit {proc.returncode})")
    marker = next(line for line in reversed(proc.stdout.splitlines()) if line.startswith("RESULT "))
    return json.loads(marker[len("RESULT ") :])


def _loaded_libraries() -> list[str]:
    """Allocator and OpenMP libraries mapped into this process (shows what LD_PRELOAD did)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if len(line.split()) >= 6}
    return sorted(os.path.basename(p) for p in paths if any(k in p for k in ("iomp", "gomp", "tcmalloc", "jemalloc")))


def _report(args, results: dict) -> dict:
    best = {mode: min(runs, key=lambda r: r["seconds"]) for mode, runs in results.items()}
    tps = {mode: r["tokens"] / r["seconds"] for mode, r in best.items()}
    base = tps.get("standalone", tps["fused"])
    expected = args.prompts * args.n * args.tokens
    print(
        f"\nrollout: {args.prompts} prompts x {args.n} samples x {args.tokens} tokens (ignore_eos), "
        f"dtype {best['fused']['dtype']}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, "
        f"{platform.processor() or platform.machine()} with {os.cpu_count()} cores"
    )
    if args.override:
        print(f"overrides: {' '.join(args.override)}")
    print(
        f"libraries (fused process): {' '.join(best['fused']['libraries']) or '-'}; "
        f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')}"
    )
    print(f"{'engine':<28} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'ratio':>6}")
    for mode, label in (("standalone", "vllm.LLM.generate"), ("fused", "hybrid generate_sequences")):
        if mode in best:
            r = best[mode]
            print(f"{label:<28} {r['tokens']:>7} {r['seconds']:>8.2f} {tps[mode]:>9.1f} {tps[mode] / base:>6.2f}")
    rounds = ", ".join(f"{mode} {[round(r['seconds'], 2) for r in runs]}" for mode, runs in results.items())
    print(f"  (fused engine call alone: {best['fused']['engine_seconds']:.2f} s; all rounds s: {rounds})")
    if "standalone" in tps:
        print(f"fused / standalone = {tps['fused'] / tps['standalone']:.2f} (goal >= 0.9)")
    if any(r["tokens"] != expected for r in best.values()):
        print(f"warning: expected {expected} tokens per run; got {[r['tokens'] for r in best.values()]}")
    rows = [
        {
            "engine": mode,
            "tokens": r["tokens"],
            "seconds": r["seconds"],
            "tokens_per_s": tps[mode],
            "ratio": tps[mode] / base,
        }
        for mode, r in best.items()
    ]
    return {
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "child", "settings")},
        "rows": rows,
        "rounds": results,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="timed generate calls per subprocess (best is kept)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating subprocess pairs")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for both sides (repeatable)",
    )
    parser.add_argument("--fused-only", action="store_true", help="time only the fused worker")
    add_json_argument(parser, "bench_rollout")
    parser.add_argument("--child", choices=["standalone", "fused"], help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    if args.child:
        result = (run_standalone if args.child == "standalone" else run_fused)(json.loads(args.settings))
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    settings = _settings(args)
    modes = ("fused",) if args.fused_only else ("standalone", "fused")
    results = {mode: [] for mode in modes}
    for _ in range(args.rounds):
        for mode in modes:
            results[mode].append(_child(mode, settings))
    write_report("bench_rollout", _report(args, results), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
