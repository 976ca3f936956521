"""Asynchronous training: `AsyncPPOTrainer` is PPOTrainer with the rollout engines in their own
actors (hybrid/engines.py) beside the training group (`actor_rollout_ref.hybrid_engine=false`);
the update of a step is PPOTrainer's, unchanged. What differs is where a step's scored batch
comes from and when the engines get new weights:

- `one_step_off`: while the trainer trains step s, the engines generate the batch of step s + 1
  with the weights of step s - 1 (verl's one-step-off policy); the lag is the staleness bound
  (async_training.max_staleness_steps, or ceil(staleness_threshold)): 1 is verl's, 0 is
  synchronous training with the engines apart (the same batches, calls and samples as the
  fused worker's). Weights go to the engines after every step.
- `fully_async`: the producer (hybrid/async_producer.py) streams prompt groups through the
  engines into the group queue (hybrid/group_queue.py) while the trainer trains; a step takes
  `require_batches x ppo_mini_batch_size` groups, the freshest first, never one staler than
  the bound; weights go to the engines every `trigger_parameter_sync_step` steps.

Both take prompts from a PromptStream (hybrid/prompt_stream.py) that the checkpoint saves,
so a resumed run generates again whatever was generating or queued and trains every prompt
once. Per step: `async/staleness/mean|max|count_<k>`, `async/queue_depth`,
`async/dropped_stale`, `async/dropped_flat`, `async/trainer_idle_share` (waiting for data),
`async/generator_idle_share` (engines without work), and the push's `timing_s/update_weights`.
"""

from __future__ import annotations

import collections
import time

import numpy as np

from hybrid.async_producer import GroupProducer
from hybrid.batch_ops import group_metric_values, kept_group_indices
from hybrid.engines import EnginePool
from hybrid.group_queue import GroupQueue, check_staleness, staleness
from hybrid.prompt_stream import PromptStream
from hybrid.rollouts import timed
from hybrid.trainer import PPOTrainer
from protocol.data_proto import DataProto


def _groups_per_step(config) -> int:
    """Prompt groups a step trains: the batch (one_step_off), or verl's fetch (fully_async)."""
    if config.async_mode == "fully_async":
        return config.async_training.require_batches * config.actor_rollout_ref.actor.ppo_mini_batch_size
    return config.data.train_batch_size


class AsyncPPOTrainer(PPOTrainer):
    def __init__(self, config, tokenizer, train_dataloader, val_dataloader, reward_fn, val_reward_fn, groups=None):
        super().__init__(config, tokenizer, train_dataloader, val_dataloader, reward_fn, val_reward_fn, groups)
        at = self.config.async_training
        self.mode = self.config.async_mode
        self.bound = at.staleness_bound
        self.sync_every = 1 if self.mode == "one_step_off" else int(at.trigger_parameter_sync_step)
        self.stream = PromptStream(train_dataloader, config.trainer.total_epochs)
        self.state.stream = self.stream
        self.engines = EnginePool(self.config)
        self.queue = GroupQueue(self.bound, self.sync_every)
        self.producer: GroupProducer | None = None
        self._engine_busy = 0.0  # the engines' busy seconds already counted
        self.trained_positions: list = []  # the prompts trained, in order (what exactly-once is checked on)

    def groups_per_step(self) -> int:
        return _groups_per_step(self.config)

    @staticmethod
    def steps_per_epoch(config, train_dataloader) -> int:
        """One pass over the data (whole batches of data.train_batch_size, as the synchronous
        trainer draws them) in steps of `groups_per_step` prompts."""
        rows = len(train_dataloader) * train_dataloader.batch_size
        return max(rows // _groups_per_step(config), 1)

    # ------------------------------------------------------------------ workers
    def init_workers(self) -> None:
        super().init_workers()
        self.engines.start()
        self.rollouts.attach(self.groups, generator=self.engines, reward_loop=self.reward_loop)
        if self.reward_loop is not None:
            self.engines.set_reward_loop(*self.reward_loop.rollout_settings())

    def update_rollout_weights(self, timing: dict) -> None:
        """Push the trainer's weights to the engines when due: at the start, and every
        `sync_every` steps; the version is the trainer's step count."""
        step = self.state.global_step
        due = self.engines.version < 0 or step % self.sync_every == 0
        if not due:
            return
        with timed("update_weights", timing):
            self.engines.push(self.actor_rollout_wg, version=step)
        if self.producer is not None:
            self.producer.new_window(step // self.sync_every)

    def shutdown(self) -> None:
        if self.producer is not None:
            self.producer.stop()
        self.engines.shutdown()
        super().shutdown()

    # ------------------------------------------------------------------ the batches
    def scored_batches(self):
        return self._fully_async() if self.mode == "fully_async" else self._one_step_off()

    def _launch(self):
        """The next step's prompts from the stream, sent to the engines: (positions, rows, results);
        None when the epochs have no whole batch left."""
        taken = []
        while len(taken) < self.config.data.train_batch_size:
            prompt = self.stream.take()
            if prompt is None:  # the last epoch is used up (a short tail stays open, untrained)
                return None
            taken.append(prompt)
        positions = [position for position, _ in taken]
        batch = DataProto.concat([row for _, row in taken])
        gen_batch = self.rollouts.prepare(batch)
        return positions, batch, self.engines.launch(gen_batch)

    def _one_step_off(self):
        pending = collections.deque()
        while True:
            # The step's batch, plus `bound` batches ahead on the weights the engines hold now.
            while len(pending) < self.bound + 1:
                launched = self._launch()
                if launched is None:
                    break
                pending.append(launched)
            if not pending:  # the epochs are trained
                return
            positions, batch, launched = pending.popleft()
            metrics: dict[str, float] = {}
            timing: dict[str, float] = {}
            start = time.perf_counter()
            with timed("gen", timing):
                gen_out = self.engines.collect(launched)
            waited = time.perf_counter() - start
            versions = gen_out.non_tensor_batch["policy_version"]
            ages = check_staleness(versions, self.engines.version, self.bound)
            batch, _ = self.rollouts.complete(batch, gen_out, timing)
            for position in positions:
                self._trained(position)
            metrics.update(self._async_metrics(ages, waited, depth=len(pending)))
            timing["async_wait"] = waited
            yield batch, metrics, timing

    def _fully_async(self):
        cfg = self.config
        at = cfg.async_training
        window = self.groups_per_step() * self.sync_every
        cap = at.max_groups_in_flight or window
        first = max(self.engines.version, 0) // self.sync_every
        self.producer = GroupProducer(
            self.rollouts, self.engines, self.stream, self.queue, window, at.staleness_threshold, cap, first
        )
        self.producer.start()
        keep = self._flat_filter()
        while True:
            metrics: dict[str, float] = {}
            timing: dict[str, float] = {}
            start = time.perf_counter()
            with timed("gen", timing):
                groups = self.queue.take(
                    self.groups_per_step(),
                    self.engines.version,
                    on_stale=self._regenerate,
                    keep=keep,
                    on_flat=self._consumed,
                    ended=self.producer.exhausted,
                )
            waited = time.perf_counter() - start
            if len(groups) < self.groups_per_step():  # the epochs ran out (dynamic sampling drew more)
                return
            batch = DataProto.concat([group.batch for group in groups])
            ages = np.asarray(
                [staleness(g.version, self.state.global_step - 1) for g in groups for _ in range(len(g.batch))]
            )
            for group in groups:
                self._trained(group.position)
                for key, value in group.metrics.items():
                    metrics[key] = metrics.get(key, 0.0) + value / len(groups)
            metrics.update(self.rollouts.multi_turn_metrics(batch))
            metrics.update(self._async_metrics(ages, waited, depth=self.queue.depth()))
            timing["async_wait"] = waited
            yield batch, metrics, timing

    def _trained(self, position) -> None:
        self.stream.trained(position)
        self.trained_positions.append(position)

    def _regenerate(self, group) -> None:
        """A group past the staleness bound: its prompt is generated anew."""
        self.stream.again(group.position)
        self.producer.discard()

    def _consumed(self, group) -> None:
        """A flat group (dynamic sampling): its prompt is used up, another takes its place."""
        self.stream.trained(group.position)
        self.producer.discard()

    def _flat_filter(self):
        """DAPO's dynamic sampling at the queue: a group whose metric does not vary is dropped."""
        cfg = self.config.algorithm.filter_groups
        if not cfg.enable:
            return lambda group: True

        def keep(group) -> bool:
            values = group_metric_values(group.batch, cfg.metric, group.extra)
            return bool(kept_group_indices(group.batch.non_tensor_batch["uid"], values))

        return keep

    def _async_metrics(self, ages: np.ndarray, waited: float, depth: int) -> dict[str, float]:
        metrics = {
            "async/staleness/mean": float(ages.mean()) if ages.size else 0.0,
            "async/staleness/max": float(ages.max()) if ages.size else 0.0,
            "async/queue_depth": float(depth),
            "async/dropped_stale": float(self.queue.dropped_stale),
            "async/dropped_flat": float(self.queue.dropped_flat),
            "async/engine_version": float(self.engines.version),
        }
        for age, count in zip(*np.unique(ages, return_counts=True)):
            metrics[f"async/staleness/count_{int(age)}"] = float(count)
        return metrics

    def _step_metrics(self, batch, metrics: dict, timing: dict, last_step: bool) -> dict:
        val = super()._step_metrics(batch, metrics, timing, last_step)
        self._idle_shares(metrics, timing)
        return val

    def _idle_shares(self, metrics: dict, timing: dict) -> None:
        """The trainer's share of the step spent waiting for data, the engines' spent idle."""
        step_s = timing.get("step", 0.0)
        metrics["async/trainer_idle_share"] = timing.get("async_wait", 0.0) / step_s if step_s > 0 else 0.0
        busy = self.engines.busy_seconds()
        if step_s > 0 and busy is not None:
            metrics["async/generator_idle_share"] = max(
                0.0, 1.0 - (busy - self._engine_busy) / (step_s * self.engines.count)
            )
            self._engine_busy = busy


__all__ = ["AsyncPPOTrainer"]
