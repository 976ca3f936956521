"""The reward loop against after-batch scoring, on the same job with a judge as the reward.

    python -m scripts.bench_reward_loop [--json PATH] [--steps 6] [--workload multi|single]
        [--judge-latency 1.0] [--judge-sigma 0.5] [--judge-concurrency 4] [--latency-mean 1.0]
        [--latency-sigma 1.0] [--seed 0] [--run-timeout 1800] [key=value ...]

Both runs train the default model on the default arithmetic prompts with the synchronous
colocated trainer and the agent loops (rollout.mode=async), 8 prompts x 4 samples a step,
`python -m hybrid.main_ppo` in a subprocess each (scripts/bench_async.py's runner). The reward
is a judge's verdict (reward_model.enable, use_reward_loop, judge.base_url, combine=rm_only)
from a hosted judge's stand-in (scripts/latency_judge.py): each verdict takes a seeded lognormal
time (`--judge-latency` mean, about one rollout turn of the workload) and at most
`--judge-concurrency` verdicts run at once; the verdict is the exact scorer's. What differs:

- after_batch: reward_model.enable_resource_pool=false (verl's colocated reward model): every
  trajectory is judged once the whole batch has generated.
- reward_loop: enable_resource_pool=true: each trajectory goes to the judge the moment it
  finishes, while the others still generate.

Workloads: `multi` (default), bench_async's latency-bound arithmetic_retry (each environment
step waits a lognormal time, mean `--latency-mean`), whose trajectories finish far apart;
`single`, the default single-turn job. Per run, means over the steps after the first: step time,
generation and scoring time, the time from a trajectory's last token to its score (reward_loop:
measured per trajectory, `reward_loop/last_token_to_score_s`; after_batch: generation time minus
the median trajectory's own time, plus the scoring time, an estimate of the median trajectory's
wait). `ratio_step_time` = reward_loop / after_batch step time; goal <= 0.85.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from scripts.bench_async import (
    PROMPTS,
    REPO,
    _cell,
    _mean,
    mode_overrides,
    run_overrides,
    run_setup,
    train,
    workload_overrides,
)
from scripts.bench_report import write_report
from scripts.latency_judge import LatencyJudge

BENCH_DIR = REPO / ".bench" / "bench_reward_loop"
MODES = ("after_batch", "reward_loop")
GOAL_RATIO = 0.85
RM = "reward_model"


def reward_overrides(mode: str, judge_url: str) -> list[str]:
    return [
        f"{RM}.enable=true",
        f"{RM}.use_reward_loop=true",
        f"{RM}.num_workers=2",
        f"{RM}.combine=rm_only",
        f"{RM}.judge.base_url={judge_url}",
        f"{RM}.judge.timeout_s=300",
        f"{RM}.enable_resource_pool={'true' if mode == 'reward_loop' else 'false'}",
    ]


def run_row(mode: str, records: list[dict]) -> dict:
    steps = sorted((r for r in records if "timing_s/step" in r), key=lambda r: r["step"])
    if len(steps) < 2:
        raise ValueError(f"{mode}: {len(steps)} step(s) logged; timing needs 2 or more")
    timed = steps[1:]
    row = {"mode": mode, "steps": len(steps)}
    for name, key in (("step_s", "step"), ("gen_s", "gen"), ("reward_s", "reward")):
        row[name] = _mean(r.get(f"timing_s/{key}") for r in timed)
    row["trajectory_p50_s"] = _mean(r.get("agent/latency_s/p50") for r in timed)
    measured = _mean(r.get("reward_loop/last_token_to_score_s/mean") for r in timed)
    if measured is not None:
        row["last_token_to_score_s"], row["last_token_to_score_kind"] = measured, "measured"
    else:
        row["last_token_to_score_s"] = row["gen_s"] - row["trajectory_p50_s"] + row["reward_s"]
        row["last_token_to_score_kind"] = "estimated"
    row["scored_in_rollout"] = _mean(r.get("reward_loop/scored_in_rollout_fraction") for r in timed)
    row["judge_ok_share"] = _mean(r.get("reward_loop/judge_ok", 0.0) / (PROMPTS * 4) for r in timed)
    row["score_mean"] = _mean(r.get("critic/score/mean") for r in steps)
    return row


def timed_run(mode: str, judge: LatencyJudge, args) -> dict:
    name = f"{args.workload}_{mode}"
    overrides = [
        *workload_overrides(args.workload, args.latency_mean, args.latency_sigma, args.seed),
        *mode_overrides("sync"),
        *reward_overrides(mode, judge.url),
        *run_overrides(args.steps, BENCH_DIR / name, name),
        *args.overrides,
    ]
    print(f"bench: {name}, {args.steps} steps", flush=True)
    judge.reset()
    result = train(name, overrides, args.run_timeout, bench_dir=BENCH_DIR)
    if "error" in result:
        print(f"bench: {name} FAILED ({result['error_kind']}): {result['command']}\n{result['error'][-2000:]}")
        return {"mode": mode, "ok": False, "error_kind": result["error_kind"], "command": result["command"]}
    row = {**run_row(mode, result["records"]), **judge.stats(), "ok": True, "wall_s": result["wall_s"]}
    row["command"] = result["command"]
    print(f"bench: {name}: step {row['step_s']:.2f} s, last token to score {row['last_token_to_score_s']:.2f} s")
    return row


def table_lines(rows: list[dict]) -> list[str]:
    head = (
        "| mode | step s | gen s | scoring after gen s | last token -> score s | scored in rollout "
        "| trajectory p50 s | verdict s | judge ok | score |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in (r for r in rows if r.get("ok")):
        lines.append(
            f"| {r['mode']} | {_cell(r['step_s'], '.2f')} | {_cell(r['gen_s'], '.2f')} | {_cell(r['reward_s'], '.2f')} "
            f"| {_cell(r['last_token_to_score_s'], '.2f')} ({r['last_token_to_score_kind']}) "
            f"| {_cell(r['scored_in_rollout'], '.0%')} | {_cell(r['trajectory_p50_s'], '.2f')} "
            f"| {_cell(r.get('verdict_s_mean'), '.2f')} | {_cell(r['judge_ok_share'], '.0%')} "
            f"| {_cell(r['score_mean'], '.3f')} |"
        )
    return lines


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_reward_loop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the numbers here (default .bench/bench_reward_loop/<time>.json)")
    parser.add_argument("--steps", type=int, default=6, help="training steps a run; the first is not timed")
    parser.add_argument("--workload", choices=("single", "multi"), default="multi")
    parser.add_argument("--judge-latency", type=float, default=1.0, help="mean seconds of one verdict")
    parser.add_argument("--judge-sigma", type=float, default=0.5)
    parser.add_argument("--judge-concurrency", type=int, default=4, help="verdicts the judge serves at once")
    parser.add_argument("--latency-mean", type=float, default=1.0, help="multi: mean environment wait")
    parser.add_argument("--latency-sigma", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-timeout", type=float, default=1800.0)
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value) for both runs")
    args = parser.parse_args(argv)
    if args.steps < 2 or args.judge_concurrency < 1:
        parser.error("--steps >= 2 and --judge-concurrency >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from hybrid.defaults import default_model_path

    started = time.perf_counter()
    model = default_model_path()
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    judge = LatencyJudge(args.judge_latency, args.judge_sigma, args.judge_concurrency, args.seed)
    try:
        rows = [timed_run(mode, judge, args) for mode in MODES]
    finally:
        judge.close()
    by_mode = {r["mode"]: r for r in rows if r.get("ok")}
    ratio = None
    if len(by_mode) == 2:
        ratio = by_mode["reward_loop"]["step_s"] / by_mode["after_batch"]["step_s"]
    doc = {
        "ratio_step_time": ratio,
        "goal_ratio_step_time": GOAL_RATIO,
        "passed": None if ratio is None else ratio <= GOAL_RATIO,
        "rows": rows,
        "setup": run_setup("bench_reward_loop", args, argv, model=model, bench_wall_s=time.perf_counter() - started),
    }
    print(
        f"\nhybrid {doc['setup']['commit']}, {doc['setup']['machine']}, model {model}; workload {args.workload}, "
        f"{args.steps} steps a run (step 1 not timed); judge: {args.judge_latency:g} s mean a verdict (sigma "
        f"{args.judge_sigma:g}), {args.judge_concurrency} at once"
    )
    print("\n".join(table_lines(rows)))
    verdict = {True: "PASS", False: "FAIL", None: "n/a "}[doc["passed"]]
    print(f"  {verdict}  ratio_step_time (reward_loop / after_batch): {_cell(ratio, '.3f')} (goal <= {GOAL_RATIO})")
    write_report("bench_reward_loop", doc, args.json, BENCH_DIR)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
