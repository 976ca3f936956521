"""Reward managers: turn a batch of generated responses into token-level scores.

Every manager takes a DataProto with `prompts` (B, P, left padded), `responses` (B, R,
right padded) and `attention_mask` (B, P+R), plus `data_source`, `reward_model`
(`{"ground_truth": ...}`) and `extra_info` per sample, decodes each valid response and
puts its score on the last valid response token of a (B, R) float32 tensor, as verl does.

- naive: one call per sample, in this process, each within `reward_kwargs.timeout_s`; a
  sample past it scores 0 and is counted (`reward/timeouts`), as in prime (reward/manager_base.py).
- prime: calls in a process pool with a per-sample time limit; a sample that times out
  or crashes scores 0 and is counted (`reward/timeouts`, `reward/errors`), and a worker
  stuck where the limit cannot reach it is killed with its pool.
- batch: one call with lists for the whole batch, within `timeout_s` per sample; past it
  every sample of the batch scores 0 and is counted.
- dapo: naive plus DAPO's overlong-response penalty.

A score is a number or a dict with a "score" number and other keys (returned per sample
in `reward_extra_info`). Anything else, NaN or inf, fails loudly with the sample index.
"""

from __future__ import annotations

import time

from .manager_base import (  # noqa: F401  (re-exported: callers import them from here)
    MANAGER_KWARGS,
    RewardFunctionError,
    RewardManagerBase,
    Sample,
    SampleTimeout,
    call_with_deadline,
    default_batch_compute_score,
)
from .prime_manager import PrimeRewardManager
from .user_code import describe_callable


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
        def call():
            return self.compute_score(
                data_sources=[s.data_source for s in samples],
                solution_strs=[s.response_str for s in samples],
                ground_truths=[s.ground_truth for s in samples],
                extra_infos=[s.extra_info for s in samples],
                **self.score_kwargs,
            )

        start = time.perf_counter()
        try:
            results = call_with_deadline(call, self.call_timeout_s * max(len(samples), 1))
        except SampleTimeout:
            self._timed_out.extend((s, time.perf_counter() - start) for s in samples)
            return [0.0] * len(samples)
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
