"""The driver's side of step-wise trajectories (`multi_turn.step_wise_trajectories`, SkyRL's
generator.step_wise_trajectories): a batch holds one sample per model turn
(workers/rollout/step_wise.py), so a prompt has as many samples as its trajectories have turns.

- `join_steps`: the prompts' rows (repeated n times, one per trajectory) matched to their
  trajectories' samples, each sample tagged with its trajectory (`step_wise_trajectory`);
- `drop_trajectories` / `last_steps`: the samples of the padding prompts cut off, and one
  sample per trajectory (its last) for validation and the per-trajectory metrics;
- `broadcast_last_step_advantages`: SkyRL's trainer: the estimator sees each trajectory's last
  sample only (its rewards, grouped by prompt `uid`, an all-ones mask so an outcome estimator
  fills every position), and the last sample's advantages and returns go to every sample of
  the trajectory, times that sample's response mask;
- `step_wise_mini_batches`: SkyRL's compute_prompt_mini_batch_boundaries: a mini-batch holds
  the samples of `ppo_mini_batch_size` prompts however many turns they took, so the number of
  optimizer steps is train_batch_size / ppo_mini_batch_size as without step-wise. The workers
  cut a rank's rows into equal mini-batches, so each mini-batch is padded with dummy rows
  (copies of one of its rows with a zero response mask: nothing in any loss, normaliser or
  metric) to the largest one's size, rounded to the data-parallel ranks, and the rows per
  rank go in meta_info (`MINI_BATCH_ROWS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from protocol.data_proto import DataProto
from workers.optimizer_step import MINI_BATCH_ROWS
from workers.rollout.step_wise import STEP_WISE_LAST, trajectory_index

TRAJECTORY = "step_wise_trajectory"


def is_step_wise(data: DataProto) -> bool:
    return STEP_WISE_LAST in data.batch.keys()


def join_steps(rows: DataProto, samples: DataProto) -> tuple[DataProto, dict[str, float]]:
    """`rows` (one per trajectory, in the rollout's order) joined to the trajectories' samples;
    returns the batch and the `step_wise/*` metrics."""
    index = trajectory_index(samples.batch[STEP_WISE_LAST])
    trajectories = int(index[-1]) + 1 if len(index) else 0
    if trajectories != len(rows):
        raise ValueError(f"step-wise rollout: {trajectories} trajectories came back for {len(rows)} prompt rows")
    batch = rows.select_idxs(index).union(samples)
    batch.non_tensor_batch[TRAJECTORY] = np.array(index, dtype=object)
    per_trajectory = np.bincount(index, minlength=trajectories)
    metrics = {
        "step_wise/samples": float(len(batch)),
        "step_wise/trajectories": float(trajectories),
        "step_wise/samples_per_trajectory/mean": float(per_trajectory.mean()) if trajectories else 0.0,
        "step_wise/samples_per_trajectory/max": float(per_trajectory.max()) if trajectories else 0.0,
    }
    return batch, metrics


def drop_trajectories(samples: DataProto, count: int) -> DataProto:
    """`samples` without the samples of its last `count` trajectories."""
    if count == 0:
        return samples
    index = trajectory_index(samples.batch[STEP_WISE_LAST])
    keep = int(np.searchsorted(index, int(index[-1]) + 1 - count))
    return samples[:keep]


def last_steps(samples: DataProto) -> DataProto:
    """Each trajectory's last sample, in order: one row per trajectory."""
    return samples.select_idxs(np.flatnonzero(samples.batch[STEP_WISE_LAST].numpy()))


def broadcast_last_step_advantages(batch: DataProto, compute: Callable[[DataProto], None]) -> None:
    """`advantages` and `returns` of every sample: its trajectory's last sample's, computed by
    `compute` (the configured estimator) over the last samples alone, times its response mask."""
    rows = np.flatnonzero(batch.batch[STEP_WISE_LAST].numpy())
    last = batch.select_idxs(rows)
    # SkyRL passes the estimator an all-ones mask: an outcome estimator's value at every position.
    last.batch["response_mask"] = torch.ones_like(last.batch["response_mask"])
    compute(last)
    owner = {trajectory: i for i, trajectory in enumerate(last.non_tensor_batch[TRAJECTORY])}
    index = torch.tensor([owner[t] for t in batch.non_tensor_batch[TRAJECTORY]], dtype=torch.long)
    advantages = last.batch["advantages"]
    mask = batch.batch["response_mask"].to(advantages.dtype)
    batch.batch["advantages"] = advantages[index] * mask
    batch.batch["returns"] = last.batch["returns"].to(advantages.dtype)[index] * mask


def step_wise_mini_batches(
    batch: DataProto, prompts_per_mini_batch: int, data_parallel: int, sequence_parallel: int = 1
) -> tuple[DataProto, int]:
    """The batch laid out for an update: mini-batch m holds the samples of prompts
    m*P..(m+1)*P-1 (P = `prompts_per_mini_batch`, prompts in order of their first sample), each
    padded with dummy rows to the same number of rows per data-parallel group (a multiple of the
    sequence-parallel size, so the worker group's even split lands on whole groups). The rows go
    group by group (each group's share of mini-batch 0, then of mini-batch 1, ...), a mini-batch's
    samples dealt to the groups longest first. Returns the batch (`MINI_BATCH_ROWS` in its
    meta_info: rows per group and mini-batch) and the number of dummy rows."""
    groups: dict[str, list[int]] = {}
    for row, uid in enumerate(batch.non_tensor_batch["uid"]):
        groups.setdefault(uid, []).append(row)
    prompts = list(groups.values())
    lengths = batch.batch["attention_mask"].sum(-1).tolist()
    minis = []
    for start in range(0, len(prompts), prompts_per_mini_batch):
        rows = [row for group in prompts[start : start + prompts_per_mini_batch] for row in group]
        minis.append(sorted(rows, key=lambda r: (-lengths[r], r)))
    per_group = math.ceil(max(len(rows) for rows in minis) / data_parallel)
    per_group = math.ceil(per_group / sequence_parallel) * sequence_parallel
    order, dummy = [], []
    for group in range(data_parallel):
        for rows in minis:
            mine = rows[group::data_parallel]
            order += mine + [rows[0]] * (per_group - len(mine))
            dummy += [False] * len(mine) + [True] * (per_group - len(mine))
    laid_out = batch.select_idxs(order)
    mask = laid_out.batch["response_mask"]
    laid_out.batch["response_mask"] = mask.masked_fill(torch.tensor(dummy).unsqueeze(-1), 0)
    laid_out.meta_info[MINI_BATCH_ROWS] = per_group
    return laid_out, sum(dummy)


__all__ = [
    "TRAJECTORY",
    "broadcast_last_step_advantages",
    "drop_trajectories",
    "is_step_wise",
    "join_steps",
    "last_steps",
    "step_wise_mini_batches",
]
