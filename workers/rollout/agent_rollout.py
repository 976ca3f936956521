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
for environments, and its rank's engine busy share and trajectories in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import threading
import time

import numpy as np

from protocol.data_proto import DataProto
from reward.environments.pool import Outcome
from reward.user_code import load_user_file
from workers.rollout.agent_loop import AGENT_LOOP_REGISTRY, AgentLoop, RolloutCall
from workers.rollout.agent_loops import BUILT_IN_AGENT_LOOPS
from workers.rollout.async_engine import AsyncEngineDriver
from workers.rollout.base import (
    GeneratedTurn,
    SamplingSettings,
    assemble_rollout,
    prompt_token_lists,
    sampling_settings,
)
from workers.rollout.multi_turn import Trajectory
from workers.rollout.openai_server import OpenAIEndpoint
from workers.rollout.vllm_params import vllm_sampling_params

AGENT = "actor_rollout_ref.rollout.agent"


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
        self.classes = _agent_loop_classes(self.agent)
        self.loops: dict[str, AgentLoop] = {}
        default = self.agent.default_agent_loop
        if default is not None and default not in self.classes:
            raise ValueError(
                f"{AGENT}.default_agent_loop={default!r} is not an agent loop; known: {_known(self.classes)}"
            )
        self._params = {}  # (settings, budget) -> SamplingParams

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
        return "environment_agent" if self.config.multi_turn.enable else "single_turn_agent"

    # ------------------------------------------------------------------ one call
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        settings = sampling_settings(self.config, prompts.meta_info)
        call = RolloutCall(prompts, self._rows(prompts), settings)
        trajectories = [Trajectory(row=i, sample=s) for i in range(len(prompts)) for s in range(settings.n)]
        names = [self._loop_name(call, t) for t in trajectories]
        for name in sorted(set(names)):
            if name not in self.loops:
                self.loops[name] = self.classes[name](self)
        self.driver = AsyncEngineDriver(self.engine.llm, name="agent-rollout")
        tracker = _InFlight()
        try:
            if self.agent.enable_http_endpoint:
                self.endpoint = self._endpoint(settings)
            self._run(call, trajectories, names, tracker)
            stats = self.driver.stats()
        finally:
            if self.endpoint is not None:
                self.endpoint.close()
                self.endpoint = None
            self.driver.close()
            self.driver = None
        busy = stats.busy_s / stats.wall_s if stats.wall_s > 0 else 0.0
        fields = _agent_fields(trajectories, busy, tracker)
        if self.config.multi_turn.enable:
            output = self.multi_turn.assemble(prompts, trajectories, settings.n)
        else:
            output = self._single_turn_output(prompts, trajectories, settings.n)
        output.non_tensor_batch.update(fields)
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
                f"batch row {trajectory.row}: agent_name={name!r} is not an agent loop; known: {_known(self.classes)} "
                f"(register one with {AGENT}.agent_loop_config_path)"
            )
        return str(name)

    def _run(self, call: RolloutCall, trajectories: list[Trajectory], names: list[str], tracker: _InFlight) -> None:
        """Every trajectory to its end, spread over up to num_workers event loops in threads."""
        bound = self.agent.max_trajectories_in_flight or len(trajectories)
        workers = max(min(int(self.agent.num_workers), bound, len(trajectories)), 1)
        shares = [list(range(w, len(trajectories), workers)) for w in range(workers)]
        limits = [bound // workers + (1 if w < bound % workers else 0) for w in range(workers)]
        errors: list[BaseException] = []

        def worker(share: list[int], limit: int) -> None:
            try:
                asyncio.run(self._run_share(call, [(trajectories[i], names[i]) for i in share], limit, tracker))
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

    async def _run_share(self, call: RolloutCall, work: list, limit: int, tracker: _InFlight) -> None:
        gate = asyncio.Semaphore(limit)

        async def one(trajectory: Trajectory, name: str) -> None:
            async with gate:
                tracker.enter()
                start = time.perf_counter()
                try:
                    await self.loops[name].run(trajectory, call)
                finally:
                    trajectory.latency_s = time.perf_counter() - start
                    tracker.leave()

        await asyncio.gather(*(one(t, name) for t, name in work))

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
        key = (settings, int(max_tokens))
        if key not in self._params:
            self._params[key] = vllm_sampling_params(dataclasses.replace(settings, n=1, max_tokens=int(max_tokens)))
        turn = await self.driver.generate(list(prompt_ids), self._params[key])
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
    }


# ---------------------------------------------------------------------- the loops a run knows


def _known(loops) -> str:
    return ", ".join(sorted(loops))


def _agent_loop_classes(agent) -> dict[str, type[AgentLoop]]:
    """The registered loops (built-ins first) plus the entries of agent_loop_config_path."""
    classes = {**BUILT_IN_AGENT_LOOPS, **AGENT_LOOP_REGISTRY}
    if agent.agent_loop_config_path:
        for name, cls, kwargs in read_agent_loop_config(agent.agent_loop_config_path):
            classes[name] = _bound(cls, kwargs) if kwargs else cls
    return classes


def _bound(cls: type[AgentLoop], kwargs: dict) -> type[AgentLoop]:
    """`cls` with an entry's settings bound, as a class the rollout instantiates."""
    return type(cls.__name__, (cls,), {"__init__": lambda self, rollout: cls.__init__(self, rollout, **kwargs)})


def read_agent_loop_config(path: str) -> list[tuple[str, type[AgentLoop], dict]]:
    """(name, class, settings) of each entry of an agent_loop_config_path YAML file; a
    mistake names the file, the entry and what to change."""
    import os

    import yaml

    key = f"{AGENT}.agent_loop_config_path"
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise FileNotFoundError(f"{key}={path!r}: no such file")
    with open(full) as f:
        entries = yaml.safe_load(f) or []
    if not isinstance(entries, list):
        raise ValueError(f"{key}: {full} must hold a list of entries (- name: ..., _target_: ...)")
    loaded = []
    for index, entry in enumerate(entries):
        where = f"{key}: {full} entry {index}"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError(f"{where} needs a name (the agent_name rows use)")
        settings = {k: v for k, v in entry.items() if k not in ("name", "_target_", "path", "class_name")}
        loaded.append((entry["name"], _entry_class(entry, where, full), settings))
    return loaded


def _entry_class(entry: dict, where: str, config_file: str) -> type[AgentLoop]:
    if "_target_" in entry:
        module_name, _, attr = str(entry["_target_"]).rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError, ValueError) as err:
            raise ImportError(f"{where}: cannot import _target_={entry['_target_']!r} ({err})") from err
    elif "path" in entry and "class_name" in entry:
        import os

        path = os.path.join(os.path.dirname(config_file), os.path.expanduser(str(entry["path"])))
        module, resolved = load_user_file(path, f"{where} path", "agent loop", "agent_loop")
        cls = getattr(module, str(entry["class_name"]), None)
        if cls is None:
            raise AttributeError(f"{where}: {resolved} defines no {entry['class_name']!r}")
    else:
        raise ValueError(f"{where} needs _target_ (pkg.module.Class) or path and class_name")
    if not (inspect.isclass(cls) and issubclass(cls, AgentLoop)):
        raise TypeError(f"{where}: {cls!r} is not a subclass of workers.rollout.agent_loop.AgentLoop")
    return cls


__all__ = ["AgentRollout", "read_agent_loop_config", "summarize_agents"]
