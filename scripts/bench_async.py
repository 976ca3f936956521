"""Asynchronous training against the synchronous colocated trainer, on the same job.

    python -m scripts.bench_async [--json PATH] [--steps 7] [--workload single|multi|both]
        [--modes sync,one_step_off,fully_async_s1,fully_async_s4] [--latency-mean 1.0]
        [--latency-sigma 1.0] [--seed 0] [--accuracy] [--accuracy-steps 20] [--val-size 100]
        [--quiet-load 1.0] [--quiet-wait 1200] [--run-timeout 1800] [key=value ...]

Every run is a real training run of `--steps` steps, `python -m hybrid.main_ppo` in a
subprocess of its own, with the default model (SmolLM2-135M) and the default arithmetic data,
no validation, no checkpoint, the file logger read back as the run goes. A subprocess per run
because each run starts and stops its own Ray cluster, vLLM engine(s) and training ranks: every
mode gets the same cold start and a clean memory, the latency environment (scripts/latency_env.py) is loaded from its
file by path in whichever process steps it (the fused worker, or the engine's actor), and a
mode that crashes or hangs is killed (its own process group) and reported with its command
while the other runs go on. Every mode runs the agent loops (`rollout.mode=async`), so what
differs is the training schedule alone:

- sync: the fused worker (hybrid_engine=true) generates, then trains, on all cores.
- one_step_off: hybrid_engine=false, one engine (rollout.n_gpus_per_node=1) beside one
  training rank (trainer.n_gpus_per_node=1): one core each; lag 1.
- fully_async_s1 / fully_async_s4: async_training.mode=fully_async, max_staleness_steps =
  staleness_threshold = 1 / 4, trigger_parameter_sync_step=1, require_batches=1 x
  ppo_mini_batch_size=8 groups a step (hybrid/async_trainer.py `_groups_per_step`).

Workloads, both 8 prompts x 4 samples a step: `single`, the default job (up to 48 tokens);
`multi`, arithmetic_retry (a wrong answer gets "Incorrect, try again.", up to 3 attempts)
whose every step first awaits a seeded lognormal latency (`--latency-mean` 1 s, sigma 1),
max_tokens_per_turn=24, data.max_response_length=96.

Timing skips step 1 (warm-up): steps/s = (steps - 1) / (seconds from step 1's metrics line to
the last one's), samples/s = steps/s x 32. Idle shares: async/trainer_idle_share and
async/generator_idle_share (sync: generation's share of the step, and the rest). A timed run
starts once the 1-minute load average is below `--quiet-load` (polled every 30 s, up to
`--quiet-wait` s); each row shows it before and after, and other processes' CPU share meanwhile.
Goals: on `multi`, fully_async_s4 >= 1.8x sync's samples/s with trainer idle <= 10%;
`--accuracy`: held-out greedy episode success after `--accuracy-steps` steps, sync vs
fully_async_s4, within 3 points.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from scripts import latency_env
from scripts.bench_agent_loop import device_name
from scripts.bench_report import git_commit, write_report

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / ".bench" / "bench_async"
ENV_SPEC = f"{Path(latency_env.__file__).resolve()}:LatencyRetryEnv"
MODES = ("sync", "one_step_off", "fully_async_s1", "fully_async_s4")
WORKLOADS = ("single", "multi")
PROMPTS, N = 8, 4
R, AT = "actor_rollout_ref.rollout", "async_training"
MT = f"{R}.multi_turn"
GOAL_RATIO, GOAL_IDLE, GOAL_ACCURACY_POINTS = 1.8, 0.10, 3.0
# Also kept per row (means over the timed steps): what the rollout did and where its time went.
EXTRA_METRICS = (
    "multi_turn/env/env_latency_s", "multi_turn/turns/mean", "multi_turn/finish_reason/length", "agent/in_flight/mean",
    "agent/engine_busy_share", "agent/env_wait_share", "agent/latency_s/p95", "async/staleness/mean",
)  # fmt: skip

# ---------------------------------------------------------------------- the runs' settings


def mode_overrides(mode: str) -> list[str]:
    """The keys that make `mode` (every mode runs the agent loops: rollout.mode=async)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    common = [f"{R}.mode=async"]
    if mode == "sync":
        return common
    apart = [*common, "actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1"]
    if mode == "one_step_off":
        return [*apart, f"{AT}.mode=one_step_off", f"{AT}.max_staleness_steps=1"]
    bound = int(mode.removeprefix("fully_async_s"))
    return [
        *apart,
        f"{AT}.mode=fully_async",
        f"{AT}.max_staleness_steps={bound}",
        f"{AT}.staleness_threshold={bound}",
        f"{AT}.trigger_parameter_sync_step=1",
        f"{AT}.require_batches=1",
    ]


def workload_overrides(workload: str, latency_mean: float, latency_sigma: float, seed: int) -> list[str]:
    """8 prompts x 4 samples a step, one mini-batch (fully async: 8 groups a step)."""
    common = [
        f"data.train_batch_size={PROMPTS}",
        f"{R}.n={N}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
    ]
    if workload == "single":
        return common
    return [
        *common,
        f"{MT}.enable=true",
        f"{MT}.env_class='{ENV_SPEC}'",
        f"{MT}.env_kwargs.seed={seed}",
        f"{MT}.env_kwargs.latency_mean={latency_mean}",
        f"{MT}.env_kwargs.latency_sigma={latency_sigma}",
        f"{MT}.max_assistant_turns=3",
        f"{MT}.max_tokens_per_turn=24",
        f"{MT}.reward_placement=final",
        f"{MT}.env_step_timeout_s=600",  # far above any wait drawn: a time-out would cut a trajectory
        "data.max_response_length=96",
    ]


def run_overrides(steps: int, run_dir: Path, name: str, val_files: str | None = None) -> list[str]:
    """Steps, the file logger into `run_dir`, no checkpoint; validation only with `val_files`
    (before training and after the last step)."""
    base = [
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=-1",
        "trainer.logger=[console,file]",
        "trainer.plot_on_finish=false",
        "trainer.merge_on_finish=false",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.experiment_name=bench_async_{name}",
    ]
    if val_files is None:
        return [*base, "trainer.test_freq=-1", "trainer.val_before_train=false"]
    return [*base, f"trainer.test_freq={steps}", "trainer.val_before_train=true", f"data.val_files={val_files}"]


# ---------------------------------------------------------------------- rows, ratios, goals, JSON


def _mean(values) -> float | None:
    values = [float(v) for v in values if v is not None]
    return sum(values) / len(values) if values else None


def run_row(mode: str, workload: str, records: list[dict], arrivals: dict[int, float]) -> dict:
    """A table row from a run's step records (metrics.jsonl) and when each line appeared."""
    steps = sorted((r for r in records if "timing_s/step" in r), key=lambda r: r["step"])
    if len(steps) < 2:
        raise ValueError(f"{workload}/{mode}: {len(steps)} step(s) logged; timing needs 2 or more")
    timed = steps[1:]  # step 1 is the warm-up
    span = arrivals[steps[-1]["step"]] - arrivals[steps[0]["step"]]
    steps_per_s = len(timed) / span
    row = {"workload": workload, "mode": mode, "steps": len(steps), "timed_steps": len(timed), "timed_s": span}
    row.update({"steps_per_s": steps_per_s, "samples_per_s": steps_per_s * PROMPTS * N})
    row["step_s_sum"] = sum(float(r["timing_s/step"]) for r in timed)
    if mode == "sync":
        gen_share = _mean(float(r.get("timing_s/gen", 0.0)) / float(r["timing_s/step"]) for r in timed)
        row.update(trainer_idle_share=gen_share, generator_idle_share=1.0 - gen_share)
        row.update(max_staleness=None, dropped_groups=None)
    else:
        row["trainer_idle_share"] = _mean(r.get("async/trainer_idle_share") for r in timed)
        row["generator_idle_share"] = _mean(r.get("async/generator_idle_share") for r in timed)
        row["max_staleness"] = max(float(r.get("async/staleness/max", 0.0)) for r in steps)
        last = steps[-1]
        row["dropped_groups"] = int(last.get("async/dropped_stale", 0) + last.get("async/dropped_flat", 0))
        row["queue_depth_mean"] = _mean(r.get("async/queue_depth") for r in timed)
    keys = sorted({k for r in timed for k in r if k.startswith("timing_s/")})
    row["timing_s"] = {k.removeprefix("timing_s/"): _mean(r.get(k) for r in timed) for k in keys}
    for name, key in (("score_mean", "critic/score/mean"), ("response_length_mean", "response_length/mean")):
        row[name] = _mean(r.get(key) for r in steps)
    for key in (k for k in EXTRA_METRICS if any(k in r for r in steps)):
        row[key] = _mean(r.get(key) for r in timed)
    return row


def work_ceiling(sync: dict) -> float | None:
    """The most any schedule on the same cores can gain over `sync` if the work is CPU-bound:
    splitting the cores between roles does not shrink the work, it can only fill the time the
    sync step leaves the cores idle, which is generation's share of the step times the share of
    generation with no request in the engine (every trajectory waiting on its environment)."""
    busy = sync.get("agent/engine_busy_share")
    if busy is None or sync.get("trainer_idle_share") is None:
        return None
    return 1.0 / (1.0 - sync["trainer_idle_share"] * (1.0 - busy))


def add_ratios(rows: list[dict]) -> None:
    """Each row's samples/s over its workload's sync row (None without one), and that
    workload's work-conservation ceiling."""
    sync = {r["workload"]: r for r in rows if r["mode"] == "sync" and r.get("ok", True)}
    for row in rows:
        base = sync.get(row["workload"])
        ok = row.get("ok", True) and base is not None
        row["ratio"] = row["samples_per_s"] / base["samples_per_s"] if ok else None
        row["work_ceiling"] = work_ceiling(base) if base is not None else None


def val_success(records: list[dict]) -> dict:
    """{step: held-out success} from the validation lines (val-core/<source>/reward/mean@1)."""
    out = {}
    for record in records:
        for key, value in record.items():
            if key.startswith("val-core/") and key.endswith("/reward/mean@1") and value is not None:
                out[int(record["step"])] = float(value)
    return out


def accuracy_result(sync_val: dict, async_val: dict, steps: int) -> dict:
    after_sync, after_async = sync_val.get(steps), async_val.get(steps)
    gap = None if after_sync is None or after_async is None else 100.0 * (after_async - after_sync)
    return {"steps": steps, "sync": sync_val, "fully_async_s4": async_val, "gap_points": gap}


def goal(name: str, value, target: str, test) -> dict:
    return {"goal": name, "value": value, "target": target, "passed": None if value is None else bool(test(value))}


def goals(ratio, idle, gap) -> list[dict]:
    return [
        goal("multi: fully_async_s4 / sync samples/s", ratio, f">= {GOAL_RATIO}", lambda v: v >= GOAL_RATIO),
        goal("multi: fully_async_s4 trainer idle share", idle, f"<= {GOAL_IDLE}", lambda v: v <= GOAL_IDLE),
        goal("accuracy: fully_async_s4 - sync held-out success, points", gap, f"|gap| <= {GOAL_ACCURACY_POINTS:g}",
             lambda v: abs(v) <= GOAL_ACCURACY_POINTS),
    ]  # fmt: skip


def summary(rows: list[dict], accuracy: dict | None, setup: dict) -> dict:
    """The JSON document: the headline numbers at the top, then goals, rows, accuracy, setup."""
    add_ratios(rows)
    by = {(r["workload"], r["mode"]): r for r in rows if r.get("ok", True)}
    latency, single = by.get(("multi", "fully_async_s4")), by.get(("single", "fully_async_s4"))
    stale = [r["max_staleness"] for r in by.values() if r["mode"] != "sync" and r.get("max_staleness") is not None]
    gap = accuracy["gap_points"] if accuracy else None
    ratio, idle = (latency["ratio"], latency["trainer_idle_share"]) if latency else (None, None)
    return {
        "ratio_fully_async_latency": ratio,
        "max_staleness_seen": max(stale) if stale else None,
        "trainer_idle_share": idle,
        "ratio_fully_async_single": single["ratio"] if single else None,
        "work_ceiling_latency": latency["work_ceiling"] if latency else None,
        "goals": goals(ratio, idle, gap),
        "rows": rows,
        "accuracy": accuracy,
        "setup": setup,
    }


def _cell(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_lines(rows: list[dict], workload: str) -> list[str]:
    """The workload's table: one line per mode, then each mode's mean step breakdown."""
    head = (
        f"{'mode':<15} {'steps/s':>8} {'samples/s':>9} {'trainer idle':>12} {'gen idle':>8} {'max stale':>9} "
        f"{'dropped':>7} {'ratio':>6} {'load before->after':>18} {'other CPU':>9} {'wall s':>7}"
    )
    lines, breakdown = [head, "-" * len(head)], []
    for r in (r for r in rows if r["workload"] == workload):
        load = f"{_cell(r.get('load_before'), '.2f')} -> {_cell(r.get('load_after'), '.2f')}"
        if not r.get("ok", True):
            lines.append(f"{r['mode']:<15} FAILED ({r.get('error_kind')}); load {load}; see below")
            continue
        lines.append(
            f"{r['mode']:<15} {r['steps_per_s']:>8.4f} {r['samples_per_s']:>9.3f} "
            f"{_cell(r['trainer_idle_share'], '.1%'):>12} {_cell(r['generator_idle_share'], '.1%'):>8} "
            f"{_cell(r['max_staleness'], '.0f'):>9} {_cell(r['dropped_groups'], 'd'):>7} {_cell(r['ratio'], '.2f'):>6} "
            f"{load:>18} {_cell(r.get('other_cpu_share'), '.1%'):>9} {_cell(r.get('wall_s'), '.0f'):>7}"
        )
        parts = ", ".join(f"{k} {v:.2f}" for k, v in r["timing_s"].items() if v is not None and v >= 0.005)
        breakdown.append(f"  {r['mode']}: mean s/step excl. step 1: {parts}")
    return lines + breakdown


# ---------------------------------------------------------------------- the shared machine


def wait_for_quiet(limit: float, poll_s: float, max_wait_s: float, load=os.getloadavg, sleep=time.sleep) -> dict:
    """Wait until the 1-minute load average is below `limit` (at most `max_wait_s`)."""
    waited = 0.0
    while True:
        now = load()[0]
        if now < limit or waited >= max_wait_s:
            return {"load_before": round(now, 2), "load_waited_s": waited, "quiet": now < limit}
        print(f"  load average {now:.2f} >= {limit:g}: waiting ({waited:.0f} of {max_wait_s:.0f} s)", flush=True)
        sleep(poll_s)
        waited += poll_s


def proc_table() -> dict[int, tuple[int, int, float]]:
    """pid -> (parent pid, session id, CPU seconds used) of every process on the machine."""
    tick, table = os.sysconf("SC_CLK_TCK"), {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(name)] = (int(fields[1]), int(fields[3]), (int(fields[11]) + int(fields[12])) / tick)
    return table


def others(table: dict, root: int, session: int) -> dict[int, float]:
    """CPU seconds of the processes that are not `root`'s descendants nor in `session`."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    ours, todo = set(), [root]
    while todo:
        pid = todo.pop()
        ours.add(pid)
        todo.extend(children.get(pid, []))
    return {pid: cpu for pid, (_, sid, cpu) in table.items() if pid not in ours and sid != session}


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two samples (a process new in `after` counts all of its own)."""
    return sum(max(cpu - before.get(pid, 0.0), 0.0) for pid, cpu in after.items())


# ---------------------------------------------------------------------- one training run


class MetricsTail:
    """metrics.jsonl read as it grows: every record, and when each step's line appeared."""

    def __init__(self, path: Path):
        self.path, self.offset, self.records, self.arrivals = path, 0, [], {}

    def poll(self) -> None:
        if not self.path.exists():
            return
        with open(self.path) as f:
            f.seek(self.offset)
            text = f.read()
        now, complete = time.perf_counter(), text[: text.rfind("\n") + 1]
        self.offset += len(complete.encode())
        for line in filter(None, complete.splitlines()):
            record = json.loads(line)
            self.records.append(record)
            if "timing_s/step" in record:
                self.arrivals.setdefault(int(record["step"]), now)


def _stop(proc: subprocess.Popen) -> None:
    """End the run's process group (started by this bench): SIGTERM, then SIGKILL after 60 s."""
    for sig, grace in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


def train(name: str, overrides: list[str], timeout_s: float, bench_dir: Path = BENCH_DIR) -> dict:
    """One `python -m hybrid.main_ppo` run (its overrides write to bench_dir/name): its records,
    line times, wall, load after, other processes' CPU share, and the error (exit status and
    log tail) if it failed or hung."""
    run_dir = bench_dir / name
    for path in run_dir.glob("*.json*"):
        path.unlink()  # metrics.jsonl appends: a previous run's lines would be read as this one's
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = ["-m", "hybrid.main_ppo", *overrides]
    tail, start, timed_out = MetricsTail(run_dir / "metrics.jsonl"), time.perf_counter(), False
    with open(run_dir / "log.txt", "w") as log:
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
        proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        sample, other_s, next_sample = others(proc_table(), os.getpid(), proc.pid), 0.0, time.perf_counter() + 5
        while proc.poll() is None:
            time.sleep(0.5)
            tail.poll()
            if time.perf_counter() >= next_sample:
                now = others(proc_table(), os.getpid(), proc.pid)
                other_s, sample, next_sample = other_s + cpu_delta(sample, now), now, next_sample + 5
            if time.perf_counter() - start > timeout_s:
                timed_out = True
                _stop(proc)
    tail.poll()
    wall = time.perf_counter() - start
    out = {"records": tail.records, "arrivals": tail.arrivals, "wall_s": wall, "rc": proc.returncode}
    out.update(load_after=round(os.getloadavg()[0], 2), other_cpu_share=other_s / (wall * (os.cpu_count() or 1)))
    out.update(command=" ".join(["python", *argv]), log=str(run_dir / "log.txt"))
    if timed_out or proc.returncode != 0:
        out["error_kind"] = f"no end after {timeout_s:.0f} s: killed" if timed_out else f"exit {proc.returncode}"
        out["error"] = (run_dir / "log.txt").read_text(errors="replace")[-4000:]
    return out


def timed_run(workload: str, mode: str, args) -> dict:
    """Wait for a quiet machine, train, and make the table row (or a failed row)."""
    quiet = wait_for_quiet(args.quiet_load, 30.0, args.quiet_wait)
    name = f"{workload}_{mode}"
    overrides = [
        *workload_overrides(workload, args.latency_mean, args.latency_sigma, args.seed),
        *mode_overrides(mode),
        *run_overrides(args.steps, BENCH_DIR / name, name),
        *args.overrides,
    ]
    print(f"bench: {name}, {args.steps} steps (load {quiet['load_before']:.2f})", flush=True)
    result = train(name, overrides, args.run_timeout)
    meta = {k: result[k] for k in ("wall_s", "load_after", "other_cpu_share", "command", "log", "rc")}
    try:
        if "error" in result:
            raise RuntimeError(result["error_kind"])
        row = {**run_row(mode, workload, result["records"], result["arrivals"]), **quiet, **meta, "ok": True}
    except (RuntimeError, ValueError, KeyError) as error:
        row = {"workload": workload, "mode": mode, **quiet, **meta, "ok": False, "error_kind": str(error)}
        row["error"] = result.get("error", "")
        print(f"bench: {name} FAILED ({error}); reproduce with: {result['command']}\n{row['error'][-1500:]}")
        return row
    print(f"bench: {name}: {row['samples_per_s']:.3f} samples/s, wall {row['wall_s']:.0f} s, load after "
          f"{row['load_after']:.2f}, other CPU {row['other_cpu_share']:.1%}", flush=True)  # fmt: skip
    return row


# ---------------------------------------------------------------------- accuracy, report, main


def small_val_file(size: int) -> str:
    """The first `size` rows of the default validation set, as a parquet file of their own."""
    import pyarrow.parquet as pq

    from hybrid.defaults import default_data_paths

    table = pq.read_table(default_data_paths()["val"])
    path = BENCH_DIR / f"val_{size}.parquet"
    pq.write_table(table.slice(0, min(size, table.num_rows)), path)
    return str(path)


def accuracy_runs(args) -> dict:
    """sync and fully_async_s4 on the latency job for `--accuracy-steps` steps (the same
    samples), greedy validation of `--val-size` held-out questions before and after."""
    val_files, found, errors = small_val_file(args.val_size), {}, {}
    for mode in ("sync", "fully_async_s4"):
        name = f"accuracy_{mode}"
        overrides = [
            *workload_overrides("multi", args.latency_mean, args.latency_sigma, args.seed),
            *mode_overrides(mode),
            *run_overrides(args.accuracy_steps, BENCH_DIR / name, name, val_files),
            *args.overrides,
        ]
        print(f"bench: {name}, {args.accuracy_steps} steps with validation (not timed)", flush=True)
        result = train(name, overrides, max(args.run_timeout, 120.0 * args.accuracy_steps))
        found[mode] = val_success(result["records"])
        if "error" in result:
            errors[mode] = {"kind": result["error_kind"], "command": result["command"], "log_tail": result["error"]}
            print(f"bench: {name} FAILED ({result['error_kind']}); reproduce with: {result['command']}")
        print(f"bench: {name}: held-out success by step {found[mode]}, wall {result['wall_s']:.0f} s", flush=True)
    out = accuracy_result(found["sync"], found["fully_async_s4"], args.accuracy_steps)
    return {**out, "val_size": args.val_size, "val_files": val_files, "errors": errors}


def run_setup(bench: str, args, argv: list[str] | None, **more) -> dict:
    """The `setup` record of a bench's JSON: its arguments, machine, commit and command line."""
    return {
        **{k: v for k, v in vars(args).items() if k != "json"},
        "machine": device_name(),
        "commit": git_commit(),
        **more,
        "command": " ".join([f"python -m scripts.{bench}", *(sys.argv[1:] if argv is None else argv)]),
    }


def print_report(doc: dict, args) -> None:
    setup = doc["setup"]
    print(
        f"\nhybrid {setup['commit']}, {setup['machine']}, model {setup['model']}; {args.steps} steps a run (step 1 "
        f"not timed), 8 prompts x 4 samples a step; load average {setup['load_start']} at the start, "
        f"{setup['load_end']} at the end; bench wall {setup['bench_wall_s'] / 60:.1f} min"
    )
    titles = {
        "single": "single: the default job (single turn, up to 48 tokens)",
        "multi": f"multi: arithmetic_retry, up to 3 attempts x 24 tokens, each env step waits a lognormal "
        f"latency (mean {args.latency_mean:g} s, sigma {args.latency_sigma:g})",
    }
    for workload in dict.fromkeys(r["workload"] for r in doc["rows"]):
        print(f"\n{titles[workload]}")
        print("\n".join(table_lines(doc["rows"], workload)))
    for row in (r for r in doc["rows"] if r["mode"] == "sync" and r.get("work_ceiling") is not None):
        gen, empty = row["trainer_idle_share"], 1 - row["agent/engine_busy_share"]
        print(
            f"{row['workload']}: sync leaves the cores idle {gen * empty:.1%} of a step (generation {gen:.1%} of it, "
            f"the engine empty {empty:.1%} of that): a CPU-bound job gains at most {row['work_ceiling']:.2f}x"
        )
    single = doc["ratio_fully_async_single"]
    print(f"\nsingle-turn fully_async_s4 / sync samples/s: {_cell(single, '.2f')} (reported, no goal)")
    print(f"max staleness seen over every async run: {_cell(doc['max_staleness_seen'], '.0f')}")
    accuracy = doc["accuracy"]
    if accuracy:
        print(
            f"accuracy ({accuracy['val_size']} held-out questions, greedy, after {accuracy['steps']} steps): "
            f"sync {accuracy['sync']}, fully_async_s4 {accuracy['fully_async_s4']}"
        )
    for g in doc["goals"]:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[g["passed"]]
        print(f"  {verdict}  {g['goal']}: {_cell(g['value'], '.3f')} (goal {g['target']})")
    for row in (r for r in doc["rows"] if not r.get("ok", True)):
        print(
            f"\nFAILED {row['workload']}/{row['mode']} ({row['error_kind']}): {row['command']}\n{row['error'][-2000:]}"
        )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_async", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the numbers here (default .bench/bench_async/bench_async-<time>.json)")
    parser.add_argument("--steps", type=int, default=7, help="training steps a run; the first is not timed")
    parser.add_argument("--workload", choices=("single", "multi", "both"), default="both")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    parser.add_argument("--latency-mean", type=float, default=1.0)
    parser.add_argument("--latency-sigma", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0, help="the latency draws' seed")
    parser.add_argument("--accuracy", action="store_true", help="also the held-out accuracy check (long)")
    parser.add_argument("--accuracy-steps", type=int, default=20)
    parser.add_argument("--val-size", type=int, default=100, help="held-out questions of the accuracy check")
    parser.add_argument("--quiet-load", type=float, default=1.0, help="start a timed run below this 1-min load")
    parser.add_argument("--quiet-wait", type=float, default=1200.0, help="longest wait for that, seconds")
    parser.add_argument("--run-timeout", type=float, default=1800.0, help="a run still going after this is killed")
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value) for every run")
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown or args.steps < 2 or args.latency_mean < 0:
        parser.error(f"modes from {', '.join(MODES)} (got {unknown}); --steps >= 2; --latency-mean >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from hybrid.defaults import default_model_path

    started, load_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    model = default_model_path()  # converted once here, before any timed run
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    workloads = WORKLOADS if args.workload == "both" else (args.workload,)
    rows = [timed_run(workload, mode, args) for workload in workloads for mode in args.modes]
    accuracy = accuracy_runs(args) if args.accuracy else None
    setup = run_setup(
        "bench_async",
        args,
        argv,
        model=model,
        omp_num_threads=os.environ.get("OMP_NUM_THREADS", "unset (main_ppo: all cores)"),
        load_start=load_start,
        load_end=[round(x, 2) for x in os.getloadavg()],
        bench_wall_s=time.perf_counter() - started,
    )
    doc = summary(rows, accuracy, setup)
    print_report(doc, args)
    write_report("bench_async", doc, args.json, BENCH_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
