"""verl tools (`multi_turn.tool_config_path`): calls parsed from the model's text, run
with a time limit, answered in the conversation.

verl's tool YAML lists tools under `tools:`, each with `class_name` (dotted import path),
`config` (a dict for the constructor; hybrid reads `timeout_s`, the per-call time limit,
default 10 s, which a tool should enforce itself) and `tool_schema` (an OpenAI function schema; optional when the class
provides its own):

    tools:
      - class_name: reward.environments.python_tool.PythonTool
        config: {timeout_s: 5}

A tool follows verl's BaseTool: `create(instance_id, **create_kwargs)` per trajectory
(create_kwargs from the row's `extra_info.tools_kwargs.<tool name>.create_kwargs`),
`execute(instance_id, parameters) -> (response, reward, metrics)` per call (response: a
string, {"text": ...} or an object with `.text`), `release(instance_id)` at the end; any
of them may be async, only `execute` is required.

Calls are read in the hermes format (`multi_turn.format=hermes`):
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number per turn. Each is
answered, in order, with its result (or the error: unknown tool, bad JSON, an exception)
truncated to `max_tool_response_length` characters as verl does (`left` keeps the start,
`right` the end, `middle` both ends). A tool that enforces its limit and reports it (the
Python tool) is answered like any result; a call that has still not returned
`GRACE_S` seconds after its limit is abandoned and ends the trajectory (`EnvTimeout`:
finish reason `error`, counted as a time-out), as verl ends a trajectory on a failed call.
When the chat template renders tool messages itself (it mentions `tool_response`, as
Qwen's does) each answer is a `tool`
message; otherwise the answers go in one `user` message as
`<tool_response>\n...\n</tool_response>` blocks. A turn without a call goes to the inner
environment when there is one (the row's env_class, or a verl interaction), and ends the
episode otherwise.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reward.environments._calls import CallTimeout, call, call_with_limit, import_class
from reward.environments.base import BaseTextEnv, EnvTimeout, StepOutput

KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
DEFAULT_TIMEOUT_S = 10.0
# How long past its timeout_s a call may take before it is abandoned: room for a tool that
# stops itself at the limit (killing a subprocess, reporting) to deliver its answer.
GRACE_S = 2.0
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str | None
    arguments: dict | None
    error: str | None = None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every hermes `<tool_call>` block of `text`, in order; a malformed one carries its error."""
    calls = []
    for body in _TOOL_CALL.findall(text):
        try:
            payload = json.loads(body.strip())
        except json.JSONDecodeError as e:
            calls.append(ToolCall(None, None, f"tool call is not valid JSON ({e.msg})"))
            continue
        name = payload.get("name") if isinstance(payload, dict) else None
        arguments = payload.get("arguments", {}) if isinstance(payload, dict) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            calls.append(ToolCall(None, None, 'tool call needs {"name": <string>, "arguments": <object>}'))
            continue
        calls.append(ToolCall(name, arguments))
    return calls


def truncate(text: str, limit: int, side: str) -> str:
    """verl's truncation of a long tool response."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-half:]


def _response_text(response) -> str:
    if isinstance(response, str):
        return response
    if isinstance(response, Mapping):
        return str(response.get("text") or "")
    text = getattr(response, "text", None)
    return str(text) if text is not None else str(response)


@dataclass
class Tool:
    name: str
    instance: Any
    schema: dict
    timeout_s: float


def _schema_object(schema: dict):
    """verl's tool classes want its pydantic schema; others take the dict."""
    try:
        from verl.tools.schemas import OpenAIFunctionToolSchema
    except ImportError:
        return schema
    return OpenAIFunctionToolSchema.model_validate(schema)


def _build_tool(item: Mapping, path: str) -> Tool:
    if "class_name" not in item:
        raise ValueError(f"{KEY}: every tool in {path} needs a class_name, got {dict(item)!r}")
    cls = import_class(item["class_name"], KEY)
    options = dict(item.get("config") or {})  # the tool's own YAML options
    schema = item.get("tool_schema") or getattr(cls, "DEFAULT_SCHEMA", None)
    if not isinstance(schema, Mapping) or "name" not in (schema.get("function") or {}):
        raise ValueError(f"{KEY}: {item['class_name']} in {path} needs a tool_schema with function.name")
    if not callable(getattr(cls, "execute", None)):
        raise TypeError(f"{KEY}: {item['class_name']} has no execute(instance_id, parameters) method")
    timeout_s = float(options.get("timeout_s", DEFAULT_TIMEOUT_S))
    if timeout_s <= 0:
        raise ValueError(f"{KEY}: {item['class_name']} config.timeout_s must be > 0, got {timeout_s}")
    instance = cls(config=options, tool_schema=_schema_object(dict(schema)))
    return Tool(schema["function"]["name"], instance, dict(schema), timeout_s)


def load_tools(path: str) -> dict[str, Tool]:
    """{tool name: Tool} from verl's tool YAML at `path`."""
    from omegaconf import OmegaConf

    if not os.path.isfile(path):
        raise FileNotFoundError(f"{KEY}: {path!r} not found (working directory {os.getcwd()})")
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    items = data.get("tools") if isinstance(data, dict) else None
    if not items:
        raise ValueError(f"{KEY}: {path} has no 'tools:' list (each item: class_name, config, tool_schema)")
    tools: dict[str, Tool] = {}
    for item in items:
        tool = _build_tool(item, path)
        if tool.name in tools:
            raise ValueError(f"{KEY}: tool name {tool.name!r} appears twice in {path}")
        tools[tool.name] = tool
    return tools


class ToolEnv(BaseTextEnv):
    """Answers the model's tool calls; other turns go to `inner` (or end the episode)."""

    def __init__(
        self,
        tools: Mapping[str, Tool],
        inner,
        extras,
        max_response_chars: int,
        truncate_side: str,
        tool_role: bool,
        max_calls: int | None = None,
    ):
        super().__init__(None, extras)
        self.tools, self.inner = tools, inner
        self.max_calls = max_calls  # verl's multi_turn.max_parallel_calls: a turn's first calls run, the rest not
        self.max_response_chars, self.truncate_side, self.tool_role = max_response_chars, truncate_side, tool_role
        self.instance_ids: dict[str, str] = {}
        self.counts = {"tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0}
        extra_info = self.extras.get("extra_info")
        tools_kwargs = extra_info.get("tools_kwargs") if isinstance(extra_info, Mapping) else None
        self.tools_kwargs = dict(tools_kwargs or {})

    def init(self, prompt):
        for name, tool in self.tools.items():
            instance_id = uuid.uuid4().hex
            create = getattr(tool.instance, "create", None)
            if create is not None:
                create_kwargs = (self.tools_kwargs.get(name) or {}).get("create_kwargs") or {}
                created = call(create, instance_id, **create_kwargs)
                # verl's newer tools return (instance_id, response), older ones the id.
                instance_id = created[0] if isinstance(created, tuple) else (created or instance_id)
            self.instance_ids[name] = instance_id
        return self.inner.init(prompt) if self.inner is not None else (prompt, {})

    def _run(self, tool_call: ToolCall) -> tuple[str, float]:
        self.counts["tool_calls"] += 1
        if tool_call.error is None and tool_call.name not in self.tools:
            tool_call = ToolCall(None, None, f"unknown tool {tool_call.name!r}; tools: {', '.join(sorted(self.tools))}")
        if tool_call.error is not None:
            self.counts["tool_errors"] += 1
            return f"Error: {tool_call.error}", 0.0
        tool = self.tools[tool_call.name]
        try:
            result = call_with_limit(
                tool.timeout_s + GRACE_S, tool.instance.execute, self.instance_ids[tool.name], tool_call.arguments
            )
        except CallTimeout:
            self.counts["tool_timeouts"] += 1
            raise EnvTimeout(
                f"tool {tool.name} gave no answer within its timeout_s={tool.timeout_s:g} (+{GRACE_S:g} s grace)"
            ) from None
        except Exception as e:
            self.counts["tool_errors"] += 1
            return f"Error: {tool.name} raised {type(e).__name__}: {e}", 0.0
        response, reward = (result[0], result[1]) if isinstance(result, tuple) else (result, 0.0)
        return _response_text(response), float(reward or 0.0)

    def step(self, action: str) -> StepOutput:
        calls = parse_tool_calls(action)
        if not calls:
            if self.inner is not None:
                return self.inner.step(action)
            return {"observations": [], "reward": 0.0, "done": True, "metadata": {}}
        self.turns += 1
        calls = calls if self.max_calls is None else calls[: self.max_calls]
        answers, reward = [], 0.0
        for tool_call in calls:
            text, tool_reward = self._run(tool_call)
            answers.append(truncate(text, self.max_response_chars, self.truncate_side))
            reward += tool_reward
        if self.tool_role:
            observations = [{"role": "tool", "content": text} for text in answers]
        else:
            body = "\n".join(f"<tool_response>\n{text}\n</tool_response>" for text in answers)
            observations = [{"role": "user", "content": body}]
        return {"observations": observations, "reward": reward, "done": False, "metadata": {}}

    def close(self) -> None:
        for name, instance_id in self.instance_ids.items():
            release = getattr(self.tools[name].instance, "release", None)
            if release is not None:
                call(release, instance_id)
        self.instance_ids = {}
        if self.inner is not None:
            self.inner.close()

    def get_metrics(self) -> dict[str, Any]:
        inner = self.inner.get_metrics() if self.inner is not None and hasattr(self.inner, "get_metrics") else {}
        return {**dict(inner or {}), **self.counts}


__all__ = ["Tool", "ToolCall", "ToolEnv", "load_tools", "parse_tool_calls", "truncate"]
