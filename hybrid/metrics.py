"""Step metrics computed on the driver from the batch and the phase timings.

Pure functions, no state: the trainer calls them once per step and hands the merged dict
to `hybrid.tracking.Tracking`. Names follow verl's `verl/trainer/ppo/metric_utils.py`
(`critic/score/mean`, `response_length/clip_ratio`, `timing_s/gen`, `perf/throughput`,
`val-core/<data_source>/reward/mean@N`, ...) so dashboards built for verl keep working.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from protocol import DataProto

__all__ = [
    "compute_data_metrics",
    "compute_timing_metrics",
    "compute_throughput_metrics",
    "compute_memory_metrics",
    "reduce_metrics",
    "process_validation_metrics",
    "validation_sample_counts",
]

# Phases whose time scales with the number of response tokens only (generation) versus
# every token in the sequence (forward/backward passes over prompt + response).
_PER_RESPONSE_TOKEN_PHASES = ("gen",)
_PER_TOTAL_TOKEN_PHASES = ("ref", "values", "adv", "update_critic", "update_actor", "old_log_prob")


def _require(batch: DataProto, keys: Iterable[str], where: str) -> None:
    available = set(batch.batch.keys()) if batch.batch is not None else set()
    missing = [k for k in keys if k not in available]
    if missing:
        raise KeyError(f"{where} needs batch keys {missing}; the batch has {sorted(available)}")


def _stats(name: str, values: torch.Tensor) -> dict[str, float]:
    """mean/max/min of a 1-d tensor; NaN for an empty selection (e.g. every response
    empty), because max/min of nothing is undefined and must not crash the step."""
    values = values.detach().float()
    if values.numel() == 0:
        nan = float("nan")
        return {f"{name}/mean": nan, f"{name}/max": nan, f"{name}/min": nan}
    return {
        f"{name}/mean": values.mean().item(),
        f"{name}/max": values.max().item(),
        f"{name}/min": values.min().item(),
    }


def _lengths(batch: DataProto) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Per-sample prompt and response lengths (as floats) and the padded maxima.

    The prompt is the first `P = input_ids.shape[1] - responses.shape[1]` positions of
    `attention_mask` (left-padded), the response is counted by `response_mask`."""
    _require(batch, ["responses", "attention_mask", "response_mask"], "length metrics")
    max_response_length = batch.batch["responses"].shape[-1]
    attention_mask = batch.batch["attention_mask"]
    max_prompt_length = attention_mask.shape[-1] - max_response_length
    if max_prompt_length < 0:
        raise ValueError(
            f"attention_mask has {attention_mask.shape[-1]} positions but responses has {max_response_length}; "
            "attention_mask must cover prompt + response"
        )
    prompt_length = attention_mask[:, :max_prompt_length].sum(-1).float()
    response_length = batch.batch["response_mask"].sum(-1).float()
    return prompt_length, response_length, max_prompt_length, max_response_length


def compute_data_metrics(batch: DataProto, use_critic: bool) -> dict[str, float]:
    """Scores, rewards, advantages, returns, (values), lengths and rollout/trainer log-prob
    mismatch of one training batch.

    Scores and rewards are per-sequence sums; advantages, returns and values are taken
    over valid response tokens only. `vf_explained_var` is 1 - Var(returns - values) /
    Var(returns) with verl's unbiased variance and 1e-5 guard.
    """
    keys = ["token_level_scores", "token_level_rewards", "advantages", "returns"]
    _require(batch, keys + (["values"] if use_critic else []), "compute_data_metrics")
    b = batch.batch
    response_mask = b["response_mask"].bool()
    prompt_length, response_length, max_prompt_length, max_response_length = _lengths(batch)

    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", b["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", b["token_level_rewards"].sum(-1)))
    valid_returns = torch.masked_select(b["returns"], response_mask).float()
    metrics.update(_stats("critic/advantages", torch.masked_select(b["advantages"], response_mask)))
    metrics.update(_stats("critic/returns", valid_returns))
    if use_critic:
        valid_values = torch.masked_select(b["values"], response_mask).float()
        metrics.update(_stats("critic/values", valid_values))
        if valid_returns.numel() < 2:
            # The unbiased variance of fewer than two tokens is undefined (torch warns every step).
            metrics["critic/vf_explained_var"] = float("nan")
        else:
            return_diff_var = torch.var(valid_returns - valid_values)
            return_var = torch.var(valid_returns)
            metrics["critic/vf_explained_var"] = (1.0 - return_diff_var / (return_var + 1e-5)).item()

    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = torch.eq(response_length, max_response_length).float().mean().item()
    metrics.update(_stats("prompt_length", prompt_length))
    metrics["prompt_length/clip_ratio"] = torch.eq(prompt_length, max_prompt_length).float().mean().item()

    keys_present = set(b.keys())
    if {"rollout_log_probs", "old_log_probs"} <= keys_present:
        diff = torch.masked_select((b["rollout_log_probs"].float() - b["old_log_probs"].float()).abs(), response_mask)
        if diff.numel() == 0:
            metrics["rollout/logp_abs_diff_mean"] = metrics["rollout/logp_abs_diff_max"] = float("nan")
        else:
            metrics["rollout/logp_abs_diff_mean"] = diff.mean().item()
            metrics["rollout/logp_abs_diff_max"] = diff.max().item()
    return metrics


def compute_rollout_data_metrics(batch: DataProto) -> dict[str, float]:
    """The part of compute_data_metrics that needs no training pass: scores (per-sequence
    sums) and lengths. What async_training.simulate_training (hybrid/async_sim.py) reports,
    where no advantages, returns or rewards beyond the scores are computed."""
    _require(batch, ["token_level_scores"], "compute_rollout_data_metrics")
    prompt_length, response_length, max_prompt_length, max_response_length = _lengths(batch)
    metrics = _stats("critic/score", batch.batch["token_level_scores"].sum(-1))
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = torch.eq(response_length, max_response_length).float().mean().item()
    metrics.update(_stats("prompt_length", prompt_length))
    metrics["prompt_length/clip_ratio"] = torch.eq(prompt_length, max_prompt_length).float().mean().item()
    return metrics


def compute_timing_metrics(batch: DataProto, timing_raw: dict[str, float]) -> dict[str, float]:
    """`timing_s/<phase>` for every timed phase, and `timing_per_token_ms/<phase>` for the
    phases whose cost scales with tokens: `gen` per response token, the forward/backward
    phases per prompt+response token. A phase over zero tokens gets no per-token entry
    (the ratio is undefined)."""
    prompt_length, response_length, _, _ = _lengths(batch)
    num_response_tokens = response_length.sum().item()
    num_overall_tokens = prompt_length.sum().item() + num_response_tokens
    tokens_of_phase = {name: num_response_tokens for name in _PER_RESPONSE_TOKEN_PHASES}
    tokens_of_phase.update({name: num_overall_tokens for name in _PER_TOTAL_TOKEN_PHASES})

    metrics = {f"timing_s/{name}": float(seconds) for name, seconds in timing_raw.items()}
    for name, seconds in timing_raw.items():
        tokens = tokens_of_phase.get(name)
        if tokens:
            metrics[f"timing_per_token_ms/{name}"] = float(seconds) * 1000.0 / tokens
    return metrics


def compute_throughput_metrics(batch: DataProto, timing_raw: dict[str, float], n_devices: int) -> dict[str, float]:
    """Tokens processed per second per device over the whole step; tokens are all
    attended positions (prompt + response, padding excluded)."""
    _require(batch, ["attention_mask"], "compute_throughput_metrics")
    if "step" not in timing_raw:
        raise KeyError(f"compute_throughput_metrics needs timing_raw['step']; timed phases: {sorted(timing_raw)}")
    if n_devices < 1:
        raise ValueError(f"n_devices must be >= 1, got {n_devices}")
    total_tokens = int(batch.batch["attention_mask"].sum().item())
    step_time = float(timing_raw["step"])
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": step_time,
        "perf/throughput": total_tokens / (step_time * n_devices) if step_time > 0 else float("nan"),
    }


def compute_memory_metrics(driver: dict[str, float], workers: Sequence[dict[str, float]] = ()) -> dict[str, float]:
    """Host memory each step: the driver's resident size and the largest rank's
    (`workers.host_memory.process_stats` / `Worker.memory_stats` dicts), and on a GPU the
    largest rank's peak allocated and reserved memory (verl's `perf/max_memory_*_gb`)."""
    metrics = {"perf/cpu_memory_rss_gb": float(driver["rss_gb"])}
    if workers:
        metrics["perf/worker_cpu_memory_rss_gb"] = max(float(w["rss_gb"]) for w in workers)
    for key in ("max_memory_allocated_gb", "max_memory_reserved_gb"):
        values = [float(w[key]) for w in workers if key in w]
        if values:
            metrics[f"perf/{key}"] = max(values)
    return metrics


def reduce_metrics(metrics: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean of each key over a list of metric dicts (e.g. one per micro-batch or worker).
    A key missing from some dicts is averaged over the dicts that have it."""
    collected: dict[str, list[float]] = defaultdict(list)
    for entry in metrics:
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                value = value.detach().float().mean().item()
            collected[key].extend(np.asarray(value, dtype=np.float64).reshape(-1).tolist())
    return {key: float(np.mean(values)) for key, values in collected.items()}


def validation_sample_counts(n: int) -> list[int]:
    """The sample counts N reported as `@N`: powers of two below n, then n (verl's choice).

    n=1 -> [1]; n=4 -> [1, 2, 4]; n=6 -> [1, 2, 4, 6]."""
    if n < 1:
        raise ValueError(f"the number of validation samples per prompt must be >= 1, got {n}")
    counts, c = [], 1
    while c < n:
        counts.append(c)
        c *= 2
    counts.append(n)
    return counts


def process_validation_metrics(
    data_sources: Sequence[str],
    sample_inputs: Sequence[Any],
    infos_dict: dict[str, Sequence[float]],
    n: int | None = None,
    subsets: Sequence[Any] | None = None,
) -> dict[str, float]:
    """Validation metrics per data source, grouped by prompt.

    Row i is one sampled response to prompt `sample_inputs[i]` from `data_sources[i]`;
    rows with the same (data source, prompt) are the samples of one prompt, in order.
    For every variable `var` in `infos_dict` and every N in `validation_sample_counts(n)`,
    over the first N samples of each prompt:

    - `mean@N`: mean score, averaged over prompts;
    - `best@N` / `worst@N`: max / min score, averaged over prompts (N >= 2 only: with one
      sample both equal the mean);
    - `std@N`: standard deviation across the N samples, averaged over prompts (N >= 2).

    `n` is the number of samples per prompt; None means the smallest group size in the
    data (so every prompt contributes to every N). A prompt with fewer than `n` samples is
    an error. Plain statistics over the first N samples, no bootstrap.

    Placement follows verl: the core variable (`acc` if present, else `reward`) at the
    largest N with `mean`, `best` or `worst` goes to `val-core/<ds>/<var>/<stat>@N`; all
    the rest to `val-aux/`. With greedy decoding (n=1) the headline number is therefore
    `val-core/<ds>/reward/mean@1`.

    `subsets` (optional, one label or None per row: the rows' `extra_info.subset`) adds the
    `mean@N` of every variable per question type, as `val-aux/<ds>/<subset>/<var>/mean@N`.
    """
    metrics = _validation_metrics(data_sources, sample_inputs, infos_dict, n)
    if subsets is None:
        return metrics
    labels = np.asarray([None if s is None else str(s) for s in subsets], dtype=object)
    if len(labels) != len(data_sources):
        raise ValueError(f"subsets has {len(labels)} rows but data_sources has {len(data_sources)}")
    for label in dict.fromkeys(x for x in labels if x is not None):
        rows = np.flatnonzero(labels == label)
        part = _validation_metrics(
            np.asarray(data_sources, dtype=object)[rows],
            np.asarray(sample_inputs, dtype=object)[rows],
            {var: np.asarray(values, dtype=np.float64)[rows] for var, values in infos_dict.items()},
            n,
        )
        for name, value in part.items():
            _section, rest = name.split("/", 1)
            source_var, stat_at = rest.rsplit("/", 1)
            if stat_at.startswith("mean@"):
                source, var = source_var.rsplit("/", 1)
                metrics[f"val-aux/{source}/{label}/{var}/{stat_at}"] = value
    return metrics


def _validation_metrics(data_sources, sample_inputs, infos_dict, n) -> dict[str, float]:
    num_rows = len(data_sources)
    if len(sample_inputs) != num_rows:
        raise ValueError(f"sample_inputs has {len(sample_inputs)} rows but data_sources has {num_rows}")
    for var, values in infos_dict.items():
        if len(values) != num_rows:
            raise ValueError(f"infos_dict[{var!r}] has {len(values)} rows but data_sources has {num_rows}")
    if num_rows == 0:
        return {}

    # Group row indices by (data source, prompt), keeping first-seen order.
    groups: dict[tuple[str, Any], list[int]] = {}
    for i, (source, prompt) in enumerate(zip(data_sources, sample_inputs)):
        groups.setdefault((str(source), _hashable(prompt)), []).append(i)

    group_sizes = [len(rows) for rows in groups.values()]
    if n is None:
        n = min(group_sizes)
    else:
        n = int(n)
        for (source, prompt), rows in groups.items():
            if len(rows) < n:
                raise ValueError(
                    f"validation prompt from {source!r} has {len(rows)} samples, fewer than n={n}: "
                    f"{str(prompt)[:200]!r}"
                )
    counts = validation_sample_counts(n)
    core_var = "acc" if "acc" in infos_dict else "reward"

    # per data source -> metric name -> one value per prompt
    per_source: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for var, raw_values in infos_dict.items():
        values = np.asarray(raw_values, dtype=np.float64)
        for (source, _prompt), rows in groups.items():
            group = values[rows]
            for count in counts:
                first = group[:count]
                per_source[source][f"{var}/mean@{count}"].append(float(first.mean()))
                if count >= 2:
                    per_source[source][f"{var}/best@{count}"].append(float(first.max()))
                    per_source[source][f"{var}/worst@{count}"].append(float(first.min()))
                    per_source[source][f"{var}/std@{count}"].append(float(first.std()))

    metrics: dict[str, float] = {}
    for source, by_name in per_source.items():
        for name, per_prompt in by_name.items():
            var, stat_at = name.rsplit("/", 1)
            stat, count = stat_at.split("@")
            is_core = var == core_var and int(count) == n and stat in ("mean", "best", "worst")
            section = "val-core" if is_core else "val-aux"
            metrics[f"{section}/{source}/{name}"] = float(np.mean(per_prompt))
    return metrics


def _hashable(value: Any) -> Any:
    """Prompts may arrive as lists of chat messages or arrays; group them by content."""
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            # tobytes() of an object array is its element pointers: equal chat messages held
            # by different objects (as parquet rows arrive) would fall into separate groups.
            return ("ndarray", value.shape, tuple(_hashable(v) for v in value.reshape(-1).tolist()))
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value
