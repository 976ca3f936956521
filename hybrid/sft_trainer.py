"""Supervised fine-tuning: `python -m hybrid.sft_trainer key=value ...` (verl's SFT keys).

The driver of an SFT run: the checked config (hybrid/config/sft_schema.py), the data
(hybrid/sft_data.py: single- or multi-turn rows, tokenized and checked before the model
loads), the loop, validation loss, metrics and checkpoints. The model lives in
workers/sft.py, which is the PPO actor's FSDP2 machinery with a cross-entropy loss.

A step takes `data.train_batch_size` samples (shuffled with `trainer.seed`, a new order per
epoch; the last partial batch of an epoch is dropped, as verl does) and makes one optimizer
step over its micro-batches. Validation loss (token mean over the whole validation set) is
computed every `trainer.test_freq` steps and at the last. Checkpoints are the PPO trainer's
(hybrid/checkpointing.py): `global_step_N/actor` holds the model's shards, `data.pt` the step
and the data position; resume is `trainer.resume_mode` auto / resume_path / disable, and
SIGTERM or Ctrl-C saves the last finished step before exiting. Metrics go to the loggers of
`trainer.logger` (`file`: <default_local_dir>/metrics.jsonl).

Several ranks: `torchrun --nproc_per_node=N -m hybrid.sft_trainer ...`, verl's launch. Every
rank runs this driver on the same data order and trains its share of each batch
(workers/sft.py); rank 0 alone logs, shows the progress bar and creates, publishes and prunes
the checkpoint folders, into which every rank writes its own shards. A stop signal is acted
on when any rank has received one, by all ranks at the same step.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from hybrid.checkpoint_folders import say
from hybrid.run_length import epochs_ran_out, run_steps


def run_sft(config) -> dict:
    """Train with the typed SFT config; returns a summary (losses, steps, tokens/s)."""
    from hybrid.defaults import resolve_default_assets
    from workers.device import select_device

    select_device(config.trainer.device)
    config = resolve_default_assets(config)
    return SFTTrainer(config).fit()


def is_lead() -> bool:
    """Rank 0 of the ranks torchrun started (or the only process): it logs and reports."""
    return int(os.environ.get("RANK", "0")) == 0


class SFTTrainer:
    def __init__(self, config):
        from hybrid.data_loader import RLSampler, StatefulDataLoader
        from hybrid.sft_data import SFTDataset, make_collate
        from workers.model_loading import load_tokenizer

        self.config = config
        self.lead = is_lead()  # logs, shows progress and writes the run's folders
        data = config.data
        tokenizer = load_tokenizer(config.model.partial_pretrain, config.model.trust_remote_code)
        self.collate = make_collate(tokenizer.pad_token_id)
        self.train_set = SFTDataset(data.train_files, tokenizer, data, data.train_max_samples)
        self.val_set = SFTDataset(data.val_files, tokenizer, data, data.val_max_samples) if data.val_files else None
        sampler = RLSampler(len(self.train_set), shuffle=True, seed=config.trainer.seed)
        self.loader = StatefulDataLoader(self.train_set, data.train_batch_size, sampler, collate_fn=self.collate)
        # As verl's SFT trainer: total_epochs passes, ended sooner by total_training_steps, which
        # the learning-rate schedule spans even where the epochs end first.
        self.length = run_steps(config.trainer, lambda: len(self.loader))
        self.total_steps = self.length.steps
        self.say(
            f"sft: {len(self.train_set)} train samples ({self.train_set.token_count()} tokens), "
            f"{len(self.val_set) if self.val_set else 0} validation; {len(self.loader)} steps per epoch, "
            f"{self.total_steps} steps"
        )
        note = epochs_ran_out(config.trainer, self.length)
        if note is not None:
            self.say(note)
        from workers.sft import SFTWorker

        self.worker = SFTWorker(config, self.length.schedule_steps)
        self.worker.init_model()

    def say(self, line: str) -> None:
        if self.lead:
            say(line)

    def validate(self) -> float | None:
        """Token-mean loss over the whole validation set. Each data-parallel rank takes a
        contiguous share; the last shares are topped up with a row that has no target token,
        so every rank runs the same passes (FSDP2 gathers inside each forward)."""
        if self.val_set is None:
            return None
        n, ranks = len(self.val_set), self.worker.dp_size
        share = -(-n // ranks)
        blank = {"input_ids": self.val_set[0]["input_ids"], "loss_mask": [0] * len(self.val_set[0]["input_ids"])}
        mine = range(self.worker.dp_rank * share, (self.worker.dp_rank + 1) * share)
        items = [self.val_set[i] if i < n else blank for i in mine]
        size = self.config.data.micro_batch * 8  # micro-batches of micro_batch rows inside
        total = count = 0.0
        for start in range(0, len(items), size):
            batch_total, batch_count = self.worker.loss_sums(self.collate(items[start : start + size]))
            total, count = total + batch_total, count + batch_count
        return total / max(count, 1.0)

    def _stop_agreed(self) -> bool:
        """Whether any rank was asked to stop (ranks can receive a signal steps apart)."""
        from workers.optimizer_step import all_reduce_max

        return all_reduce_max(float(self.stop.requested)) > 0

    def fit(self) -> dict:
        import dataclasses

        from hybrid.checkpointing import RunCheckpoints
        from hybrid.errors import mark_training_started
        from hybrid.interrupts import StopSignals
        from hybrid.tracking import Tracking
        from hybrid.trainer_state import TrainerState

        cfg = self.config.trainer
        config = dataclasses.asdict(self.config)
        loggers = list(cfg.logger) if self.lead else []
        self.tracker = Tracking(cfg.project_name, cfg.experiment_name, loggers, config, cfg.default_local_dir)
        self.checkpoints = RunCheckpoints(self.config.checkpoint_view, use_critic=False, lead=self.lead)
        self.state = TrainerState(self.loader)
        self.groups = {"actor_rollout": self.worker}
        start = self.checkpoints.resume(self.state, self.groups)
        self.tracker.continue_from(start)
        mark_training_started()
        with StopSignals(defer=True, save_on_stop=cfg.save_on_stop) as self.stop:
            return self._loop(start)

    def _loop(self, start: int) -> dict:
        from tqdm import tqdm

        from hybrid.errors import RunStopped

        cfg = self.config.trainer
        summary: dict = {"first_loss": None, "last_loss": None, "val_loss": [], "tokens_per_s": []}
        progress = tqdm(total=self.total_steps, initial=start, desc="sft", dynamic_ncols=True, disable=not self.lead)
        batches = iter(self.loader)
        for step in range(start + 1, self.total_steps + 1):
            try:
                batch = next(batches)
            except StopIteration:  # an epoch ended: the loader moves on to the next one
                batches = iter(self.loader)
                batch = next(batches)
            self.state.global_step = step
            metrics = self._train_step(batch)
            last = step == self.total_steps
            stopping = self._stop_agreed()
            if cfg.test_freq > 0 and (step % cfg.test_freq == 0 or last) and not stopping:
                metrics["val/loss"] = self.validate()
                summary["val_loss"].append((step, metrics["val/loss"]))
            self.tracker.log(metrics, step)
            if self.checkpoints.due(step, last):
                self.checkpoints.save(self.state, self.groups, last_step=last)
            if summary["first_loss"] is None:
                summary["first_loss"] = metrics["train/loss"]
            summary["last_loss"] = metrics["train/loss"]
            summary["tokens_per_s"].append(metrics["perf/throughput"])
            progress.set_postfix(loss=f"{metrics['train/loss']:.4f}", refresh=False)
            progress.update(1)
            if stopping:
                progress.close()
                saved = self.checkpoints.save_on_stop(self.state, self.groups)
                self.tracker.finish()
                signum = self.stop.signum if self.stop.requested else signal.SIGTERM  # another rank's
                raise RunStopped(signum, step, self.total_steps, saved, cfg.save_on_stop)
        progress.close()
        self.tracker.finish()
        summary["steps"] = self.total_steps
        return summary

    def _train_step(self, batch) -> dict:
        start = time.perf_counter()
        metrics = self.worker.train_batch(batch)
        seconds = time.perf_counter() - start
        metrics["train/time(s)"] = seconds  # verl's name
        metrics["timing_s/step"] = seconds  # the PPO trainer's, which the console line shows
        metrics["perf/throughput"] = metrics["train/tokens"] / seconds
        return metrics


def main(argv: list[str] | None = None) -> dict | None:
    """The command line: overrides as `key=value` (`+key=value` accepted, as in verl scripts);
    `--cfg job` prints the composed config and exits."""
    from omegaconf import OmegaConf

    from hybrid.config.sft_schema import load_sft_config, typed_sft_config

    argv = list(sys.argv[1:] if argv is None else argv)
    show = "--cfg" in argv
    overrides = [a for a in argv if a not in ("--cfg", "job")]
    cfg = load_sft_config(overrides)
    if show:
        print(OmegaConf.to_yaml(cfg))
        return None
    return run_sft(typed_sft_config(cfg))


def cli() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    from hybrid.errors import exit_on_error
    from hybrid.interrupts import StopSignals

    with exit_on_error(), StopSignals(defer=False):
        summary = main()
        if not is_lead():
            return
        if summary and summary["first_loss"] is None:
            say(f"sft: nothing left to train (resumed at the last of {summary['steps']} steps)")
        elif summary:
            say(
                f"sft: done, {summary['steps']} steps; train loss {summary['first_loss']:.4f} -> "
                f"{summary['last_loss']:.4f}"
                + (f"; validation loss {summary['val_loss'][-1][1]:.4f}" if summary["val_loss"] else "")
            )


if __name__ == "__main__":
    cli()
