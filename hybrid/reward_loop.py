"""The driver's side of the reward loop (reward_model.use_reward_loop=true).

`RewardLoop` starts `reward_model.num_workers` reward-loop workers (reward/reward_loop.py) as
Ray actors and, when a reward model is enabled and no `judge.base_url` is named, one engine
serving it (workers/reward_engine.py). Each worker scores one trajectory per call and many
calls at once. With agent loops (rollout.mode=async) the rollout hands every trajectory to a
worker the moment it finishes, so scores are computed while the rest of the batch still
generates, and the rows come back already scored (`reward_loop` per sample). `score` fills in
whatever is not scored yet (every row, with the lock-step rollout) by sending all of them at
once, and assembles token-level scores as the after-batch path does: the reward function's
score and the reward model's on the last response token, the environments' rewards in
multi-turn rollouts, `reward_model.combine` as before.

When the agent loops score: with no reward model, or with `reward_model.enable_resource_pool`
(verl's rule: a reward model with resources of its own); a colocated reward model scores after
the batch. Placement: the workers and the engine ask Ray for no cores of their own: on a CPU
machine they share the cores with the trainer (the engine time-shared, as the colocated rollout
engine is); a served reward model on GPUs is not built yet and is refused at start.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import ray
import torch

from protocol.data_proto import DataProto
from reward.judge import STATUSES
from reward.reward_loop import RewardLoopWorker, trajectory_sample
from workers.device import is_cuda_available
from workers.reward_engine import GENERATIVE, RewardEngine, reward_model_kind

SCORED = "reward_loop"  # the non-tensor column of rows the rollout already scored


def batch_samples(batch: DataProto, reward_fn_key: str) -> list[dict]:
    """Each row of a generated batch as the reward loop's sample (valid prompt and response ids
    and the row's fields)."""
    prompts, responses = batch.batch["prompts"], batch.batch["responses"]
    mask = batch.batch["attention_mask"]
    width = prompts.shape[-1]
    # images_seen: what reward/scorers/roll_detection.py reads of a vision row (reward/row_fields.py)
    fields = ("raw_prompt", "reward_model", "extra_info", "images_seen", reward_fn_key)
    keys = [k for k in fields if k in batch.non_tensor_batch]
    samples = []
    for i in range(len(batch)):
        prompt_ids = prompts[i][mask[i, :width].bool()].tolist()
        response_ids = responses[i][mask[i, width:].bool()].tolist()
        fields = {key: batch.non_tensor_batch[key][i] for key in keys}
        samples.append(trajectory_sample(prompt_ids, response_ids, fields))
    return samples


class RewardLoop:
    """config: the whole run's (HybridConfig)."""

    def __init__(self, config):
        rm = config.reward_model
        self.config = config
        self.engine, self.kind, context = None, None, None
        if rm.enable:
            self.kind = GENERATIVE if rm.judge.base_url else reward_model_kind(rm.model.path)
            if not rm.judge.base_url:
                tp = int(rm.rollout.tensor_model_parallel_size)
                if tp != 1 and not is_cuda_available():
                    raise ValueError(
                        f"reward_model.rollout.tensor_model_parallel_size={tp}: without a GPU the reward engine is "
                        "one vLLM process on CPU cores; set it to 1"
                    )
                if is_cuda_available():
                    raise ValueError(
                        "reward_model.use_reward_loop=true with a served reward model places its engine on CPU "
                        "cores only in this version (GPU placement is not built); use reward_model.use_reward_loop"
                        "=false (the reward model's FSDP worker) or a judge at reward_model.judge.base_url"
                    )
                engine_cls = ray.remote(RewardEngine).options(num_cpus=0, max_concurrency=1024, name=None)
                self.engine = engine_cls.remote(rm, config.trainer.default_local_dir)
                context = ray.get(self.engine.info.remote())["max_model_len"]  # a model that fails stops the run here
            if rm.judge.domains is not None and self.kind != GENERATIVE:
                raise ValueError(
                    f"reward_model.judge.domains={list(rm.judge.domains)}: reward_model.model.path={rm.model.path} "
                    "is a classifier, not a judge; unset judge.domains"
                )
        worker_cls = ray.remote(RewardLoopWorker).options(num_cpus=0, max_concurrency=1024)
        workers = int(rm.num_workers)
        self.workers = [worker_cls.remote(config, self.engine, self.kind, context) for _ in range(workers)]
        ray.get([w.ready.remote() for w in self.workers])  # so does a reward file
        self._next = itertools.cycle(range(len(self.workers)))

    @property
    def handles(self) -> list:
        """The workers, for the agent loops to send finished trajectories to."""
        return list(self.workers)

    def rollout_settings(self) -> tuple[list, bool, str]:
        """What the agent loops need to score trajectories as they finish: the workers, whether
        the reward function scores (multi-turn: only a custom one), the data-source key."""
        multi_turn = self.config.actor_rollout_ref.rollout.multi_turn.enable
        use_reward_fn = not multi_turn or bool(self.config.custom_reward_function.path)
        rm = self.config.reward_model
        # verl's rule: a reward model colocated with the policy scores after the batch.
        during_rollout = not rm.enable or rm.enable_resource_pool
        return (self.handles if during_rollout else []), use_reward_fn, self.config.data.reward_fn_key

    def submit(self, samples: list[dict], use_reward_fn: bool) -> list:
        """Start scoring `samples` (round robin over the workers); the results' object refs."""
        return [self.workers[next(self._next)].score.remote(s, use_reward_fn) for s in samples]

    def close(self) -> None:
        for actor in self.workers + ([self.engine] if self.engine is not None else []):
            ray.kill(actor)
        self.workers, self.engine = [], None

    # ------------------------------------------------------------------ a batch
    def results(self, batch: DataProto, use_reward_fn: bool) -> list[dict]:
        """Every row's result: the rollout's where it scored the row, the rest scored now."""
        done = batch.non_tensor_batch.get(SCORED)
        results: list = [None] * len(batch)
        if done is not None:
            for i, result in enumerate(done):
                results[i] = result if isinstance(result, dict) else None
        todo = [i for i, r in enumerate(results) if r is None]
        if todo:
            samples = batch_samples(batch.select_idxs(todo), self.config.data.reward_fn_key)
            for i, result in zip(todo, ray.get(self.submit(samples, use_reward_fn))):
                results[i] = result
        return results

    def score(self, batch: DataProto, use_reward_fn: bool, env_rewards: torch.Tensor | None) -> dict:
        """What a reward manager returns for the batch (`reward_tensor`, `reward_extra_info`,
        `reward_metrics`), the reward model's score already combined in, plus `rm_scores`."""
        start = time.perf_counter()
        results = self.results(batch, use_reward_fn)
        response_mask = batch.batch["attention_mask"][:, batch.batch["prompts"].shape[-1] :]
        last = (response_mask.sum(-1) - 1).clamp(min=0)
        rows = torch.arange(len(batch))
        scores = torch.zeros(response_mask.shape, dtype=torch.float32)
        if use_reward_fn:
            # A row only the judge scores (reward_model.judge.domains) has no reward-function score.
            scores[rows, last] = torch.tensor([0.0 if r["score"] is None else float(r["score"]) for r in results])
        if env_rewards is not None:
            scores = scores + env_rewards
        extra: dict[str, list] = {}
        for i, result in enumerate(results):
            for key, value in result["extra"].items():
                extra.setdefault(key, [None] * len(batch))[i] = value
        metrics = _summed(r["metrics"] for r in results)
        latencies = [r["latency_s"] for r in results]
        metrics["reward_loop/score_latency_s/mean"] = float(np.mean(latencies)) if latencies else 0.0
        waits = [r["scored_after_s"] for r in results if "scored_after_s" in r]
        if waits:
            # From a trajectory's last token to its score (rows the rollout scored as they finished).
            metrics["reward_loop/last_token_to_score_s/mean"] = float(np.mean(waits))
            metrics["reward_loop/last_token_to_score_s/max"] = float(np.max(waits))
        metrics["reward_loop/scored_in_rollout_fraction"] = (len(batch) - _count_unscored(batch)) / max(len(batch), 1)
        rm_scores = None
        if self.config.reward_model.enable:
            rm_scores = torch.zeros(response_mask.shape, dtype=torch.float32)
            rm_scores[rows, last] = torch.tensor([float(r["rm_score"]) for r in results])
            extra["rm_score"] = [float(r["rm_score"]) for r in results]
            scores = rm_scores.clone() if self.config.reward_model.combine == "rm_only" else scores + rm_scores
            if self.kind == GENERATIVE:
                statuses = [r["judge_status"] for r in results]
                extra["judge_status"] = statuses
                for status in STATUSES:
                    metrics[f"reward_loop/judge_{status}"] = float(sum(s == status for s in statuses))
                usable = [r for r in results if r["judge_status"] == "ok" and r["score"] is not None]
                if use_reward_fn and usable:
                    # Of the usable verdicts, how many round to the reward function's score (0/1 tasks).
                    agree = [abs(float(r["rm_score"]) - float(r["score"])) < 0.5 for r in usable]
                    metrics["reward_loop/judge_agrees_with_reward_fn"] = float(np.mean(agree))
            else:
                metrics["reward_loop/rm_truncated"] = float(sum(bool(r.get("truncated")) for r in results))
        metrics["reward_loop/collect_s"] = time.perf_counter() - start
        return {"reward_tensor": scores, "reward_extra_info": extra, "reward_metrics": metrics, "rm_scores": rm_scores}


def _count_unscored(batch: DataProto) -> int:
    done = batch.non_tensor_batch.get(SCORED)
    return len(batch) if done is None else sum(not isinstance(r, dict) for r in done)


def _summed(dicts) -> dict[str, float]:
    """The reward function's per-row metrics over the batch (counts: timeouts, errors)."""
    total: dict[str, float] = {}
    for metrics in dicts:
        for key, value in metrics.items():
            total[key] = total.get(key, 0.0) + float(value)
    return total
