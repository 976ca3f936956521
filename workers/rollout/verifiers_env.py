"""Environments of the `verifiers` library (PyPI `verifiers`, 0.4.0: `verifiers.v1`) trained as
agent loops: the agent loop `verifiers_env` runs one episode of the row's task through the
environment's own harness, whose model calls reach the rank's OpenAI-compatible endpoint
(workers/rollout/openai_server.py) through verifiers' interception server, so the tokens,
log-probs and masks trained on are the ones the engine saw and sampled (the environment's
turns masked out), as for any OpenAIAgentLoop. The trajectory's reward is the episode's rubric
reward (`trace.reward`: the weighted sum of the task's `@vf.reward` functions and judges), as
SkyRL's VerifiersGenerator takes it.

Which environment: the row's `verifiers.environment` (SkyRL's prepare_dataset.py writes it),
else `actor_rollout_ref.rollout.agent.verifiers_env` (SkyRL's `environment.env_class`); a
taskset id as verifiers loads it (`owner/name@version` and `name` load the same installed
package). Which task: the taskset's task whose index is the row's `verifiers.example_id`, else
its `example_id` column (SkyRL's rows carry it there). The harness runs on this machine (a
subprocess runtime, as the endpoint is on localhost); one agent seat per episode (a
multi-agent environment is refused, naming it).
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

from workers.rollout.agent_loop import RolloutCall
from workers.rollout.multi_turn import Trajectory
from workers.rollout.openai_agent import AGENT, OpenAIAgentLoop

KEY = f"{AGENT}.verifiers_env"
API_KEY_VAR = "HYBRID_VERIFIERS_API_KEY"  # unset: verifiers sends "EMPTY"; the endpoint needs none


def load_verifiers():
    try:
        import verifiers.v1 as vf
    except ImportError as err:
        raise ImportError(
            f"{KEY} runs environments of the verifiers library, which is not installed: "
            f"pip install -e '.[verifiers]' ({err})"
        ) from err
    return vf


def environment_of(row: dict, default: str | None) -> str:
    spec = row.get("verifiers")
    name = spec.get("environment") if isinstance(spec, dict) else None
    if not name and not default:
        raise ValueError(f"a row without verifiers.environment: set {KEY} to the verifiers environment (taskset id)")
    return str(name or default)


def example_index(row: dict, where: str) -> int:
    spec = row.get("verifiers") if isinstance(row.get("verifiers"), dict) else {}
    value = spec.get("example_id", row.get("example_id"))
    if value is None:
        raise ValueError(f"{where}: no verifiers.example_id or example_id column (the task's index in the taskset)")
    return int(value)


class VerifiersEnvironment:
    """One loaded environment: the `Env`, and its taskset's tasks by index."""

    def __init__(self, env_id: str):
        vf = load_verifiers()
        from verifiers.v1.configs.agent import agent_config_fields

        # verifiers and its interception server (aiohttp) log every request, server and episode at
        # INFO: several lines per trajectory in the run's console. Their warnings and errors show.
        for name in ("verifiers", "aiohttp.access"):
            logging.getLogger(name).setLevel(logging.WARNING)

        config = vf.resolve_env_config({"taskset": {"id": env_id}, "agent": {"runtime": {"type": "subprocess"}}})
        self.env = vf.load_environment(config)
        seats = sorted(agent_config_fields(config))
        if len(seats) != 1:
            raise ValueError(f"{KEY}={env_id!r}: {type(self.env).__name__} has agent seats {seats}; hybrid trains one")
        if not self.env.taskset.bounded:
            raise ValueError(f"{KEY}={env_id!r}: its taskset is infinite; rows name tasks by their index")
        self.tasks = {task.data.idx: task for task in self.env.taskset}
        self.env_id = env_id

    def task(self, index: int, row: dict, where: str):
        if index not in self.tasks:
            raise ValueError(f"{where}: example_id {index} is not a task of {self.env_id!r} ({len(self.tasks)} tasks)")
        task = self.tasks[index]
        answer = row["verifiers"].get("answer") if isinstance(row.get("verifiers"), dict) else None
        if answer not in (None, "") and str(getattr(task.data, "answer", answer)) != str(answer):
            raise ValueError(
                f"{where}: verifiers.answer {answer!r} is not task {index}'s answer {task.data.answer!r} in "
                f"{self.env_id!r} (the data was prepared from another version of the environment)"
            )
        return task


class VerifiersAgentLoop(OpenAIAgentLoop):
    """The agent loop `verifiers_env`: one verifiers episode per trajectory."""

    _lock = threading.Lock()
    _environments: dict[str, VerifiersEnvironment] = {}

    def environment(self, env_id: str) -> VerifiersEnvironment:
        with self._lock:  # one load per process: the loops' threads share it
            if env_id not in self._environments:
                self._environments[env_id] = VerifiersEnvironment(env_id)
            return self._environments[env_id]

    async def run(self, trajectory: Trajectory, call: RolloutCall) -> None:
        vf = load_verifiers()
        from verifiers.v1.configs.client import EvalClientConfig

        row, where = self.row(trajectory, call), f"batch row {trajectory.row}"
        source = self.environment(environment_of(row, self.rollout.agent.verifiers_env))
        task = source.task(example_index(row, where), row, where)
        endpoint = self.rollout.endpoint
        client = EvalClientConfig(base_url=endpoint.base_url, api_key_var=API_KEY_VAR)
        ctx = vf.ModelContext(model="policy", client=client)
        traces: list = []  # every trace of the episode: verifiers sends its id as the session id
        episode, error = None, None
        # Env.serving() keeps its interception server on the instance: a shallow copy per
        # trajectory (the taskset and harnesses are shared values) keeps concurrent ones apart.
        env = copy.copy(source.env)
        try:
            async with env.serving():
                episode = await env.run_episode(task, ctx, on_trace=traces.append)
        except Exception as raised:  # the environment's code: ends its trajectory, or the run
            error = raised
        records = {str(trace.id): endpoint.take_session(str(trace.id)) for trace in traces}
        final = episode.traces[-1] if episode is not None and episode.traces else None
        record = records.get(str(final.id)) if final is not None else None
        if record is not None and record.finished and record.finish_reason == "length":
            # The endpoint's budget ran out (a 400 to the harness): the trajectory ends there
            # (finish reason length, no reward), as OpenAIAgentLoop's do.
            error, final = None, None
        elif episode is not None and error is None:
            error = self._episode_error(episode, source.env_id)
        reward = final.reward if final is not None and error is None else None
        self._fill(trajectory, call, record, reward)
        if error is not None:
            self._failed(trajectory, error)

    @staticmethod
    def _episode_error(episode: Any, env_id: str) -> Exception | None:
        if episode.errors:
            first = episode.errors[0]
            return RuntimeError(f"verifiers environment {env_id!r}: {first.type}: {first.message}")
        failed = [trace for trace in episode.traces if not trace.ok]
        if failed:
            return RuntimeError(f"verifiers environment {env_id!r}: trace {failed[0].id} did not finish")
        return None
