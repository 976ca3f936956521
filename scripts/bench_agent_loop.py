"""Agent loops (rollout mode=async) against the lock-step multi-turn loop, with environments
that take time to answer.

    python -m scripts.bench_agent_loop [--json PATH] [--trajectories 64] [--turns 3]
        [--tokens-per-turn 32] [--latency-mean 1.0] [--latency-sigma 1.0] [--seed 0]
        [--repeats 1] [--model default|PATH] [key=value ...]

One process, one in-process engine (`VLLMRollout`, real weights: load_format=hf, the config's
dtype, `auto`: bf16 where the hardware has fast bf16), `--trajectories` distinct arithmetic
prompts x n=1 (one prompt per trajectory: the environment seeds its waits by the row's
`index`). Equal work in both modes: temperature 1 (training settings), ignore_eos and
max_tokens_per_turn, so every model turn is exactly `--tokens-per-turn` tokens. The
environment's `async def step` sleeps a lognormal wait of mean `--latency-mean` (mu =
ln(mean) - sigma^2/2) seeded per (seed, trajectory, turn), so both modes see the same
waits; it answers a fixed user message, and is done after the model's `--turns`th turn.

- lock-step: `VLLMRollout.generate_sequences`, mode=sync (`MultiTurnLoop`): one batched engine
  call per turn, then every step in the pool (env_workers = trajectories: all waits overlap).
- async: `AgentRollout(engine).generate_sequences`: a coroutine per trajectory through
  `AsyncEngineDriver`, which the bench replaces with a subclass that stamps every request
  (arrival, admission, finishing step, resume) and every engine step (the printed profile).

After an untimed warm-up of each mode: both modes at `--latency-mean`, then at zero, each
`--repeats` times (medians). Async's lower bound at the latency run is the larger of (a) the
engine's busy seconds in that very run (`AsyncEngineDriver.stats().busy_s`, the per-sample
`agent_engine_busy_share` x wall): the run cannot end before its engine work does, and the
same run sees the same load on this shared machine (the zero-latency lock-step's fully
batched engine seconds are printed beside it); (b) the slowest trajectory's drawn waits plus
`--turns` turns of one request alone, timed through a driver as the agent loops use it (a
turn is never faster than alone). `async_over_bound` = async wall / bound. Goals: async
>= 2.0x lock-step trajectories/s at the latency run, wall <= 1.15x bound, >= 0.95x lock-step
at zero latency. OMP_NUM_THREADS and OMP_WAIT_POLICY are the caller's; the header prints
them and one batched turn on the main thread (lock-step's) and on a fresh one (the
driver's): libgomp spins or sleeps at barriers by thread and load, several-fold apart.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import statistics
import sys
import threading
import time

import numpy as np

from reward.environments import BaseTextEnv, register_env
from scripts.latency_env import lognormal_mu

ENV_NAME = "bench_agent_latency"
R = "actor_rollout_ref.rollout"
MT = f"{R}.multi_turn"
OBSERVATION = "Continue."
# Room per turn for EOS + the rendered observation (about 13 tokens with SmolLM2's template).
OBSERVATION_ROOM = 24
PROMPT_WIDTH = 64
GOAL_RATIO_LATENCY, GOAL_OVER_BOUND, GOAL_RATIO_ZERO = 2.0, 1.15, 0.95


# ---------------------------------------------------------------------- pure parts


def draw_latency(seed: int, trajectory: int, turn: int, mean: float, sigma: float) -> float:
    """The environment's wait at `turn` (1-based) of `trajectory`: the same in every mode and
    repeat, whatever order the steps run in. Zero when mean <= 0."""
    if mean <= 0:
        return 0.0
    rng = np.random.default_rng([seed, trajectory, turn])
    return float(rng.lognormal(lognormal_mu(mean, sigma), sigma))


def trajectory_waits(seed: int, trajectories: int, turns: int, mean: float, sigma: float) -> list[float]:
    """Each trajectory's sum of waits over its turns (one step after every model turn)."""
    return [sum(draw_latency(seed, i, t, mean, sigma) for t in range(1, turns + 1)) for i in range(trajectories)]


def lower_bound(engine_busy_s: float, waits: list[float], turn_s: float, turns: int) -> dict:
    """Async's lower bound: the larger of the engine's busy time (a) and the slowest
    trajectory's waits plus its own `turns` model turns of at least `turn_s` each (b)."""
    slowest = max(range(len(waits)), key=waits.__getitem__)
    trajectory_s = waits[slowest] + turns * turn_s
    return {
        "engine_busy_s": engine_busy_s,
        "slowest_trajectory": slowest,
        "slowest_env_wait_s": waits[slowest],
        "single_request_turn_s": turn_s,
        "slowest_generation_s": turns * turn_s,
        "slowest_trajectory_s": trajectory_s,
        "bound_s": max(engine_busy_s, trajectory_s),
        "binding": "engine" if engine_busy_s >= trajectory_s else "slowest_trajectory",
    }


def goals(ratio_latency: float, over_bound: float, ratio_zero: float) -> list[dict]:
    return [
        {"goal": "async / lock-step trajectories/s at the latency run", "value": ratio_latency, "target": ">= 2.0",
         "passed": ratio_latency >= GOAL_RATIO_LATENCY},
        {"goal": "async wall / its lower bound", "value": over_bound, "target": "<= 1.15",
         "passed": over_bound <= GOAL_OVER_BOUND},
        {"goal": "async / lock-step trajectories/s at zero latency", "value": ratio_zero, "target": ">= 0.95",
         "passed": ratio_zero >= GOAL_RATIO_ZERO},
    ]  # fmt: skip


def median_row(mode: str, latency: float, runs: list[dict], trajectories: int) -> dict:
    """One table row from the repeats of a run: the median of each number."""
    wall = statistics.median(r["wall_s"] for r in runs)
    row = {"mode": mode, "latency_mean_s": latency, "wall_s": wall, "trajectories_per_s": trajectories / wall}
    for key in runs[0]:
        if key not in row and isinstance(runs[0][key], (int, float)):
            row[key] = statistics.median(r[key] for r in runs)
    row["walls_s"] = [r["wall_s"] for r in runs]
    return row


def summary(rows: list[dict], bound: dict, setup: dict) -> dict:
    """The JSON document: the ratios and async_over_bound at the top, then rows and parts."""
    by = {(r["mode"], r["latency_mean_s"]): r for r in rows}
    latency = max(r["latency_mean_s"] for r in rows)
    ratio_latency = by["async", latency]["trajectories_per_s"] / by["lock-step", latency]["trajectories_per_s"]
    ratio_zero = by["async", 0.0]["trajectories_per_s"] / by["lock-step", 0.0]["trajectories_per_s"]
    over_bound = by["async", latency]["wall_s"] / bound["bound_s"]
    return {
        "ratio_latency_1s": ratio_latency,
        "ratio_latency_0s": ratio_zero,
        "async_over_bound": over_bound,
        "goals": goals(ratio_latency, over_bound, ratio_zero),
        "rows": rows,
        "bound": bound,
        "setup": setup,
    }


# ---------------------------------------------------------------------- the environment


@register_env(ENV_NAME)
class LatencyEnv(BaseTextEnv):
    """Waits its drawn latency (asyncio.sleep: an async client), answers OBSERVATION, and is
    done after env_kwargs.turns model turns. env_kwargs: seed, latency_mean, latency_sigma, turns."""

    async def step(self, action):
        self.turns += 1
        config = self.env_config
        seed, mean, sigma = int(config["seed"]), float(config["latency_mean"]), float(config["latency_sigma"])
        wait = draw_latency(seed, int(self.extras["index"]), self.turns, mean, sigma)
        if wait > 0:
            await asyncio.sleep(wait)
        done = self.turns >= int(config["turns"])
        observations = [] if done else [{"role": "user", "content": OBSERVATION}]
        return {"observations": observations, "reward": 0.0, "done": done, "metadata": {"wait_s": wait}}


# ---------------------------------------------------------------------- where async time goes


class _EngineProbe:
    """The engine as the driver's thread sees it: stamps admissions, each step (start, end,
    requests in the engine) and each finishing step."""

    def __init__(self, engine, driver):
        self._engine, self._driver = engine, driver

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def add_request(self, *args, **kwargs):
        self._driver.trace["admitted"].append(time.perf_counter())
        return self._engine.add_request(*args, **kwargs)

    def step(self):
        start, in_engine = time.perf_counter(), len(self._driver._running)
        outputs = self._engine.step()
        end = time.perf_counter()
        self._driver.trace["steps"].append((start, end, in_engine))
        self._driver.trace["finished"] += [end] * sum(1 for output in outputs if output.finished)
        return outputs


def tracing_driver_class():
    """AsyncEngineDriver that stamps every request: arrival (generate called), admission
    (add_request), finish (its last step ends), resume (the coroutine has the result).
    `Bench` installs it in place of agent_rollout's driver."""
    from workers.rollout.async_engine import AsyncEngineDriver

    class TracingDriver(AsyncEngineDriver):
        last = None

        def __init__(self, llm, name: str = "async-engine", **kwargs):
            super().__init__(llm, name, **kwargs)
            self.trace = {"arrived": [], "admitted": [], "finished": [], "resumed": [], "steps": []}
            self._engine = _EngineProbe(self._engine, self)
            TracingDriver.last = self

        async def generate(self, prompt_ids, params):
            self.trace["arrived"].append(time.perf_counter())
            turn = await super().generate(prompt_ids, params)
            self.trace["resumed"].append(time.perf_counter())
            return turn

    return TracingDriver


def timeline_summary(trace: dict, trajectory_busy_s: float) -> dict:
    """Request seconds summed over requests (all end, so sums need no pairing): queued
    (arrival -> admission), in the engine (-> finishing step), handed back (-> resumed);
    `outside_s`: trajectory time in neither an environment call nor a request (agent code,
    tokenizer lock, event loops). Engine steps: count, busy s, gaps, requests per step
    (time-weighted), median step at <= 8 and > 32 requests in the engine."""
    arrived, admitted, finished, resumed = (sum(trace[k]) for k in ("arrived", "admitted", "finished", "resumed"))
    steps = trace["steps"]
    busy = sum(end - start for start, end, _ in steps)
    span = steps[-1][1] - steps[0][0] if steps else 0.0
    small = [end - start for start, end, n in steps if n <= 8]
    large = [end - start for start, end, n in steps if n > 32]
    return {
        "requests": len(trace["resumed"]),
        "request_queued_s": admitted - arrived,
        "request_engine_s": finished - admitted,
        "request_handback_s": resumed - finished,
        "outside_s": trajectory_busy_s - (resumed - arrived),
        "steps": len(steps),
        "step_busy_s": busy,
        "step_gaps_s": span - busy,
        "step_requests_mean": sum((end - start) * n for start, end, n in steps) / busy if busy else 0.0,
        "step_s_at_1_to_8": statistics.median(small) if small else 0.0,
        "step_s_above_32": statistics.median(large) if large else 0.0,
    }


# ---------------------------------------------------------------------- engine and prompts


def build_config(args):
    from hybrid.config import build_config as build
    from hybrid.defaults import default_model_path

    model = default_model_path() if args.model == "default" else args.model
    return build(
        [
            f"actor_rollout_ref.model.path={model}",
            f"{R}.n=1",
            f"{R}.temperature=1.0",
            f"{R}.ignore_eos=true",
            f"{R}.load_format=hf",
            f"{R}.mode=sync",
            f"data.max_prompt_length={PROMPT_WIDTH}",
            f"data.max_response_length={args.turns * (args.tokens_per_turn + OBSERVATION_ROOM)}",
            f"{MT}.enable=true",
            f"{MT}.env_class={ENV_NAME}",
            f"{MT}.max_tokens_per_turn={args.tokens_per_turn}",
            f"{MT}.env_workers={args.trajectories}",
            # Far above any wait drawn here: a time-out would end a trajectory early (less work).
            f"{MT}.env_step_timeout_s=600",
            *args.overrides,
        ]
    )


def question_chats(count: int, seed: int) -> list[list[dict]]:
    """`count` distinct one-message chats (arithmetic questions of the default task's kind)."""
    rng = np.random.default_rng(seed)
    chats = []
    for i in range(count):
        a, b = (int(x) for x in rng.integers(10, 100, size=2))
        chats.append([{"role": "user", "content": f"Question {i}: what is {a} + {b}? Show your steps."}])
    return chats


def chat_batch(tokenizer, chats: list[list[dict]], width: int = PROMPT_WIDTH):
    """Prompts as the data loader makes them (template text -> tokens, left padded), with the
    non-tensor fields the multi-turn loop reads (raw_prompt; index: the environment's seed)."""
    import torch

    from protocol.data_proto import DataProto

    ids = torch.full((len(chats), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(chats), width), dtype=torch.long)
    for i, chat in enumerate(chats):
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        row = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(row) > width:
            raise ValueError(f"prompt {i} is {len(row)} tokens, wider than {width}")
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    columns = {
        "raw_prompt": chats,
        "index": list(range(len(chats))),
        "extra_info": [{"index": i} for i in range(len(chats))],
    }
    arrays = {}
    for key, values in columns.items():
        arrays[key] = np.empty(len(chats), dtype=object)
        arrays[key][:] = values
    position_ids = torch.clamp(mask.cumsum(-1) - 1, min=0)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": position_ids}, non_tensors=arrays
    )


def build_engine(config):
    from transformers import AutoConfig, AutoTokenizer

    from workers.rollout.vllm_rollout import VLLMRollout

    model = config.actor_rollout_ref.model
    tokenizer = AutoTokenizer.from_pretrained(model.path)
    hf_config = AutoConfig.from_pretrained(model.path)
    return VLLMRollout(model, config.actor_rollout_ref.rollout, tokenizer, hf_config)


class Bench:
    """The engine with one rollout section (and its multi-turn loop, whose pool is kept)
    per latency, and the timed calls of each mode."""

    def __init__(self, engine, args):
        from workers.rollout import agent_rollout

        self.engine, self.args, self.base, self.sections = engine, args, engine.config, {}
        # The bench's driver: agent_rollout builds one per call from its module global.
        self.driver_class = agent_rollout.AsyncEngineDriver = tracing_driver_class()
        self.agents = agent_rollout.AgentRollout(engine)

    def use_latency(self, mean: float) -> None:
        from workers.rollout.multi_turn import MultiTurnLoop

        if mean not in self.sections:
            kwargs = {"seed": self.args.seed, "latency_mean": mean, "latency_sigma": self.args.latency_sigma,
                      "turns": self.args.turns}  # fmt: skip
            multi_turn = dataclasses.replace(self.base.multi_turn, env_kwargs=kwargs)
            self.engine.config = dataclasses.replace(self.base, multi_turn=multi_turn)
            self.sections[mean] = (self.engine.config, MultiTurnLoop(self.engine))
        self.engine.config, self.engine.multi_turn = self.sections[mean]

    def lock_step(self, batch) -> dict:
        llm = self.engine.llm
        inner, engine_s = llm.generate, [0.0]

        def generate(*a, **kw):  # the engine's share of the lock-step wall
            start = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                engine_s[0] += time.perf_counter() - start

        llm.generate = generate
        try:
            start = time.perf_counter()
            out = self.engine.generate_sequences(batch)
            wall = time.perf_counter() - start
        finally:
            del llm.generate
        return {"wall_s": wall, "engine_s": engine_s[0], **self._work(out)}

    def agent(self, batch) -> dict:
        start = time.perf_counter()
        out = self.agents.generate_sequences(batch)
        end = time.perf_counter()
        fields, wall, steps = out.non_tensor_batch, end - start, self.driver_class.last.trace["steps"]
        latency = np.asarray(list(fields["agent_latency_s"]), dtype=float)
        env_wait = np.asarray(list(fields["agent_env_wait_s"]), dtype=float)
        return {
            "wall_s": wall,
            "engine_s": float(fields["agent_engine_busy_share"][0]) * wall,
            "trajectory_latency_p50_s": float(np.median(latency)),
            "trajectory_latency_max_s": float(latency.max()),
            "in_flight_mean": float(out.meta_info["metrics"]["agent/in_flight/mean"]),
            # The call's time before its first engine step and after its last one.
            "before_first_step_s": steps[0][0] - start,
            "after_last_step_s": end - steps[-1][1],
            **timeline_summary(self.driver_class.last.trace, float((latency - env_wait).sum())),
            **self._work(out),
        }

    def _work(self, out) -> dict:
        """What the run did: model tokens and turns (the same in both modes, or a warning)."""
        fields = out.non_tensor_batch
        return {
            "model_tokens": int(out.batch["response_mask"].sum()),
            "turns_min": int(min(fields["multi_turn_turns"])),
            "done_share": float(np.mean([r == "done" for r in fields["multi_turn_finish_reason"]])),
        }

    def single_request_turn_s(self, batch, count: int = 3) -> float:
        """One request alone on the engine, through a driver as the agent loops use it:
        seconds to decode one turn (median of `count` distinct prompts)."""
        from workers.rollout.base import prompt_token_lists, sampling_settings
        from workers.rollout.vllm_params import vllm_sampling_params

        settings = sampling_settings(self.engine.config, {})
        params = vllm_sampling_params(dataclasses.replace(settings, n=1, max_tokens=self.args.tokens_per_turn))
        prompts = prompt_token_lists(batch.batch["input_ids"], batch.batch["attention_mask"])
        driver = self.driver_class(self.engine.llm, name="bench-single")

        async def one(ids) -> float:
            start = time.perf_counter()
            await driver.generate(ids, params)
            return time.perf_counter() - start

        try:
            return statistics.median(asyncio.run(one(ids)) for ids in prompts[-count:])
        finally:
            driver.close()

    def thread_probe(self, count: int) -> dict:
        """Seconds of one batched turn (`count` requests, `generate_ids`) on a fresh thread (as
        the driver steps), then on this one (as lock-step calls the engine)."""
        from workers.rollout.base import prompt_token_lists, sampling_settings

        settings = dataclasses.replace(sampling_settings(self.engine.config, {}), n=1)
        seconds = {}

        def turn(key: str, seed: int) -> None:
            batch = chat_batch(self.engine.tokenizer, question_chats(count, seed))
            prompts = prompt_token_lists(batch.batch["input_ids"], batch.batch["attention_mask"])
            start = time.perf_counter()
            self.engine.generate_ids(prompts, settings, [self.args.tokens_per_turn] * count)
            seconds[key] = time.perf_counter() - start

        thread = threading.Thread(target=turn, args=("fresh_thread_s", self.args.seed + 1))
        thread.start()
        thread.join()
        turn("main_thread_s", self.args.seed + 2)
        return seconds


# ---------------------------------------------------------------------- the runs


def run_all(bench: Bench, batch, args) -> tuple[list[dict], float, dict]:
    """Warm-up, the single-request turn time, the thread probe, then the four timed runs x
    repeats: (rows, turn_s, probe)."""
    bench.use_latency(0.0)
    warm = batch[:4]
    bench.lock_step(warm)
    bench.agent(warm)
    turn_s = bench.single_request_turn_s(batch)
    probe = bench.thread_probe(len(batch))
    print(
        f"  one batched turn ({len(batch)} x {args.tokens_per_turn} tokens): {probe['main_thread_s']:.2f} s on the "
        f"main thread, {probe['fresh_thread_s']:.2f} s on a fresh thread; one request alone {turn_s:.3f} s",
        flush=True,
    )
    plan = [("lock-step", args.latency_mean), ("async", args.latency_mean), ("lock-step", 0.0), ("async", 0.0)]
    runs: dict[tuple, list[dict]] = {key: [] for key in plan}
    for repeat in range(args.repeats):
        for mode, latency in plan:
            bench.use_latency(latency)
            result = bench.lock_step(batch) if mode == "lock-step" else bench.agent(batch)
            runs[mode, latency].append(result)
            print(
                f"  [{repeat + 1}/{args.repeats}] {mode:<9} latency {latency:g} s: {result['wall_s']:.2f} s "
                f"(engine {result['engine_s']:.2f} s, load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    rows = [median_row(mode, latency, runs[mode, latency], len(batch)) for mode, latency in plan]
    return rows, turn_s, probe


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return f"GPU {torch.cuda.get_device_name(0)}"
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    return f"CPU {cpu or platform.machine()}, {os.cpu_count()} cores"


def print_report(doc: dict, args) -> None:
    setup, bound = doc["setup"], doc["bound"]
    print(
        f"\n{setup['trajectories']} trajectories ({setup['prompts']} prompts x n={setup['n']}), {args.turns} turns x "
        f"{args.tokens_per_turn} tokens (ignore_eos, temperature 1), env wait lognormal mean {args.latency_mean:g} s "
        f"sigma {args.latency_sigma:g}\nmodel {setup['model']} ({setup['dtype']}), {setup['device']}, "
        f"OMP_NUM_THREADS={setup['omp_num_threads']}, OMP_WAIT_POLICY={setup['omp_wait_policy']}, "
        f"load average {setup['load_average_start']} -> {setup['load_average_end']}"
    )
    print(f"{'mode':<10} {'latency s':>9} {'wall s':>8} {'traj/s':>8} {'engine s':>9} {'ratio':>6}")
    ratios = {args.latency_mean: doc["ratio_latency_1s"], 0.0: doc["ratio_latency_0s"]}
    for row in doc["rows"]:
        ratio = f"{ratios[row['latency_mean_s']]:>6.2f}" if row["mode"] == "async" else f"{'':>6}"
        print(
            f"{row['mode']:<10} {row['latency_mean_s']:>9g} {row['wall_s']:>8.2f} {row['trajectories_per_s']:>8.2f} "
            f"{row['engine_s']:>9.2f} {ratio}"
        )
    print(
        f"async lower bound at latency {args.latency_mean:g} s: {bound['bound_s']:.2f} s ({bound['binding']}) = max("
        f"(a) engine busy {bound['engine_busy_s']:.2f} s [fully batched: {bound['engine_batched_s']:.2f} s], "
        f"(b) slowest trajectory #{bound['slowest_trajectory']}: waits {bound['slowest_env_wait_s']:.2f} s + "
        f"{args.turns} x {bound['single_request_turn_s']:.3f} s alone = {bound['slowest_trajectory_s']:.2f} s "
        f"[at full batch: {bound['full_batch_trajectory_s']:.2f} s per trajectory])"
    )
    print(f"async_over_bound = {doc['async_over_bound']:.3f}")
    for row in (r for r in doc["rows"] if r["mode"] == "async"):
        print(
            f"async at {row['latency_mean_s']:g} s, {row['requests']:.0f} requests: queued "
            f"{row['request_queued_s']:.1f} s, in the engine {row['request_engine_s']:.1f} s, handed back "
            f"{row['request_handback_s']:.2f} s, trajectories outside requests and env {row['outside_s']:.2f} s; "
            f"engine {row['steps']:.0f} steps, busy {row['step_busy_s']:.2f} s, gaps {row['step_gaps_s']:.2f} s "
            f"(+{row['before_first_step_s']:.2f} s before the first, {row['after_last_step_s']:.2f} s after the last), "
            f"{row['step_requests_mean']:.1f} requests/step, step {row['step_s_at_1_to_8'] * 1e3:.0f} ms at <= 8 "
            f"requests, {row['step_s_above_32'] * 1e3:.0f} ms at > 32"
        )
    for goal in doc["goals"]:
        print(f"  {'PASS' if goal['passed'] else 'FAIL'}  {goal['goal']}: {goal['value']:.3f} (goal {goal['target']})")
    expected = setup["trajectories"] * args.turns * args.tokens_per_turn
    odd = [r for r in doc["rows"] if r["model_tokens"] != expected or r["done_share"] != 1.0]
    if odd:
        print(f"warning: expected {expected} model tokens and every trajectory done; got {odd}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_agent_loop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the numbers here")
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens-per-turn", type=int, default=32)
    parser.add_argument("--latency-mean", type=float, default=1.0)
    parser.add_argument("--latency-sigma", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--model", default="default", help="default (SmolLM2-135M) or a model folder")
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value) for both modes")
    args = parser.parse_args(argv)
    if args.latency_mean <= 0 or args.trajectories < 4 or args.repeats < 1:
        parser.error("--latency-mean must be > 0, --trajectories >= 4, --repeats >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    load_start, config = os.getloadavg(), build_config(args)
    engine = build_engine(config)
    batch = chat_batch(engine.tokenizer, question_chats(args.trajectories, args.seed))
    bench = Bench(engine, args)
    rows, turn_s, probe = run_all(bench, batch, args)
    by = {(r["mode"], r["latency_mean_s"]): r for r in rows}
    waits = trajectory_waits(args.seed, args.trajectories, args.turns, args.latency_mean, args.latency_sigma)
    bound = lower_bound(by["async", args.latency_mean]["engine_s"], waits, turn_s, args.turns)
    bound["engine_batched_s"] = by["lock-step", 0.0]["engine_s"]
    bound["full_batch_trajectory_s"] = by["async", 0.0]["trajectory_latency_p50_s"]
    setup = {
        **{key: value for key, value in vars(args).items() if key != "json"},
        "model": config.actor_rollout_ref.model.path,
        "dtype": str(engine.engine_dtype).removeprefix("torch."),
        "device": device_name(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
        "prompts": args.trajectories,
        "n": 1,
        "env_workers": args.trajectories,
        "agent_num_workers": int(config.actor_rollout_ref.rollout.agent.num_workers),
        "batched_turn_main_thread_s": probe["main_thread_s"],
        "batched_turn_fresh_thread_s": probe["fresh_thread_s"],
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
    }
    doc = summary(rows, bound, setup)
    print_report(doc, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
