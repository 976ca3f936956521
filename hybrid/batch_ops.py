"""Driver-side operations on a step's batch, between the workers' calls: prompt uids,
balancing tokens across ranks, the advantage computation, DAPO group filtering, masking
truncated responses out of the losses, ROLL's batch adjustment (copies or drops), and SkyRL's
mini-batch padding with dummy rows (trainer.pad_mini_batches)."""

from __future__ import annotations

import heapq
import uuid

import numpy as np
import torch

from hybrid.core_algos import estimator_spec, get_adv_estimator_fn, masked_whiten
from hybrid.step_wise import broadcast_last_step_advantages, is_step_wise
from protocol.data_proto import DataProto


def assign_uids(batch: DataProto) -> None:
    """One uid per prompt; the n samples of a prompt share it after repeat(interleave)."""
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)


def balance_order(seq_lens: list[int], num_partitions: int) -> list[int]:
    """A permutation whose `num_partitions` contiguous equal-size chunks have similar token sums.

    Longest first onto the lightest partition that still has room; every partition gets
    exactly len/num_partitions samples, so the chunks the dispatcher cuts stay aligned.
    """
    n = len(seq_lens)
    if num_partitions <= 1 or n % num_partitions:
        return list(range(n))
    capacity = n // num_partitions
    heap = [(0, p) for p in range(num_partitions)]
    members: list[list[int]] = [[] for _ in range(num_partitions)]
    for idx in sorted(range(n), key=lambda i: -seq_lens[i]):
        load, p = heapq.heappop(heap)
        members[p].append(idx)
        if len(members[p]) < capacity:  # a full partition leaves the heap for good
            heapq.heappush(heap, (load + seq_lens[idx], p))
    return [i for p in range(num_partitions) for i in sorted(members[p])]


def balance_batch(batch: DataProto, world_size: int, keep_groups: bool = False) -> dict[str, float]:
    """Reorder in place so every rank gets about the same number of tokens.

    `keep_groups` (prompt-once packing is on): the rows of a prompt group (one `uid`) move
    together, so each rank can put their prompt through the model once, and a group's load
    counts its prompt once; when equal-size groups cannot split evenly over the ranks, rows
    are balanced one by one (still exact, less sharing).
    """
    seq_lens = batch.batch["attention_mask"].sum(-1).tolist()
    uids = batch.non_tensor_batch.get("uid")
    groups = list(rows_by_uid(uids).values()) if keep_groups and world_size > 1 and uids is not None else None
    if groups and len(groups) % world_size == 0 and len({len(g) for g in groups}) == 1:
        prompt_width = batch.batch["input_ids"].shape[1] - batch.batch["responses"].shape[1]
        prompt_lens = batch.batch["attention_mask"][:, :prompt_width].sum(-1).tolist()
        costs = [prompt_lens[g[0]] + sum(seq_lens[r] - prompt_lens[r] for r in g) for g in groups]
        order = [row for unit in balance_order(costs, world_size) for row in groups[unit]]
    else:
        order = balance_order(seq_lens, world_size)
    batch.reorder(torch.tensor(order))
    chunk = len(order) // max(world_size, 1)
    loads = [sum(seq_lens[i] for i in order[r * chunk : (r + 1) * chunk]) for r in range(world_size)]
    return {"perf/balance_max_min_ratio": max(loads) / max(min(loads), 1)} if world_size > 1 else {}


def rows_by_uid(uids: np.ndarray) -> dict[str, list[int]]:
    """The rows of each prompt group (one `uid`), groups in order of their first row."""
    by_uid: dict[str, list[int]] = {}
    for row, uid in enumerate(uids):
        by_uid.setdefault(uid, []).append(row)
    return by_uid


# Estimator inputs read from the algorithm section (the others are the batch's columns).
ALGORITHM_INPUTS = ("gamma", "lam", "norm_adv_by_std_in_grpo")


def estimator_inputs(batch: DataProto, algorithm_config, name: str) -> dict:
    """The keywords the estimator `name` takes (its spec's `inputs`), and `config`."""
    kwargs = {"config": algorithm_config}
    for key in estimator_spec(name).inputs:
        if key == "index":
            kwargs[key] = batch.non_tensor_batch["uid"]
        elif key in ALGORITHM_INPUTS:
            kwargs[key] = getattr(algorithm_config, key)
        elif key in batch.batch.keys():
            kwargs[key] = batch.batch[key]
        elif key in batch.non_tensor_batch:
            kwargs[key] = batch.non_tensor_batch[key]
        else:
            raise ValueError(f"algorithm.adv_estimator={name!r} takes {key!r}, which the batch does not have")
    return kwargs


def compute_advantage(batch: DataProto, algorithm_config) -> None:
    """Fill `advantages` and `returns` with the configured estimator, given what its spec takes."""
    name = algorithm_config.adv_estimator
    advantages, returns = get_adv_estimator_fn(name)(**estimator_inputs(batch, algorithm_config, name))
    batch.batch["advantages"] = advantages
    batch.batch["returns"] = returns


FULL_RESPONSE_MASK = "full_response_mask"


def mask_truncated_responses(batch: DataProto, eos_token_ids: set[int]) -> float:
    """`algorithm.mask_truncated_responses` (SkyRL's apply_overlong_filtering, DAPO's overlong
    filtering): every response that used its whole budget (data.max_response_length) without
    ending in an EOS token gets a response mask of zeros, so it leaves every loss, the KL in the
    reward and the advantage whitening, while its reward still counts in its group's statistics.
    The mask as it was is kept as `full_response_mask` (travelling with its row through any
    reordering) for `restore_response_mask`. Returns the share of responses masked."""
    tensors = batch.batch
    responses, mask = tensors["responses"], tensors["response_mask"]
    width = responses.shape[-1]
    lengths = tensors["attention_mask"][:, -width:].sum(-1)
    last = responses.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    eos = torch.tensor(sorted(eos_token_ids), dtype=responses.dtype)
    truncated = (lengths >= width) & ~torch.isin(last, eos)
    tensors[FULL_RESPONSE_MASK] = mask
    tensors["response_mask"] = mask * (~truncated).unsqueeze(-1).to(mask.dtype)
    return float(truncated.float().mean()) if len(truncated) else 0.0


def mask_by_difficulty(batch: DataProto, low: float, high: float) -> float:
    """`algorithm.difficulty_mask` (ROLL's difficulty_mask): every response of a prompt group
    (one `uid`) whose mean score (token_level_scores summed per response: the reward before any
    KL) is not strictly between `low` and `high` gets a response mask of zeros, so the group leaves
    every loss, the KL in the reward and the advantage whitening, as ROLL's sample mask
    (final_response_mask, which its advantages are computed with). The mask as it was is kept for
    `restore_response_mask`. Returns the share of responses kept (ROLL's difficulty_mask_ratio)."""
    tensors = batch.batch
    scores = tensors["token_level_scores"].sum(-1).float()
    keep = torch.ones(len(scores), dtype=torch.bool)
    for rows in rows_by_uid(batch.non_tensor_batch["uid"]).values():
        mean = float(scores[rows].mean())
        keep[rows] = low < mean < high
    mask = tensors["response_mask"]
    if FULL_RESPONSE_MASK not in tensors.keys():
        tensors[FULL_RESPONSE_MASK] = mask
    tensors["response_mask"] = mask * keep.unsqueeze(-1).to(mask.dtype)
    return float(keep.float().mean()) if len(keep) else 1.0


def restore_response_mask(batch: DataProto) -> None:
    """The response mask before `mask_truncated_responses` / `mask_by_difficulty`, for the step's data metrics."""
    if FULL_RESPONSE_MASK in batch.batch.keys():
        batch.batch["response_mask"] = batch.batch[FULL_RESPONSE_MASK]
        batch.pop(batch_keys=[FULL_RESPONSE_MASK])


def clip_rewards_and_advantages(batch: DataProto, algorithm, metrics: dict) -> None:
    """`compute_advantage` between ROLL's two clamps:
    `algorithm.reward_clip` on the token-level rewards before, `algorithm.advantage_clip` on
    the advantages after, each with its clip fraction in `metrics` (ROLL's names); with
    `algorithm.whiten_advantages` the advantages are whitened before the clamp, as ROLL's."""
    tensors, mask = batch.batch, batch.batch["response_mask"]
    if algorithm.reward_clip is not None:
        clipped, share = clamp_masked(tensors["token_level_rewards"], float(algorithm.reward_clip), mask)
        tensors["token_level_rewards"] = clipped
        metrics["critic/token_reward_clip_frac"] = share
    if algorithm.advantages_per_domain:
        _advantages_per_domain(batch, algorithm)
    else:
        _advantages(batch, algorithm)
    if algorithm.advantage_clip is not None:
        clipped, share = clamp_masked(tensors["advantages"], float(algorithm.advantage_clip), mask)
        tensors["advantages"] = clipped
        metrics["critic/advantage_clip_frac"] = share


def _advantages(batch: DataProto, algorithm) -> None:
    if is_step_wise(batch):  # the last turn's advantages on every turn (hybrid/step_wise.py)
        broadcast_last_step_advantages(batch, lambda last: compute_advantage(last, algorithm))
    else:
        compute_advantage(batch, algorithm)
    mask = batch.batch["response_mask"]
    if algorithm.whiten_advantages and mask.sum() > 1:
        # ROLL's agentic whiten_advantages: over the batch's response tokens (unbiased variance), then masked;
        # skipped, as ROLL skips it, with fewer than two tokens
        batch.batch["advantages"] = masked_whiten(batch.batch["advantages"], mask) * mask


def _advantages_per_domain(batch: DataProto, algorithm) -> None:
    """`algorithm.advantages_per_domain` (ROLL's multi-domain RLVR pipeline groups the batch by
    its `domain` column and computes each domain's advantages apart): the estimator and the
    whitening see one domain's rows at a time, so statistics over the batch (gae's and
    reinforce_plus_plus's whitening, whiten_advantages) are each domain's; estimators over
    prompt groups give the same either way (a group's rows share a domain)."""
    domains = batch.non_tensor_batch["domain"]
    advantages = torch.zeros_like(batch.batch["token_level_rewards"])
    returns = torch.zeros_like(advantages)
    for domain in dict.fromkeys(domains.tolist()):
        rows = np.flatnonzero(domains == domain)
        part = batch.select_idxs(rows)
        _advantages(part, algorithm)
        index = torch.from_numpy(rows)
        advantages[index] = part.batch["advantages"].to(advantages.dtype)
        returns[index] = part.batch["returns"].to(returns.dtype)
    batch.batch["advantages"], batch.batch["returns"] = advantages, returns


def clamp_masked(values: torch.Tensor, bound: float, mask: torch.Tensor) -> tuple[torch.Tensor, float]:
    """`values` clamped to [-bound, bound] (ROLL's reward_clip and advantage_clip), and the share
    of valid tokens whose value changed (ROLL logs it as the clip fraction)."""
    clamped = values.clamp(-bound, bound)
    valid = mask.bool()
    share = float((clamped != values)[valid].float().mean()) if valid.any() else 0.0
    return clamped, share


def pf_ppo_weights(scores: torch.Tensor, method: str, weight_pow: float) -> torch.Tensor:
    """verl's PF-PPO sampling weights of sequence scores: `pow` |score|^weight_pow,
    `max_min` 1 for the batch's best and worst scores and 0 otherwise, `max_random` 0.4
    for the best and 0.1 otherwise; every weight at least 1e-8 (after adding it)."""
    if method == "pow":
        weights = scores.abs().pow(weight_pow)
    elif method == "max_min":
        weights = ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)
    elif method == "max_random":
        weights = scores.new_full(scores.shape, 0.1).masked_fill(scores == scores.max(), 0.4)
    else:
        raise ValueError(f"algorithm.pf_ppo.reweight_method={method!r} must be pow, max_min or max_random")
    return torch.clamp(weights + 1e-8, min=1e-8)


def pf_ppo_resample(batch: DataProto, pf_ppo, generator: torch.Generator) -> DataProto:
    """As many rows as the batch has, drawn with replacement by their PF-PPO weights."""
    scores = batch.batch["token_level_scores"].sum(-1).double()
    weights = pf_ppo_weights(scores, pf_ppo.reweight_method, float(pf_ppo.weight_pow))
    return batch[torch.multinomial(weights, len(batch), replacement=True, generator=generator)]


def group_metric_values(batch: DataProto, metric: str, extra_info: dict) -> np.ndarray:
    if metric in ("seq_reward", "score"):
        return batch.batch["token_level_scores"].sum(-1).numpy()
    if metric == "seq_final_reward":
        return batch.batch["token_level_rewards"].sum(-1).numpy()
    if metric in extra_info:
        return np.asarray(extra_info[metric], dtype=float)
    if metric == "acc":  # scorers without an `acc` key: a positive score counts as correct
        return (batch.batch["token_level_scores"].sum(-1) > 0).float().numpy()
    raise KeyError(
        f"algorithm.filter_groups.metric={metric!r} is neither a reward extra-info key "
        f"({sorted(extra_info)}) nor one of acc, score, seq_reward, seq_final_reward"
    )


def kept_group_indices(uids: np.ndarray, values: np.ndarray) -> list[int]:
    """Rows of the groups whose metric varies (a group all right or all wrong teaches nothing)."""
    keep = []
    for rows in rows_by_uid(uids).values():
        if len(rows) == 1 or np.std(values[rows]) > 0:
            keep.extend(rows)
    return sorted(keep)


BATCH_ADJUST_MODES = ("copy", "delete", "auto", "random_sample")


def adjusted_rows(size: int, multiple: int, mode: str, generator: torch.Generator) -> tuple[list[int], int, int]:
    """ROLL's agentic adjust_batch (roll/pipeline/agentic/agentic_pipeline.py) on row indices:
    a batch of `size` rows brought to a multiple of `multiple` rows. Returns (the rows in their
    new order, rows added, rows removed). `copy` appends `multiple - size % multiple` rows drawn
    at random (without replacement unless more are needed than the batch has), `delete` drops
    `size % multiple` rows at random (a copy when that would leave none), `auto` copies when the
    remainder is at least half the batch or the batch is smaller than `multiple` and deletes
    otherwise, `random_sample` keeps `multiple` rows at random (a copy when the batch is smaller)."""
    rest = size % multiple
    if rest == 0:
        return list(range(size)), 0, 0
    if mode == "auto":
        mode = "copy" if rest >= 0.5 * size or size // multiple == 0 else "delete"
    elif mode == "random_sample" and size < multiple:
        mode = "copy"
    if mode == "delete" and rest >= size:
        mode = "copy"
    if mode == "copy":
        add = multiple - rest
        if add > size:
            extra = torch.randint(size, (add,), generator=generator).tolist()
        else:
            extra = torch.randperm(size, generator=generator)[:add].tolist()
        return list(range(size)) + extra, add, 0
    if mode == "delete":
        dropped = set(torch.randperm(size, generator=generator)[:rest].tolist())
        return [i for i in range(size) if i not in dropped], 0, rest
    if mode == "random_sample":
        return sorted(torch.randperm(size, generator=generator)[:multiple].tolist()), 0, size - multiple
    raise ValueError(f"algorithm.batch_adjust.mode={mode!r} is not one of {', '.join(BATCH_ADJUST_MODES)}")


def adjust_batch(batch: DataProto, multiple: int, mode: str, generator: torch.Generator) -> tuple[DataProto, dict]:
    """algorithm.batch_adjust: the scored batch brought to a multiple of `multiple` samples before
    the log-prob passes and the advantages, which see the copies like any other sample (as in
    ROLL); returns the batch and its metrics (rows added and removed, 0 when none)."""
    rows, added, removed = adjusted_rows(len(batch), multiple, mode, generator)
    metrics = {"batch_adjust/added": float(added), "batch_adjust/removed": float(removed)}
    if not added and not removed:
        return batch, metrics
    return batch.select_idxs(rows), metrics


def pad_mini_batches(batch: DataProto, mini_batch: int, ranks: int) -> tuple[DataProto, int]:
    """trainer.pad_mini_batches, as SkyRL's MeshDispatch.stage_chunks: each mini batch (`mini_batch`
    consecutive rows) that does not split over `ranks` gets `-mini_batch % ranks` dummy rows, copies
    of its first row with a zero response mask, so they add nothing to any loss, normaliser or
    metric of the update. The rows are laid out rank by rank (each rank's share of mini batch 0,
    then of mini batch 1, ...) so that the dispatcher's even split hands each rank its rows in
    mini-batch order. Returns the batch for the update and the dummies added (0: `batch` itself)."""
    pad = -mini_batch % ranks
    if pad == 0:
        return batch, 0
    if len(batch) % mini_batch:
        raise ValueError(f"a batch of {len(batch)} samples is not a whole number of mini-batches of {mini_batch}")
    minis, per_rank = len(batch) // mini_batch, (mini_batch + pad) // ranks
    # Slot s of a padded mini batch: a real row while s < mini_batch, else a dummy copy of its first row.
    slots = [(m, r * per_rank + j) for r in range(ranks) for m in range(minis) for j in range(per_rank)]
    rows = [m * mini_batch + (s if s < mini_batch else 0) for m, s in slots]
    dummy = torch.tensor([s >= mini_batch for _, s in slots])
    padded = batch.select_idxs(rows)
    padded.batch["response_mask"] = padded.batch["response_mask"].masked_fill(dummy.unsqueeze(-1), 0)
    return padded, minis * pad
