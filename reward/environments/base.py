"""The environment contract of a multi-turn rollout: skyrl-gym's `BaseTextEnv`.

One environment object lives for one trajectory. The rollout loop calls
`init(prompt_messages)` once (it may rewrite the first prompt), then after every model turn
`step(action_text)`, which answers with the environment's reply as chat messages, a reward
for that turn, and whether the episode is over; `close()` ends it and `get_metrics()` says
what the episode measured (numbers, averaged over the batch).

Environments are built as skyrl-gym builds its own: `cls(env_config=..., extras=...)`,
where `env_config` is `actor_rollout_ref.rollout.multi_turn.env_kwargs` (an OmegaConf
mapping, readable by key and by attribute) and `extras` is the dataset row (its columns,
plus `reward_spec`, `max_turns`, see reward/environments/factory.py). A skyrl-gym
environment is one of these already; `check_step_output` holds every environment to the
shape the loop relies on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypedDict


class EnvTimeout(Exception):
    """Raised by an environment when something it waited for (a tool, a server) ran past
    its time limit: the rollout ends that trajectory (finish reason `error`, counted as a
    time-out) instead of stopping the run, as it does when `step` itself runs too long."""


class StepOutput(TypedDict):
    observations: list[dict[str, str]]
    reward: float
    done: bool
    metadata: dict[str, Any]


class BaseTextEnv:
    """Text in, text out. Subclasses implement `step`; `init` returns the prompt unchanged."""

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None):
        self.env_config = env_config
        self.extras = dict(extras or {})
        self.turns = 0

    def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        return prompt, {}

    def step(self, action: str) -> StepOutput:
        raise NotImplementedError(f"{type(self).__name__}.step")

    def close(self) -> None:
        pass

    def get_metrics(self) -> dict[str, Any]:
        return {}


def _message_problem(message, parts: bool = False) -> str | None:
    if not isinstance(message, Mapping):
        return f"{type(message).__name__} {message!r}"
    content = message.get("content")
    # `parts`: a vision-language loop also takes OpenAI-style content parts (text and images).
    if parts and isinstance(content, (list, tuple)) and all(isinstance(p, Mapping) and "type" in p for p in content):
        content = ""
    if not isinstance(message.get("role"), str) or not isinstance(content, str):
        what = "string 'role' and 'content' (or a list of content parts)" if parts else "string 'role' and 'content'"
        return f"{dict(message)!r} (needs {what})"
    return None


class EnvironmentFailed(RuntimeError):
    """An environment raised, timed out in a way the run cannot absorb, or broke the step
    contract; the message names the environment, the row and the call. When the
    environment's own code raised, that error is the cause (its frames are shown)."""


def check_step_output(output, parts: bool = False) -> tuple[list[dict[str, str]], float, bool, dict]:
    """(observations, reward, done, metadata) of one `step` result; ValueError when its
    shape is not the contract's (the loop reports it as the environment's error). `parts`:
    observation contents may be lists of content parts (a vision-language policy's loop)."""
    if not isinstance(output, Mapping):
        raise ValueError(f"step returned a {type(output).__name__}, not a dict with observations/reward/done")
    missing = [k for k in ("observations", "reward", "done") if k not in output]
    if missing:
        raise ValueError(f"step returned a dict without {missing} (it has {sorted(output)})")
    observations = output["observations"] or []
    if not isinstance(observations, (list, tuple)):
        raise ValueError(f"step observations must be a list of chat messages, got {type(observations).__name__}")
    for message in observations:
        problem = _message_problem(message, parts)
        if problem:
            raise ValueError(f"step observation is not a chat message: {problem}")
    reward = output["reward"]
    # skyrl-gym's scorers return ints and None for "no reward this turn".
    reward = 0.0 if reward is None else reward
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        raise ValueError(f"step reward must be a number, got {type(reward).__name__} {reward!r}") from None
    if not math.isfinite(reward):
        raise ValueError(f"step reward must be finite, got {reward}")
    done = output["done"]
    if not isinstance(done, bool) and type(done).__name__ != "bool_":
        raise ValueError(f"step done must be a bool, got {type(done).__name__} {done!r}")
    metadata = output.get("metadata") or {}
    return [{"role": m["role"], "content": m["content"]} for m in observations], reward, bool(done), dict(metadata)
