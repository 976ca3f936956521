"""Finished prompt groups between the engines and the trainer, and the staleness bound, enforced
here and nowhere else.

A `Group` is one prompt's n samples, rolled out and scored, stamped with the oldest policy
version any of its tokens came from (a trajectory whose weights changed between its turns
counts as old as its oldest turn: its behaviour log-probs are per token, but its age is its
worst). The trainer at step s updates weights of version s - 1; a group of version v is then
(s - 1 - v) versions stale. `GroupQueue.take` hands out the groups the trainer asks for,
oldest first, and never one staler than the bound: such a group is dropped, counted, and its
prompt handed back for generating anew (`on_stale`), so no prompt is lost. Dynamic sampling's
flat groups (no variation in the filter metric) are dropped at the same place (`keep`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from protocol.data_proto import DataProto


@dataclass
class Group:
    position: tuple[int, int]  # the prompt's place in the data (hybrid/prompt_stream.py)
    batch: DataProto  # its n samples, scored
    version: int  # the oldest policy version of its tokens
    extra: dict = field(default_factory=dict)  # the reward function's extra info, per sample
    metrics: dict = field(default_factory=dict)  # reward metrics of this group alone
    finished_at: float = field(default_factory=time.perf_counter)


def staleness(version: int, current: int, every: int = 1) -> int:
    """Weight pushes since `version`, when the engines hold `current` (pushes every `every` steps)."""
    return (current - version) // every


def check_staleness(versions, current: int, bound: int, every: int = 1) -> np.ndarray:
    """The staleness of each version; raises when one is past the bound (a schedule that
    cannot produce such data, like one-step-off, uses this as its guard)."""
    ages = np.asarray([staleness(int(v), current, every) for v in versions], dtype=np.int64)
    if ages.size and ages.max() > bound:
        raise RuntimeError(
            f"a batch holds data {int(ages.max())} weight versions old, past the staleness bound of {bound} "
            f"(async_training.max_staleness_steps); this is a scheduling error, please report it"
        )
    return ages


class GroupQueue:
    """Thread-safe: engines' results arrive from the producer's threads, the trainer takes."""

    def __init__(self, bound: int, every: int = 1):
        self.bound = int(bound)
        self.every = int(every)
        self._groups: list[Group] = []
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self.dropped_stale = 0
        self.dropped_flat = 0

    def put(self, group: Group) -> None:
        with self._cond:
            self._groups.append(group)
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """The producer failed: the trainer's next take raises its error."""
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def depth(self) -> int:
        with self._cond:
            return len(self._groups)

    def take(
        self,
        count: int,
        current: int,
        on_stale: Callable[[Group], None],
        keep: Callable[[Group], bool] = lambda group: True,
        on_flat: Callable[[Group], None] = lambda group: None,
        wait: bool = True,
        ended: Callable[[], bool] = lambda: False,
    ) -> list[Group]:
        """`count` groups no staler than the bound when the engines hold version `current`,
        oldest versions first; blocks until there are enough (wait=False: those there are now;
        or fewer once `ended()` says no more will come). Stale groups go to `on_stale`, groups
        `keep` refuses to `on_flat`."""
        taken: list[Group] = []
        with self._cond:
            while len(taken) < count:
                if self._error is not None:
                    raise self._error
                self._groups.sort(key=lambda g: (g.version, g.finished_at))
                while self._groups and len(taken) < count:
                    group = self._groups.pop(0)
                    if staleness(group.version, current, self.every) > self.bound:
                        self.dropped_stale += 1
                        on_stale(group)
                    elif not keep(group):
                        self.dropped_flat += 1
                        on_flat(group)
                    else:
                        taken.append(group)
                if len(taken) < count:
                    if not wait or (not self._groups and ended()):
                        break
                    self._cond.wait(timeout=1.0)
        return taken


__all__ = ["Group", "GroupQueue", "check_staleness", "staleness"]
