"""Environment calls of one turn, run side by side with a time limit each.

`StepPool(workers, timeout_s).run(calls)` runs the zero-argument callables on `workers`
threads and returns one `Outcome` per call, in order: its value, the exception it raised,
or `timed_out` when it ran longer than `timeout_s` (counted from when it started, not from
when it was queued). `await pool.call(fn)` is the same for one call from a coroutine (the
asynchronous rollout, where each trajectory steps its environment on its own). Nothing can
stop a Python thread, so a call past its limit is left running and its thread is
replaced; the threads are daemons, so an environment that
never returns neither blocks the run nor keeps the process alive at exit (a
`concurrent.futures` pool would: its threads are joined at interpreter exit). The threads
hold the queue, not the pool, and an idle thread drops its last call (whose closure may hold
the pool's owner): a pool nobody uses any more (its rollout loop and engine gone) is collected
and its idle threads end, as `shutdown` ends them.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False


class _Task:
    __slots__ = ("fn", "started", "finished", "abandoned", "value", "error", "notify")

    def __init__(self, fn: Callable[[], Any], notify: Callable[[str], None] | None = None):
        self.fn = fn
        self.started: float | None = None
        self.finished = self.abandoned = False
        self.value = self.error = None
        self.notify = notify  # `call`'s hook: "started" and "finished", from the worker thread


class _Shared:
    """What the worker threads hold: the queue, the condition and how many threads were
    started (never the pool itself, so that an unused pool can be collected)."""

    __slots__ = ("queue", "cond", "threads")

    def __init__(self):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.cond = threading.Condition()
        self.threads = 0


def _work(shared: _Shared) -> None:
    while (task := shared.queue.get()) is not None:
        abandoned = _run(shared, task)
        # An idle thread must not keep its last call: the call's closure holds its owner (the
        # rollout loop, which holds this pool), and a running thread's frame is a root the
        # garbage collector never clears, so the pool and these threads would live forever.
        task = None
        if abandoned:
            return  # a replacement thread has taken this one's place


def _run(shared: _Shared, task: _Task) -> bool:
    """Run one call; True when its caller abandoned it (timed out) meanwhile."""
    with shared.cond:
        if task.abandoned:  # its caller gave up before it started (a cancelled coroutine)
            return False
        task.started = time.monotonic()
        shared.cond.notify_all()
    if task.notify is not None:
        task.notify("started")
    try:
        task.value = task.fn()
    except BaseException as e:  # the caller decides what an environment's error means
        task.error = e
    with shared.cond:
        task.finished = True
        shared.cond.notify_all()
        abandoned = task.abandoned
    if task.notify is not None and not abandoned:  # an abandoned call's caller waits no more
        task.notify("finished")
    return abandoned


def _end_idle_threads(shared: _Shared) -> None:
    for _ in range(shared.threads):
        shared.queue.put(None)


class StepPool:
    def __init__(self, workers: int, timeout_s: float):
        if workers < 1 or timeout_s <= 0:
            raise ValueError(f"StepPool needs workers >= 1 and timeout_s > 0, got {workers}, {timeout_s}")
        self.timeout_s = float(timeout_s)
        self._shared = _Shared()
        self._queue, self._cond = self._shared.queue, self._shared.cond
        # Runs once: at shutdown(), or when the pool is collected.
        self._finalizer = weakref.finalize(self, _end_idle_threads, self._shared)
        for _ in range(workers):
            self._spawn()

    def _spawn(self) -> None:
        self._shared.threads += 1
        name = f"env-worker-{self._shared.threads}"
        threading.Thread(target=_work, args=(self._shared,), daemon=True, name=name).start()

    def run(self, calls: list[Callable[[], Any]]) -> list[Outcome]:
        tasks = [_Task(fn) for fn in calls]
        for task in tasks:
            self._queue.put(task)
        with self._cond:
            while True:
                now = time.monotonic()
                running = [t for t in tasks if not t.finished and not t.abandoned]
                if not running:
                    break
                overdue = [t for t in running if t.started is not None and now - t.started >= self.timeout_s]
                for task in overdue:
                    task.abandoned = True
                    self._spawn()
                if overdue:
                    continue
                deadlines = [t.started + self.timeout_s - now for t in running if t.started is not None]
                # Workers notify when a call starts or ends; otherwise wake at the next deadline.
                self._cond.wait(timeout=min(deadlines) if deadlines else None)
        return [Outcome(timed_out=True) if t.abandoned else Outcome(value=t.value, error=t.error) for t in tasks]

    async def call(self, fn: Callable[[], Any]) -> Outcome:
        """`fn` on a pool thread, awaited: its Outcome, with the time limit counted from when
        it starts. A call past its limit is left running, as in `run`; a cancelled caller's
        call is dropped when it has not started yet."""
        loop = asyncio.get_running_loop()
        started, finished = loop.create_future(), loop.create_future()

        def notify(kind: str) -> None:
            future = started if kind == "started" else finished
            try:
                loop.call_soon_threadsafe(lambda: future.done() or future.set_result(None))
            except RuntimeError:
                # The caller returned as the call ended (its time ran out at that moment) and its
                # event loop has closed since: nobody is waiting. Any other RuntimeError is raised.
                if not loop.is_closed():
                    raise

        task = _Task(fn, notify)
        self._queue.put(task)
        try:
            await started
            left = self.timeout_s - (time.monotonic() - task.started)
            await asyncio.wait_for(asyncio.shield(finished), max(left, 0.0))
        except (TimeoutError, asyncio.CancelledError) as stop:
            with self._cond:
                if not task.finished:
                    task.abandoned = True
                    if task.started is not None:
                        self._spawn()  # the stuck call keeps its thread; replace it
            if isinstance(stop, asyncio.CancelledError):
                raise
            if not task.finished:
                return Outcome(timed_out=True)
        return Outcome(value=task.value, error=task.error)

    def shutdown(self) -> None:
        """End the idle threads (a thread busy past its limit ends when its call returns)."""
        self._finalizer()
