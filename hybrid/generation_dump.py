"""verl's generation dumps: `trainer.rollout_data_dir` (each training step's responses) and
`trainer.validation_data_dir` (each validation's), written as verl's `_dump_generations` writes
them: `<dir>/<global step>.jsonl`, one JSON object per sample with `input` (the prompt's text),
`output` (the response's text, special tokens skipped), `gts` (the row's
`reward_model.ground_truth`, or null), `score` (the summed token-level score), `step`, and each
per-sample reward value of the same length (validation: `reward` and the reward function's
extra values). A file of the same step is overwritten, as verl's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol.data_proto import DataProto


def _plain(value: Any) -> Any:
    """numpy scalars and arrays (ground truths read from parquet) as JSON values."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def ground_truths(batch: DataProto) -> list:
    """Each row's `reward_model.ground_truth` (None where the row has none), as verl reads it."""
    column = batch.non_tensor_batch.get("reward_model")
    if column is None:
        return [None] * len(batch)
    return [row.get("ground_truth") if isinstance(row, dict) else None for row in column]


def write_generations(
    folder: str,
    step: int,
    inputs: Sequence[str],
    outputs: Sequence[str],
    gts: Sequence[Any],
    scores: Sequence[float],
    extra: dict[str, Sequence[Any]] | None = None,
) -> str:
    """`<folder>/<step>.jsonl` with one line per sample; extra columns whose length is the samples'
    are added to each line (others left out, as verl). Returns the file's path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{step}.jsonl")
    n = len(inputs)
    columns: dict[str, Sequence[Any]] = {"input": inputs, "output": outputs, "gts": gts, "score": scores}
    columns["step"] = [step] * n
    columns.update({key: values for key, values in (extra or {}).items() if len(values) == n})
    lines = [json.dumps({k: v[i] for k, v in columns.items()}, ensure_ascii=False, default=_plain) for i in range(n)]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"hybrid: dumped generations to {path}", flush=True)
    return path


def dump_rollouts(folder: str | None, step: int, batch: DataProto, tokenizer) -> str | None:
    """trainer.rollout_data_dir: the step's trained batch (prompts, responses, ground truths, scores);
    None when the key is unset."""
    if not folder:
        return None
    inputs = tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
    outputs = tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True)
    scores = batch.batch["token_level_scores"].sum(-1).tolist()
    return write_generations(folder, step, inputs, outputs, ground_truths(batch), scores)


__all__ = ["dump_rollouts", "ground_truths", "write_generations"]
