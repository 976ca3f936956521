"""An asyncio front to the worker's in-process vLLM engine, for rollouts that generate at
their own pace (one coroutine per trajectory: generate, step an environment, generate
again) while the engine batches whatever requests are in flight at each step.

Why not vLLM's `AsyncLLM`: it always runs the engine core in a child process, which then
holds the weights, and the fused worker's in-memory weight update (`collective_rpc(
"reload_weights")` on `VLLMRollout.llm`) could not reach them. So `AsyncEngineDriver`
drives the very engine `VLLMRollout` built (`llm.llm_engine`, an in-process `LLMEngine`)
the way `LLM.generate` does (`add_request`, then `step()` while requests are unfinished,
keeping the finished `RequestOutput`s), but from one background thread that never stops
while work is in flight, so a request arriving mid-generation joins the running batch at
the next step instead of waiting for a whole `generate` call to end.

Threading: the engine is not thread-safe, so one thread calls it: the driver's own (add,
abort, step). Coroutines never touch the engine: `generate` queues its request under the
driver's small state lock and awaits an asyncio future; the thread adds queued requests
between steps and hands each finished output back to the future's own event loop with
`call_soon_threadsafe`. Calling `add_request` from the coroutine under an engine lock
would stall its event loop (and every environment step on it) until the running step
ended; queueing costs the same one-step delay without the stall, and with one thread on
the engine no engine lock is needed. Each request remembers the loop that awaits it, so
coroutines may await on any running loop (several too); that loop must keep running
until its requests end, and closing it with requests in flight leaves them to finish
unread (asyncio.run cancels its tasks first, which aborts them).

Other users of the same engine (`llm.generate`, `VLLMRollout.generate_ids`, weight
updates, `collective_rpc`, sleep/wake) must run inside `pause()`, while the driver's
thread is parked: beside the race, `LLM.generate` steps the engine until it is empty and
would swallow this driver's outputs (the driver fails, saying so, if it notices).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from workers.rollout.base import GeneratedTurn

if TYPE_CHECKING:
    from vllm import SamplingParams

logger = logging.getLogger(__name__)


class GenerationAborted(RuntimeError):
    """The driver took the request out of the engine unfinished: `pause(abort=True)` or
    `close()`. Not a `CancelledError`: the awaiting coroutine was not cancelled, and may
    retry after `resume()` (with the weights loaded meanwhile)."""


@dataclass(frozen=True)
class DriverStats:
    """The engine's work since `reset_stats()` (or the start): `busy_s` seconds inside
    `step()` out of `wall_s`, in `steps` calls; `finished` requests returned; requests in
    the engine at once (added, not finished or aborted), at most and averaged over time."""

    wall_s: float
    busy_s: float
    steps: int
    finished: int
    max_in_flight: int
    mean_in_flight: float


@dataclass(eq=False)
class _Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams  # a clone, FINAL_ONLY
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class AsyncEngineDriver:
    """`await driver.generate(prompt_ids, params)` on an in-process `vllm.LLM`.

    `pause(abort=False)` waits until no request is in the engine (with `abort=True` it
    aborts them; their awaiters get `GenerationAborted`) and admits no new ones until
    `resume()`; requests made meanwhile wait in the queue. Use it as `with
    driver.pause(): ...` around weight updates, sleep/wake and synchronous generation.
    An exception in `step()` fails every waiting request with that exception, and the
    driver then refuses new requests. `close()` aborts what is in flight and stops the
    thread.
    """

    def __init__(self, llm, name: str = "async-engine", own_thread: bool = True):
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        self._engine = llm.llm_engine
        self._tokens_prompt = TokensPrompt
        self._final_only = RequestOutputKind.FINAL_ONLY
        # Distinct from LLM.generate's ids ("0", "1", ...) and another driver's.
        # itertools.count's next() is atomic; a generator's is not, and coroutines on several
        # event loops (threads) ask for ids at once.
        self._prefix = f"{name}-{uuid.uuid4().hex[:8]}"
        self._counter = itertools.count()
        # Guards every field below; the thread sleeps on it when there is nothing to do.
        self._cond = threading.Condition(threading.Lock())
        self._pending: collections.deque[_Request] = collections.deque()
        self._running: dict[str, _Request] = {}  # handed to the engine, not yet returned
        self._to_abort: list[str] = []  # cancelled while in the engine
        self._abort_all = False
        self._pause_depth = 0
        self._stepping = False
        self._failure: BaseException | None = None
        self._closed = False
        self.reset_stats()
        # own_thread=False: the caller steps the engine with `serve()` on a thread of its own
        # choosing, the one that already runs torch's OpenMP team (on CPU a second thread's
        # team steps the same engine about 1.6x slower: scripts/bench_agent_loop.py).
        self._thread: threading.Thread | None = None
        if own_thread:
            self._thread = threading.Thread(target=self.serve, name=name, daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ requests
    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GeneratedTurn:
        """One sample of `prompt_ids` under `params` (a vLLM `SamplingParams` with n=1 and
        `logprobs` set, e.g. `vllm_sampling_params(settings)`): the ids as sampled, the
        engine's log-prob of each, and "stop" or "length", as `VLLMRollout.generate_ids`.

        Cancelling the awaiting coroutine (a trajectory's time-out) takes the request out
        of the engine. A request the engine refuses (too long a prompt, ...) raises here.
        """
        if params.n != 1:
            raise ValueError(f"AsyncEngineDriver.generate samples one continuation per request; got n={params.n}")
        if params.logprobs is None:
            raise ValueError("AsyncEngineDriver.generate returns each sampled token's log-prob: set logprobs=0")
        params = params.clone()
        # Else the engine returns every unfinished request's output so far at every step.
        params.output_kind = self._final_only
        loop = asyncio.get_running_loop()
        request_id = f"{self._prefix}-{next(self._counter)}"
        request = _Request(request_id, list(prompt_ids), params, loop.create_future(), loop)
        with self._cond:
            self._refuse_if_stopped()
            self._pending.append(request)
            self._cond.notify_all()
        try:
            output = await request.future
        except asyncio.CancelledError:
            self._withdraw(request)
            raise
        completion = output.outputs[0]
        ids = list(completion.token_ids)
        log_probs = [step[tok].logprob for step, tok in zip(completion.logprobs, ids)]
        return GeneratedTurn(ids, log_probs, "stop" if completion.finish_reason == "stop" else "length")

    def _refuse_if_stopped(self) -> None:
        if self._failure is not None:
            raise RuntimeError(
                f"AsyncEngineDriver: the engine failed ({type(self._failure).__name__}: {self._failure}); its state "
                f"is unknown and this driver takes no more requests"
            ) from self._failure
        if self._closed:
            raise RuntimeError("AsyncEngineDriver is closed; it takes no more requests")

    def _withdraw(self, request: _Request) -> None:
        with self._cond:
            if request in self._pending:
                self._pending.remove(request)
            elif request.request_id in self._running:
                # Stays counted in flight until the thread has aborted it, so pause() waits for that.
                self._to_abort.append(request.request_id)
                self._cond.notify_all()

    # ------------------------------------------------------------------ pause
    def pause(self, abort: bool = False, timeout: float | None = None) -> _Paused:
        """Blocks until no request is in the engine and none will enter it until
        `resume()`; returns a context manager that resumes on exit. `abort=True` aborts
        the requests in flight instead of letting them finish (their awaiters get
        `GenerationAborted`). Queued requests stay queued. Pauses nest; each needs its
        resume. Callable from an event loop's thread too: the engine thread finishes the
        requests without the loop. After `timeout` seconds it resumes and raises
        TimeoutError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._pause_depth += 1
            if abort and self._running:
                self._abort_all = True
                self._cond.notify_all()
            while self._running or self._stepping:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self._resume_locked()
                    raise TimeoutError(f"AsyncEngineDriver.pause: {len(self._running)} requests still in the engine")
                self._cond.wait(left)
        return _Paused(self)

    def resume(self) -> None:
        with self._cond:
            self._resume_locked()

    def _resume_locked(self) -> None:
        if self._pause_depth == 0:
            raise RuntimeError("AsyncEngineDriver.resume without a pause")
        self._pause_depth -= 1
        self._cond.notify_all()

    # ------------------------------------------------------------------ statistics
    def reset_stats(self) -> None:
        with self._cond:
            now = time.monotonic()
            self._stats_since = self._in_flight_since = now
            self._busy_s = self._in_flight_area = 0.0
            self._steps = self._finished = 0
            self._max_in_flight = len(self._running)

    def stats(self) -> DriverStats:
        with self._cond:
            now = time.monotonic()
            wall = now - self._stats_since
            area = self._in_flight_area + len(self._running) * (now - self._in_flight_since)
            return DriverStats(
                wall_s=wall,
                busy_s=self._busy_s,
                steps=self._steps,
                finished=self._finished,
                max_in_flight=self._max_in_flight,
                mean_in_flight=area / wall if wall > 0 else float(len(self._running)),
            )

    def _count_in_flight_locked(self) -> None:
        """Call before every change of `_running`: closes the interval at the old count."""
        now = time.monotonic()
        self._in_flight_area += len(self._running) * (now - self._in_flight_since)
        self._in_flight_since = now

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Aborts the requests in flight and queued (`GenerationAborted`), stops the
        thread. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> AsyncEngineDriver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ the engine thread
    def serve(self) -> None:
        """Step the engine on the calling thread until `close()` (from another thread); the
        driver's own thread does this unless it was built with own_thread=False."""
        # Grad mode is per thread; generate_ids runs under no_grad, so does this loop.
        try:
            with torch.no_grad():
                while self._serve_once():
                    pass
        except BaseException as exc:  # every waiter gets it: nothing may hang on a dead thread
            logger.error("AsyncEngineDriver: the engine failed", exc_info=True)
            self._drop_all(exc, failure=exc)
        else:
            self._drop_all(GenerationAborted("AsyncEngineDriver.close() aborted this request"))

    def _serve_once(self) -> bool:
        """One round: aborts, admissions, one step. False when closed."""
        with self._cond:
            while not self._closed and not self._has_work_locked():
                self._cond.wait()
            if self._closed:
                return False
            abort_ids, self._to_abort = self._to_abort, []
            dropped = []
            if self._abort_all:
                dropped = list(self._running.values())
                abort_ids += [r.request_id for r in dropped]
                self._abort_all = False
            admitted = []
            if not self._pause_depth and self._pending:
                admitted = list(self._pending)
                self._pending.clear()
                self._count_in_flight_locked()
                # In `_running` before the engine has them, so a cancellation now aborts them.
                self._running.update((r.request_id, r) for r in admitted)
                self._max_in_flight = max(self._max_in_flight, len(self._running))
            self._stepping = True

        # The engine, outside the state lock: coroutines queue and cancel meanwhile.
        refused, outputs, step_s = [], None, 0.0
        if abort_ids:
            self._engine.abort_request(abort_ids)
        for r in admitted:
            try:
                self._engine.add_request(r.request_id, self._tokens_prompt(prompt_token_ids=r.prompt_ids), r.params)
            except Exception as exc:  # the engine refuses this request (its prompt, its params)
                refused.append((r, exc))
        if self._engine.has_unfinished_requests():
            start = time.perf_counter()
            outputs = self._engine.step()
            step_s = time.perf_counter() - start

        with self._cond:
            self._count_in_flight_locked()
            for request_id in abort_ids:
                self._running.pop(request_id, None)
            for r, exc in refused:
                self._running.pop(r.request_id, None)
                _settle(r, error=exc)
            for r in dropped:
                _settle(r, error=GenerationAborted("AsyncEngineDriver.pause(abort=True) aborted this request"))
            for output in outputs or ():
                if output.finished and (r := self._running.pop(output.request_id, None)) is not None:
                    self._finished += 1
                    _settle(r, result=output)
            if outputs is not None:
                self._steps += 1
                self._busy_s += step_s
            self._stepping = False
            self._cond.notify_all()
            if outputs is None and self._running:
                raise RuntimeError(
                    f"AsyncEngineDriver: {len(self._running)} requests vanished from the engine unfinished; something "
                    f"else stepped or aborted it (LLM.generate outside pause()?)"
                )
        return True

    def _has_work_locked(self) -> bool:
        return bool(self._to_abort or self._abort_all or self._running or (self._pending and not self._pause_depth))

    def _drop_all(self, error: BaseException, failure: BaseException | None = None) -> None:
        """Ends the driver: every request in flight or queued gets `error`."""
        with self._cond:
            self._count_in_flight_locked()
            self._failure = failure
            self._closed = True
            victims = [*self._running.values(), *self._pending]
            in_engine = list(self._running)
            self._running.clear()
            self._pending.clear()
            self._to_abort = []
            self._stepping = False
            self._cond.notify_all()
        # Requests left in the engine would come out of the next LLM.generate (or clog the batch).
        try:
            self._engine.abort_request(in_engine)
        except Exception:  # after a failure the engine may be broken; the first error is the one that counts
            logger.warning("AsyncEngineDriver: could not abort the requests left in the engine", exc_info=True)
        for r in victims:
            _settle(r, error=error)


class _Paused:
    """What `pause()` returns: `with driver.pause(): ...` resumes on leaving."""

    def __init__(self, driver: AsyncEngineDriver):
        self._driver = driver

    def __enter__(self) -> AsyncEngineDriver:
        return self._driver

    def __exit__(self, *exc) -> None:
        self._driver.resume()


def _settle(request: _Request, result=None, error: BaseException | None = None) -> None:
    """Hands the outcome to the request's loop; a cancelled awaiter has stopped listening."""

    def settle():
        if request.future.done():
            return
        if error is not None:
            request.future.set_exception(error)
        else:
            request.future.set_result(result)

    try:
        request.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: nobody awaits this any more
        pass
