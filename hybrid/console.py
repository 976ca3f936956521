"""What a run prints besides the per-step lines: a header saying what is about to run and
where its files go, and the summary at the end (steps, minutes, validation accuracy before
and after on the held-out set named by its distinct count, where the files are)."""

from __future__ import annotations

import glob
import os

import numpy as np


def _model_name(path: str) -> str:
    return os.path.basename(os.path.normpath(str(path))) or str(path)


def print_header(config, trainer) -> None:
    """Three lines before the workers load: algorithm, model, devices and engine; the data and
    the length of the run; the run folder."""
    from workers.device import get_device_name

    rollout = config.actor_rollout_ref.rollout
    mode = "multi-turn " if rollout.multi_turn.enable else ""
    val_dl = trainer.validation.dataloader
    val_rows = len(val_dl.dataset) if val_dl is not None else 0
    test_freq = config.trainer.test_freq
    lines = [
        f"hybrid: {config.algorithm.adv_estimator} on {_model_name(config.actor_rollout_ref.model.path)} | "
        f"{get_device_name()} x {config.world_size} | {mode}rollout {rollout.name}, n={rollout.n}",
        f"  data: {len(trainer.train_dataloader.dataset)} training rows, {val_rows} validation rows | "
        f"{trainer.total_training_steps} step{'s' if trainer.total_training_steps != 1 else ''} of "
        f"{config.data.train_batch_size} prompts"
        + (f" | validation every {test_freq} steps" if val_rows and test_freq > 0 else ""),
        f"  run folder: {config.trainer.default_local_dir} (metrics, engine logs, checkpoints)",
    ]
    print("\n".join(lines), flush=True)


def _val_score(metrics: dict) -> float | None:
    keys = [k for k in metrics if k.startswith("val-core/") and k.endswith("/mean@1")]
    return float(np.mean([metrics[k] for k in keys])) if keys else None


def print_summary(config, result: dict) -> None:
    before, after = _val_score(result.get("val_before") or {}), _val_score(result.get("val_after") or {})
    steps = result.get("steps", 0)
    lines = [f"hybrid: finished {steps} step{'' if steps == 1 else 's'} in {result['minutes']:.1f} min"]
    if before is not None:
        val = result.get("val_before") or {}
        distinct, rows = val.get("val-aux/num_distinct_prompts"), val.get("val-aux/num_prompts")
        held_out = (
            ""
            if distinct is None
            else f" on {int(distinct)} distinct held-out prompts"
            + (f" ({int(rows)} rows)" if rows is not None and rows != distinct else "")
        )
        lines.append(
            f"  validation accuracy (greedy){held_out}: before {before:.3f}"
            + (f" -> after {after:.3f}" if after is not None else "")
        )
    lines.append(f"  metrics: {os.path.join(config.trainer.default_local_dir, 'metrics.jsonl')}")
    engine_logs = sorted(glob.glob(os.path.join(config.trainer.default_local_dir, "engine_rank*.log")))
    if engine_logs:
        lines.append(f"  engine logs: {', '.join(engine_logs)}")
    if result.get("plots"):
        lines.append(
            f"  plots: {os.path.dirname(result['plots'][0])} "
            f"({', '.join(os.path.basename(str(p)) for p in result['plots'])})"
        )
    from hybrid.checkpoint_folders import latest_checkpoint

    checkpoint = latest_checkpoint(os.path.abspath(str(config.trainer.default_local_dir)))
    if checkpoint is not None:
        lines.append(f"  checkpoint: {checkpoint}")
        merged = os.path.join(checkpoint, "actor", "huggingface")
        # The folder always holds config and tokenizer; weights only once the merger ran.
        if any(os.path.exists(os.path.join(merged, f)) for f in ("model.safetensors", "model.safetensors.index.json")):
            lines.append(f"  merged Hugging Face model: {merged}")
    print("\n".join(lines), flush=True)
