"""The built-in agent loops of mode=async (workers/rollout/agent_loop.py):

- `single_turn_agent`: one model turn from the data loader's prompt (verl's name);
- `environment_agent`: the multi-turn loop of workers/rollout/multi_turn.py for one
  trajectory: the environment of the row (env_class), of the run, a verl interaction or
  verl tools; the same per-trajectory steps as the lock-step loop, so greedy decoding with
  deterministic environments gives its tokens exactly;
- `tool_agent` (verl's name): that loop where the environment is the verl tools of
  multi_turn.tool_config_path (hermes tool calls in the model's text);
- `verifiers_env`: an episode of a `verifiers` environment through the OpenAI endpoint
  (workers/rollout/verifiers_env.py).

and the loops a run knows (`agent_loop_classes`): those, the registered ones, and the
entries of agent.agent_loop_config_path (`read_agent_loop_config`).
"""

from __future__ import annotations

import importlib
import inspect

from reward.user_code import load_user_file
from workers.rollout.agent_loop import AGENT, AGENT_LOOP_REGISTRY, AgentLoop, RolloutCall
from workers.rollout.multi_turn import MULTI_TURN, Trajectory
from workers.rollout.verifiers_env import VerifiersAgentLoop


class SingleTurnAgentLoop(AgentLoop):
    async def run(self, trajectory: Trajectory, call: RolloutCall) -> None:
        trajectory.prompt_ids = self.dataset_prompt_ids(trajectory, call)
        turn = await self.generate(trajectory.prompt_ids, call.settings.max_tokens, call)
        trajectory.response_ids = list(turn.token_ids)
        trajectory.mask = [1] * len(turn.token_ids)
        trajectory.log_probs = [float(p) for p in turn.log_probs]
        trajectory.turns = 1
        trajectory.finish = "done"
        if turn.token_ids:
            trajectory.last_model_position = len(turn.token_ids) - 1
            trajectory.last_turn_text = self.decode(turn.token_ids)


class EnvironmentAgentLoop(AgentLoop):
    async def run(self, trajectory: Trajectory, call: RolloutCall) -> None:
        loop = self.rollout.multi_turn
        if loop is None:
            raise ValueError(
                f"agent loop {type(self).__name__} steps an environment: set {MULTI_TURN}.enable=true "
                f"(with env_class, a tool or an interaction)"
            )
        rollout, rows, lock = self.rollout, call.rows, self.rollout.tokenizer_lock
        outcome = await rollout.env_call(trajectory, loop.opener(trajectory, rows))
        with lock:
            loop.set_prompt(trajectory, outcome, rows, call.prompts)
        while trajectory.finish is None:
            budget = loop.budget(trajectory)
            turn = await self.generate(loop.turn_prompt(trajectory), budget, call)
            loop.apply_turn(trajectory, turn, budget, self.decode(turn.token_ids))
            outcome = await rollout.env_call(trajectory, *self._step(trajectory, loop))
            with lock:  # an observation is rendered with the tokenizer
                loop.apply_step(trajectory, outcome, rows)
        if loop.closable(trajectory):
            loop.apply_close(trajectory, await rollout.env_call(trajectory, loop.closer(trajectory)), rows)

    @staticmethod
    def _step(trajectory: Trajectory, loop) -> tuple:
        """(plain call, None), or (None, the coroutine) for an `async def step`."""
        if inspect.iscoroutinefunction(trajectory.env.step):
            return None, trajectory.env.step(trajectory.last_turn_text)
        return loop.stepper(trajectory), None


class ToolAgentLoop(EnvironmentAgentLoop):
    def __init__(self, rollout, **kwargs):
        super().__init__(rollout, **kwargs)
        if not rollout.config.multi_turn.tool_config_path:
            raise ValueError(
                f"agent loop tool_agent calls verl tools: set {MULTI_TURN}.tool_config_path (and "
                f"{MULTI_TURN}.enable=true), or use environment_agent"
            )


BUILT_IN_AGENT_LOOPS: dict[str, type[AgentLoop]] = {
    "single_turn_agent": SingleTurnAgentLoop,
    "environment_agent": EnvironmentAgentLoop,
    "tool_agent": ToolAgentLoop,
    "verifiers_env": VerifiersAgentLoop,
}


def known(loops) -> str:
    return ", ".join(sorted(loops))


def agent_loop_classes(agent) -> dict[str, type[AgentLoop]]:
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
