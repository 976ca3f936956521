"""SkyRL's simulated fully async trainer (`async_training.simulate_training`; SkyRL's
FullyAsyncTrainerSim, `trainer.fully_async.simulate_training`): generation for real, each
training step a sleep, to measure generation throughput and staleness without trainer devices.

What runs as in AsyncPPOTrainer's fully async mode: the engines, the producer streaming prompt
groups into the group queue within the staleness budget, the queue's bound and drops, the
scoring (reward manager, environments, reward loop), and the per-step staleness, queue and
idle metrics. What is simulated:

- no trainer model is built (no actor, reference, critic or reward model worker): the engines
  read the model folder themselves (a dummy `rollout.load_format` reads it too, as there are no
  trainer weights to push) and serve it as version 0;
- a step takes its groups from the queue, then sleeps `simulate_training_step_seconds`
  (`timing_s/simulated_step`) instead of the log-prob passes, advantages and updates;
- a push (every `trigger_parameter_sync_step` steps) pauses the engines as a real one does,
  aborting the turns in flight with `partial_rollout`, holds them `simulate_weight_sync_seconds`
  where the load would run, and resumes them serving the same weights under the next version
  (`timing_s/update_weights`); so the versions, and the staleness accounting that reads them,
  advance as in training, while the weights never change.

The step's metrics are the reward, score and length ones (no advantages, returns or losses:
nothing computes them), the timings, `perf/throughput` per engine device, and the async ones.
Validation, checkpoints, exports, resume, a critic, a reward model worker and the profiler are
refused at start (hybrid/config/rules_async.py), as SkyRL asserts for the same reason.
"""

from __future__ import annotations

import time
from dataclasses import replace

from hybrid.async_trainer import AsyncPPOTrainer
from hybrid.engines import EnginePool
from hybrid.metrics import compute_rollout_data_metrics, compute_throughput_metrics, compute_timing_metrics
from hybrid.rollouts import timed
from workers.rollout.base import DUMMY_LOAD_FORMATS


def engines_config(config):
    """`config` with the engines reading the model folder: a dummy load format would leave them
    random weights that no trainer replaces."""
    arr = config.actor_rollout_ref
    if arr.rollout.load_format not in DUMMY_LOAD_FORMATS:
        return config
    return replace(config, actor_rollout_ref=replace(arr, rollout=replace(arr.rollout, load_format="auto")))


class SimulatedAsyncTrainer(AsyncPPOTrainer):
    def __init__(self, config, tokenizer, train_dataloader, val_dataloader, reward_fn, val_reward_fn, groups=None):
        super().__init__(config, tokenizer, train_dataloader, val_dataloader, reward_fn, val_reward_fn, groups)
        at = self.config.async_training
        if not at.simulate_training or self.mode != "fully_async":
            raise ValueError(
                "SimulatedAsyncTrainer needs async_training.simulate_training=true with async_training.mode=fully_async"
            )
        self.step_seconds = float(at.simulate_training_step_seconds)
        self.sync_seconds = float(at.simulate_weight_sync_seconds)
        self.engines = EnginePool(engines_config(self.config))

    def init_workers(self) -> None:
        """The engines (and the reward loop's workers) only: no trainer worker group."""
        from hybrid.roles import init_ray_if_needed

        self.groups = {}
        if self.config.reward_model.use_reward_loop and self.reward_loop is None:
            from hybrid.reward_loop import RewardLoop

            self.reward_loop = RewardLoop(self.config)
        init_ray_if_needed(self.config)
        self.engines.start()
        if self.engines.remote.enabled:
            # A remote deployment serves whatever weights it holds (the model folder's, or a past
            # run's pushes): the simulation benchmarks it as it is, those weights named version 0.
            self.engines.simulate_push(0, 0.0)
        elif self.engines.initial_version != 0:
            raise RuntimeError(f"simulated training: the engines serve version {self.engines.initial_version}, not 0")
        self.engines.version = 0  # the model folder's weights, as a real run's first push would name them
        self.rollouts.attach(self.groups, generator=self.engines, reward_loop=self.reward_loop)
        if self.reward_loop is not None:
            self.engines.set_reward_loop(*self.reward_loop.rollout_settings())

    def update_rollout_weights(self, timing: dict) -> None:
        """The simulated push, when a real one would be due (never at the start: the engines
        already serve version 0)."""
        step = self.state.global_step
        if step == 0 or step % self.sync_every:
            return
        with timed("update_weights", timing):
            self.engines.simulate_push(step, self.sync_seconds)
        if self.producer is not None:
            self.producer.new_window(step // self.sync_every)

    def update_step(self, batch, metrics: dict, timing: dict):
        """The step's training, simulated: a sleep on the driver while the producer keeps
        generating, then the simulated push."""
        batch.meta_info["global_steps"] = self.state.global_step
        with timed("simulated_step", timing):
            time.sleep(self.step_seconds)
        self.update_rollout_weights(timing)
        return batch

    def _step_metrics(self, batch, metrics: dict, timing: dict, last_step: bool) -> dict:
        metrics.update(self.rollouts.take_metrics())
        metrics.update(compute_rollout_data_metrics(batch))
        metrics.update(compute_timing_metrics(batch, timing))
        # Per engine device: the devices this run has (a remote deployment's: its own).
        metrics.update(compute_throughput_metrics(batch, timing, self.engines.devices))
        self._idle_shares(metrics, timing)
        return {}  # no validation (refused at start)

    def worker_memory_stats(self) -> list:
        return []  # no trainer worker


__all__ = ["SimulatedAsyncTrainer", "engines_config"]
