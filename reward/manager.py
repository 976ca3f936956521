"""Reward managers: turn a batch of generated responses into token-level scores.

Every manager takes a DataProto with `prompts` (B, P, left padded), `responses` (B, R,
right padded) and `attention_mask` (B, P+R), plus `data_source`, `reward_model`
(`{"ground_truth": ...}`) and `extra_info` per sample, decodes each valid response and
puts its score on the last valid response token of a (B, R) float32 tensor, as verl does.

- naive: one call per sample, in this process.
- prime: calls in a process pool with a per-sample time limit; a sample that times out
  or crashes scores 0 and is counted (`reward/timeouts`, `reward/errors`), and a worker
  stuck where the limit cannot reach it is killed with its pool.
- batch: one call with lists for the whole batch.
- dapo: naive plus DAPO's overlong-response penalty.

A score is a number or a dict with a "score" number and other keys (returned per sample
in `reward_extra_info`). Anything else, NaN or inf, fails loudly with the sample index.
"""

from __future__ import annotations

import abc
import math
import multiprocessing
import numbers
import os
import pickle
import signal
import warnings
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import torch

from .row_fields import row_fields
from .scorers import default_compute_score
from .user_code import describe_callable

# Manager-level keys of `reward_model.reward_kwargs`. The config carries every manager's
# keys, so each manager ignores the others'; any key not listed here is passed on to the
# scoring function.
MANAGER_KWARGS = frozenset(
    {"timeout_s", "num_processes", "hang_grace_s", "overlong_buffer", "overlong_buffer_cfg", "max_resp_len"}
)


class RewardFunctionError(RuntimeError):
    """A reward function raised, or returned something that is not a usable score."""


@dataclass
class Sample:
    index: int
    data_source: Any
    response_str: str
    ground_truth: Any
    extra_info: Any
    response_length: int
    row: dict | None = None  # the row's own fields, for a compute_score that `reads_rows` (reward/row_fields.py)

    def row_kwargs(self) -> dict:
        return {} if self.row is None else {"row": self.row}


def default_batch_compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
    """`default_compute_score` over lists, for the batch manager without a custom function."""
    return [
        default_compute_score(ds, s, gt, extra_info=info, **kwargs)
        for ds, s, gt, info in zip(data_sources, solution_strs, ground_truths, extra_infos)
    ]


class RewardManagerBase(abc.ABC):
    """Decoding, score checking and assembly shared by the managers; subclasses say how
    the scoring function is called (`_score`)."""

    def __init__(
        self, tokenizer, num_examine: int, compute_score=None, reward_fn_key: str = "data_source", **reward_kwargs
    ):
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        self.score_kwargs = {k: v for k, v in reward_kwargs.items() if k not in MANAGER_KWARGS}
        self.last_metrics: dict[str, float] = {}

    @classmethod
    def manager_kwargs(cls) -> frozenset:
        return MANAGER_KWARGS

    # ---- reading the batch -------------------------------------------------------------

    def _samples(self, data) -> list[Sample]:
        batch = data.batch
        missing = [k for k in ("prompts", "responses", "attention_mask") if k not in batch.keys()]
        if missing:
            raise KeyError(f"reward manager needs {missing} in data.batch; it has {sorted(batch.keys())}")
        prompts, responses, mask = batch["prompts"], batch["responses"], batch["attention_mask"]
        prompt_len, response_len = prompts.shape[-1], responses.shape[-1]
        if mask.shape[-1] != prompt_len + response_len:
            raise ValueError(
                f"attention_mask has {mask.shape[-1]} columns; expected prompts ({prompt_len}) + responses "
                f"({response_len})"
            )
        non_tensor = data.non_tensor_batch
        for key in (self.reward_fn_key, "reward_model"):
            if key not in non_tensor:
                raise KeyError(f"reward manager needs {key!r} in data.non_tensor_batch; it has {sorted(non_tensor)}")
        lengths = mask[:, prompt_len:].sum(-1).tolist()
        texts = self.tokenizer.batch_decode(
            [responses[i, : int(n)].tolist() for i, n in enumerate(lengths)], skip_special_tokens=True
        )
        extra_infos = non_tensor.get("extra_info")
        reads_rows = getattr(self.compute_score, "reads_rows", False)  # DomainScorers with ROW_FIELDS
        samples = []
        for i, text in enumerate(texts):
            reward_model = non_tensor["reward_model"][i]
            if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
                raise ValueError(f"sample {i}: reward_model must be a dict with 'ground_truth', got {reward_model!r}")
            samples.append(
                Sample(
                    index=i,
                    data_source=non_tensor[self.reward_fn_key][i],
                    response_str=text,
                    ground_truth=reward_model["ground_truth"],
                    extra_info=None if extra_infos is None else extra_infos[i],
                    response_length=int(lengths[i]),
                    row=row_fields(non_tensor, i) if reads_rows else None,
                )
            )
        return samples

    def _prompt_str(self, data, i: int) -> str:
        prompts, mask = data.batch["prompts"], data.batch["attention_mask"]
        n = int(mask[i, : prompts.shape[-1]].sum())
        ids = prompts[i, prompts.shape[-1] - n :].tolist() if n else []
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ---- scoring -------------------------------------------------------------------------

    def _call_one(self, sample: Sample):
        try:
            return self.compute_score(
                data_source=sample.data_source,
                solution_str=sample.response_str,
                ground_truth=sample.ground_truth,
                extra_info=sample.extra_info,
                **sample.row_kwargs(),
                **self.score_kwargs,
            )
        except Exception as e:
            raise RewardFunctionError(
                f"reward function {describe_callable(self.compute_score)} raised on sample {sample.index} "
                f"(data_source={sample.data_source!r}): {type(e).__name__}: {e}"
            ) from e

    @abc.abstractmethod
    def _score(self, samples: list[Sample]) -> list[Any]:
        """One raw result (number or dict) per sample, in order."""

    def _check(self, result, sample: Sample) -> tuple[float, dict]:
        """The score of one result and its extra keys; loud on anything unusable."""
        where = (
            f"reward function {describe_callable(self.compute_score)} on sample {sample.index} "
            f"(data_source={sample.data_source!r})"
        )
        extras: dict = {}
        value = result
        if isinstance(result, dict):
            if "score" not in result:
                raise RewardFunctionError(f"{where} returned a dict without 'score' (keys: {sorted(result)})")
            value = result["score"]
            extras = dict(result)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        # bool, int, float and numpy scalars are all numbers.Real.
        if isinstance(value, numbers.Real):
            score = float(value)
        else:
            raise RewardFunctionError(
                f"{where} returned {type(value).__name__} {value!r}; a score must be a number or a dict "
                f"with a numeric 'score'"
            )
        if not math.isfinite(score):
            raise RewardFunctionError(f"{where} returned {score}; scores must be finite")
        return score, extras

    def _adjust(self, sample: Sample, score: float) -> tuple[float, dict]:
        """Hook for managers that change the score (DAPO's penalty); extra per-sample info."""
        return score, {}

    # ---- the call ------------------------------------------------------------------------

    def __call__(self, data, return_dict: bool = False):
        samples = self._samples(data)
        results = self._score(samples)
        responses = data.batch["responses"]
        reward_tensor = torch.zeros(responses.shape, dtype=torch.float32)
        extra: dict[str, list] = {}
        printed: dict = defaultdict(int)
        for sample, result in zip(samples, results):
            score, extras = self._check(result, sample)
            reward, adjusted = self._adjust(sample, score)
            extras.update(adjusted)
            for key, value in extras.items():
                # Every list has one entry per sample even when only some samples report a key.
                extra.setdefault(key, [None] * len(samples))[sample.index] = value
            # An empty response has no last token; its score goes to position 0, which the
            # response mask hides anyway.
            reward_tensor[sample.index, max(sample.response_length - 1, 0)] = reward
            if printed[sample.data_source] < self.num_examine:
                printed[sample.data_source] += 1
                print("[prompt]", self._prompt_str(data, sample.index))
                print("[response]", sample.response_str)
                print("[ground_truth]", sample.ground_truth)
                for key, value in (extras or {"score": reward}).items():
                    print(f"[{key}]", value)
        reward_tensor = reward_tensor.to(responses.device)
        if return_dict:
            return {
                "reward_tensor": reward_tensor,
                "reward_extra_info": extra,
                "reward_metrics": dict(self.last_metrics),
            }
        return reward_tensor


class NaiveRewardManager(RewardManagerBase):
    """One call of `compute_score` per sample, in order, in this process."""

    def _score(self, samples):
        return [self._call_one(s) for s in samples]


class DAPORewardManager(NaiveRewardManager):
    """Naive scoring plus DAPO's soft overlong penalty: responses longer than
    `max_resp_len - overlong_buffer.len` lose up to `penalty_factor`, linearly over the buffer."""

    def __init__(
        self,
        tokenizer,
        num_examine,
        compute_score=None,
        reward_fn_key="data_source",
        max_resp_len=None,
        overlong_buffer=None,
        overlong_buffer_cfg=None,
        **reward_kwargs,
    ):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **reward_kwargs)
        # A plain keyword dict (verl's scripts spell it overlong_buffer_cfg); missing entries
        # take verl's DAPO defaults, as a verl reward manager built from Python would.
        buffer = dict((overlong_buffer_cfg if overlong_buffer_cfg is not None else overlong_buffer) or {})
        self.overlong_enable = bool(buffer.get("enable", False))
        self.overlong_len = int(buffer.get("len", 0))
        self.overlong_penalty_factor = float(buffer.get("penalty_factor", 1.0))
        self.overlong_log = bool(buffer.get("log", False))
        self.max_resp_len = max_resp_len
        if self.overlong_enable:
            if max_resp_len is None:
                raise ValueError(
                    "reward_model.reward_kwargs.max_resp_len must be set when overlong_buffer.enable is true"
                )
            if not 0 < self.overlong_len <= int(max_resp_len):
                raise ValueError(
                    f"reward_model.reward_kwargs.overlong_buffer.len={self.overlong_len} must be in "
                    f"(0, max_resp_len={max_resp_len}]; otherwise every response would be penalized"
                )

    def _adjust(self, sample, score):
        if not self.overlong_enable:
            return score, {}
        expected_len = int(self.max_resp_len) - self.overlong_len
        exceed_len = sample.response_length - expected_len
        penalty = min(-exceed_len / self.overlong_len * self.overlong_penalty_factor, 0.0)
        extras = {"overlong_reward": penalty, "overlong": penalty < 0} if self.overlong_log else {}
        return score + penalty, extras


class BatchRewardManager(RewardManagerBase):
    """One call with lists: `compute_score(data_sources, solution_strs, ground_truths,
    extra_infos, **kwargs)` returns one score per sample."""

    def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source", **reward_kwargs):
        super().__init__(
            tokenizer, num_examine, compute_score or default_batch_compute_score, reward_fn_key, **reward_kwargs
        )

    def _score(self, samples):
        try:
            results = self.compute_score(
                data_sources=[s.data_source for s in samples],
                solution_strs=[s.response_str for s in samples],
                ground_truths=[s.ground_truth for s in samples],
                extra_infos=[s.extra_info for s in samples],
                **self.score_kwargs,
            )
        except Exception as e:
            raise RewardFunctionError(
                f"batch reward function {describe_callable(self.compute_score)} raised on a batch of {len(samples)} "
                f"samples: {type(e).__name__}: {e}"
            ) from e
        results = list(results)
        if len(results) != len(samples):
            raise RewardFunctionError(
                f"batch reward function {describe_callable(self.compute_score)} returned {len(results)} scores "
                f"for {len(samples)} samples"
            )
        return results


# ---- prime: a process pool with time limits ---------------------------------------------

_WORKER_FN: Callable | None = None
_STARTUP_BARRIER = None
# How long a new pool's processes may take to start (spawn re-imports the main module).
STARTUP_TIMEOUT_S = 120.0


class SampleTimeout(BaseException):
    """Raised inside a pool worker when a sample runs past its limit. A BaseException so a
    reward function's `except Exception` cannot catch it."""


def _init_worker(fn_bytes: bytes, barrier) -> None:
    global _WORKER_FN, _STARTUP_BARRIER
    _WORKER_FN = pickle.loads(fn_bytes)
    _STARTUP_BARRIER = barrier


def _worker_ready(timeout_s: float) -> int:
    # Every process must pass the barrier, so a new pool counts as ready only when all of
    # its processes have started; start-up time never counts against a sample's limit.
    _STARTUP_BARRIER.wait(timeout_s)
    return os.getpid()


def _on_alarm(signum, frame):
    raise SampleTimeout()


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
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **reward_kwargs)
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


# reward_model.reward_manager names; a plug-in module (external_lib) may add its own.
REWARD_MANAGER_REGISTRY: dict[str, type] = {
    "naive": NaiveRewardManager,
    "prime": PrimeRewardManager,
    "batch": BatchRewardManager,
    "dapo": DAPORewardManager,
}


def register_reward_manager(name: str):
    """Class decorator: make `reward_model.reward_manager=<name>` build this manager."""

    def decorator(cls: type) -> type:
        REWARD_MANAGER_REGISTRY[name] = cls
        return cls

    return decorator


def get_reward_manager_cls(name: str):
    if name not in REWARD_MANAGER_REGISTRY:
        raise ValueError(f"unknown reward_model.reward_manager {name!r}; known: {', '.join(REWARD_MANAGER_REGISTRY)}")
    return REWARD_MANAGER_REGISTRY[name]
