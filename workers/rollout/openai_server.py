"""An OpenAI-compatible HTTP endpoint on the rollout's engine, for agent code that speaks the
OpenAI API (the `openai` client, agent frameworks): `/v1/chat/completions`,
`/v1/completions` and `/v1/models`, non-streaming, every request served by
`AsyncEngineDriver.generate` on the worker's in-process engine. SkyRL's
`generator.enable_http_endpoint` serves the same purpose.

Sessions make it a rollout rather than a chat server. A request carries a session id (the
`X-Session-Id` header, or `session_id` in the body, which the openai client sends with
`extra_body={"session_id": ...}`); the first request of an id opens the session (no
separate call). The endpoint records per session the exact token trajectory the trainer
trains on, as the multi-turn loop (workers/rollout/multi_turn.py) does:

- chat: the first request's messages rendered with the chat template (`render_prompt_ids`,
  with its `tools`) are the prompt; each model turn appends its sampled ids (mask 1, the
  engine's log-probs); a later request must repeat the conversation so far (same roles and
  contents, the assistant's content exactly the text the endpoint returned, the same
  tools), and only its new messages are rendered, by `ObservationRenderer`, and appended
  (mask 0), after the EOS token (mask 0) when the previous model turn ended without one.
  The engine is fed the recorded ids plus that new part, never a re-render of the whole
  conversation: re-tokenizing the model's text does not always give back the sampled ids.
  Messages are read as role and content only (text parts are joined; tool_call_id, name,
  tool_calls are not rendered: `ObservationRenderer` renders role and content).
- completions: the first prompt (text, or a list of token ids) is tokenized as it is; a
  later prompt must extend the session's text (the first prompt as sent, then each
  completion's text as returned and each appended tail), or with token prompts its ids;
  the tail is tokenized and appended (mask 0). The text the agent holds is what is
  compared, not a decode of the tokens, which may differ from it.

A request that does not extend its session (edited or shortened history, another first
prompt, other tools) gets a 400 naming the first difference, and the session is left as it
was; so is it after an engine error. The budget is the multi-turn loop's: the whole
response part (model and observation tokens) within `response_length`, prompt and response
within `max_model_len`. A request whose new part leaves no room for one model token gets a
400 (code `context_length_exceeded`: the agent should stop) and ends the session with
finish reason "length"; the new part is not recorded, so the trajectory ends on a model
turn. One request per session at a time (a second one gets a 400). Requests without a
session id are served without a record (the whole conversation rendered, a first turn's
budget). `take_session` hands the trainer a session's
`SessionRecord` and forgets it; a request of that session still in flight is cancelled
(its turn is not in the record), and the id is not reopened by a late request.

Sampling is the trainer's, not the request's (workers/rollout/openai_protocol.py says
which request options count).

Why aiohttp: it comes with vLLM (as does the `openai` client), and its server runs on an
event loop we own in our own thread (`AppRunner` + `TCPSite`), binds port 0 and reports the
port, and with `handler_cancellation` cancels a handler whose client went away, which
cancels the engine request (the driver aborts on cancellation). uvicorn would need a
second server object's life cycle and polling for disconnects. The server thread runs its
own loop, so agent code on any loop (or thread) and the trainer never block it; the
driver settles each request on the loop that awaits it.

Errors are OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 4xx
`invalid_request_error` for bodies and session rules, 500 `server_error` for an engine
error on that request, 503 when the driver aborted it (a pause for a weight update; the
session is unchanged, so a retry works: the openai client retries 503 by itself).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace

from aiohttp import web

from workers.rollout.async_engine import GenerationAborted
from workers.rollout.base import SamplingSettings
from workers.rollout.multi_turn import ObservationRenderer, render_prompt_ids
from workers.rollout.openai_protocol import (
    RequestError,
    SessionRecord,
    _excerpt,
    _first_difference,
    _is_int,
    _json_errors,
    _messages,
    _Options,
    _options,
    _Plan,
    _refuse_streaming,
    _Session,
    _session_id,
    _tools,
)

logger = logging.getLogger(__name__)

# Taken ids remembered so a late request does not reopen a session; bounded for long runs.
_TAKEN_IDS_KEPT = 100_000
# Conversations grow with every turn; aiohttp's default body limit is 1 MiB.
_MAX_BODY_BYTES = 64 * 1024 * 1024


class OpenAIEndpoint:
    """The endpoint on `driver` (an `AsyncEngineDriver`). `settings` is the rollout's
    sampling (temperature, filters, stops, the per-turn `max_tokens`); `make_params` turns
    a `SamplingSettings` into the engine's parameters (`vllm_sampling_params`; passed in
    so this module does not import the engine module that may own the endpoint).
    `start()` serves on `host:port` (0: a free port) and returns the port; `close()` stops
    (idempotent; in-flight requests are cancelled, which aborts them in the engine)."""

    def __init__(
        self,
        driver,
        tokenizer,
        eos_token_ids,
        settings: SamplingSettings,
        max_model_len: int,
        response_length: int,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        make_params: Callable[[SamplingSettings], object],
        model_name: str = "hybrid-policy",
    ):
        self.driver = driver
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        eos = tokenizer.eos_token_id
        self.eos_token_id = eos if eos in self.eos_token_ids else min(self.eos_token_ids)
        self.settings = replace(settings, n=1)
        self.max_model_len = int(max_model_len)
        self.response_length = int(response_length)
        self.host, self.port = host, int(port)
        self.model_name = model_name
        self._make_params = make_params
        self.renderer = ObservationRenderer(tokenizer, True, self.eos_token_ids)
        self._vocab_size = len(tokenizer)
        # Guards the sessions: handlers run on the server's loop, take_session on the trainer's thread.
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._taken: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._inflight: set[asyncio.Task] = set()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._closed = False

    # ------------------------------------------------------------------ life cycle
    @property
    def base_url(self) -> str:
        """What the openai client takes as `base_url`."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> int:
        """Starts the server thread; returns the bound port once it accepts connections."""
        if self._closed:
            raise RuntimeError("OpenAIEndpoint is closed; build a new one")
        if self._thread is None:
            self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), name="openai-endpoint")
            self._thread.daemon = True
            self._thread.start()
            self._ready.wait()
            if self._start_error is not None:
                self._thread.join()
                raise RuntimeError(
                    f"OpenAIEndpoint could not serve on {self.host}:{self.port}: {self._start_error}"
                ) from self._start_error
        return self.port

    def close(self) -> None:
        """Stops serving; idempotent. Not from a handler (it waits for the server thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._thread is None or self._start_error is not None:
            return
        try:
            self._loop.call_soon_threadsafe(self._stop.set)
        except RuntimeError:  # the loop has already ended
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=60)

    def __enter__(self) -> OpenAIEndpoint:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application(middlewares=[_json_errors], client_max_size=_MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        # handler_cancellation: a client that goes away cancels its handler, and so its engine request.
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=5.0)
        try:
            await runner.setup()
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
            self.port = int(runner.addresses[0][1])
        except BaseException as e:
            self._start_error = e
            self._ready.set()
            await runner.cleanup()
            return
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            # Cancelled engine requests are aborted by the driver; their handlers answer 503.
            for task in list(self._inflight):
                task.cancel()
            await runner.cleanup()

    # ------------------------------------------------------------------ sessions
    def take_session(self, session_id: str) -> SessionRecord | None:
        """Removes and returns the session's record (None: no such session). A request of
        it still in flight is cancelled, and its turn is not in the record; later
        requests with this id are refused. Callable from any thread."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
            if session is None:
                return None
            session.taken = True
            self._taken[session_id] = None
            while len(self._taken) > _TAKEN_IDS_KEPT:
                self._taken.popitem(last=False)
            task = session.task
        if task is not None:
            try:
                self._loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the server has stopped: nothing runs any more
                pass
        return session.record

    def session_ids(self) -> list[str]:
        """The ids of the sessions opened and not taken."""
        with self._lock:
            return list(self._sessions)

    def _enter_session(self, session_id: str, kind: str, token_prompts: bool = False) -> _Session:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                if session_id in self._taken:
                    raise RequestError(
                        400, f"session {session_id!r} was taken by the trainer; it takes no more requests"
                    )
                session = _Session(SessionRecord(session_id, kind), token_prompts=token_prompts)
                self._sessions[session_id] = session
            if session.busy:
                raise RequestError(400, f"session {session_id!r} has a request in flight; send one at a time")
            if session.record.kind != kind:
                raise RequestError(
                    400, f"session {session_id!r} is a {session.record.kind} session; this is a {kind} request"
                )
            if session.record.finished:
                raise RequestError(
                    400,
                    f"session {session_id!r} is finished ({session.record.finish_reason}): no room is left "
                    f"in its budget",
                    code="context_length_exceeded",
                )
            session.busy = True
            return session

    def _leave_session(self, session: _Session) -> None:
        with self._lock:
            session.busy = False
            session.task = None
            # A first request that failed leaves no session behind: a retry starts it afresh.
            if not session.started and self._sessions.get(session.record.session_id) is session:
                del self._sessions[session.record.session_id]

    def _room(self, prompt_len: int, used: int) -> int:
        return min(self.response_length - used, self.max_model_len - prompt_len - used)

    def _turn_input(self, session: _Session, plan: _Plan, options: _Options):
        """The engine input and budget of this turn; records the end of a session with no room."""
        record = session.record
        if plan.prompt_ids is not None:
            prompt, used = plan.prompt_ids, 0
        else:
            prompt, used = record.prompt_ids, len(record.response_ids) + len(plan.new_ids)
        room = self._room(len(prompt), used)
        if room < 1:
            with self._lock:
                if session.taken:  # the record is the trainer's now
                    raise RequestError(400, f"session {record.session_id!r} was taken by the trainer")
                if plan.prompt_ids is not None:
                    _open(record, plan)
                record.finished, record.finish_reason = True, "length"
            raise RequestError(
                400,
                f"session {record.session_id!r} has no room left: response {used} of {self.response_length} "
                f"tokens, prompt {len(prompt)} + response within max_model_len {self.max_model_len}; the session "
                f"is finished, stop the agent",
                code="context_length_exceeded",
            )
        engine_ids = list(prompt) if plan.prompt_ids is not None else record.prompt_ids + record.response_ids
        return engine_ids + plan.new_ids, self._turn_budget(room, options)

    def _commit(self, session: _Session, plan: _Plan, turn, text: str, kind: str) -> None:
        record = session.record
        ids = list(turn.token_ids)
        with self._lock:
            if session.taken:
                raise RequestError(400, f"session {record.session_id!r} was taken by the trainer during this turn")
            if plan.prompt_ids is not None:
                _open(record, plan)
            else:
                record.response_ids += plan.new_ids
                record.response_mask += [0] * len(plan.new_ids)
                record.log_probs += [0.0] * len(plan.new_ids)
                record.messages += plan.messages
                record.text += plan.text
            record.response_ids += ids
            record.response_mask += [1] * len(ids)
            record.log_probs += [float(p) for p in turn.log_probs]
            record.turns += 1
            record.turn_ends.append(len(record.response_ids) - 1)
            record.finish_reason = turn.finish_reason
            if kind == "chat":
                record.messages.append({"role": "assistant", "content": text})
            record.text += text
            session.closed = bool(ids) and ids[-1] in self.eos_token_ids

    # ------------------------------------------------------------------ generation
    def _turn_budget(self, room: int, options: _Options) -> int:
        budget = min(room, int(self.settings.max_tokens))
        return min(budget, options.max_tokens) if options.max_tokens is not None else budget

    async def _generate(self, engine_ids: list[int], budget: int, options: _Options, session: _Session | None):
        try:
            params = self._make_params(
                replace(self.settings, max_tokens=budget, stop=tuple(self.settings.stop) + options.stop)
            )
        except ValueError as e:
            raise RequestError(400, f"the sampling parameters are refused: {e}", param="stop") from e
        task = asyncio.ensure_future(self.driver.generate(engine_ids, params))
        self._inflight.add(task)
        if session is not None:
            with self._lock:
                session.task = task
        try:
            turn = await task
        except asyncio.CancelledError:
            # Cancelled from outside (take_session, close), not this handler (its client left).
            if task.cancelled() and not asyncio.current_task().cancelling():
                if session is not None and session.taken:
                    raise RequestError(400, "the session was taken by the trainer during this turn") from None
                raise RequestError(503, "the endpoint is closing; the request was aborted") from None
            raise
        except GenerationAborted as e:
            raise RequestError(503, f"the engine aborted this request (a pause for a weight update?): {e}") from e
        except Exception as e:
            logger.warning("OpenAIEndpoint: the engine failed on a request", exc_info=True)
            raise RequestError(500, f"the engine failed on this request: {type(e).__name__}: {e}") from e
        finally:
            self._inflight.discard(task)
        return turn

    async def _serve_turn(self, session_id, kind, plan_fn, options: _Options, token_prompts: bool = False):
        """A request's turn: stateless without a session id, else planned against its session,
        generated, and recorded. Returns (engine input, turn, returned text)."""
        if session_id is None:
            plan = plan_fn(None)
            room = self._room(len(plan.prompt_ids), 0)
            if room < 1:
                raise RequestError(
                    400,
                    f"the prompt is {len(plan.prompt_ids)} tokens; max_model_len {self.max_model_len} leaves no room",
                    code="context_length_exceeded",
                )
            turn = await self._generate(plan.prompt_ids, self._turn_budget(room, options), options, None)
            return plan.prompt_ids, turn, self._decode(turn.token_ids)
        session = self._enter_session(session_id, kind, token_prompts)
        try:
            if session.token_prompts != token_prompts:
                raise RequestError(400, f"session {session_id!r} takes prompts as {_prompt_kind(session)}")
            plan = plan_fn(session)
            engine_ids, budget = self._turn_input(session, plan, options)
            turn = await self._generate(engine_ids, budget, options, session)
            text = self._decode(turn.token_ids)
            self._commit(session, plan, turn, text, kind)
            return engine_ids, turn, text
        finally:
            self._leave_session(session)

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------------ chat
    async def _chat(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        session_id = _session_id(request, body)
        _refuse_streaming(body)
        messages = _messages(body.get("messages"))
        tools = _tools(body.get("tools"))
        options = _options(body, chat=True)

        def plan(session: _Session | None) -> _Plan:
            if session is None or not session.started:
                return _Plan(prompt_ids=self._render_prompt(messages, tools), messages=messages, tools=tools)
            return self._chat_extension(session, messages, tools)

        engine_ids, turn, text = await self._serve_turn(session_id, "chat", plan, options)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": self._chat_logprobs(turn, options) if options.logprobs else None,
            "finish_reason": turn.finish_reason,
        }
        response = self._envelope("chatcmpl", "chat.completion", choice, engine_ids, turn)
        if options.token_ids:  # where vLLM's server puts them
            choice["token_ids"] = list(turn.token_ids)
            response["prompt_token_ids"] = list(engine_ids)
        return web.json_response(response)

    def _render_prompt(self, messages, tools) -> list[int]:
        try:
            return render_prompt_ids(self.tokenizer, messages, tools)
        except Exception as e:  # the template's own errors (jinja) name the problem
            raise RequestError(400, f"the chat template cannot render these messages: {e}", param="messages") from e

    def _chat_extension(self, session: _Session, messages, tools) -> _Plan:
        record = session.record
        recorded = record.messages
        for i, (got, want) in enumerate(zip(messages, recorded)):
            if got != want:
                raise RequestError(
                    400,
                    f"messages[{i}] ({got['role']}: {_excerpt(got['content'])}) differs from the session's message "
                    f"{i} ({want['role']}: {_excerpt(want['content'])}); a session request repeats the conversation "
                    f"so far unchanged (assistant contents as returned) and adds messages after it",
                    param=f"messages[{i}]",
                )
        if len(messages) < len(recorded):
            raise RequestError(
                400,
                f"the request has {len(messages)} messages, the session {len(recorded)}: messages[{len(messages)}] "
                f"({recorded[len(messages)]['role']}) is missing; repeat the whole conversation so far",
                param="messages",
            )
        if (tools or None) != (record.tools or None):
            raise RequestError(400, "the tools differ from the session's first request's", param="tools")
        new = messages[len(recorded) :]
        try:
            ids = self.renderer.render(new)
        except Exception as e:  # the template refuses them
            raise RequestError(400, f"the chat template cannot render the new messages: {e}", param="messages") from e
        # The template closes an assistant turn with EOS; a turn that stopped without it gets it here.
        closing = [] if session.closed else [self.eos_token_id]
        return _Plan(new_ids=closing + ids, messages=new)

    def _chat_logprobs(self, turn, options: _Options) -> dict:
        tokens = self.tokenizer.batch_decode([[i] for i in turn.token_ids])
        content = []
        for token, logprob in zip(tokens, turn.log_probs):
            entry = {"token": token, "logprob": float(logprob), "bytes": list(token.encode("utf-8"))}
            content.append({**entry, "top_logprobs": [entry] if options.top_logprobs > 0 else []})
        return {"content": content}

    # ------------------------------------------------------------------ completions
    async def _completions(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        session_id = _session_id(request, body)
        _refuse_streaming(body)
        for key, off in (("echo", False), ("suffix", None), ("best_of", 1)):
            if body.get(key, off) not in (off, None):
                raise RequestError(400, f"{key}={body[key]!r} is not supported", param=key)
        prompt = self._prompt(body.get("prompt"))
        options = _options(body, chat=False)
        token_prompts = isinstance(prompt, list)

        def plan(session: _Session | None) -> _Plan:
            if session is None or not session.started:
                if token_prompts:
                    return _Plan(prompt_ids=list(prompt), text=self._decode(prompt))
                return _Plan(prompt_ids=self._encode(prompt), text=prompt)
            return self._completion_extension(session, prompt)

        engine_ids, turn, text = await self._serve_turn(session_id, "completion", plan, options, token_prompts)
        choice = {
            "index": 0,
            "text": text,
            "logprobs": self._completion_logprobs(turn, options) if options.logprobs else None,
            "finish_reason": turn.finish_reason,
        }
        if options.token_ids:
            choice.update(prompt_token_ids=list(engine_ids), token_ids=list(turn.token_ids))
        return web.json_response(self._envelope("cmpl", "text_completion", choice, engine_ids, turn))

    def _prompt(self, prompt):
        # One prompt per request: a list of one string or one id list is that prompt.
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            return prompt
        if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < self._vocab_size]
            if bad:
                raise RequestError(400, f"prompt token ids {bad[:5]} are outside the vocabulary", param="prompt")
            return [int(t) for t in prompt]
        raise RequestError(
            400, "prompt must be one non-empty string or one non-empty list of token ids (no batches)", param="prompt"
        )

    def _completion_extension(self, session: _Session, prompt) -> _Plan:
        record = session.record
        if isinstance(prompt, list):
            so_far = record.prompt_ids + record.response_ids
            at = _first_difference(prompt, so_far)
            if at < len(so_far):
                raise RequestError(
                    400,
                    f"the prompt's token {at} differs from the session's token ids so far ({len(so_far)} ids); a "
                    f"session prompt extends them",
                    param="prompt",
                )
            tail = prompt[len(so_far) :]
            return _Plan(new_ids=list(tail), text=self._decode(tail))
        at = _first_difference(prompt, record.text)
        if at < len(record.text):
            raise RequestError(
                400,
                f"the prompt differs from the session's text so far at character {at} (prompt: "
                f"{_excerpt(prompt[at:])}, session: {_excerpt(record.text[at:])}); a session prompt is the text so "
                f"far (completions as returned) plus new text",
                param="prompt",
            )
        tail = prompt[len(record.text) :]
        return _Plan(new_ids=self._encode(tail) if tail else [], text=tail)

    def _completion_logprobs(self, turn, options: _Options) -> dict:
        tokens = self.tokenizer.batch_decode([[i] for i in turn.token_ids])
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [float(p) for p in turn.log_probs],
            "top_logprobs": [{t: float(p)} for t, p in zip(tokens, turn.log_probs)] if options.top_logprobs else None,
            "text_offset": offsets,
        }

    # ------------------------------------------------------------------ the rest
    def _envelope(self, prefix: str, kind: str, choice: dict, engine_ids, turn) -> dict:
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(engine_ids),
                "completion_tokens": len(turn.token_ids),
                "total_tokens": len(engine_ids) + len(turn.token_ids),
            },
        }

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "hybrid"}
        return web.json_response({"object": "list", "data": [model]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})


# ---------------------------------------------------------------------- request reading
async def _json_body(request: web.Request) -> dict:
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise RequestError(400, f"the body must be a JSON object, not {type(body).__name__}")
    return body


def _open(record: SessionRecord, plan: _Plan) -> None:
    """A session's first request: its prompt, and what it was rendered from."""
    record.prompt_ids = list(plan.prompt_ids)
    record.messages = list(plan.messages)
    record.tools = plan.tools
    record.text = plan.text


def _prompt_kind(session: _Session) -> str:
    return "token id lists" if session.token_prompts else "text"
