"""The prime reward manager: scoring calls in a process pool with a per-sample time limit; a
sample that times out or crashes scores 0 and is counted, and a worker stuck where the limit
cannot reach it is killed with its pool."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import warnings
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

# The per-sample limit's exception and SIGALRM handler, shared with the other managers' deadline.
from .manager_base import RewardManagerBase, SampleTimeout
from .manager_base import on_alarm as _on_alarm
from .user_code import describe_callable

# ---- prime: a process pool with time limits ---------------------------------------------

_WORKER_FN: Callable | None = None
_STARTUP_BARRIER = None
# How long a new pool's processes may take to start (spawn re-imports the main module).
STARTUP_TIMEOUT_S = 120.0


def _init_worker(fn_bytes: bytes, barrier) -> None:
    global _WORKER_FN, _STARTUP_BARRIER
    _WORKER_FN = pickle.loads(fn_bytes)
    _STARTUP_BARRIER = barrier


def _worker_ready(timeout_s: float) -> int:
    # Every process must pass the barrier, so a new pool counts as ready only when all of
    # its processes have started; start-up time never counts against a sample's limit.
    _STARTUP_BARRIER.wait(timeout_s)
    return os.getpid()


def _score_in_worker(timeout_s: float, kwargs: dict):
    """Run in a pool process: ("ok", result), ("timeout", None) or ("error", message)."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return ("ok", _WORKER_FN(**kwargs))
    except SampleTimeout:
        return ("timeout", None)
    except Exception as e:
        # Counted and reported by the parent (reward/errors), not raised: prime mode
        # scores a crashing sample 0 rather than stopping the run.
        return ("error", f"{type(e).__name__}: {e}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class PrimeRewardManager(RewardManagerBase):
    """Per-sample calls in `num_processes` processes, each limited to `timeout_s` seconds.

    The limit is a SIGALRM inside the worker. A worker stuck where the signal cannot reach
    it (a long C call) stops all progress; when nothing finishes for `timeout_s +
    hang_grace_s` seconds the pool's processes are terminated, the unfinished samples
    count as timeouts, and the next call starts a new pool.
    """

    def __init__(
        self,
        tokenizer,
        num_examine,
        compute_score=None,
        reward_fn_key="data_source",
        num_processes: int = 8,
        timeout_s: float = 300.0,
        hang_grace_s: float = 10.0,
        **reward_kwargs,
    ):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, timeout_s, **reward_kwargs)
        if int(num_processes) < 1 or not float(timeout_s) > 0:
            raise ValueError(
                f"prime reward manager needs num_processes >= 1 and timeout_s > 0, got {num_processes}, {timeout_s}"
            )
        self.num_processes = int(num_processes)
        self.timeout_s = float(timeout_s)
        self.hang_grace_s = float(hang_grace_s)
        try:
            self._fn_bytes = pickle.dumps(self.compute_score)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise TypeError(
                f"the prime reward manager sends {describe_callable(self.compute_score)} to other processes, but it "
                f"cannot be pickled ({e}); use a module-level function or custom_reward_function.path"
            ) from e
        self._pool: ProcessPoolExecutor | None = None

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: the trainer process holds threads (Ray, torch) that a forked
            # child could find holding locks.
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                max_workers=self.num_processes,
                mp_context=context,
                initializer=_init_worker,
                initargs=(self._fn_bytes, context.Barrier(self.num_processes)),
            )
            ready = [self._pool.submit(_worker_ready, STARTUP_TIMEOUT_S) for _ in range(self.num_processes)]
            done, not_done = wait(ready, timeout=STARTUP_TIMEOUT_S + 10)
            failures = [f.exception() for f in done if f.exception() is not None]
            if not_done or failures:
                self.close()
                cause = failures[0] if failures else f"not started after {STARTUP_TIMEOUT_S:.0f}s"
                raise RuntimeError(
                    f"prime reward manager: the {self.num_processes} worker processes for "
                    f"{describe_callable(self.compute_score)} did not start: {cause}"
                )
        return self._pool

    def close(self) -> None:
        """Stop the pool's processes at once, running tasks included."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if hasattr(pool, "terminate_workers"):
            pool.terminate_workers()
            return
        # Python < 3.14 has no public way to stop a running task; _processes is the pool's
        # own map of its worker processes.
        processes = list((pool._processes or {}).values())
        for p in processes:
            p.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        for p in processes:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()

    def __del__(self):
        if getattr(self, "_pool", None) is not None:
            self.close()

    def _score(self, samples):
        pool = self._get_pool()
        futures = {}
        for s in samples:
            kwargs = dict(
                data_source=s.data_source,
                solution_str=s.response_str,
                ground_truth=s.ground_truth,
                extra_info=s.extra_info,
                **s.row_kwargs(),
                **self.score_kwargs,
            )
            futures[pool.submit(_score_in_worker, self.timeout_s, kwargs)] = s.index
        results: list[Any] = [0.0] * len(samples)
        timeouts, errors, broken = [], [], False
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=self.timeout_s + self.hang_grace_s, return_when=FIRST_COMPLETED)
            if not done:
                timeouts.extend(futures[f] for f in pending)
                warnings.warn(
                    f"prime reward manager: no sample finished in {self.timeout_s + self.hang_grace_s:.0f}s; "
                    f"terminating the pool, {len(pending)} samples score 0 as timeouts",
                    stacklevel=2,
                )
                self.close()
                break
            for f in done:
                i = futures[f]
                exc = f.exception()
                if isinstance(exc, SampleTimeout):
                    timeouts.append(i)
                elif isinstance(exc, BrokenProcessPool):
                    broken = True
                    errors.append((i, f"worker process died: {exc}"))
                elif exc is not None:
                    errors.append((i, f"{type(exc).__name__}: {exc}"))
                else:
                    status, value = f.result()
                    if status == "ok":
                        results[i] = value
                    elif status == "timeout":
                        timeouts.append(i)
                    else:
                        errors.append((i, value))
        if broken:
            self.close()
        self.last_metrics = {"reward/timeouts": float(len(timeouts)), "reward/errors": float(len(errors))}
        if timeouts:
            print(
                f"[prime reward] {len(timeouts)} samples ran past {self.timeout_s}s and score 0: "
                f"indices {sorted(timeouts)}"
            )
        for i, message in sorted(errors)[:3]:
            print(f"[prime reward] sample {i} (data_source={samples[i].data_source!r}) failed and scores 0: {message}")
        if len(errors) > 3:
            print(f"[prime reward] ... {len(errors) - 3} more failed samples")
        return results
