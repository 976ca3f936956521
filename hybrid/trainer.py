"""PPOTrainer.fit: the single controller. One step, as data (shared/DESIGN.md):

rollout (n samples per prompt, uid per prompt) -> reward -> old log-probs -> reference
log-probs (when KL is used) -> values (GAE) -> KL in reward -> advantages on the driver ->
critic update -> actor update (after critic_warmup) -> metrics -> validation every
`test_freq` -> checkpoint every `save_freq`.

The driver never touches weights; every call to a worker group carries a DataProto.
"""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import contextmanager

import numpy as np
import torch
from tqdm import tqdm

from hybrid.batch_ops import (
    assign_uids,
    balance_batch,
    compute_advantage,
    group_metric_values,
    kept_group_indices,
    pf_ppo_resample,
)
from hybrid.checkpointing import load_checkpoint, save_checkpoint, save_on_stop, should_save
from hybrid.config import HybridConfig, typed_config
from hybrid.core_algos import agg_loss, get_kl_controller, kl_in_reward
from hybrid.errors import RunStopped, mark_training_started
from hybrid.interrupts import StopSignals
from hybrid.metrics import (
    compute_data_metrics,
    compute_memory_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    process_validation_metrics,
)
from hybrid.roles import build_worker_groups
from hybrid.tracking import Tracking, ValidationGenerationsLogger
from protocol.data_proto import DataProto, pad_dataproto_to_divisor
from workers.host_memory import process_stats
from workers.profiling import profiled_step
from workers.rollout.multi_turn import summarize as summarize_multi_turn
from workers.shared_prefix import shares_prompts

GEN_KEYS = ["input_ids", "attention_mask", "position_ids"]


@contextmanager
def timed(name: str, timing: dict):
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def as_typed(config) -> HybridConfig:
    """The typed config; a composed DictConfig (tests, older scripts) is checked and converted."""
    return config if isinstance(config, HybridConfig) else typed_config(config)


class PPOTrainer:
    def __init__(self, config, tokenizer, train_dataloader, val_dataloader, reward_fn, val_reward_fn, groups=None):
        config = as_typed(config)
        self.tokenizer = tokenizer
        self.train_dataloader = train_dataloader
        self.val_dataloader = val_dataloader
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn
        self.use_critic = config.use_critic
        self.use_reference_policy = config.use_reference_policy
        self.use_rm = config.reward_model.enable
        self.world_size = config.world_size
        self.kl_ctrl = get_kl_controller(config.algorithm.kl_ctrl) if config.algorithm.use_kl_in_reward else None
        self.total_training_steps = (
            config.trainer.total_training_steps or len(train_dataloader) * config.trainer.total_epochs
        )
        # The learning-rate schedules span the run unless their own key says otherwise.
        self.config = config.with_schedule_steps(self.total_training_steps)
        self.global_steps = 0
        self.groups = groups
        self.history: list[dict] = []
        self._reward_metrics: dict[str, float] = {}
        self.multi_turn = config.actor_rollout_ref.rollout.multi_turn.enable

    # ------------------------------------------------------------------ workers
    def init_workers(self) -> None:
        if self.groups is None:
            self.groups = build_worker_groups(self.config)
        self.actor_rollout_wg = self.groups["actor_rollout"]
        self.critic_wg = self.groups.get("critic")
        self.rm_wg = self.groups.get("rm")
        if self.critic_wg is not None:
            self.critic_wg.init_model()
        if self.rm_wg is not None:
            self.rm_wg.init_model()
        self.actor_rollout_wg.init_model()

    def update_rollout_weights(self, timing: dict) -> None:
        """Hand the actor's current weights to the rollout engine (in memory, every rank)."""
        with timed("update_weights", timing):
            self.actor_rollout_wg.update_rollout_weights()

    def shutdown(self) -> None:
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

    # ------------------------------------------------------------------ pieces
    def _generate(self, gen_batch: DataProto) -> DataProto:
        """Pad the prompts to the world size, generate, and drop the padding's samples."""
        padded, pad = pad_dataproto_to_divisor(gen_batch, self.world_size)
        output = self.actor_rollout_wg.generate_sequences(padded)
        if pad:
            n = int(output.meta_info.get("n", len(output) // len(padded)))
            output = output[: len(output) - pad * n]
        return output

    def _gen_batch(self, batch: DataProto) -> DataProto:
        """The prompts' tensors (popped from `batch`); a multi-turn rollout also gets a copy of
        the rows' non-tensor fields its environments read (raw_prompt, env_class, reward_model,
        extra_info, data_source, index, ...), which stay in `batch` for the reward function."""
        gen_batch = batch.pop(batch_keys=GEN_KEYS)
        if self.multi_turn:
            gen_batch.non_tensor_batch.update(batch.non_tensor_batch)
        return gen_batch

    def _multi_turn_metrics(self, output: DataProto) -> dict[str, float]:
        """`multi_turn/*` of the whole batch: the workers' meta_info holds rank 0's only."""
        output.meta_info.pop("metrics", None)
        if not self.multi_turn:
            return {}
        return summarize_multi_turn(output.non_tensor_batch)

    def _judge(self, batch: DataProto, reward_fn) -> dict:
        """The reward function's result. With multi-turn the environments judge the rows:
        the scores are `env_rewards`, plus the reward function's only when
        custom_reward_function.path is set (the built-in scorers would read the whole
        trajectory, observations included, as the answer)."""
        if not self.multi_turn:
            return reward_fn(batch, return_dict=True)
        env_rewards = batch.batch["env_rewards"]
        if not self.config.custom_reward_function.path:
            return {"reward_tensor": env_rewards.clone()}
        result = dict(reward_fn(batch, return_dict=True))
        result["reward_tensor"] = result["reward_tensor"] + env_rewards
        return result

    def _score(self, batch: DataProto, reward_fn) -> tuple[torch.Tensor, dict]:
        result = self._judge(batch, reward_fn)
        scores = result["reward_tensor"]
        extra = dict(result.get("reward_extra_info", {}))
        self._reward_metrics.update(result.get("reward_metrics", {}))
        # Extra keys of a dict-valued score become metrics (their batch mean).
        for key, values in numeric_columns(extra, len(batch)).items():
            self._reward_metrics[f"reward_extra/{key}/mean"] = float(np.mean(values))
        if self.use_rm:
            rm = self.rm_wg.compute_rm_score(batch).batch["rm_scores"]
            scores = rm if self.config.reward_model.combine == "rm_only" else scores + rm
            extra["rm_score"] = rm.sum(-1).tolist()
        return scores, extra

    def _rollout_and_score(self, batch: DataProto, timing: dict) -> tuple[DataProto, dict]:
        n = self.config.actor_rollout_ref.rollout.n
        assign_uids(batch)
        gen_batch = self._gen_batch(batch)
        gen_batch.meta_info.update({"do_sample": True})
        with timed("gen", timing):
            gen_out = self._generate(gen_batch)
        gen_out.meta_info.pop("timing", None)  # the driver times the call itself (timing_s/gen)
        # Logged with the step's metrics (a dynamic-sampling step: its last generation batch).
        self._reward_metrics.update(self._multi_turn_metrics(gen_out))
        if self.config.algorithm.adv_estimator == "remax":
            with timed("gen_max", timing):
                greedy = gen_batch.select(batch_keys=GEN_KEYS)
                greedy.meta_info["do_sample"] = False
                greedy_out = self._generate(greedy)
                self._multi_turn_metrics(greedy_out)  # not the step's rollout: not logged
                base = batch.select().union(greedy_out)  # union fills its receiver: keep batch as it was
                base_scores, _ = self._score(base, self.reward_fn)
                baselines = base_scores.sum(-1)
        batch = batch.repeat(repeat_times=n, interleave=True).union(gen_out)
        if self.config.algorithm.adv_estimator == "remax":
            batch.batch["reward_baselines"] = baselines.repeat_interleave(n)
        with timed("reward", timing):
            scores, extra = self._score(batch, self.reward_fn)
        batch.batch["token_level_scores"] = scores
        return batch, extra

    def _filtered_batch(self, batch_iter, timing: dict, metrics: dict) -> DataProto | None:
        """DAPO dynamic sampling: keep groups whose metric varies; generate more until full."""
        cfg = self.config.algorithm.filter_groups
        n = self.config.actor_rollout_ref.rollout.n
        want = self.config.data.train_batch_size * n
        kept: list[DataProto] = []
        num_gen, kept_rows = 0, 0
        current = next(batch_iter, None)
        while current is not None:
            batch, extra = self._rollout_and_score(current, timing)
            num_gen += 1
            values = group_metric_values(batch, cfg.metric, extra)
            keep = kept_group_indices(batch.non_tensor_batch["uid"], values)
            metrics["train/num_gen_batches"] = num_gen
            if keep:
                kept.append(batch.select_idxs(keep))
                kept_rows += len(keep)
            limit = cfg.max_num_gen_batches
            if kept_rows >= want:
                break
            if limit and num_gen >= limit:
                if not kept:
                    raise RuntimeError(
                        f"algorithm.filter_groups: {num_gen} generation batches in a row had no group whose "
                        f"{cfg.metric!r} varies, so there is nothing to train on; the data may be too hard or too "
                        "easy for the model, or raise algorithm.filter_groups.max_num_gen_batches (0 = no limit)"
                    )
                break
            current = next(batch_iter, None)
        if not kept:
            return None
        merged = DataProto.concat(kept)
        usable = min(len(merged), want)
        usable -= usable % (n * self.world_size) if usable >= n * self.world_size else 0
        metrics["train/kept_group_fraction"] = kept_rows / max(num_gen * want, 1)
        return merged[:usable] if usable else None

    def on_policy_update(self) -> bool:
        """True when the actor update is one optimizer step on the whole batch with nothing
        else reading old log-probs: they then equal the update's own forward pass, so the
        separate pass is skipped (actor.skip_old_log_prob_on_policy). Decoupled rollout
        correction with rejection or batch-normalised weights reads the whole batch's old
        log-probs before the update, so it keeps the pass."""
        cfg = self.config
        actor = cfg.actor_rollout_ref.actor
        return (
            actor.skip_old_log_prob_on_policy
            and actor.ppo_epochs == 1
            and actor.ppo_mini_batch_size >= cfg.data.train_batch_size
            and not cfg.algorithm.use_kl_in_reward
            and not cfg.algorithm.filter_groups.enable
            and not cfg.algorithm.rollout_correction.reads_old_log_probs_first
        )

    # ------------------------------------------------------------------ one step
    def train_step(self, batch: DataProto, batch_iter, metrics: dict, timing: dict) -> DataProto | None:
        cfg = self.config
        if cfg.algorithm.filter_groups.enable:
            batch = self._filtered_batch(_chain(batch, batch_iter or iter(())), timing, metrics)
            if batch is None:
                return None
        else:
            batch, _ = self._rollout_and_score(batch, timing)
        batch.meta_info["global_steps"] = self.global_steps
        if cfg.trainer.balance_batch:
            arr = cfg.actor_rollout_ref
            keep_groups = shares_prompts(arr.actor.use_prefix_grouper, arr.rollout.n, arr.model.use_remove_padding)
            metrics.update(balance_batch(batch, self.world_size, keep_groups))

        correction = cfg.algorithm.rollout_correction
        if correction.bypass_mode:
            # verl's bypass mode: the engine's log-probs are the PPO anchor; no old log-prob pass.
            if "rollout_log_probs" not in batch.batch.keys():
                raise RuntimeError(
                    "algorithm.rollout_correction.bypass_mode needs the engine's log-probs (rollout_log_probs)"
                )
            batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
        elif not self.on_policy_update():
            with timed("old_log_prob", timing):
                old = self.actor_rollout_wg.compute_log_prob(batch)
            entropys = old.batch.pop("entropys")
            metrics["actor/entropy"] = float(
                agg_loss(entropys, batch.batch["response_mask"], cfg.actor_rollout_ref.actor.loss_agg_mode)
            )
            old.meta_info.pop("timing", None)
            batch = batch.union(old)

        if self.use_reference_policy:
            with timed("ref", timing):
                batch = batch.union(self.actor_rollout_wg.compute_ref_log_prob(batch))
        if self.use_critic:
            with timed("values", timing):
                batch = batch.union(self.critic_wg.compute_values(batch))

        with timed("adv", timing):
            if cfg.algorithm.use_kl_in_reward:
                rewards, kl_metrics = kl_in_reward(
                    batch.batch["token_level_scores"],
                    batch.batch["old_log_probs"],
                    batch.batch["ref_log_prob"],
                    batch.batch["response_mask"],
                    self.kl_ctrl,
                    cfg.algorithm.kl_penalty,
                )
                batch.batch["token_level_rewards"] = rewards
                metrics.update(kl_metrics)
            else:
                batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            compute_advantage(batch, cfg.algorithm)
            if cfg.algorithm.use_pf_ppo:
                # Seeded by step, so a resumed run draws the same rows.
                generator = torch.Generator().manual_seed(cfg.trainer.seed * 1_000_003 + self.global_steps)
                batch = pf_ppo_resample(batch, cfg.algorithm.pf_ppo, generator)

        if self.use_critic:
            with timed("update_critic", timing):
                critic_out = self.critic_wg.update_critic(batch)
            metrics.update(critic_out.meta_info["metrics"])
        if self.global_steps > cfg.trainer.critic_warmup or not self.use_critic:
            with timed("update_actor", timing):
                # The workers get their own config sections only; the actor applies this one.
                batch.meta_info["rollout_correction"] = correction
                actor_out = self.actor_rollout_wg.update_actor(batch)
                batch.meta_info.pop("rollout_correction")
            metrics.update(actor_out.meta_info["metrics"])
            self.update_rollout_weights(timing)
        if correction.bypass_mode:
            # The anchor was the engine's own log-probs: left in, the data metrics would report
            # a gap of 0 over the actor's measured rollout/logp_abs_diff_*.
            batch.pop(batch_keys=["old_log_probs"])
        return batch

    # ------------------------------------------------------------------ validation
    def validate(self) -> dict[str, float]:
        if self.val_dataloader is None or self.val_reward_fn is None:
            return {}
        data_sources, input_rows, scores, samples, subsets, prompts = [], [], [], [], [], set()
        extra_columns: dict[str, list[float]] = {}
        turn_fields: list[dict] = []  # multi-turn per-sample fields, summarized over all batches
        val_kwargs = self.config.actor_rollout_ref.rollout.val_kwargs
        for batch_index, batch_dict in enumerate(self.val_dataloader):
            batch = DataProto.from_single_dict(batch_dict)
            gen_batch = self._gen_batch(batch)
            gen_batch.meta_info.update({"validate": True, "do_sample": val_kwargs.do_sample})
            out = self._generate(gen_batch)
            out.meta_info.pop("metrics", None)  # rank 0's only
            if self.multi_turn:
                turn_fields.append({k: v for k, v in out.non_tensor_batch.items() if k.startswith("multi_turn_")})
            n = int(out.meta_info.get("n", 1))
            batch = batch.repeat(repeat_times=n, interleave=True).union(out)
            result = self._judge(batch, self.val_reward_fn)
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
            if len(samples) < self.config.trainer.log_val_generations:
                responses = self.tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True)
                samples.extend(zip(prompt_texts, responses, seq_scores))
        infos = {"reward": scores}
        infos.update(
            {k: v + [float("nan")] * (len(scores) - len(v)) for k, v in extra_columns.items() if k != "reward"}
        )
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
            self.val_logger.log(self.config.trainer.logger, samples[:k], self.global_steps)
        return metrics

    # ------------------------------------------------------------------ loop
    def fit(self) -> dict:
        """Train to the last step; SIGTERM or Ctrl-C ends the run at the next safe point."""
        with StopSignals(defer=True, save_freq=self.config.trainer.save_freq) as self.stop:
            return self._fit()

    def _stop_if_requested(self, progress) -> None:
        """A safe point: step `global_steps` is finished, logged and checkpointed when due, and
        the next batch is not drawn yet. After SIGTERM or Ctrl-C, save this step (when
        trainer.save_freq > 0) and end the run with RunStopped, so a resumed run continues
        exactly as after a normal save."""
        if not self.stop.requested:
            return
        progress.close()
        checkpoint = save_on_stop(self)
        self.tracker.finish()
        raise RunStopped(
            self.stop.signum, self.global_steps, self.total_training_steps, checkpoint, self.config.trainer.save_freq
        )

    def _fit(self) -> dict:
        cfg = self.config
        self.tracker = Tracking(
            project_name=cfg.trainer.project_name,
            experiment_name=cfg.trainer.experiment_name,
            default_backend=list(cfg.trainer.logger),
            config=dataclasses.asdict(cfg),
            local_dir=cfg.trainer.default_local_dir,
        )
        self.val_logger = ValidationGenerationsLogger(local_dir=cfg.trainer.default_local_dir)
        load_checkpoint(self)  # trainer.resume_mode: sets global_steps and the data position
        mark_training_started()  # failures from here on exit with status 1 (hybrid/errors.py)
        self.update_rollout_weights({})  # the engine starts with placeholder weights
        if self.global_steps >= self.total_training_steps:
            print(
                f"hybrid: resumed at step {self.global_steps} of {self.total_training_steps}; nothing left to train",
                flush=True,
            )
            self.tracker.finish()
            return {"val_before": {}, "val_after": {}, "steps": self.global_steps}
        first_val = last_val = {}
        if cfg.trainer.val_before_train and self.val_dataloader is not None:
            first_val = last_val = self.validate()
            self.tracker.log(first_val, step=self.global_steps)
            if cfg.trainer.val_only:
                return {"val_before": first_val}
        progress = tqdm(
            total=self.total_training_steps, initial=self.global_steps, desc="training", unit="step", dynamic_ncols=True
        )
        self._stop_if_requested(progress)
        self.global_steps += 1
        done = False
        for _epoch in range(cfg.trainer.total_epochs if not cfg.trainer.total_training_steps else 10**9):
            batch_iter = iter(self.train_dataloader)
            steps_at_epoch_start = self.global_steps
            for batch_dict in batch_iter:
                metrics: dict[str, float] = {}
                timing: dict[str, float] = {}
                workers = (self.actor_rollout_wg, self.critic_wg)
                with timed("step", timing), profiled_step(cfg.global_profiler, self.global_steps, workers):
                    batch = DataProto.from_single_dict(batch_dict)
                    batch = self.train_step(batch, _dict_iter(batch_iter), metrics, timing)
                if batch is None:
                    continue
                metrics.update(self._reward_metrics)
                self._reward_metrics = {}
                metrics.update(compute_data_metrics(batch, use_critic=self.use_critic))
                metrics.update(compute_timing_metrics(batch, timing))
                metrics.update(compute_throughput_metrics(batch, timing, self.world_size))
                last_step = self.global_steps >= self.total_training_steps
                test_freq = cfg.trainer.test_freq
                # A stopping run skips validation: a preempted job has seconds, not minutes.
                val_due = (
                    test_freq > 0 and (self.global_steps % test_freq == 0 or last_step) and not self.stop.requested
                )
                if self.val_dataloader is not None and val_due:
                    with timed("testing", timing):
                        last_val = self.validate()
                    metrics.update(last_val)
                    metrics["timing_s/testing"] = timing["testing"]
                self.log_step(metrics)
                progress.update(1)
                if last_step:
                    done = True
                    break
                self._stop_if_requested(progress)
                self.global_steps += 1
            if done:
                break
            if self.global_steps == steps_at_epoch_start:
                # Only dynamic sampling can skip every batch; another epoch would do the same.
                raise RuntimeError(
                    "a whole epoch of training data gave no batch to train on: algorithm.filter_groups dropped "
                    f"every group (no variation in {self.config.algorithm.filter_groups.metric!r}); check the "
                    "reward function and the data, or disable algorithm.filter_groups"
                )
        progress.close()
        self.tracker.finish()
        return {"val_before": first_val, "val_after": last_val, "steps": self.global_steps}

    def log_step(self, metrics: dict) -> None:
        """The step's console line, then its checkpoint when due (`after_step`, which prints
        its own lines), then the whole record, save time and memory included, to the other
        backends and the run's history."""
        self.tracker.log(metrics, step=self.global_steps, backends=["console"])
        self.after_step(metrics)
        # Measured after validation and the checkpoint: the step's whole footprint.
        metrics.update(compute_memory_metrics(process_stats(), self.actor_rollout_wg.memory_stats()))
        others = [name for name in self.tracker.loggers if name != "console"]
        self.tracker.log(metrics, step=self.global_steps, backends=others)
        self.history.append({"step": self.global_steps, **metrics})

    def after_step(self, metrics: dict) -> None:
        """Checkpoint every trainer.save_freq steps and at the last step (hybrid.checkpointing)."""
        if should_save(self):
            metrics["timing_s/save_checkpoint"] = save_checkpoint(self)


def _subsets(batch: DataProto) -> list:
    """Each row's question type (`extra_info.subset`, as the arithmetic task writes), or None."""
    infos = batch.non_tensor_batch.get("extra_info")
    if infos is None:
        return [None] * len(batch)
    return [info.get("subset") if isinstance(info, dict) else None for info in infos]


def numeric_columns(extra_info: dict, rows: int) -> dict[str, list[float]]:
    """The per-sample numeric columns of a reward manager's extra info (one value per row)."""
    columns = {}
    for key, values in extra_info.items():
        values = list(values) if isinstance(values, (list, tuple, np.ndarray)) else None
        if values is None or len(values) != rows:
            continue
        if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in values):
            columns[key] = [float(v) for v in values]
    return columns


def _dict_iter(batch_iter):
    for batch_dict in batch_iter:
        yield DataProto.from_single_dict(batch_dict)


def _chain(first: DataProto, rest):
    yield first
    yield from rest


def build_dataloaders(config, tokenizer):
    from hybrid.data import collate_fn, create_dataloader, create_rl_dataset, create_rl_sampler

    data = config.data
    if config.actor_rollout_ref.rollout.multi_turn.enable:
        # The multi-turn loop starts each trajectory from the row's chat messages (raw_prompt).
        data = dataclasses.replace(as_typed(config).data, return_raw_chat=True)
    train_ds = create_rl_dataset(data.train_files, data, tokenizer)
    train_dl = create_dataloader(
        train_ds,
        data.train_batch_size,
        create_rl_sampler(data, train_ds),
        collate_fn,
        drop_last=True,
        num_workers=data.dataloader_num_workers,
    )
    val_dl = None
    if data.val_files:
        val_ds = create_rl_dataset(data.val_files, data, tokenizer)
        val_dl = create_dataloader(
            val_ds,
            data.val_batch_size or len(val_ds),
            None,
            collate_fn,
            drop_last=False,
            num_workers=data.dataloader_num_workers,
        )
    return train_dl, val_dl


def val_num_examine(config) -> int:
    """How many validation samples per data source the reward manager prints. verl prints
    one (num_examine=1, as its main_ppo sets; not a config key); the console's table of
    validation samples (`trainer.log_val_generations` with the `console` logger) shows that
    same first sample, so then none: each sample once. Training prints none either way."""
    table = config.trainer.log_val_generations > 0 and "console" in config.trainer.logger
    return 0 if table else 1


def run_ppo(config) -> dict:
    """Train `config` (a HybridConfig, or a composed tree that is checked first): everything
    `python -m hybrid.main_ppo` does after the command line."""
    import random

    from transformers import AutoTokenizer

    from hybrid.console import print_header, print_summary
    from hybrid.defaults import resolve_default_assets
    from hybrid.roles import init_ray_if_needed, wants_ray
    from reward.loader import load_reward_manager
    from workers.device import select_device
    from workers.engine_logs import ENGINE_LOG_DIR_ENV

    config = resolve_default_assets(as_typed(config))  # prepares the default model and data when named
    select_device(config.trainer.device)
    seed = config.trainer.seed
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    started = time.time()
    model = config.actor_rollout_ref.model
    tokenizer = AutoTokenizer.from_pretrained(model.tokenizer, trust_remote_code=model.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    # Reward functions load (and fail) before any model does.
    reward_fn = load_reward_manager(config, tokenizer, num_examine=0)
    val_reward_fn = load_reward_manager(config, tokenizer, num_examine=val_num_examine(config))
    train_dl, val_dl = build_dataloaders(config, tokenizer)
    os.makedirs(config.trainer.default_local_dir, exist_ok=True)
    # The engines' own log lines go to files there (workers/engine_logs.py), not the console.
    os.environ[ENGINE_LOG_DIR_ENV] = os.path.abspath(config.trainer.default_local_dir)
    trainer = PPOTrainer(config, tokenizer, train_dl, val_dl, reward_fn, val_reward_fn)
    print_header(config, trainer)
    if wants_ray(config):
        init_ray_if_needed(config)  # before our handlers: ray.init replaces the driver's SIGTERM handler
    try:
        with StopSignals(defer=False):  # while the workers load, a signal ends the run at once
            trainer.init_workers()
        result = trainer.fit()
    finally:
        trainer.shutdown()
    result["minutes"] = (time.time() - started) / 60
    if config.trainer.plot_on_finish and "file" in config.trainer.logger:
        from hybrid.plots import plot_metrics

        run_dir = config.trainer.default_local_dir
        result["plots"] = plot_metrics(os.path.join(run_dir, "metrics.jsonl"), os.path.join(run_dir, "plots"))
    print_summary(config, result)
    return result
