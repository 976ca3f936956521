"""The data of the OpenAI-compatible endpoint (workers/rollout/openai_server.py): a session's
record (`SessionRecord`, what the trainer trains on), the reading of a request's body
(session id, messages, tools, options, each checked), and the errors a request gets in
OpenAI's shape (`RequestError`, turned into `{"error": {...}}` JSON by the `_json_errors`
middleware, so one bad request never takes the server down).

Sampling is the trainer's, not the request's: the rollout's log-probs assume its
`settings`, so temperature, top_p, top_k, min_p, penalties and seed in a request are
ignored. The request's `max_tokens` (or `max_completion_tokens`) can only lower a turn's
budget (absent: the rollout's `settings.max_tokens` and the room left); its `stop` strings
are added to the rollout's (they end a turn early; the returned text is the decode of every
sampled id, the stop string included, since those ids are what is trained on). `n` must be
1. `logprobs` (chat: true, completions: a number) returns each sampled token's log-prob in
OpenAI's shape; the engine keeps only the sampled token's, so top_logprobs hold at most it.
`return_token_ids` (vLLM's extension) adds the engine's prompt ids and sampled ids, where
vLLM's server puts them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from aiohttp import web

logger = logging.getLogger("workers.rollout.openai_server")

SESSION_HEADER = "X-Session-Id"


@dataclass
class SessionRecord:
    """One session's trajectory, what the trainer trains on. `response_mask` is 1 on the
    engine's sampled ids, 0 on observation ids and the EOS closing a turn that stopped
    without it; `log_probs` the engine's for sampled ids, 0.0 elsewhere. `turn_ends` holds
    each model turn's last response position. `finish_reason` is the last turn's ("stop":
    EOS or a stop string/token, "length": its budget), "length" when the endpoint ended
    the session for want of room (`finished`), None before any turn. `messages` are the
    chat seen (role and content; each assistant content as returned); `text` the
    completion session's text so far."""

    session_id: str
    kind: str  # "chat" or "completion"
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    turns: int = 0
    turn_ends: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    finished: bool = False
    messages: list[dict[str, str]] = field(default_factory=list)
    tools: list | None = None
    text: str = ""


@dataclass(eq=False)
class _Session:
    record: SessionRecord
    token_prompts: bool = False  # completion sessions: prompts are token id lists
    closed: bool = True  # the last model turn ended with EOS
    busy: bool = False
    taken: bool = False
    task: asyncio.Task | None = None  # the engine request in flight

    @property
    def started(self) -> bool:
        return bool(self.record.prompt_ids)


@dataclass
class _Plan:
    """What a session request adds: for a first request the prompt, else the new ids (mask
    0) with the messages or text they come from."""

    prompt_ids: list[int] | None = None
    new_ids: list[int] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)
    text: str = ""
    tools: list | None = None


@dataclass
class _Options:
    max_tokens: int | None
    stop: tuple[str, ...]
    logprobs: bool
    top_logprobs: int
    token_ids: bool  # vLLM's `return_token_ids`: the engine's prompt and sampled ids in the response


class RequestError(Exception):
    """A request the endpoint refuses; becomes an OpenAI-shaped JSON error."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def _error_response(status: int, message: str, kind: str, param=None, code=None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


@web.middleware
async def _json_errors(request: web.Request, handler):
    """Every failure as OpenAI's JSON error, for this request only; the server goes on."""
    try:
        return await handler(request)
    except RequestError as e:
        kind = "invalid_request_error" if e.status < 500 else "server_error"
        return _error_response(e.status, e.message, kind, e.param, e.code)
    except web.HTTPException as e:  # unknown path, wrong method
        return _error_response(e.status, f"{request.method} {request.path}: {e.reason}", "invalid_request_error")
    except Exception as e:  # a bug here must not take the server down
        logger.exception("OpenAIEndpoint: %s %s failed", request.method, request.path)
        return _error_response(500, f"internal error: {type(e).__name__}: {e}", "server_error")


def _session_id(request: web.Request, body: dict) -> str | None:
    header, field_value = request.headers.get(SESSION_HEADER), body.get("session_id")
    for where, value in ((SESSION_HEADER, header), ("session_id", field_value)):
        if value is not None and (not isinstance(value, str) or not value or len(value) > 256):
            raise RequestError(400, f"{where} must be a non-empty string of at most 256 characters", param=where)
    if header is not None and field_value is not None and header != field_value:
        raise RequestError(400, f"the {SESSION_HEADER} header ({header!r}) and session_id ({field_value!r}) differ")
    return header if header is not None else field_value


def _refuse_streaming(body: dict) -> None:
    if body.get("stream"):
        raise RequestError(400, "streaming is not supported: send stream=false", param="stream")


def _messages(value) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise RequestError(400, "messages must be a non-empty list of messages", param="messages")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not message["role"]:
            raise RequestError(400, f"messages[{i}] must be an object with a string role", param=f"messages[{i}]")
        messages.append({"role": message["role"], "content": _content(message.get("content"), i)})
    return messages


def _content(content, i: int) -> str:
    if content is None:  # an assistant message that only called tools
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str) for part in content
    ):
        return "".join(part["text"] for part in content)
    raise RequestError(
        400, f"messages[{i}].content must be a string or a list of text parts", param=f"messages[{i}].content"
    )


def _tools(value) -> list | None:
    if value is not None and not (isinstance(value, list) and all(isinstance(t, dict) for t in value)):
        raise RequestError(400, "tools must be a list of tool objects", param="tools")
    return value or None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _options(body: dict, chat: bool) -> _Options:
    limits = []
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None:
            if not _is_int(value) or value < 1:
                raise RequestError(400, f"{key} must be an integer >= 1", param=key)
            limits.append(value)
    n = body.get("n")
    if n is not None and n != 1:
        raise RequestError(400, "n must be 1: one sample per request (one session is one trajectory)", param="n")
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else stop
    if stops is not None and not (isinstance(stops, list) and all(isinstance(s, str) and s for s in stops)):
        raise RequestError(400, "stop must be a non-empty string or a list of them", param="stop")
    if chat:
        logprobs, top = body.get("logprobs"), body.get("top_logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise RequestError(400, "logprobs must be true or false", param="logprobs")
        if top is not None and (not _is_int(top) or not 0 <= top <= 20):
            raise RequestError(400, "top_logprobs must be an integer from 0 to 20", param="top_logprobs")
        wanted, top = bool(logprobs), int(top or 0)
    else:
        logprobs = body.get("logprobs")
        if logprobs is not None and (not _is_int(logprobs) or not 0 <= logprobs <= 20):
            raise RequestError(400, "logprobs must be an integer from 0 to 20", param="logprobs")
        wanted, top = logprobs is not None, int(logprobs or 0)
    token_ids = body.get("return_token_ids")
    if token_ids is not None and not isinstance(token_ids, bool):
        raise RequestError(400, "return_token_ids must be true or false", param="return_token_ids")
    return _Options(min(limits) if limits else None, tuple(stops or ()), wanted, top, bool(token_ids))


def _first_difference(a, b) -> int:
    """The first position where `a` differs from `b`; `len(b)` when `a` starts with `b`."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _excerpt(text: str, width: int = 60) -> str:
    return repr(text if len(text) <= width else text[:width] + "...")
