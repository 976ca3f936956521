"""The update loop every trained model shares (actor and critic hold one each).

Mini-batches: the rank's batch is cut into `samples_per_rank` rows per optimizer step (in
order, or shuffled with `seed + epoch`), `epochs` times. Micro-batches: each mini-batch is
cut by `MicroBatching` into forward/backward passes whose gradients accumulate. Scaling:
a micro-batch's loss is weighted by its share of the mini-batch's loss units (tokens, or
sequences for the `seq-mean-*` aggregations) summed over all ranks, times the world size
that FSDP's gradient average divides by, so the gradient does not depend on the
micro-batch size, the token budget or the number of ranks. Then the gradient is clipped
(a non-finite norm skips the step and is counted), the optimizer steps, and once per call
the LR scheduler steps.

The model-specific part is a `MicroLoss`: given one micro-batch's tensors, its weight and
the mini-batch's global counts, it returns the loss to back-propagate and its metrics,
already multiplied by the weight. Summed over micro-batches and ranks and averaged over
mini-batches, those are global means. `<prefix>/grad_norm`, `<prefix>/lr` and (when any)
`<prefix>/skipped_steps` are added here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from protocol.data_proto import DataProto
from workers.config.batching import MicroBatching
from workers.device import current_device, for_collective
from workers.micro_batch import micro_batches
from workers.vision import MULTI_MODAL_INPUTS

# meta_info key: rows per optimizer step on a rank for this update, where the driver lays out
# mini-batches whose size varies by step (step-wise trajectories: hybrid/step_wise.py).
MINI_BATCH_ROWS = "mini_batch_rows_per_rank"


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def all_reduce_sum(values: list[float]) -> list[float]:
    """Element-wise sums over all ranks (float64; exact for counts)."""
    if world_size() == 1 or not values:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=current_device())
    dist.all_reduce(t)
    return t.tolist()


def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
    """torch's `clip_grad_norm_` (L2) with one step between its halves: the total norm of the
    sharded gradients (a DTensor each rank holds part of) is brought where the process group's
    collectives take it before it is reduced, so gradients left on the host by FSDP2's
    CPUOffloadPolicy can be clipped over NCCL (verl's fsdp2_clip_grad_norm_ does the same).
    On the CPU nothing moves. Returns the total norm as a plain tensor, the same on every rank."""
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    total = for_collective(torch.nn.utils.get_total_norm(grads, norm_type=2.0))
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    return total.full_tensor() if isinstance(total, DTensor) else total


def all_reduce_max(value: float) -> float:
    if world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=current_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


@dataclass(frozen=True)
class UpdatePlan:
    samples_per_rank: int  # rows per optimizer step on this rank (the config's mini_batch_samples_per_rank)
    epochs: int
    shuffle: bool
    seed: int  # epoch e shuffles with seed + e
    micro: MicroBatching
    seq_level: bool  # weight by sequences (seq-mean-* aggregations) instead of tokens
    summed: bool = False  # token-sum: every micro-batch's loss counts whole (sums, not a mean)


@dataclass(frozen=True)
class MiniBatchCounts:
    """One mini-batch summed over all ranks (at least 1, so they can divide)."""

    units: float  # what the loss averages over: tokens, or sequences with a response token
    tokens: float  # response tokens


MicroLoss = Callable[[dict[str, torch.Tensor], float, MiniBatchCounts], tuple[torch.Tensor, dict[str, float]]]


class OptimizerStep:
    def __init__(self, module: torch.nn.Module, optimizer, lr_scheduler, grad_clip: float, prefix: str):
        self.module = module
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.grad_clip = float(grad_clip)
        self.prefix = prefix
        self.world_size = world_size()

    def run(self, data: DataProto, keys: list[str], plan: UpdatePlan, micro_loss: MicroLoss) -> dict[str, float]:
        """Train on `data` (this rank's rows, the tensors named by `keys`); returns metrics."""
        self.module.train()
        sums: dict[str, float] = defaultdict(float)
        grad_norms: list[float] = []
        skipped = 0
        rows = int(data.meta_info.get(MINI_BATCH_ROWS, plan.samples_per_rank))
        for epoch in range(plan.epochs):
            minis = data.select(batch_keys=keys).make_iterator(
                mini_batch_size=rows,
                epochs=1,
                seed=plan.seed + epoch,
                dataloader_kwargs={"shuffle": plan.shuffle},
            )
            for mini in minis:
                self._accumulate(mini, keys, plan, micro_loss, sums)
                grad_norm = self._clip_and_step()
                skipped += 0 if torch.isfinite(torch.tensor(grad_norm)) else 1
                grad_norms.append(grad_norm)
        lr = self._step_scheduler()
        self.optimizer.zero_grad(set_to_none=True)
        return self._reduce(sums, len(grad_norms), grad_norms, lr, skipped)

    def _accumulate(
        self, mini: DataProto, keys: list[str], plan: UpdatePlan, micro_loss: MicroLoss, sums: dict
    ) -> None:
        """Forward and backward every micro-batch of one mini-batch; gradients accumulate."""
        tensors = mini.batch.to(current_device())
        mask_all = tensors["response_mask"]
        counts = self._counts(mask_all, plan.seq_level)
        self.optimizer.zero_grad(set_to_none=True)
        images = mini.non_tensor_batch.get(MULTI_MODAL_INPUTS)  # a vision-language batch's (workers/vision.py)
        for idx in micro_batches(mini.batch, plan.micro, self.world_size):
            index = torch.tensor(idx, device=mask_all.device)
            micro = {k: tensors[k][index] for k in keys}
            if images is not None:
                micro[MULTI_MODAL_INPUTS] = images[idx]
            mask = micro["response_mask"]
            weight = 1.0 if plan.summed else float(mask.any(-1).sum() if plan.seq_level else mask.sum()) / counts.units
            loss, metrics = micro_loss(micro, weight, counts)
            # FSDP averages gradients over ranks, so scale by world size to get the global mean
            # (or, for token-sum, the global sum).
            (loss * weight * self.world_size).backward()
            for name, value in metrics.items():
                sums[name] += value

    def _counts(self, mask: torch.Tensor, seq_level: bool) -> MiniBatchCounts:
        local_units = float(mask.any(-1).sum() if seq_level else mask.sum())
        units, tokens = all_reduce_sum([local_units, float(mask.sum())])
        return MiniBatchCounts(units=max(units, 1.0), tokens=max(tokens, 1.0))

    def _clip_and_step(self) -> float:
        grad_norm = float(clip_grad_norm(self.module.parameters(), max_norm=self.grad_clip))
        if torch.isfinite(torch.tensor(grad_norm)):
            self.optimizer.step()
        else:
            # A non-finite gradient would poison the weights; skip this step (it is reported).
            self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _step_scheduler(self) -> float:
        """One scheduler step per update call; returns the LR this call trained with."""
        if self.lr_scheduler is None:
            return self.optimizer.param_groups[0]["lr"]
        lr = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        return lr

    def _reduce(self, sums: dict, num_minis: int, grad_norms: list[float], lr: float, skipped: int) -> dict[str, float]:
        """Per-micro weighted sums are global means once summed over ranks; average over minis."""
        names = sorted(sums)
        metrics = {k: v / max(num_minis, 1) for k, v in zip(names, all_reduce_sum([sums[k] for k in names]))}
        metrics[f"{self.prefix}/grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        metrics[f"{self.prefix}/lr"] = lr
        if skipped:
            metrics[f"{self.prefix}/skipped_steps"] = float(skipped)
        return metrics
