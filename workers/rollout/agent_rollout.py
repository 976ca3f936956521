"""Agent loops: the rollout of `actor_rollout_ref.rollout.mode=async`, every trajectory on its
own, while the engine batches whatever requests are in flight.

`AgentRollout.generate_sequences` takes the same DataProto as the lock-step rollout and
returns the same fields. Each of the n samples of each prompt is a trajectory run by one
coroutine of an `AgentLoop`: generate, step an environment, append its observation,
generate again, each trajectory at its own pace. The coroutines await the worker's own
in-process vLLM engine through `AsyncEngineDriver` (workers/rollout/async_engine.py), which
adds every request to the running batch (continuous batching), so the engine never waits
for a batch's slowest environment and environments never wait for its longest answer.

Which loop runs a row: its `agent_name` column (verl's), else
`agent.default_agent_loop`, else `environment_agent` with multi_turn.enable and
`single_turn_agent` without. Built in (workers/rollout/agent_loops.py): `single_turn_agent`,
`environment_agent` (the multi-turn loop of workers/rollout/multi_turn.py, one trajectory at
a time: same budgets, masks, rewards and finish reasons, so greedy decoding with
deterministic environments gives the lock-step loop's tokens), `tool_agent` (verl's name:
the same loop over the verl tools of multi_turn.tool_config_path). A user's loops come from
`agent.agent_loop_config_path`, a YAML list of `{name, _target_: pkg.module.Class}` (verl's
form) or `{name, path: my_agents.py, class_name: Class}`, other keys going to the class's
constructor; `register_agent_loop` registers one from code (actor_rollout_ref.model.external_lib).

The trajectories are spread over `agent.num_workers` event loops, each in its own thread
(verl's agent-loop workers), so agent code that blocks its loop holds back only its share;
`agent.max_trajectories_in_flight` bounds how many run at once. Plain environment calls run
in the multi-turn pool's threads with its time limit (`env_step_timeout_s`); an `async def
step` is awaited with the same limit. One trajectory's error or time-out ends only that
trajectory (with `tolerate_env_errors`; otherwise the run stops, as in the lock-step loop).

Per-sample fields for the metrics (`summarize_agents`): each trajectory's latency, its wait
for environments, its model turns aborted and redone, and its rank's engine busy share and
trajectories in flight.

Two ways in, one path for the trajectories. `generate_sequences` is the fused worker's: a
driver for the call, the trajectories on `num_workers` event loops in threads. `agenerate`
is a rollout engine worker's (workers/rollout_engine_worker.py): the trajectories run as
coroutines on the caller's own event loop, over a long-lived driver that several calls
share, while the worker loads new weights between engine requests. Each model turn is
stamped with the policy version the worker serves when its request returns (the worker
changes the version only while the driver is paused with no request in the engine, so one
request never spans two versions), and a turn aborted by a load (`GenerationAborted`) is
sampled again from the same prompt on the new weights; its partial tokens never reach the
trajectory. `agenerate` with `version` returns the stamps: `rollout_versions` (B, R) per
response token (-1 where the model did not sample), `policy_version` per sample (the oldest
version among its model tokens).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

from protocol.data_proto import DataProto
from reward.environments.pool import Outcome
from workers.rollout.agent_loop import AgentLoop, RolloutCall
from workers.rollout.agent_loops import agent_loop_classes, known, read_agent_loop_config
from workers.rollout.async_engine import AsyncEngineDriver, GenerationAborted
from workers.rollout.base import (
    GeneratedTurn,
    SamplingSettings,
    assemble_rollout,
    prompt_token_lists,
    sampling_settings,
)
from workers.rollout.multi_turn import Trajectory
from workers.rollout.openai_server import OpenAIEndpoint
from workers.rollout.step_wise import STEP_WISE_LAST, expand_fields
from workers.rollout.vllm_params import vllm_sampling_params

AGENT = "actor_rollout_ref.rollout.agent"


def check_shared_driver(agent) -> None:
    """Refuse what `agenerate` cannot do: the OpenAI endpoint serves one call's driver and sampling."""
    if agent.enable_http_endpoint:
        raise ValueError(
            f"{AGENT}.enable_http_endpoint=true serves the fused worker's engine during one generate_sequences "
            f"call; rollout engines in their own processes (asynchronous training) do not run it; set it to false"
        )


class _Running:
    """One trajectory's link to the engine while its loop runs (the context of its task):
    the driver its turns go to, where the policy version is read, and the version of the
    turns returned since the trajectory's tokens were last stamped."""

    def __init__(self, trajectory: Trajectory, driver: AsyncEngineDriver, version: Callable[[], int]):
        self.trajectory, self.driver, self.version = trajectory, driver, version
        self.pending: int | None = None

    def stamp(self) -> None:
        """Versions for the tokens appended since the last stamp: the model's (mask 1) came
        from the turns returned since then (the oldest of them, should a loop run two
        turns at once), the rest (observations, a closing EOS) from no policy: -1."""
        t = self.trajectory
        del t.versions[len(t.mask) :]  # a loop that cut its trajectory back
        v = -1 if self.pending is None else self.pending
        t.versions += [v if m else -1 for m in t.mask[len(t.versions) :]]
        self.pending = None


# The trajectory a task runs: each trajectory's coroutine is its own task (asyncio.gather),
# so each sees its own; tasks a loop spawns inherit it.
_RUNNING: contextvars.ContextVar[_Running] = contextvars.ContextVar("agent_trajectory")


class AgentRollout:
    """The agent loops of one engine (`engine`: a VLLMRollout, which holds `config` (the
    rollout section), `tokenizer`, `llm`, `max_model_len`, `pad_token_id`, `eos_token_ids`
    and `multi_turn`, its MultiTurnLoop when multi_turn.enable)."""

    def __init__(self, engine):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        # The tokenizer's Rust core refuses concurrent use ("Already borrowed"): one lock for
        # every encode and decode the loops' threads make.
        self.tokenizer_lock = threading.RLock()
        self.driver: AsyncEngineDriver | None = None
        self.endpoint: OpenAIEndpoint | None = None  # agent.enable_http_endpoint, during a call
        # Classes now (a file or import that fails stops the run before any rollout); an
        # instance when a call first needs it (tool_agent needs tools only when rows use it).
        self.classes = agent_loop_classes(self.agent)
        self.loops: dict[str, AgentLoop] = {}
        default = self.agent.default_agent_loop
        if default is not None and default not in self.classes:
            raise ValueError(
                f"{AGENT}.default_agent_loop={default!r} is not an agent loop; known: {known(self.classes)}"
            )
        self._params = {}  # (settings, budget) -> SamplingParams
        self.activity = _Activity()
        # The reward loop's workers (Ray actor handles; set_reward_loop): each trajectory is
        # sent to one as it finishes and comes back scored (its `reward_loop` field).
        self.reward_loop: list | None = None
        self.reward_use_fn = True
        self.reward_fn_key = "data_source"
        self._reward_turn = 0

    def set_reward_loop(self, handles: list | None, use_reward_fn: bool, reward_fn_key: str) -> None:
        self.reward_loop = list(handles) if handles else None
        self.reward_use_fn, self.reward_fn_key = bool(use_reward_fn), str(reward_fn_key)

    @property
    def config(self):
        """The engine's rollout section (read through the engine: it is the one place it is kept)."""
        return self.engine.config

    @property
    def agent(self):
        return self.engine.config.agent

    @property
    def multi_turn(self):
        return self.engine.multi_turn

    def default_loop(self) -> str:
        if self.agent.default_agent_loop is not None:
            return self.agent.default_agent_loop
        if self.agent.verifiers_env is not None:
            return "verifiers_env"
        return "environment_agent" if self.config.multi_turn.enable else "single_turn_agent"

    # ------------------------------------------------------------------ one call
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """The fused worker's call: a driver of its own, the trajectories on num_workers event loops in threads."""
        call, trajectories, names = self._prepare(prompts)
        # This (the worker's) thread steps the engine: it already runs torch's OpenMP team,
        # and a second thread's steps the same engine markedly slower on CPU.
        self.driver = AsyncEngineDriver(self.engine.llm, name="agent-rollout", own_thread=False)
        tracker = _InFlight()
        try:
            if self.agent.enable_http_endpoint:
                self.endpoint = self._endpoint(call.settings)
            self._serve_while(lambda: self._run_threads(call, trajectories, names, tracker, self.driver))
            stats = self.driver.stats()
        finally:
            if self.endpoint is not None:
                self.endpoint.close()
                self.endpoint = None
            self.driver.close()
            self.driver = None
        busy = stats.busy_s / stats.wall_s if stats.wall_s > 0 else 0.0
        return self._output(prompts, call, trajectories, busy, tracker)

    def _serve_while(self, work: Callable[[], None]) -> None:
        """Run `work` (the agent loops' threads) while this thread steps the engine; then stop
        serving, and raise what `work` raised."""
        errors: list[BaseException] = []

        def run() -> None:
            try:
                work()
            except BaseException as error:  # re-raised on the serving thread below
                errors.append(error)
            finally:
                self.driver.close()

        runner = threading.Thread(target=run, name="agent-loops", daemon=True)
        runner.start()
        self.driver.serve()
        runner.join()
        if errors:
            raise errors[0]

    async def agenerate(
        self, prompts: DataProto, driver: AsyncEngineDriver, version: Callable[[], int] | None = None
    ) -> DataProto:
        """A rollout engine worker's call: the trajectories as coroutines on the running event
        loop, their requests on `driver` (shared with the worker's other calls in flight).
        `version()` is the policy version the engine serves; with it each sample carries its
        stamps (`rollout_versions`, `policy_version`; see the module's docstring)."""
        check_shared_driver(self.agent)
        call, trajectories, names = self._prepare(prompts)
        tracker = _InFlight()
        before = driver.stats()
        bound = self.agent.max_trajectories_in_flight or len(trajectories)
        work = list(zip(trajectories, names))
        await self._run_share(call, work, max(int(bound), 1), tracker, driver, version or _no_version)
        after = driver.stats()
        wall = after.wall_s - before.wall_s
        busy = min(max((after.busy_s - before.busy_s) / wall, 0.0), 1.0) if wall > 0 else 0.0
        output = self._output(prompts, call, trajectories, busy, tracker)
        if version is not None:
            _add_versions(output, trajectories, version())
        return output

    def _prepare(self, prompts: DataProto) -> tuple[RolloutCall, list[Trajectory], list[str]]:
        """The call's shared state, its trajectories (n per row, a row's samples adjacent), their loops' names."""
        settings = sampling_settings(self.config, prompts.meta_info)
        call = RolloutCall(prompts, self._rows(prompts), settings)
        trajectories = [Trajectory(row=i, sample=s) for i in range(len(prompts)) for s in range(settings.n)]
        names = [self._loop_name(call, t) for t in trajectories]
        for name in sorted(set(names)):
            if name not in self.loops:
                self.loops[name] = self.classes[name](self)
        return call, trajectories, names

    def _output(
        self, prompts: DataProto, call: RolloutCall, trajectories: list[Trajectory], busy: float, tracker: _InFlight
    ) -> DataProto:
        n = call.settings.n
        fields = _agent_fields(trajectories, busy, tracker)
        if self.config.multi_turn.enable:
            output = self.multi_turn.assemble(prompts, trajectories, n)
        else:
            output = self._single_turn_output(prompts, trajectories, n)
        if STEP_WISE_LAST in output.batch.keys():  # a sample per model turn: the trajectory's fields on each
            fields = expand_fields(fields, output)
        output.non_tensor_batch.update(fields)
        if any(t.reward_loop is not None for t in trajectories):
            scored = np.empty(len(trajectories), dtype=object)
            scored[:] = [t.reward_loop for t in trajectories]
            output.non_tensor_batch["reward_loop"] = scored
        output.meta_info["metrics"] = {**output.meta_info.get("metrics", {}), **summarize_agents(fields)}
        return output

    def _endpoint(self, settings: SamplingSettings) -> OpenAIEndpoint:
        """The OpenAI-compatible endpoint on this call's driver, on http_endpoint_port + rank."""
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        port = int(self.agent.http_endpoint_port)
        per_turn = self.config.multi_turn.max_tokens_per_turn or self.config.response_length
        endpoint = OpenAIEndpoint(
            self.driver,
            _LockedTokenizer(self.tokenizer, self.tokenizer_lock),
            self.engine.eos_token_ids,
            dataclasses.replace(settings, n=1, max_tokens=int(per_turn)),
            self.engine.max_model_len,
            int(self.config.response_length),
            host=self.agent.http_endpoint_host,
            port=port + rank if port else 0,
            make_params=vllm_sampling_params,
        )
        endpoint.start()
        return endpoint

    def _rows(self, prompts: DataProto) -> list[dict]:
        fields = prompts.non_tensor_batch
        ids = prompt_token_lists(prompts.batch["input_ids"], prompts.batch["attention_mask"])
        rows = [{key: values[i] for key, values in fields.items()} for i in range(len(prompts))]
        for row, prompt_ids in zip(rows, ids):
            row["_prompt_ids"] = prompt_ids
        return rows

    def _loop_name(self, call: RolloutCall, trajectory: Trajectory) -> str:
        name = call.rows[trajectory.row].get("agent_name") or self.default_loop()
        if name not in self.classes:
            raise ValueError(
                f"batch row {trajectory.row}: agent_name={name!r} is not an agent loop; known: {known(self.classes)} "
                f"(register one with {AGENT}.agent_loop_config_path)"
            )
        return str(name)

    def _run_threads(
        self,
        call: RolloutCall,
        trajectories: list[Trajectory],
        names: list[str],
        tracker: _InFlight,
        driver: AsyncEngineDriver,
    ) -> None:
        """Every trajectory to its end, spread over up to num_workers event loops in threads."""
        bound = self.agent.max_trajectories_in_flight or len(trajectories)
        workers = max(min(int(self.agent.num_workers), bound, len(trajectories)), 1)
        shares = [list(range(w, len(trajectories), workers)) for w in range(workers)]
        limits = [bound // workers + (1 if w < bound % workers else 0) for w in range(workers)]
        errors: list[BaseException] = []

        def worker(share: list[int], limit: int) -> None:
            work = [(trajectories[i], names[i]) for i in share]
            try:
                asyncio.run(self._run_share(call, work, limit, tracker, driver, _no_version))
            except BaseException as error:  # re-raised on the calling thread below
                errors.append(error)

        threads = [
            threading.Thread(target=worker, args=(share, limit), name=f"agent-loop-{w}", daemon=True)
            for w, (share, limit) in enumerate(zip(shares, limits))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    async def _run_share(
        self,
        call: RolloutCall,
        work: list,
        limit: int,
        tracker: _InFlight,
        driver: AsyncEngineDriver,
        version: Callable[[], int],
    ) -> None:
        gate = asyncio.Semaphore(limit)

        async def one(trajectory: Trajectory, name: str) -> None:
            async with gate:
                running = _Running(trajectory, driver, version)
                _RUNNING.set(running)  # this task's context only
                tracker.enter()
                self.activity.change(trajectories=1)
                start = time.perf_counter()
                try:
                    await self.loops[name].run(trajectory, call)
                finally:
                    running.stamp()
                    trajectory.latency_s = time.perf_counter() - start
                    tracker.leave()
                    self.activity.change(trajectories=-1)
            # Validation is judged by the validation reward function on the driver: no reward-loop calls.
            if self.reward_loop and not call.prompts.meta_info.get("validate", False):
                await self._score(trajectory, call)

        await asyncio.gather(*(one(t, name) for t, name in work))

    async def _score(self, trajectory: Trajectory, call: RolloutCall) -> None:
        """The trajectory's scores from a reward-loop worker, while the others still generate."""
        from reward.reward_loop import trajectory_sample

        row = call.rows[trajectory.row]
        keys = ("raw_prompt", "reward_model", "extra_info", self.reward_fn_key)
        fields = {k: row[k] for k in keys if k in row}
        prompt_ids = trajectory.prompt_ids or row["_prompt_ids"]
        response_ids = trajectory.response_ids[: int(self.config.response_length)]
        sample = trajectory_sample(prompt_ids, response_ids, fields)
        handle = self.reward_loop[self._reward_turn % len(self.reward_loop)]
        self._reward_turn += 1
        finished = time.perf_counter()
        result = await handle.score.remote(sample, self.reward_use_fn)
        result["scored_after_s"] = time.perf_counter() - finished
        trajectory.reward_loop = result

    def _single_turn_output(self, prompts: DataProto, trajectories: list[Trajectory], n: int) -> DataProto:
        return assemble_rollout(
            prompts.batch["input_ids"],
            prompts.batch["attention_mask"],
            prompts.batch["position_ids"],
            [t.response_ids for t in trajectories],
            [t.log_probs for t in trajectories],
            n=n,
            response_length=int(self.config.response_length),
            pad_token_id=self.engine.pad_token_id,
            eos_token_ids=self.engine.eos_token_ids,
            meta_info={"n": n},
        )

    # ------------------------------------------------------------------ what loops call
    async def generate(self, prompt_ids: list[int], max_tokens: int, settings: SamplingSettings) -> GeneratedTurn:
        """One model turn of the trajectory this task runs. A turn aborted by a weight load
        is sampled again from the same prompt once the driver resumes, on the new weights."""
        running = _RUNNING.get(None)
        if running is None:
            raise RuntimeError(
                "AgentRollout.generate serves the trajectories of generate_sequences/agenerate; call it from an "
                "agent loop's run() (or a task it starts)"
            )
        key = (settings, int(max_tokens))
        if key not in self._params:
            self._params[key] = vllm_sampling_params(dataclasses.replace(settings, n=1, max_tokens=int(max_tokens)))
        running.stamp()  # the tokens the loop appended since its previous turn
        self.activity.change(requests=1)
        try:
            while True:
                try:
                    turn = await running.driver.generate(list(prompt_ids), self._params[key])
                    break
                except GenerationAborted:
                    # A closed driver refuses the retry with its own error, so this ends.
                    running.trajectory.aborted_turns += 1
                    self.activity.change(aborted=1)
            # Read at once on resuming: the worker changes versions only while the driver is
            # paused, after the loop has run the wake-ups of every request that returned.
            version = running.version()
        finally:
            self.activity.change(requests=-1)
        running.pending = version if running.pending is None else min(running.pending, version)
        return GeneratedTurn(turn.token_ids[:max_tokens], turn.log_probs[:max_tokens], turn.finish_reason)

    async def env_call(self, trajectory: Trajectory, fn, coroutine=None) -> Outcome:
        """A plain environment call in the multi-turn pool's threads, or `coroutine` (from an
        `async def` method) awaited here, with the same time limit; the wait is counted."""
        start = time.perf_counter()
        try:
            if coroutine is None:
                return await self.multi_turn.pool.call(fn)
            try:
                return Outcome(value=await asyncio.wait_for(coroutine, self.multi_turn.pool.timeout_s))
            except TimeoutError:
                return Outcome(timed_out=True)
            except Exception as error:  # the environment's; the loop decides what it means
                return Outcome(error=error)
        finally:
            trajectory.env_wait_s += time.perf_counter() - start


class _LockedTokenizer:
    """The tokenizer as the endpoint's thread uses it: every call under the rollout's lock
    (the agent loops' threads use the same tokenizer)."""

    def __init__(self, tokenizer, lock):
        self._tokenizer, self._lock = tokenizer, lock

    def __call__(self, *args, **kwargs):
        with self._lock:
            return self._tokenizer(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._tokenizer)

    def __getattr__(self, name: str):
        value = getattr(self._tokenizer, name)
        if not callable(value):
            return value

        def locked(*args, **kwargs):
            with self._lock:
                return value(*args, **kwargs)

        return locked


class _Activity:
    """What the rollout is doing now, over all its calls (a worker's `stats()`): trajectories
    running, engine requests awaited (queued or in the engine), and turns aborted by weight
    loads since it was built."""

    def __init__(self):
        self.lock = threading.Lock()
        self.trajectories = self.requests = self.aborted = 0

    def change(self, trajectories: int = 0, requests: int = 0, aborted: int = 0) -> None:
        with self.lock:
            self.trajectories += trajectories
            self.requests += requests
            self.aborted += aborted

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {
                "trajectories_in_flight": self.trajectories,
                "requests_in_flight": self.requests,
                "aborted_turns": self.aborted,
            }


def _no_version() -> int:
    return 0


def _add_versions(output: DataProto, trajectories: list[Trajectory], current: int) -> None:
    """`rollout_versions` (B, R): each response token's policy version, -1 where the response
    mask is 0 (observations, padding, what assemble cut); `policy_version` per sample: the
    oldest version among its sampled tokens (`current`, the engine's now, for a sample
    without one)."""
    mask = output.batch["response_mask"].bool()
    width = mask.shape[1]
    versions = torch.full(mask.shape, -1, dtype=torch.int64)
    for i, t in enumerate(trajectories):
        row = t.versions[:width]
        versions[i, : len(row)] = torch.tensor(row, dtype=torch.int64)
    versions[~mask] = -1
    # Tokens a loop put in with mask 1 without sampling them carry -1: no version to count.
    sampled = versions >= 0
    oldest = [int(v[m].min()) if m.any() else int(current) for v, m in zip(versions, sampled)]
    output.batch["rollout_versions"] = versions
    output.non_tensor_batch["policy_version"] = _column(oldest)


class _InFlight:
    """Trajectories running at once over a call: the most, and the time-weighted mean."""

    def __init__(self):
        self.lock = threading.Lock()
        self.start = self.last = time.perf_counter()
        self.now = self.max = 0
        self.area = 0.0

    def _advance(self) -> None:
        now = time.perf_counter()
        self.area += self.now * (now - self.last)
        self.last = now

    def enter(self) -> None:
        with self.lock:
            self._advance()
            self.now += 1
            self.max = max(self.max, self.now)

    def leave(self) -> None:
        with self.lock:
            self._advance()
            self.now -= 1

    def mean(self) -> float:
        with self.lock:
            self._advance()
            wall = self.last - self.start
            return self.area / wall if wall > 0 else float(self.max)


def _column(values) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _agent_fields(trajectories: list[Trajectory], busy: float, tracker: _InFlight) -> dict[str, np.ndarray]:
    """Per-sample fields; the rank's numbers repeated on each of its samples, so the driver's
    concatenation of the ranks' outputs summarizes them over ranks."""
    count = len(trajectories)
    return {
        "agent_latency_s": _column([t.latency_s for t in trajectories]),
        "agent_env_wait_s": _column([t.env_wait_s for t in trajectories]),
        "agent_turns": _column([t.turns for t in trajectories]),
        "agent_aborted_turns": _column([t.aborted_turns for t in trajectories]),
        "agent_engine_busy_share": _column([busy] * count),
        "agent_in_flight_max": _column([tracker.max] * count),
        "agent_in_flight_mean": _column([tracker.mean()] * count),
    }


def summarize_agents(non_tensor_batch) -> dict[str, float]:
    """`agent/*` metrics of mode=async from the per-sample fields (one rank's, or the whole
    batch's once the driver has the ranks' outputs)."""
    if "agent_latency_s" not in non_tensor_batch:
        return {}
    latency = np.asarray(list(non_tensor_batch["agent_latency_s"]), dtype=np.float64)
    if latency.size == 0:
        return {}
    wait = np.asarray(list(non_tensor_batch["agent_env_wait_s"]), dtype=np.float64)
    total = float(latency.sum())
    return {
        "agent/latency_s/p50": float(np.percentile(latency, 50)),
        "agent/latency_s/p95": float(np.percentile(latency, 95)),
        "agent/env_wait_share": float(wait.sum() / total) if total > 0 else 0.0,
        "agent/engine_busy_share": float(np.mean(list(non_tensor_batch["agent_engine_busy_share"]))),
        "agent/in_flight/max": float(np.max(list(non_tensor_batch["agent_in_flight_max"]))),
        "agent/in_flight/mean": float(np.mean(list(non_tensor_batch["agent_in_flight_mean"]))),
        "agent/turns/mean": float(np.mean(list(non_tensor_batch["agent_turns"]))),
        "agent/aborted_turns": float(np.sum(list(non_tensor_batch.get("agent_aborted_turns", [0])))),
    }


__all__ = ["AgentRollout", "read_agent_loop_config", "summarize_agents"]
