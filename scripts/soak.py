"""Soak run: a long training job of a small config, watching for leaks.

Trains a tiny random Llama (2 layers, hidden 64, the SmolLM2 tokenizer, as the
integration tests build it) with GRPO on the arithmetic task through the Ray worker group
(2 ranks by default, the in-process vLLM engine, validation and checkpoints on) for
`--steps` steps. After every step (validation and checkpoint included) it records the
resident memory, open file descriptors and threads of the driver and of every rank, then
prints a summary: growth of each from `--from-step` (after warm-up) to the end, in percent
for memory (the goal is < 5 %), start and end for fds and threads. It writes the per-step
records (`soak.jsonl`) and a plot (`--plot`, default `<out>/soak_memory.png`).

    OMP_NUM_THREADS=1 python -m scripts.soak --steps 220 --plot docs/soak_memory.png

Each step's `perf/cpu_memory_rss_gb` (driver) and `perf/worker_cpu_memory_rss_gb` (largest
rank) metrics come from the trainer itself; this script adds the per-rank detail, fds and
threads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

SERIES = ("rss_gb", "fds", "threads")
# glibc only: what malloc has handed out. Flat while RSS rises means the allocator keeps
# freed memory or holes (workers/host_memory.py), not live objects piling up.
HEAP = "malloc_in_use_gb"


# ----------------------------------------------------------------------------- summary (pure)


def growth_percent(steps: list[int], values: list[float], from_step: int) -> float:
    """Growth in % from the value at the first step >= `from_step` to the last value."""
    pairs = [(s, v) for s, v in zip(steps, values) if s >= from_step]
    if len(pairs) < 2:
        raise ValueError(
            f"need at least two records from step {from_step} on, have {len(pairs)} (steps {steps[:3]}...)"
        )
    start, end = pairs[0][1], pairs[-1][1]
    if start <= 0:
        raise ValueError(f"the value at step {pairs[0][0]} is {start}; growth needs a positive start")
    return 100.0 * (end - start) / start


def per_process_series(records: list[dict]) -> dict[str, dict[str, list[float]]]:
    """{'driver' | 'rank0' | ...: {'step': [...], 'rss_gb': [...], 'fds': [...], 'threads': [...],
    'malloc_in_use_gb': [...] (nan where not measured)}}."""
    series: dict[str, dict[str, list[float]]] = {}
    for record in records:
        for name, stats in [("driver", record["driver"])] + [(f"rank{i}", w) for i, w in enumerate(record["workers"])]:
            entry = series.setdefault(name, {"step": [], **{key: [] for key in SERIES + (HEAP,)}})
            entry["step"].append(record["step"])
            for key in SERIES:
                entry[key].append(stats[key])
            entry[HEAP].append(stats[HEAP] if HEAP in stats else float("nan"))
    return series


def summarize(records: list[dict], from_step: int) -> dict[str, dict[str, float]]:
    """Per process: RSS at `from_step` and at the end (GB), its growth (%), the peak, and
    fds and threads at the first record and at the end."""
    summary = {}
    for name, s in per_process_series(records).items():
        after = [i for i, step in enumerate(s["step"]) if step >= from_step]
        summary[name] = {
            "rss_start_gb": s["rss_gb"][after[0]] if after else float("nan"),
            "rss_end_gb": s["rss_gb"][-1],
            "rss_growth_pct": growth_percent(s["step"], s["rss_gb"], from_step),
            "rss_peak_gb": max(s["rss_gb"]),
            "heap_start_gb": s[HEAP][after[0]] if after else float("nan"),
            "heap_end_gb": s[HEAP][-1],
            "fds_start": s["fds"][0],
            "fds_end": s["fds"][-1],
            "threads_start": s["threads"][0],
            "threads_end": s["threads"][-1],
        }
    return summary


def format_summary(summary: dict[str, dict[str, float]], from_step: int, last_step: int, goal_pct: float = 5.0) -> str:
    lines = [
        f"{'process':<8} {'RSS@' + str(from_step) + ' GB':>11} {'RSS@' + str(last_step) + ' GB':>11} "
        f"{'growth %':>9} {'peak GB':>8} {'malloc GB':>13} {'fds':>11} {'threads':>11}",
    ]
    for name, s in summary.items():
        lines.append(
            f"{name:<8} {s['rss_start_gb']:>11.3f} {s['rss_end_gb']:>11.3f} {s['rss_growth_pct']:>9.2f} "
            f"{s['rss_peak_gb']:>8.3f} {s['heap_start_gb']:>6.3f}->{s['heap_end_gb']:<6.3f} "
            f"{s['fds_start']:>5.0f}->{s['fds_end']:<5.0f} {s['threads_start']:>5.0f}->{s['threads_end']:<5.0f}"
        )
    worst = max(s["rss_growth_pct"] for s in summary.values())
    verdict = "within" if worst < goal_pct else "OVER"
    lines.append(
        f"largest RSS growth from step {from_step} to {last_step}: {worst:.2f} % ({verdict} the {goal_pct:g} % goal)"
    )
    return "\n".join(lines)


def plot_soak(records: list[dict], from_step: int, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = per_process_series(records)
    fig = Figure(figsize=(8, 7.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(3, 1, sharex=True)
    titles = {"rss_gb": "memory (GB)", "fds": "open file descriptors", "threads": "threads"}
    for ax, key in zip(axes, SERIES):
        for i, (name, s) in enumerate(series.items()):
            ax.plot(s["step"], s[key], label=name, linewidth=1.2, color=f"C{i}")
            if key == "rss_gb":
                ax.plot(s["step"], s[HEAP], linewidth=1, linestyle="--", color=f"C{i}", label=f"{name}: malloc in use")
        ax.axvline(from_step, color="grey", linestyle=":", linewidth=1)
        ax.set_ylabel(titles[key])
        ax.grid(True, alpha=0.3)
    axes[0].set_title(f"soak run: {records[-1]['step']} steps (dotted: step {from_step}, end of warm-up)")
    axes[0].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1].set_xlabel("step")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


# ----------------------------------------------------------------------------- the run


def build_tiny_model(out_dir: Path, tokenizer_dir: str) -> str:
    """The integration tests' tiny model: 2 layers, hidden 64, random weights (seed 0)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,  # head size 32: the vLLM CPU backend's smallest
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)


def soak_config(args, model_dir: str, files: dict, run_dir: Path):
    from hybrid.config import load_config, validate_config

    cfg = load_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            f"data.train_files={files['train']}",
            f"data.val_files={files['val']}",
            "data.train_batch_size=8",
            "data.max_prompt_length=64",
            "data.max_response_length=16",
            f"actor_rollout_ref.rollout.name={args.engine}",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.rollout.max_num_batched_tokens=1024",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            f"trainer.n_gpus_per_node={args.ranks}",
            f"trainer.worker_group={args.worker_group}",
            f"trainer.total_training_steps={args.steps}",
            # 256 rows / 8 a step: 32 steps an epoch; the run ends with its epochs (as verl's), so
            # enough of them that total_training_steps ends it (a pass is at least one step).
            f"trainer.total_epochs={args.steps}",
            f"trainer.test_freq={args.test_freq}",
            f"trainer.save_freq={args.save_freq}",
            "trainer.max_actor_ckpt_to_keep=2",
            "trainer.val_before_train=false",
            "trainer.merge_on_finish=false",
            "trainer.logger=[file]",
            f"trainer.default_local_dir={run_dir}",
            *args.override,
        ]
    )
    validate_config(cfg)
    return cfg


def train(cfg, log_path: Path) -> list[dict]:
    """Run `cfg` to the end in this process, recording every process's stats per step."""
    import ray
    from transformers import AutoTokenizer

    from hybrid.roles import init_ray_if_needed
    from hybrid.run import build_dataloaders
    from hybrid.trainer import PPOTrainer, as_typed
    from reward.loader import load_reward_manager
    from workers.engine_logs import ENGINE_LOG_DIR_ENV
    from workers.host_memory import process_stats

    records: list[dict] = []

    class SoakTrainer(PPOTrainer):
        def after_step(self, metrics: dict) -> None:
            super().after_step(metrics)  # the checkpoint, when due: part of the step's footprint
            record = {
                "step": self.state.global_step,
                "time": time.time(),
                "driver": process_stats(),
                "workers": self.actor_rollout_wg.memory_stats(),
            }
            records.append(record)
            with open(log_path, "a") as f:
                f.write(json.dumps(record) + "\n")

    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path)
    train_dl, val_dl = build_dataloaders(cfg, tokenizer)
    reward_fn = load_reward_manager(cfg, tokenizer, num_examine=0)
    # The engines' start-up lines go to the run folder, as in a run of hybrid.main_ppo.
    os.environ[ENGINE_LOG_DIR_ENV] = os.path.abspath(cfg.trainer.default_local_dir)
    init_ray_if_needed(as_typed(cfg))
    trainer = SoakTrainer(cfg, tokenizer, train_dl, val_dl, reward_fn, reward_fn)
    try:
        trainer.init_workers()
        trainer.fit()
    finally:
        trainer.shutdown()
        ray.shutdown()
    return records


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=220)
    parser.add_argument("--from-step", type=int, default=20, help="end of warm-up: growth is measured from here")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--engine", default="vllm", choices=["vllm", "hf"])
    parser.add_argument(
        "--worker-group", default="ray", choices=["ray", "local"], help="local: one rank in this process"
    )
    parser.add_argument("--test-freq", type=int, default=20)
    parser.add_argument("--save-freq", type=int, default=25)
    parser.add_argument("--out", type=Path, default=Path("outputs/soak"))
    parser.add_argument("--plot", type=Path, default=None, help="PNG path (default <out>/soak_memory.png)")
    parser.add_argument("--override", nargs="*", default=[], help="extra config overrides KEY=VALUE")
    parser.add_argument("--records", type=Path, default=None, help="summarize and plot this soak.jsonl; no training")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    from hybrid.arithmetic_task import write_arithmetic_parquet
    from hybrid.defaults import default_model_path

    args = parse_args(argv)
    if args.records is not None:
        records = [json.loads(line) for line in args.records.read_text().splitlines()]
        print(format_summary(summarize(records, args.from_step), args.from_step, records[-1]["step"]))
        print(f"plot: {plot_soak(records, args.from_step, args.plot or args.records.with_suffix('.png'))}")
        return
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = build_tiny_model(args.out / "tiny_model", default_model_path())
    files = write_arithmetic_parquet(args.out / "data", n_train=256, n_val=32, seed=3)
    log_path = args.out / "soak.jsonl"
    log_path.unlink(missing_ok=True)
    run_dir = args.out / "run"
    shutil.rmtree(run_dir, ignore_errors=True)  # a checkpoint left there would resume, not soak
    started = time.time()
    records = train(soak_config(args, model_dir, files, run_dir), log_path)
    minutes = (time.time() - started) / 60
    summary = summarize(records, args.from_step)
    print(
        f"soak: {len(records)} steps in {minutes:.1f} min ({args.ranks} ranks, {args.engine} engine, "
        f"validation every {args.test_freq}, checkpoint every {args.save_freq})"
    )
    print(format_summary(summary, args.from_step, records[-1]["step"]))
    plot = plot_soak(records, args.from_step, args.plot or args.out / "soak_memory.png")
    (args.out / "soak_summary.json").write_text(json.dumps({"minutes": minutes, "summary": summary}, indent=1))
    print(f"records: {log_path}\nplot: {plot}")


if __name__ == "__main__":
    main()
