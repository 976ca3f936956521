"""ROLL's step batch in hybrid's units (the ROLL dialect, roll.py): the rules for
rollout_batch_size and val_batch_size, the agentic pipeline's batch adjustment, and the
learning-rate warm-up, which ROLL counts in optimizer steps.

ROLL's agentic pipeline (roll/pipeline/agentic/agentic_pipeline.py, adjust_batch) brings every
scored batch to a multiple of the least common multiple of the batches its workers take: the
optimizer step (per_device_train_batch_size x gradient_accumulation_steps x data-parallel ranks)
and the log-prob passes (infer_batch_size x data-parallel ranks) of actor_train, of the reference
when it is built and of the critic with gae. batch_adjust_mode (copy by default) says how: copies
of random samples added, random samples dropped, or `multiple` kept at random. hybrid does the
same with algorithm.batch_adjust (hybrid/batch_ops.py), which the rollout_batch_size rule sets
when the batch is not such a multiple. ROLL's RLVR pipeline has no adjustment: hybrid's check of
whole mini batches applies as written.
"""

from __future__ import annotations

import math
from typing import Any

from hybrid.dialects.roll_episodes import _train_batch, _val_batch, is_agentic, samples_per_prompt, train_prompts
from hybrid.dialects.roll_placement import ACTOR, _mini_batch, _world, parse_devices
from hybrid.dialects.table import Context, Refusal, custom, hybrid_default

ADJUST_MODES = ("copy", "delete", "auto", "random_sample")
ROLL_INFER_BATCH = 16  # WorkerConfig.infer_batch_size's default
ROLL_INIT_KL_COEF = 0.2  # BaseConfig.init_kl_coef's default


def _ranks(ctx: Context, role: str) -> int:
    """A worker's data-parallel ranks: its devices (actor_train's where it gives none) / its ulysses_size."""
    mapping = f"{role}.device_mapping" if ctx.has(f"{role}.device_mapping") else "actor_train.device_mapping"
    if not ctx.has(mapping):
        return _world(ctx)
    devices = len(parse_devices(ctx.get(mapping)))
    ulysses = ctx.get(f"{role}.model_args.ulysses_size", 1) or 1
    return devices // ulysses if isinstance(ulysses, int) and devices % ulysses == 0 else devices


def _worker_batches(ctx: Context) -> list[int]:
    """The batches (samples) of the workers ROLL's adjust_batch takes the least common multiple of."""
    train = "actor_train.training_args"
    actor = _world(ctx)
    sizes = [
        ctx.get(f"{train}.per_device_train_batch_size") * ctx.get(f"{train}.gradient_accumulation_steps") * actor,
        ctx.get("actor_train.infer_batch_size", ROLL_INFER_BATCH) * actor,
    ]
    kl = ctx.get("use_kl_loss", False) or ctx.get("init_kl_coef", ROLL_INIT_KL_COEF) > 0
    lora = ctx.get("actor_train.model_args.lora_target", None) is not None
    if (ctx.get("enable_reference", False) or kl) and not lora:  # ROLL's use_ref_model
        sizes.append(ctx.get("reference.infer_batch_size", ROLL_INFER_BATCH) * _ranks(ctx, "reference"))
    if ctx.get("adv_estimator") == "gae":
        critic, args = _ranks(ctx, "critic"), "critic.training_args"
        sizes.append(ctx.get(f"{args}.per_device_train_batch_size") * ctx.get(f"{args}.gradient_accumulation_steps"))
        sizes[-1] *= critic
        sizes.append(ctx.get("critic.infer_batch_size", ROLL_INFER_BATCH) * critic)
    return sizes


def adjustment(ctx: Context) -> tuple[int, str, int] | None:
    """(multiple, mode, samples after) when ROLL's agentic pipeline adjusts the batch, else None."""
    if not is_agentic(ctx):
        return None
    mode = ctx.get("batch_adjust_mode", "copy")
    if mode not in ADJUST_MODES:
        raise Refusal(f"batch_adjust_mode={mode!r}: one of {', '.join(ADJUST_MODES)} (ROLL's choices)")
    samples = train_prompts(ctx) * samples_per_prompt(ctx)
    multiple = math.lcm(*_worker_batches(ctx))
    rest = samples % multiple
    if rest == 0:
        return None
    if mode == "auto":
        mode = "copy" if rest >= 0.5 * samples or samples < multiple else "delete"
    if mode == "copy" or samples < multiple:  # delete and random_sample copy when the batch is too small
        after = samples + multiple - rest
    else:
        after = samples - rest if mode == "delete" else multiple
    return multiple, mode, after


def _rollout_batch(value: Any, ctx: Context) -> dict[str, Any]:
    out = _train_batch(value, ctx)
    adjusted = adjustment(ctx)
    if adjusted is not None:
        mode = ctx.get("batch_adjust_mode", "copy")  # hybrid resolves auto as ROLL does (batch_ops.adjusted_rows)
        out.update({"algorithm.batch_adjust.multiple": adjusted[0], "algorithm.batch_adjust.mode": mode})
    return out


def _adjust_mode(value: Any, ctx: Context) -> dict[str, Any]:
    if value not in ADJUST_MODES:
        raise Refusal(f"one of {', '.join(ADJUST_MODES)} (ROLL's choices)")
    return {}  # set with the multiple by rollout_batch_size, where the batch needs it


def _warmup(role: str, verl_key: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        train = train_prompts(ctx)
        epochs = ctx.effective("ppo_epochs", f"{ACTOR}.ppo_epochs")
        if ctx.has(f"{role}.training_args.per_device_train_batch_size") or ctx.has(
            f"{role}.training_args.gradient_accumulation_steps"
        ):
            mini, _ = _mini_batch(role, ctx)
        else:
            mini = hybrid_default(f"{ACTOR}.ppo_mini_batch_size")
        adjusted = adjustment(ctx) if role == "actor_train" else None
        n = samples_per_prompt(ctx)
        samples = adjusted[2] if adjusted is not None else train * n
        if samples % (mini * n):
            return {verl_key: value}  # hybrid's own check names the batch sizes that do not divide
        per = samples // (mini * n) * epochs
        if value % per:
            raise Refusal(
                f"ROLL counts warm-up in optimizer steps and hybrid steps its schedule once per "
                f"training step, which here is {per} optimizer steps; use a multiple of {per}"
            )
        return {verl_key: value // per}

    return convert


BATCH_RULES = (
    custom(
        "rollout_batch_size",
        ("data.train_batch_size", "algorithm.batch_adjust.multiple", "algorithm.batch_adjust.mode"),
        _rollout_batch,
        "prompts per step; agentic (env managers given): trajectories / train_env_manager.group_size; agentic, "
        "not a multiple of the workers' batches: batch_adjust.multiple = their least common multiple, mode = "
        "batch_adjust_mode (copy)",
        "ROLL's agentic pipeline counts the batch in trajectories, hybrid in prompts (seed rows); it copies or drops "
        "random trajectories until the batch is a multiple of the lcm of actor_train's optimizer-step batch "
        "(per_device_train_batch_size x gradient_accumulation_steps x ranks) and log-prob batch (infer_batch_size x "
        "ranks), the reference's log-prob batch when it is built and the critic's with gae (its adjust_batch), "
        "before the log-probs and advantages, which see the copies",
    ),
    custom(
        "val_batch_size",
        ("data.val_batch_size",),
        _val_batch,
        "same value; agentic: trajectories / val_env_manager.group_size",
        "the validation set of an agentic run is this many seed rows, the same boards at every validation",
    ),
)

__all__ = ["ADJUST_MODES", "BATCH_RULES", "adjustment"]
