"""The reward managers' common part: how a score is checked, what a sample is, and the base class
that decodes a batch and places each score on its last response token (reward/manager.py has the
managers and their registry).

A call of the reward function on one sample (`_call_one`: the naive and dapo managers) has a
deadline, `reward_model.reward_kwargs.timeout_s` (the key prime's pool uses): past it the sample
scores 0 as prime's timed-out samples do, it is counted (`reward/timeouts`, per call of the
manager, so per step) and one console line per call names each such sample (its index,
data_source and extra_info.index) and how long it ran. In the main thread the limit is prime's
SIGALRM (it interrupts Python code and sleeps); elsewhere (the reward loop scores in a thread)
the call runs in a daemon thread that is abandoned at the deadline."""

from __future__ import annotations

import abc
import math
import numbers
import signal
import threading
import time
from collections import defaultdict
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


# The per-sample deadline when a manager is built without `timeout_s` (prime's own default);
# the trainer's yaml sets reward_model.reward_kwargs.timeout_s.
DEFAULT_TIMEOUT_S = 300.0
TIMEOUT_KEY = "reward_model.reward_kwargs.timeout_s"


class RewardFunctionError(RuntimeError):
    """A reward function raised, or returned something that is not a usable score."""


class SampleTimeout(BaseException):
    """Raised when a sample runs past its limit (in prime's pool workers too). A BaseException
    so a reward function's `except Exception` cannot catch it."""


def on_alarm(signum, frame):
    raise SampleTimeout()


def call_with_deadline(fn, timeout_s: float):
    """`fn()`, or SampleTimeout once it has run `timeout_s` seconds."""
    # SIGALRM only in the main thread, and only when no one else's ITIMER_REAL is armed there
    # (a caller's own alarm is left to fire as its owner set it).
    if threading.current_thread() is threading.main_thread() and signal.getitimer(signal.ITIMER_REAL)[0] == 0:
        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    # Not the main thread (SIGALRM reaches only that one) or its timer taken: run it in a
    # daemon thread and abandon the thread at the deadline (a daemon thread never holds the
    # process at exit).
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller below, re-raised there
            box["error"] = e

    worker = threading.Thread(target=run, name="reward-call", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise SampleTimeout()
    if "error" in box:
        raise box["error"]
    return box["value"]


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
        self,
        tokenizer,
        num_examine: int,
        compute_score=None,
        reward_fn_key: str = "data_source",
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        **reward_kwargs,
    ):
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        self.score_kwargs = {k: v for k, v in reward_kwargs.items() if k not in MANAGER_KWARGS}
        self.last_metrics: dict[str, float] = {}
        if timeout_s is None or not float(timeout_s) > 0:
            raise ValueError(f"{TIMEOUT_KEY} must be a number of seconds > 0, got {timeout_s!r}")
        self.call_timeout_s = float(timeout_s)
        self._timed_out: list[tuple[Sample, float]] = []  # this call's samples past the deadline

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
        """The reward function on one sample within the deadline; 0.0 (and counted) past it."""

        def call():
            return self.compute_score(
                data_source=sample.data_source,
                solution_str=sample.response_str,
                ground_truth=sample.ground_truth,
                extra_info=sample.extra_info,
                **sample.row_kwargs(),
                **self.score_kwargs,
            )

        start = time.perf_counter()
        try:
            return call_with_deadline(call, self.call_timeout_s)
        except SampleTimeout:
            self._timed_out.append((sample, time.perf_counter() - start))
            return 0.0
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

    def _report_timeouts(self) -> None:
        """reward/timeouts for this call, and one line naming the samples that ran past the deadline."""
        timed_out, self._timed_out = self._timed_out, []
        if "reward/timeouts" in self.last_metrics:
            return  # counted by the manager's own _score (prime's pool)
        self.last_metrics = {**self.last_metrics, "reward/timeouts": float(len(timed_out))}
        if not timed_out:
            return
        described = ", ".join(
            f"sample {s.index} (data_source={s.data_source!r}{_dataset_index(s)}) after {seconds:.1f} s"
            for s, seconds in timed_out
        )
        print(
            f"[reward] {len(timed_out)} call(s) of {describe_callable(self.compute_score)} ran past "
            f"{TIMEOUT_KEY}={self.call_timeout_s:g} s and score 0: {described}",
            flush=True,
        )

    def __call__(self, data, return_dict: bool = False):
        samples = self._samples(data)
        self._timed_out = []
        self.last_metrics = {k: v for k, v in self.last_metrics.items() if k != "reward/timeouts"}
        results = self._score(samples)
        self._report_timeouts()
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


def _dataset_index(sample: Sample) -> str:
    info = sample.extra_info
    return f", extra_info.index={info['index']!r}" if isinstance(info, dict) and "index" in info else ""
