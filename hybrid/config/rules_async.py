"""The rules of asynchronous training across keys (hybrid/config/rules.py runs them): which keys
turn it on together, whether the placement fits the machine (more engines than devices is
refused with the numbers), and which features each mode supports."""

from __future__ import annotations

import os

from hybrid.config.rules_remote import SERVING, check_remote, serving_only
from hybrid.config.schema import HybridConfig
from hybrid.core_algos import estimator_spec
from protocol.config_schema import Problems, fmt, valid

ARR = "actor_rollout_ref"
AT = "async_training"


def check_async(config: HybridConfig, problems: Problems) -> None:
    arr, placement, at = config.actor_rollout_ref, config.rollout, config.async_training
    check_remote(config, problems)
    remote = valid(arr.rollout.remote) and arr.rollout.remote.enabled
    if not valid(arr.hybrid_engine, placement.n_gpus_per_node, at.mode):
        return
    if at.simulate_training is True:
        _check_simulated(config, problems)
    if arr.hybrid_engine is True and not remote:
        if at.mode is not None:
            problems.add(
                f"{AT}.mode={fmt(at.mode)} runs the rollout engines in their own actors: set {ARR}.hybrid_engine=false "
                f"and rollout.n_gpus_per_node (their devices)"
            )
        if placement.n_gpus_per_node > 0:
            problems.add(
                f"rollout.n_gpus_per_node={placement.n_gpus_per_node} gives the rollout engines devices of their own, "
                f"which needs {ARR}.hybrid_engine=false (with hybrid_engine=true the fused worker generates)"
            )
        return
    if arr.hybrid_engine is True:  # with remote engines: check_remote said so
        return
    mode = config.async_mode
    if placement.n_gpus_per_node < 1 and not remote:
        problems.add(
            f"{ARR}.hybrid_engine=False runs the rollout engines in their own actors, on devices of their own: set "
            f"rollout.n_gpus_per_node (and rollout.nnodes) to their count"
        )
        return
    tp = arr.rollout.tensor_model_parallel_size
    if valid(tp) and placement.devices % tp and not remote:
        problems.add(
            f"rollout.nnodes x rollout.n_gpus_per_node = {placement.devices} devices do not split into engines of "
            f"{ARR}.rollout.tensor_model_parallel_size={tp}"
        )
    if config.trainer.worker_group == "local":
        problems.add(
            f"{AT}.mode={mode!r} runs the engines beside the training group, in Ray actors: set trainer.worker_group="
            f"ray or auto"
        )
    _check_features(config, mode, problems)
    _check_fits(config, problems)


def _check_features(config: HybridConfig, mode: str, problems: Problems) -> None:
    algorithm = config.algorithm
    if valid(algorithm.adv_estimator) and estimator_spec(algorithm.adv_estimator).greedy_baseline:
        problems.add(
            f"algorithm.adv_estimator={algorithm.adv_estimator!r} needs a greedy rollout of every batch with the "
            f"current weights before its update, which {AT}.mode={mode!r} does not make; choose grpo, rloo or another "
            f"estimator"
        )
    if mode == "one_step_off" and algorithm.filter_groups.enable is True:
        problems.add(
            f"algorithm.filter_groups (dynamic sampling) generates batches until enough groups vary, which the "
            f"one-step-off schedule (one batch ahead) does not do; use {AT}.mode=fully_async, which drops a flat group "
            f"as it arrives and generates another"
        )
    if mode == "fully_async":
        at, arr = config.async_training, config.actor_rollout_ref
        groups = at.require_batches * arr.actor.ppo_mini_batch_size
        samples = groups * arr.rollout.n
        world = config.world_size
        if valid(samples, world) and samples % world:
            problems.add(
                f"{AT}.require_batches={at.require_batches} x {ARR}.actor.ppo_mini_batch_size="
                f"{arr.actor.ppo_mini_batch_size} x {ARR}.rollout.n={arr.rollout.n} = {samples} samples per trainer "
                f"step do not split evenly over the {world} training ranks"
            )


def _check_simulated(config: HybridConfig, problems: Problems) -> None:
    """async_training.simulate_training (SkyRL's simulated trainer, hybrid/async_sim.py) builds no
    trainer model: only the fully async schedule, and nothing that needs the trainer's weights."""
    mode = config.async_mode
    if mode != "fully_async":
        problems.add(
            f"{AT}.simulate_training=true simulates the steps of the fully async trainer only (here {AT}.mode="
            f"{fmt(mode)}): set {ARR}.hybrid_engine=false and {AT}.mode=fully_async, or simulate_training=false"
        )
        return
    trainer = config.trainer
    if not valid(trainer.test_freq, trainer.save_freq, trainer.hf_save_freq, trainer.resume_mode):
        return
    # What SkyRL's FullyAsyncTrainerSim asserts, for the same reason: there are no trainer models.
    why = "the simulated trainer builds no trainer model"
    needs = (
        (trainer.test_freq > 0, f"trainer.test_freq={trainer.test_freq}", "-1 (the weights never change: {why})"),
        (trainer.val_before_train is True, "trainer.val_before_train=true", "false (the weights never change: {why})"),
        (trainer.save_freq > 0, f"trainer.save_freq={trainer.save_freq}", "-1 (nothing to save: {why})"),
        (trainer.hf_save_freq > 0, f"trainer.hf_save_freq={trainer.hf_save_freq}", "-1 (nothing to export: {why})"),
        (trainer.merge_on_finish is True, "trainer.merge_on_finish=true", "false or null (nothing to merge: {why})"),
        (trainer.resume_mode != "disable", f"trainer.resume_mode={fmt(trainer.resume_mode)}", "disable ({why})"),
        (config.use_critic, "a critic (critic.enable or adv_estimator=gae)", "none ({why})"),
        (config.reward_model.enable is True, "reward_model.enable=true", "false (no reward model worker is built)"),
        (
            config.global_profiler.tool is not None,
            f"global_profiler.tool={fmt(config.global_profiler.tool)}",
            "null (no trainer worker to profile)",
        ),
    )
    for given, what, fix in needs:
        if given:
            problems.add(f"{AT}.simulate_training=true with {what}: set it to {fix.format(why=why)}")


def _check_fits(config: HybridConfig, problems: Problems) -> None:
    """The training group and the engines side by side on one machine: enough devices (GPUs, or
    CPU cores when there is none) for both. Several nodes: Ray places them and says so."""
    trainer, placement = config.trainer, config.rollout
    if trainer.nnodes != 1 or placement.nnodes != 1:
        return
    from workers.device import is_cuda_available  # the one device helper (imports torch)

    # The simulated trainer (async_training.simulate_training) and hybrid.serve start no training rank.
    no_ranks = config.async_training.simulate_training is True or SERVING.get()
    ranks = 0 if no_ranks else trainer.n_gpus_per_node
    asked = ranks + placement.n_gpus_per_node
    if is_cuda_available():
        import torch

        have, what = torch.cuda.device_count(), "GPUs"
    else:
        have, what = os.cpu_count() or 1, "CPU cores"
    if asked > have and no_ranks:
        problems.add(
            f"rollout.n_gpus_per_node={placement.n_gpus_per_node} engine devices, but this machine has {have} {what}; "
            f"lower it"
        )
    elif asked > have:
        problems.add(
            f"trainer.n_gpus_per_node={trainer.n_gpus_per_node} training ranks + rollout.n_gpus_per_node="
            f"{placement.n_gpus_per_node} engine devices = {asked}, but this machine has {have} {what}; "
            f"lower one of them"
        )


__all__ = ["check_async", "serving_only"]
