"""PPOTrainer.fit: the single controller. One step, as data (docs/architecture.md):

rollout (n samples per prompt, uid per prompt) -> reward -> old log-probs (unless the
update is on-policy) -> reference log-probs (when KL is used, or a distillation teacher) ->
values (GAE) -> KL in reward (or the teacher's grades) -> advantages on the driver -> critic
update -> actor update (after critic_warmup) -> weights to the engine -> metrics ->
validation every `test_freq` -> checkpoint every `save_freq`.

The driver never touches weights; every call to a worker group carries a DataProto.
Generating and scoring are hybrid/rollouts.py's, validation hybrid/validation.py's, the
resumable state hybrid/trainer_state.py's and checkpoints hybrid/checkpointing.py's.
"""

from __future__ import annotations

import dataclasses
import os
import time

import torch
from tqdm import tqdm

from hybrid.batch_ops import (
    adjust_batch,
    balance_batch,
    clip_rewards_and_advantages,
    mask_by_difficulty,
    mask_truncated_responses,
    pad_mini_batches,
    pf_ppo_resample,
    restore_response_mask,
)
from hybrid.checkpointing import RunCheckpoints
from hybrid.config import HybridConfig, typed_config
from hybrid.core_algos import agg_loss, get_kl_controller, kl_in_reward
from hybrid.distillation import distillation_rewards
from hybrid.dummy_steps import run_dummy_steps
from hybrid.errors import RunStopped, mark_training_started
from hybrid.generation_dump import dump_rollouts
from hybrid.interrupts import StopSignals
from hybrid.metrics import (
    compute_data_metrics,
    compute_memory_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
)
from hybrid.roles import build_worker_groups
from hybrid.rollouts import Rollouts, timed
from hybrid.run_length import epochs_ran_out, run_steps
from hybrid.step_wise import is_step_wise, step_wise_mini_batches
from hybrid.tracking import Tracking
from hybrid.trainer_state import TrainerState
from hybrid.validation import Validation
from protocol.data_proto import DataProto
from workers.host_memory import process_stats
from workers.profiling import profiled_step


def as_typed(config) -> HybridConfig:
    """The typed config; a composed DictConfig (tests, older scripts) is checked and converted."""
    return config if isinstance(config, HybridConfig) else typed_config(config)


class PPOTrainer:
    def __init__(self, config, tokenizer, train_dataloader, val_dataloader, reward_fn, val_reward_fn, groups=None):
        config = as_typed(config)
        self.tokenizer = tokenizer
        self.train_dataloader = train_dataloader
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn
        self.use_critic = config.use_critic
        self.use_reference_policy = config.use_reference_policy
        self.world_size = config.world_size
        self.kl_ctrl = get_kl_controller(config.algorithm.kl_ctrl) if config.algorithm.use_kl_in_reward else None
        self.length = run_steps(
            config.trainer, lambda: self.steps_per_epoch(config, train_dataloader), config.trainer.max_training_steps
        )
        self.total_training_steps = self.length.steps
        # The learning-rate schedules span the run (verl: total_training_steps when given, even
        # past the epochs' end) unless their own key says otherwise.
        self.config = config.with_schedule_steps(self.length.schedule_steps)
        self.state = TrainerState(train_dataloader, self.kl_ctrl)
        self.checkpoints = RunCheckpoints(self.config, self.use_critic)
        self.rollouts = Rollouts(self.config, reward_fn)
        self.validation = Validation(self.config, tokenizer, val_dataloader, val_reward_fn, self.rollouts)
        self.groups = groups
        self.actor_rollout_wg = self.critic_wg = self.rm_wg = None  # init_workers
        self.reward_loop = None  # init_workers, with reward_model.use_reward_loop
        self.tracker: Tracking | None = None  # fit: it opens the run's log files
        self.stop: StopSignals | None = None  # fit: SIGTERM / Ctrl-C while it runs
        self.history: list[dict] = []

    @staticmethod
    def steps_per_epoch(config, train_dataloader) -> int:
        """Steps one pass over the training data makes (a step per data loader batch)."""
        return len(train_dataloader)

    # ------------------------------------------------------------------ workers
    def init_workers(self) -> None:
        if self.groups is None:
            self.groups = build_worker_groups(self.config)
        self.actor_rollout_wg = self.groups["actor_rollout"]
        self.critic_wg = self.groups.get("critic")
        self.rm_wg = self.groups.get("rm")
        if self.config.reward_model.use_reward_loop and self.reward_loop is None:
            from hybrid.reward_loop import RewardLoop

            self.reward_loop = RewardLoop(self.config)
        self.rollouts.attach(self.groups, reward_loop=self.reward_loop)
        if self.critic_wg is not None:
            self.critic_wg.init_model()
        if self.rm_wg is not None:
            self.rm_wg.init_model()
        self.actor_rollout_wg.init_model()
        if self.reward_loop is not None and self.config.async_mode is None:
            # The agent loops send each trajectory to the reward loop as it finishes.
            self.actor_rollout_wg.set_reward_loop(*self.reward_loop.rollout_settings())

    def update_rollout_weights(self, timing: dict) -> None:
        """Hand the actor's current weights to the rollout engine (in memory, every rank)."""
        with timed("update_weights", timing):
            self.actor_rollout_wg.update_rollout_weights()

    def shutdown(self) -> None:
        if self.reward_loop is not None:
            self.reward_loop.close()
        for fn in (self.reward_fn, self.val_reward_fn):
            if hasattr(fn, "close"):
                fn.close()
        for key in ("actor_rollout", "critic", "rm"):
            group = (self.groups or {}).get(key)
            if group is not None:
                group.shutdown()
        pool = (self.groups or {}).get("pool")
        if pool is not None:
            pool.remove()

    # ------------------------------------------------------------------ one step
    def train_step(self, batch: DataProto, batch_iter, metrics: dict, timing: dict) -> DataProto | None:
        cfg = self.config
        if cfg.algorithm.filter_groups.enable:
            batch = self.rollouts.filtered_batch(_chain(batch, batch_iter or iter(())), timing, metrics)
            if batch is None:
                return None
        else:
            batch, _ = self.rollouts.rollout_and_score(batch, timing)
        return self.update_step(batch, metrics, timing)

    def update_step(self, batch: DataProto, metrics: dict, timing: dict) -> DataProto:
        """Everything after the rollout: old and reference log-probs, values, advantages, the
        critic's and the actor's updates, and the new weights to the engine."""
        cfg = self.config
        batch.meta_info["global_steps"] = self.state.global_step
        actor = cfg.actor_rollout_ref.actor
        adjust = cfg.algorithm.batch_adjust
        if adjust.multiple is not None:
            # Seeded by step, so a resumed run copies or drops the same rows.
            generator = torch.Generator().manual_seed(cfg.trainer.seed * 1_000_003 + self.state.global_step + 7)
            batch, adjust_metrics = adjust_batch(batch, adjust.multiple, adjust.mode, generator)
            metrics.update(adjust_metrics)
        if cfg.trainer.balance_batch:
            metrics.update(balance_batch(batch, self.world_size, keep_groups=actor.share_prompts))

        bypass = actor.correction is not None and actor.correction.bypass
        if bypass:
            # verl's bypass mode: the engine's log-probs are the PPO anchor; no old log-prob pass.
            if "rollout_log_probs" not in batch.batch.keys():
                raise RuntimeError(
                    "algorithm.rollout_correction.bypass_mode needs the engine's log-probs (rollout_log_probs)"
                )
            batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
        elif not actor.on_policy_update:
            with timed("old_log_prob", timing):
                old = self.actor_rollout_wg.compute_log_prob(batch)
            entropys = old.batch.pop("entropys")
            metrics["actor/entropy"] = float(
                agg_loss(entropys, batch.batch["response_mask"], actor.loss_agg_mode, actor.loss_scale_factor)
            )
            old.meta_info.pop("timing", None)
            batch = batch.union(old)

        if self.use_reference_policy:
            with timed("ref", timing):
                batch = batch.union(self.actor_rollout_wg.compute_ref_log_prob(batch))
        if self.use_critic:
            with timed("values", timing):
                batch = batch.union(self.critic_wg.compute_values(batch))

        if self._mask_responses(batch, metrics):
            if bypass:
                batch.pop(batch_keys=["old_log_probs"])  # as at the end of a step that trains
            return batch
        with timed("adv", timing):
            batch = self._advantages(batch, metrics)

        if cfg.trainer.dump_data_batch:
            self.dump_batch(batch)
        if self.use_critic:
            with timed("update_critic", timing):
                critic_out = self.critic_wg.update_critic(self._padded(batch, cfg.critic, "critic", metrics))
            metrics.update(critic_out.meta_info["metrics"])
        if self.state.global_step > cfg.trainer.critic_warmup or not self.use_critic:
            with timed("update_actor", timing):
                actor_out = self.actor_rollout_wg.update_actor(self._padded(batch, actor, "actor", metrics))
            metrics.update(actor_out.meta_info["metrics"])
            self.update_rollout_weights(timing)
        if bypass:
            # The anchor was the engine's own log-probs: left in, the data metrics would report
            # a gap of 0 over the actor's measured rollout/logp_abs_diff_*.
            batch.pop(batch_keys=["old_log_probs"])
        restore_response_mask(batch)  # the data metrics measure every response as generated
        return batch

    def _advantages(self, batch: DataProto, metrics: dict) -> DataProto:
        """Rewards (the KL penalty in them when use_kl_in_reward; with on_policy_distillation the
        teacher's grades instead, hybrid/distillation.py), their clipping, the advantages, and
        PF-PPO's resampling: the batch the updates train on."""
        algorithm = self.config.algorithm
        if algorithm.on_policy_distillation:
            tensors = batch.batch
            rewards, distill_metrics = distillation_rewards(
                tensors["old_log_probs"], tensors["ref_log_prob"], tensors["response_mask"]
            )
            tensors["token_level_rewards"] = rewards
            metrics.update(distill_metrics)
        elif algorithm.use_kl_in_reward:
            rewards, kl_metrics = kl_in_reward(
                batch.batch["token_level_scores"],
                batch.batch["old_log_probs"],
                batch.batch["ref_log_prob"],
                batch.batch["response_mask"],
                self.kl_ctrl,
                algorithm.kl_penalty,
            )
            batch.batch["token_level_rewards"] = rewards
            metrics.update(kl_metrics)
        else:
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        clip_rewards_and_advantages(batch, algorithm, metrics)
        if algorithm.use_pf_ppo:
            # Seeded by step, so a resumed run draws the same rows.
            generator = torch.Generator().manual_seed(self.config.trainer.seed * 1_000_003 + self.state.global_step)
            batch = pf_ppo_resample(batch, algorithm.pf_ppo, generator)
        return batch

    def _padded(self, batch: DataProto, section, role: str, metrics: dict) -> DataProto:
        """trainer.pad_mini_batches: the batch the update of `section` (actor or critic) gets, each
        mini-batch padded with zero-mask dummy rows to its data-parallel ranks (hybrid/batch_ops.py);
        `<role>/dummy_rows` counts them."""
        if is_step_wise(batch):  # mini-batches of whole prompts, however many turns (hybrid/step_wise.py)
            padded, dummies = step_wise_mini_batches(
                batch, section.ppo_mini_batch_size, section.data_parallel_size, section.ulysses_sequence_parallel_size
            )
        elif not self.config.trainer.pad_mini_batches:
            return batch
        else:
            mini = section.ppo_mini_batch_size * section.rollout_n
            padded, dummies = pad_mini_batches(batch, mini, section.data_parallel_size)
        metrics[f"{role}/dummy_rows"] = float(dummies)
        return padded

    def _mask_responses(self, batch: DataProto, metrics: dict) -> bool:
        """algorithm.mask_truncated_responses and difficulty_mask take responses out of the
        losses; True when none is left (the step then trains nothing)."""
        algorithm = self.config.algorithm
        if algorithm.mask_truncated_responses:
            eos = {self.tokenizer.eos_token_id} - {None}
            metrics["response_length/truncated_masked_ratio"] = mask_truncated_responses(batch, eos)
        difficulty = algorithm.difficulty_mask
        if difficulty.enable:
            metrics["actor/difficulty_mask_ratio"] = mask_by_difficulty(batch, difficulty.low, difficulty.high)
        masked = algorithm.mask_truncated_responses or difficulty.enable
        return masked and self._skip_if_all_masked(batch, metrics)

    @staticmethod
    def _skip_if_all_masked(batch: DataProto, metrics: dict) -> bool:
        """When the masks (mask_truncated_responses, difficulty_mask) leave no response in the
        losses the step trains nothing, as ROLL skips such a step (its mask/final_mask_sum_eq_0):
        no advantages to whiten, no update, no new weights. The step's metrics report zero
        advantages and returns (nothing was learned) and every response as generated."""
        empty = not bool(batch.batch["response_mask"].any())
        metrics["mask/final_mask_sum_eq_0"] = float(empty)
        if empty:
            tensors = batch.batch
            tensors["token_level_rewards"] = tensors["token_level_scores"]
            tensors["advantages"] = torch.zeros_like(tensors["token_level_scores"])
            tensors["returns"] = torch.zeros_like(tensors["token_level_scores"])
            restore_response_mask(batch)
        return empty

    def dump_batch(self, batch: DataProto) -> str:
        """trainer.dump_data_batch (SkyRL's): the step's training input, advantages included, as
        `DataProto.save_to_disk` writes it (read back with `DataProto.load_from_disk`)."""
        folder = os.path.join(os.path.abspath(str(self.config.trainer.default_local_dir)), "dumped_data")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"global_step_{self.state.global_step}_training_input.pt")
        batch.save_to_disk(path)
        return path

    # ------------------------------------------------------------------ loop
    def fit(self) -> dict:
        """Train to the last step; SIGTERM or Ctrl-C ends the run at the next safe point."""
        with StopSignals(defer=True, save_on_stop=self.config.trainer.save_on_stop) as self.stop:
            return self._fit()

    def _stop_if_requested(self, progress) -> None:
        """A safe point: step `state.global_step` is finished, logged and checkpointed when
        due, and the next batch is not drawn yet. After SIGTERM or Ctrl-C, save this step
        (when trainer.save_freq > 0) and end the run with RunStopped, so a resumed run
        continues exactly as after a normal save."""
        if not self.stop.requested:
            return
        progress.close()
        checkpoint = self.checkpoints.save_on_stop(self.state, self.groups)
        self.tracker.finish()
        raise RunStopped(
            self.stop.signum,
            self.state.global_step,
            self.total_training_steps,
            checkpoint,
            self.config.trainer.save_on_stop,
        )

    def _fit(self) -> dict:
        cfg = self.config
        self.tracker = Tracking(
            project_name=cfg.trainer.project_name,
            experiment_name=cfg.trainer.experiment_name,
            default_backend=list(cfg.trainer.logger),
            config=dataclasses.asdict(cfg),
            local_dir=cfg.trainer.default_local_dir,
            wandb_tags=cfg.trainer.wandb_tags,
        )
        if cfg.trainer.num_dummy_steps:  # SkyRL's full-context trainer: dummy steps only, no resume
            mark_training_started()
            return run_dummy_steps(self)
        self.checkpoints.resume(self.state, self.groups)  # trainer.resume_mode: step and data position
        self.tracker.continue_from(self.state.global_step)
        mark_training_started()  # failures from here on exit with status 1 (hybrid/errors.py)
        self.update_rollout_weights({})  # the engine starts with placeholder weights
        if self.state.global_step >= self.total_training_steps:
            print(
                f"hybrid: resumed at step {self.state.global_step} of {self.total_training_steps}; "
                f"nothing left to train",
                flush=True,
            )
            self.tracker.finish()
            return {"val_before": {}, "val_after": {}, "steps": self.state.global_step}
        note = epochs_ran_out(cfg.trainer, self.length)
        if note is not None:
            print(note, flush=True)
        first_val = {}
        if cfg.trainer.val_before_train and self.validation.dataloader is not None:
            first_val = self.validation.run(self.state.global_step)
            self.tracker.log(first_val, step=self.state.global_step)
            if cfg.trainer.val_only:
                return {"val_before": first_val}
        last_val = self._train(first_val)
        self.tracker.finish()
        return {"val_before": first_val, "val_after": last_val, "steps": self.state.global_step}

    def _train(self, last_val: dict) -> dict:
        """Steps from the state's position to the last one; returns the last validation's metrics."""
        cfg = self.config
        state = self.state
        progress = tqdm(
            total=self.total_training_steps, initial=state.global_step, desc="training", unit="step", dynamic_ncols=True
        )
        self._stop_if_requested(progress)
        state.global_step += 1
        batches = self.scored_batches()
        while True:
            workers = (self.actor_rollout_wg, self.critic_wg)
            with profiled_step(cfg.global_profiler, state.global_step, workers):
                start = time.perf_counter()
                scored = next(batches, None)
                if scored is None:  # dynamic sampling used the last epoch's data up early
                    state.global_step -= 1
                    self._data_ran_out()
                    break
                batch, metrics, timing = scored
                batch = self.update_step(batch, metrics, timing)
                timing["step"] = time.perf_counter() - start
            last_step = state.global_step >= self.total_training_steps
            last_val = self._step_metrics(batch, metrics, timing, last_step) or last_val
            self.log_step(metrics)
            progress.update(1)
            if last_step:
                break
            self._stop_if_requested(progress)
            state.global_step += 1
        progress.close()
        return last_val

    def _data_ran_out(self) -> None:
        """The data of trainer.total_epochs ran out before the planned last step: only dynamic
        sampling (algorithm.filter_groups), which draws batches until enough groups vary, makes
        fewer steps than batches. Step `state.global_step` was the last: its checkpoint (when
        checkpoints are kept) is saved now if not already, as the last step's is."""
        step = self.state.global_step
        print(
            f"hybrid: the training data ran out after trainer.total_epochs={self.config.trainer.total_epochs} "
            f"at step {step} of the {self.total_training_steps} planned (algorithm.filter_groups drew more than "
            f"one batch for some steps); the run ends here",
            flush=True,
        )
        saved = self.checkpoints.last is not None and self.checkpoints.last[0] == step
        if step > 0 and not saved and self.checkpoints.due(step, last_step=True):
            self.checkpoints.save(self.state, self.groups, last_step=True)

    def scored_batches(self):
        """(batch, metrics, timing) per step: the step's prompts rolled out and scored, the
        step's metrics and timings so far. Here the fused worker generates each step's batch
        from the data loader, epoch after epoch up to trainer.total_epochs (hybrid/async_trainer.py
        streams them from the engines of asynchronous training instead)."""
        cfg = self.config
        # verl's `for epoch in range(current_epoch, total_epochs)`; a resumed run goes on in the
        # epoch its checkpoint was in (the loader's position says which).
        while _next_epoch(self.train_dataloader) < cfg.trainer.total_epochs:
            batch_iter = iter(self.train_dataloader)
            produced = False
            for batch_dict in batch_iter:
                metrics: dict[str, float] = {}
                timing: dict[str, float] = {}
                batch = DataProto.from_single_dict(batch_dict)
                if cfg.algorithm.filter_groups.enable:
                    batch = self.rollouts.filtered_batch(_chain(batch, _dict_iter(batch_iter)), timing, metrics)
                    if batch is None:
                        continue
                else:
                    batch, _ = self.rollouts.rollout_and_score(batch, timing)
                produced = True
                yield batch, metrics, timing
            if not produced:
                # Only dynamic sampling can skip every batch; another epoch would do the same.
                raise RuntimeError(
                    "a whole epoch of training data gave no batch to train on: algorithm.filter_groups dropped "
                    f"every group (no variation in {cfg.algorithm.filter_groups.metric!r}); check the "
                    "reward function and the data, or disable algorithm.filter_groups"
                )

    def _step_metrics(self, batch: DataProto, metrics: dict, timing: dict, last_step: bool) -> dict:
        """The step's reward, data, timing and throughput metrics into `metrics`, and the
        validation's when due (returned too; {} when it did not run)."""
        dump_rollouts(self.config.trainer.rollout_data_dir, self.state.global_step, batch, self.tokenizer)  # verl's
        metrics.update(self.rollouts.take_metrics())
        metrics.update(compute_data_metrics(batch, use_critic=self.use_critic))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughput_metrics(batch, timing, self.world_size))
        test_freq = self.config.trainer.test_freq
        step = self.state.global_step
        # A stopping run skips validation: a preempted job has seconds, not minutes.
        val_due = test_freq > 0 and (step % test_freq == 0 or last_step) and not self.stop.requested
        if self.validation.dataloader is None or not val_due:
            return {}
        with timed("testing", timing):
            val = self.validation.run(step)
        metrics.update(val)
        metrics["timing_s/testing"] = timing["testing"]
        return val

    def log_step(self, metrics: dict) -> None:
        """The step's console line, then its checkpoint when due (`after_step`, which prints
        its own lines), then the whole record, save time and memory included, to the other
        backends and the run's history."""
        self.tracker.log(metrics, step=self.state.global_step, backends=["console"])
        self.after_step(metrics)
        # Measured after validation and the checkpoint: the step's whole footprint.
        metrics.update(compute_memory_metrics(process_stats(), self.worker_memory_stats()))
        others = [name for name in self.tracker.loggers if name != "console"]
        self.tracker.log(metrics, step=self.state.global_step, backends=others)
        self.history.append({"step": self.state.global_step, **metrics})

    def worker_memory_stats(self) -> list:
        """Each training rank's memory (`Worker.memory_stats`)."""
        return self.actor_rollout_wg.memory_stats()

    def after_step(self, metrics: dict) -> None:
        """Checkpoint every trainer.save_freq steps and at the last step, and export a Hugging Face
        folder every trainer.hf_save_freq steps and at the last step (hybrid/checkpointing.py)."""
        last_step = self.state.global_step >= self.total_training_steps
        if self.checkpoints.due(self.state.global_step, last_step):
            metrics["timing_s/save_checkpoint"] = self.checkpoints.save(self.state, self.groups, last_step)
        if self.checkpoints.hf_export_due(self.state.global_step, last_step):
            metrics["timing_s/export_hf"] = self.checkpoints.export_hf(self.state.global_step, self.groups)


def _next_epoch(loader) -> int:
    """The epoch the loader's next batch comes from (a finished epoch's position moves on)."""
    return int(loader.epoch) + (1 if loader.batches_consumed >= len(loader) else 0)


def _dict_iter(batch_iter):
    for batch_dict in batch_iter:
        yield DataProto.from_single_dict(batch_dict)


def _chain(first: DataProto, rest):
    yield first
    yield from rest
