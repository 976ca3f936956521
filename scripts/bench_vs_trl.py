"""hybrid vs TRL's GRPOTrainer: seconds per step and mean reward on the same GRPO job.

    .venv/bin/python -m scripts.bench_vs_trl [--steps 5] [--skip-trl] [--skip-hybrid]
                                             [--trl-precision auto|fp32|bf16|both]

Both sides train the default model (SmolLM2-135M-Instruct, the folder hybrid.defaults
converts) on the default arithmetic prompts, in the order hybrid's dataloader draws them:
8 prompts x 4 samples per step, up to 64 new tokens, temperature 1, the same learning rate
(hybrid's default actor lr, constant), weight decay and gradient clip, no KL and no
reference model, one optimizer update per step on micro-batches of 8 samples, the same
reward (reward.scorers.arithmetic.compute_score), and the same number of steps.

TRL runs in its own virtual environment (.bench/trl-venv, created on first use, pinned
below, no vLLM: rollout is transformers `generate`), through scripts/trl_worker_grpo.py,
with use_cpu=True. Its precision: `auto` picks bf16 where the CPU has fast bf16 matmuls
(AVX-512 bf16 / AMX, the same test hybrid's `auto` dtypes use) and fp32 otherwise;
`both` runs it twice and compares hybrid with the faster of the two. hybrid runs as
`python -m hybrid.main_ppo` with overrides (its own `auto` dtypes) and is read back from
its metrics.jsonl (`timing_s/step`, `critic/score/mean`, every `timing_s/*` phase).

Prints a table (s/step mean over all steps and without step 1, mean reward per step,
hybrid/TRL ratio; the goal is <= 0.33) and writes everything to .bench/bench_vs_trl-*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from scripts.bench_report import write_report

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / ".bench"
TRL_VENV = BENCH_DIR / "trl-venv"
STAMP = "hybrid-bench-stamp.json"
WORKER = REPO / "scripts" / "trl_worker_grpo.py"

TRL_VERSION = "1.16.0"
DATASETS_VERSION = "5.2.0"
GOAL_RATIO = 0.33

# The shared job (hybrid's override keys and TRL's GRPOConfig take these values).
PROMPTS_PER_STEP = 8
SAMPLES_PER_PROMPT = 4
MAX_NEW_TOKENS = 64
MICRO_BATCH = 8  # samples per forward/backward (hybrid: ppo_micro_batch_size_per_gpu)


# ----------------------------------------------------------------------------- environment
def _project_pins() -> dict[str, str]:
    """torch / transformers / accelerate pins from pyproject.toml, so TRL runs on the same."""
    with open(REPO / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    reqs = list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values() for r in extra]
    pins = {}
    for req in reqs:
        if "==" in req:
            name, version = req.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def trl_requirements() -> list[str]:
    pins = _project_pins()
    return [
        f"torch=={pins['torch']}",
        f"transformers=={pins['transformers']}",
        f"accelerate=={pins['accelerate']}",
        f"trl=={TRL_VERSION}",
        f"datasets=={DATASETS_VERSION}",
    ]


def ensure_trl_venv(venv: Path = TRL_VENV) -> Path:
    """Create TRL's virtual environment once; a stamp file makes a second call a no-op."""
    python = venv / "bin" / "python"
    reqs = trl_requirements()
    stamp = {"requirements": reqs, "python": platform.python_version()}
    stamp_path = venv / STAMP
    if python.exists() and stamp_path.is_file():
        try:
            if json.loads(stamp_path.read_text()) == stamp:
                return python
        except ValueError:
            pass
    print(f"bench: creating TRL's virtual environment in {venv} ({' '.join(reqs)}); takes a few minutes", flush=True)
    if not python.exists():
        # The base interpreter, not this venv's: the new one must not see hybrid's packages.
        base = Path(sys.base_prefix) / "bin" / "python3"
        subprocess.run([str(base if base.exists() else sys.executable), "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *reqs], check=True)
    stamp_path.unlink(missing_ok=True)
    stamp_path.write_text(json.dumps(stamp, indent=2))
    return python


def machine_info() -> dict:
    model, flags = "unknown", ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "avx512f": " avx512f" in flags,
        "fast_bf16": ("avx512_bf16" in flags) or ("amx_bf16" in flags),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


class LoadSampler:
    """Samples the 1-minute load average every `every` seconds while a run goes on: the
    machine is shared, and a run beside another heavy job is not a clean timing."""

    def __init__(self, every: float = 10.0):
        import threading

        self.every, self.samples = every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        xs = self.samples or [float("nan")]
        return {"load1_mean": round(sum(xs) / len(xs), 2), "load1_max": round(max(xs), 2)}


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# ----------------------------------------------------------------------------- shared job
def shared_settings(steps: int) -> dict:
    """The values both sides use; hybrid's own defaults for lr, decay, clip, temperature, seed."""
    from hybrid.config import build_config
    from workers.losses import _clip_range

    cfg = build_config()
    actor = cfg.actor_rollout_ref.actor
    clip_low, clip_high = _clip_range(actor)  # the losses' own reading of a null bound
    return {
        "steps": int(steps),
        "prompts_per_step": PROMPTS_PER_STEP,
        "n": SAMPLES_PER_PROMPT,
        "max_new_tokens": MAX_NEW_TOKENS,
        "micro_batch_size": MICRO_BATCH,
        "lr": float(actor.optim.lr),
        "weight_decay": float(actor.optim.weight_decay),
        "grad_clip": float(actor.grad_clip),
        "clip_ratio_low": float(clip_low),
        "clip_ratio_high": float(clip_high),
        "temperature": float(cfg.actor_rollout_ref.rollout.temperature),
        "seed": int(cfg.trainer.seed),
        "data_seed": int(cfg.data.seed),
    }


def hybrid_order_rows(train_path: str, count: int, data_seed: int) -> list[dict]:
    """The first `count` training rows in the order hybrid's dataloader draws them (epoch 0)."""
    import pyarrow.parquet as pq

    from hybrid.data_loader import RLSampler

    table = pq.read_table(train_path).to_pylist()
    order = RLSampler(len(table), shuffle=True, seed=data_seed).indices_for_epoch(0)
    rows = []
    for index in order[:count]:
        row = table[index]
        rows.append({"prompt": row["prompt"], "ground_truth": row["reward_model"]["ground_truth"]})
    return rows


def _env(threads: int) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # No hub here: local folders only, no telemetry thread trying the network.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    return env


def _summary(step_seconds: list[float], rewards: list[float]) -> dict:
    def mean(xs):
        return sum(xs) / len(xs) if xs else float("nan")

    return {
        "s_per_step_mean": mean(step_seconds),
        "s_per_step_mean_excl_first": mean(step_seconds[1:]) if len(step_seconds) > 1 else float("nan"),
        "s_per_step_median": sorted(step_seconds)[len(step_seconds) // 2] if step_seconds else float("nan"),
        "reward_mean": mean(rewards),
    }


# ----------------------------------------------------------------------------- runs
def run_trl(
    python: Path, settings: dict, rows: list[dict], model_path: str, bf16: bool, threads: int, tag: str
) -> dict:
    out_dir = BENCH_DIR / f"trl-{tag}"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    spec = {
        **settings,
        "rows": rows,
        "model_path": model_path,
        "bf16": bf16,
        "output_dir": str(out_dir / "trainer"),
        "result_path": str(out_dir / "result.json"),
    }
    spec_path = out_dir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    print(
        f"bench: TRL {TRL_VERSION} GRPOTrainer, {'bf16' if bf16 else 'fp32'}, {settings['steps']} steps ...", flush=True
    )
    load_before = _loadavg()
    started = time.perf_counter()
    with open(out_dir / "log.txt", "w") as log, LoadSampler() as load:
        proc = subprocess.run([str(python), str(WORKER), str(spec_path)], cwd=REPO, env=_env(threads), stderr=log)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        tail = (out_dir / "log.txt").read_text()[-3000:]
        raise RuntimeError(f"the TRL worker failed (exit {proc.returncode}); log {out_dir / 'log.txt'}:\n{tail}")
    result = json.loads((out_dir / "result.json").read_text())
    result.update(_summary(result["step_seconds"], result["step_rewards"]))
    gen = result.get("gen_seconds", [])
    result["gen_mean_excl_first"] = sum(gen[1:]) / len(gen[1:]) if len(gen) > 1 else float("nan")
    result["name"] = f"TRL {result['trl_version']} ({'bf16' if bf16 else 'fp32'})"
    result["wall_seconds"] = wall
    result["loadavg_before"], result["loadavg_after"] = load_before, _loadavg()
    result.update(load.summary())
    lengths = [log["completions/mean_length"] for log in result.get("logs", []) if "completions/mean_length" in log]
    result["response_length_mean"] = sum(lengths) / len(lengths) if lengths else None
    return result


def hybrid_overrides(settings: dict, run_dir: Path) -> list[str]:
    return [
        f"data.train_batch_size={settings['prompts_per_step']}",
        f"data.max_response_length={settings['max_new_tokens']}",
        f"actor_rollout_ref.rollout.n={settings['n']}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={settings['prompts_per_step']}",  # one update per step
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={settings['micro_batch_size']}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        f"actor_rollout_ref.actor.optim.lr={settings['lr']}",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "algorithm.use_kl_in_reward=false",
        "algorithm.adv_estimator=grpo",
        f"trainer.total_training_steps={settings['steps']}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[file]",
        "trainer.plot_on_finish=false",
        "trainer.merge_on_finish=false",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir}",
    ]


def run_hybrid(settings: dict, threads: int) -> dict:
    run_dir = BENCH_DIR / "hybrid-run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    cmd = [sys.executable, "-m", "hybrid.main_ppo", *hybrid_overrides(settings, run_dir)]
    print(f"bench: hybrid, {settings['steps']} steps: {' '.join(cmd[1:])}", flush=True)
    load_before = _loadavg()
    started = time.perf_counter()
    with open(run_dir / "log.txt", "w") as log, LoadSampler() as load:
        proc = subprocess.run(cmd, cwd=REPO, env=_env(threads), stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        tail = (run_dir / "log.txt").read_text()[-3000:]
        raise RuntimeError(f"hybrid failed (exit {proc.returncode}); log {run_dir / 'log.txt'}:\n{tail}")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [s for s in steps if "timing_s/step" in s]
    step_seconds = [float(s["timing_s/step"]) for s in steps]
    rewards = [float(s["critic/score/mean"]) for s in steps]
    phases = sorted({k for s in steps for k in s if k.startswith("timing_s/")})
    result = {
        "system": "hybrid",
        "name": "hybrid",
        "steps": len(steps),
        "step_seconds": step_seconds,
        "step_rewards": rewards,
        "phases": {k.removeprefix("timing_s/"): [float(s.get(k, 0.0)) for s in steps] for k in phases},
        "response_length_mean": sum(float(s.get("response_length/mean", 0.0)) for s in steps) / max(len(steps), 1),
        "wall_seconds": wall,
        "loadavg_before": load_before,
        "loadavg_after": _loadavg(),
        "command": " ".join(["python", "-m", "hybrid.main_ppo", *hybrid_overrides(settings, run_dir)]),
        "log": str(run_dir / "log.txt"),
    }
    result.update(_summary(step_seconds, rewards))
    result.update(load.summary())
    gen = result["phases"].get("gen", [])
    result["gen_mean_excl_first"] = sum(gen[1:]) / len(gen[1:]) if len(gen) > 1 else float("nan")
    return result


# ----------------------------------------------------------------------------- report
def _fmt(x, spec=".1f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def print_table(results: dict, machine: dict, threads: int, trl_key: str | None) -> None:
    rows = [r for r in results.values() if r]
    print()
    print(
        f"machine: {machine['cpu']}, {machine['cores']} cores, fast bf16: {machine['fast_bf16']}, "
        f"OMP/torch threads: {threads}"
    )
    header = (
        f"{'system':<22} {'s/step mean':>11} {'excl. step 1':>12} {'gen s excl. 1':>13} {'reward/step':>11} "
        f"{'resp len':>8} {'wall s':>7} {'load1 mean/max':>14}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['name']:<22} {_fmt(r['s_per_step_mean']):>11} {_fmt(r['s_per_step_mean_excl_first']):>12} "
            f"{_fmt(r.get('gen_mean_excl_first')):>13} {_fmt(r['reward_mean'], '.3f'):>11} "
            f"{_fmt(r.get('response_length_mean')):>8} {_fmt(r['wall_seconds'], '.0f'):>7} "
            f"{_fmt(r.get('load1_mean')) + '/' + _fmt(r.get('load1_max')):>14}"
        )
        if r.get("load1_max", 0) > threads + 1:
            print(
                f"  ^ the machine was busy during this run (1-min load up to {r['load1_max']:.1f} on "
                f"{machine['cores']} cores): its timing is not clean"
            )
    hybrid, trl = results.get("hybrid"), results.get(trl_key) if trl_key else None
    if hybrid and trl:
        ratio_all = hybrid["s_per_step_mean"] / trl["s_per_step_mean"]
        ratio_steady = hybrid["s_per_step_mean_excl_first"] / trl["s_per_step_mean_excl_first"]
        verdict = "meets" if ratio_steady <= GOAL_RATIO else "misses"
        print(
            f"ratio hybrid/{trl['name']}: {ratio_all:.2f} (all steps), {ratio_steady:.2f} (excl. step 1) -- "
            f"goal <= {GOAL_RATIO}: {verdict}"
        )
    if hybrid:
        print("hybrid per-phase seconds, mean excl. step 1 (all steps if only one):")
        for name, values in hybrid["phases"].items():
            vals = values[1:] if len(values) > 1 else values
            print(f"  {name:<16} {sum(vals) / len(vals):7.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=5, help="training steps for each system (default 5)")
    parser.add_argument("--skip-trl", action="store_true", help="run hybrid only")
    parser.add_argument("--skip-hybrid", action="store_true", help="run TRL only")
    parser.add_argument(
        "--trl-precision",
        choices=("auto", "fp32", "bf16", "both"),
        default="auto",
        help="TRL's precision: auto = bf16 where the CPU has fast bf16 matmuls, else fp32; "
        "both = run both, compare with the faster",
    )
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="OMP_NUM_THREADS for both runs (default: all cores)"
    )
    parser.add_argument(
        "--json",
        "--out",
        dest="json",
        type=Path,
        default=None,
        help="result JSON (default .bench/bench_vs_trl-<time>.json)",
    )
    parser.add_argument("--install-only", action="store_true", help="create TRL's virtual environment and stop")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")

    BENCH_DIR.mkdir(exist_ok=True)
    if args.install_only:
        print(f"bench: TRL's python is {ensure_trl_venv()}")
        return 0

    from hybrid.defaults import default_data_paths, default_model_path

    machine = machine_info()
    settings = shared_settings(args.steps)
    model_path = default_model_path()
    data = default_data_paths()
    rows = hybrid_order_rows(data["train"], args.steps * settings["prompts_per_step"], settings["data_seed"])

    results: dict[str, dict | None] = {}
    trl_key = None
    if not args.skip_trl:
        python = ensure_trl_venv()
        precision = args.trl_precision
        if precision == "auto":
            precision = "bf16" if machine["fast_bf16"] else "fp32"
        for p in ("fp32", "bf16") if precision == "both" else (precision,):
            results[f"trl_{p}"] = run_trl(
                python, settings, rows, model_path, bf16=(p == "bf16"), threads=args.threads, tag=p
            )
        trl_key = min(
            (k for k in results if k.startswith("trl_")), key=lambda k: results[k]["s_per_step_mean_excl_first"]
        )
    if not args.skip_hybrid:
        results["hybrid"] = run_hybrid(settings, args.threads)

    print_table(results, machine, args.threads, trl_key)
    hybrid, trl = results.get("hybrid"), results.get(trl_key) if trl_key else None
    report = {
        "machine": {**machine, "threads": args.threads},
        "settings": settings,
        "model_path": model_path,
        "train_file": data["train"],
        "command": " ".join(
            [".venv/bin/python", "-m", "scripts.bench_vs_trl", *(sys.argv[1:] if argv is None else argv)]
        ),
        "trl_compared": trl_key,
        "ratio_mean": hybrid["s_per_step_mean"] / trl["s_per_step_mean"] if hybrid and trl else None,
        "ratio_mean_excl_first": hybrid["s_per_step_mean_excl_first"] / trl["s_per_step_mean_excl_first"]
        if hybrid and trl
        else None,
        "goal_ratio": GOAL_RATIO,
        "results": results,
    }
    write_report("bench_vs_trl", report, args.json, BENCH_DIR)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
