"""Validation: every row of the validation data generated with `val_kwargs` (greedy by
default), judged by the validation reward manager, and summarized per data source
(`val-core/<source>/reward/mean@1`, `val-aux/...`, hybrid/metrics.py), with a few samples
shown on the console and written to val_generations.jsonl (hybrid/tracking.py).
"""

from __future__ import annotations

import numpy as np

from hybrid.config import HybridConfig
from hybrid.generation_dump import ground_truths, write_generations
from hybrid.metrics import process_validation_metrics
from hybrid.rollouts import Rollouts, numeric_columns
from hybrid.tracking import ValidationGenerationsLogger
from protocol.data_proto import DataProto
from workers.rollout.multi_turn import summarize as summarize_multi_turn


class Validation:
    """`dataloader`, `reward_fn`: the validation data and reward manager (None: no validation)."""

    def __init__(self, config: HybridConfig, tokenizer, dataloader, reward_fn, rollouts: Rollouts):
        self.config = config
        self.tokenizer = tokenizer
        self.dataloader = dataloader
        self.reward_fn = reward_fn
        self.rollouts = rollouts
        self.logger = ValidationGenerationsLogger(local_dir=config.trainer.default_local_dir)

    def run(self, step: int) -> dict[str, float]:
        """Generate for every validation row (val_kwargs), score, and return the metrics;
        the first `trainer.log_val_generations` samples go to the loggers under `step`."""
        if self.dataloader is None or self.reward_fn is None:
            return {}
        data_sources, input_rows, scores, samples, subsets, prompts = [], [], [], [], [], set()
        extra_columns: dict[str, list[float]] = {}
        turn_fields: list[dict] = []  # multi-turn per-sample fields, summarized over all batches
        val_kwargs = self.config.actor_rollout_ref.rollout.val_kwargs
        dump_dir = self.config.trainer.validation_data_dir  # verl's: every sample to <dir>/<step>.jsonl
        dumped: dict[str, list] = {"inputs": [], "outputs": [], "gts": []}
        for batch_index, batch_dict in enumerate(self.dataloader):
            batch = DataProto.from_single_dict(batch_dict)
            gen_batch = self.rollouts.gen_batch(batch)
            gen_batch.meta_info.update({"validate": True, "do_sample": val_kwargs.do_sample})
            out = self.rollouts.generate(gen_batch)
            out.meta_info.pop("metrics", None)  # rank 0's only
            if self.rollouts.multi_turn:
                turn_fields.append({k: v for k, v in out.non_tensor_batch.items() if k.startswith("multi_turn_")})
            n = int(out.meta_info.get("n", 1))
            batch = batch.repeat(repeat_times=n, interleave=True).union(out)
            result = self.rollouts.judge(batch, self.reward_fn)
            seq_scores = result["reward_tensor"].sum(-1).tolist()
            scores.extend(seq_scores)
            for key, values in numeric_columns(dict(result.get("reward_extra_info", {})), len(batch)).items():
                extra_columns.setdefault(key, [float("nan")] * (len(scores) - len(batch))).extend(values)
            data_sources.extend(
                batch.non_tensor_batch.get("data_source", np.array(["unknown"] * len(batch), dtype=object)).tolist()
            )
            subsets.extend(_subsets(batch))
            # Samples are grouped by the validation row they answer (a repeated question
            # still counts once per row), n adjacent samples per row.
            input_rows.extend(f"{batch_index}:{i // n}" for i in range(len(batch)))
            prompt_texts = self.tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
            prompts.update(prompt_texts)
            logged = len(samples) < self.config.trainer.log_val_generations
            if dump_dir or logged:  # decoded once for both
                responses = self.tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True)
            if dump_dir:
                dumped["inputs"].extend(prompt_texts)
                dumped["outputs"].extend(responses)
                dumped["gts"].extend(ground_truths(batch))
            if logged:
                samples.extend(zip(prompt_texts, responses, seq_scores))
        infos = {"reward": scores}
        infos.update(
            {k: v + [float("nan")] * (len(scores) - len(v)) for k, v in extra_columns.items() if k != "reward"}
        )
        if dump_dir:
            write_generations(dump_dir, step, dumped["inputs"], dumped["outputs"], dumped["gts"], scores, infos)
        metrics = process_validation_metrics(
            np.array(data_sources, dtype=object),
            np.array(input_rows, dtype=object),
            infos,
            None,
            subsets=subsets if any(s is not None for s in subsets) else None,
        )
        metrics["val-aux/num_prompts"] = float(len(set(input_rows)))
        metrics["val-aux/num_distinct_prompts"] = float(len(prompts))
        if turn_fields:
            # First-turn accuracy (first_turn_reward), final reward, turns, finish reasons.
            merged = {key: np.concatenate([f[key] for f in turn_fields]) for key in turn_fields[0]}
            metrics.update({f"val-aux/{k}": v for k, v in summarize_multi_turn(merged).items()})
        k = self.config.trainer.log_val_generations
        if k and samples:
            self.logger.log(self.config.trainer.logger, samples[:k], step)
        return metrics


def _subsets(batch: DataProto) -> list:
    """Each row's question type (`extra_info.subset`, as the arithmetic task writes), or None."""
    infos = batch.non_tensor_batch.get("extra_info")
    if infos is None:
        return [None] * len(batch)
    return [info.get("subset") if isinstance(info, dict) else None for info in infos]
