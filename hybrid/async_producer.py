"""The producer of fully asynchronous training: prompt groups streamed through the engines into
the group queue while the trainer trains.

Two threads. The submitter takes prompts from the stream (hybrid/prompt_stream.py), one group
each, and sends each to the least busy engine (hybrid/engines.py), as long as the budget
allows; the collector waits for finished groups, scores them (the reward manager, or the
environments' rewards) and puts them in the queue (hybrid/group_queue.py), stamped with the
oldest policy version of their tokens.

The budget is verl's freshness control: with weights of sync window k on the engines (a
window is `trigger_parameter_sync_step` trainer steps, W prompt groups), at most
(k + 1 + staleness_threshold) x W groups may have been started in all, not counting the ones
the trainer dropped (stale or flat): generation runs at most `staleness_threshold` windows
ahead of training. staleness_threshold=0 is synchronous training with the engines apart:
every window's groups are generated with that window's weights. `max_groups_in_flight`
bounds the groups generating at once (SkyRL's num_parallel_generation_workers).
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import ray

from hybrid.group_queue import Group, GroupQueue


class GroupProducer:
    def __init__(
        self,
        rollouts,
        engines,
        stream,
        queue: GroupQueue,
        window_groups: int,
        threshold: float,
        cap: int,
        first_window: int = 0,
    ):
        self.rollouts, self.engines, self.stream, self.queue = rollouts, engines, stream, queue
        self.window_groups = int(window_groups)
        self.threshold = float(threshold)
        self.cap = int(cap)  # groups generating at once
        self.window = int(first_window)  # the sync window whose weights the engines hold
        # Groups started in all; a resumed run counts its earlier windows' as started, so the
        # budget lets it run staleness_threshold windows ahead, not ahead of its whole past.
        self.started = self.window * self.window_groups
        self.discarded = 0  # groups the trainer dropped: their budget is given back
        self._pending: dict = {}  # ref -> (engine index, position, rows, prompt batch)
        self._cond = threading.Condition()
        self._stop = False
        self._threads: list[threading.Thread] = []
        self.busy_since = time.perf_counter()

    def allowed(self) -> int:
        """Groups that may have been started by now (verl's staleness_threshold budget)."""
        return math.floor((self.window + 1 + self.threshold) * self.window_groups) + self.discarded

    def start(self) -> None:
        for target, name in ((self._submit_loop, "group-submitter"), (self._collect_loop, "group-collector")):
            thread = threading.Thread(target=self._guard(target), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _guard(self, loop):
        def run():
            try:
                loop()
            except BaseException as error:  # handed to the trainer, which raises it at its next take
                self.queue.fail(error)
                with self._cond:
                    self._stop = True
                    self._cond.notify_all()

        return run

    def new_window(self, window: int) -> None:
        """The engines now hold window `window`'s weights: the budget grows."""
        with self._cond:
            self.window = int(window)
            self._cond.notify_all()

    def discard(self, count: int = 1) -> None:
        with self._cond:
            self.discarded += count
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=30)

    def in_flight(self) -> int:
        with self._cond:
            return len(self._pending)

    def exhausted(self) -> bool:
        """The data's epochs are all handed out and nothing is generating: no group will come."""
        with self._cond:
            return not self._pending and self.stream.exhausted()

    # ------------------------------------------------------------------ the threads
    def _submit_loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (self.started >= self.allowed() or len(self._pending) >= self.cap):
                    self._cond.wait(timeout=1.0)
                if self._stop:
                    return
                taken = self.stream.take()
                if taken is None:  # the last epoch is handed out; a dropped group may still come back
                    self._cond.wait(timeout=1.0)
                    continue
                position, row = taken
                gen_batch = self.rollouts.prepare(row)
                index, ref = self.engines.submit(gen_batch)
                self._pending[ref] = (index, position, len(gen_batch), row)
                self.started += 1
                self._cond.notify_all()

    def _collect_loop(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    return
                refs = list(self._pending)
                if not refs:
                    self._cond.wait(timeout=1.0)
                    continue
            done, _ = ray.wait(refs, num_returns=1, timeout=1.0)
            for ref in done:
                with self._cond:
                    index, position, rows, row = self._pending.pop(ref)
                    self._cond.notify_all()
                self.engines.done(index, rows)
                self.queue.put(self._group(position, row, ray.get(ref)))

    def _group(self, position, row, gen_out) -> Group:
        metrics: dict[str, float] = {}
        versions = gen_out.non_tensor_batch["policy_version"]
        batch, extra = self.rollouts.complete(row, gen_out, {}, into=metrics)
        return Group(position, batch, int(np.min(list(versions))), extra, metrics)


__all__ = ["GroupProducer"]
