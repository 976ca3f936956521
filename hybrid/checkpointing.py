"""A run's checkpoints, on the driver: resume at the start, a save every `trainer.save_freq`
steps and at the last step, a save when the run is stopped, and the merged Hugging Face
folder at the end (`trainer.merge_on_finish`; by default only when `save_freq` > 0, so
`save_freq=-1` writes nothing, as in verl).

A save writes every role's shards (each worker group's `save_checkpoint`), the driver's
`TrainerState` (hybrid/trainer_state.py) and, last, a manifest of every file's size and
checksum into `global_step_N.partial`, then renames it to `global_step_N`
(hybrid/checkpoint_folders.py has the layout, the rules that make a folder complete and the
manifest check resume makes before trusting one); resume loads both back, from the newest
folder that passes the check. A run stopped by SIGTERM or Ctrl-C saves its last finished
step the same way (`save_on_stop`), so resuming from it is the same as resuming from a
scheduled save.

`trainer.hf_save_freq` (SkyRL's hf_save_interval) is a separate cadence: the actor alone as a
Hugging Face folder in `<trainer.hf_export_dir>/global_step_N` (written under a temporary
name, then renamed), with no shards or optimizer, so it is not a checkpoint to resume from.
"""

from __future__ import annotations

import os
import shutil
import time

from hybrid.checkpoint_folders import (
    DATA_FILE,
    PARTIAL_SUFFIX,
    CheckpointError,
    apply_retention,
    publish,
    remove_partial_checkpoints,
    resume_checkpoint,
    say,
    step_dir,
    write_manifest,
    write_tracker,
)
from hybrid.trainer_state import TrainerState


class RunCheckpoints:
    """`groups`: the trainer's worker groups ('actor_rollout', and 'critic' when it trains one).
    `lead=False`: a rank other than 0 of several ranks that each drive themselves (torchrun
    SFT); it saves and loads its own shards, rank 0 alone makes, publishes and prunes the
    folders and reports (its worker's save waits until rank 0 has made the temporary one)."""

    def __init__(self, config, use_critic: bool, lead: bool = True):
        self.config = config
        self.use_critic = use_critic
        self.lead = lead
        # Absolute: Ray workers do not share the driver's working directory.
        self.root = os.path.abspath(str(config.trainer.default_local_dir))
        self.last: tuple[int, str] | None = None  # (step, folder) of the newest checkpoint this run has

    def resume(self, state: TrainerState, groups: dict) -> int:
        """Restore the workers and `state` from the checkpoint `trainer.resume_mode` picks;
        returns its step (0: a fresh start)."""
        import torch

        # Resolved first: a resume_from_path naming a partial folder is reported as partial.
        path = resume_checkpoint(self.config, self.use_critic)
        if self.lead:
            remove_partial_checkpoints(self.root)  # never resumable, whatever the mode
        if path is None:
            if self.config.trainer.resume_mode == "auto" and self.lead:
                say(f"checkpoint: no complete checkpoint under {self.root}; starting from step 0")
            return 0
        start = time.perf_counter()
        groups["actor_rollout"].load_checkpoint(os.path.join(path, "actor"))
        if self.use_critic:
            groups["critic"].load_checkpoint(os.path.join(path, "critic"))
        # data.pt holds only plain values and CPU tensors, written by this driver.
        state.load_state_dict(torch.load(os.path.join(path, DATA_FILE), weights_only=True))
        self.last = (state.global_step, path)
        if self.lead:
            say(f"checkpoint: resumed from {path} at step {state.global_step} in {time.perf_counter() - start:.2f} s")
        return state.global_step

    def due(self, step: int, last_step: bool) -> bool:
        """Every save_freq steps and at the last step, as verl (save_freq <= 0: never); also the
        last step when trainer.merge_on_finish=true asks for a Hugging Face folder, which is made
        from that checkpoint."""
        cfg = self.config.trainer
        if last_step and cfg.merge_on_finish:
            return True
        return cfg.save_freq > 0 and (step % cfg.save_freq == 0 or last_step)

    def hf_export_due(self, step: int, last_step: bool) -> bool:
        """trainer.hf_save_freq: every N steps and at the last step (<= 0: never)."""
        freq = self.config.trainer.hf_save_freq
        return freq > 0 and (step % freq == 0 or last_step)

    def hf_export_root(self) -> str:
        cfg = self.config.trainer
        return os.path.abspath(str(cfg.hf_export_dir or os.path.join(cfg.default_local_dir, "hf_exports")))

    def export_hf(self, step: int, groups: dict) -> float:
        """The actor as a Hugging Face folder in <hf_export_dir>/global_step_N; returns seconds."""
        start = time.perf_counter()
        final = step_dir(self.hf_export_root(), step)
        temp = final + PARTIAL_SUFFIX
        shutil.rmtree(temp, ignore_errors=True)  # left by a crash at this very step
        groups["actor_rollout"].export_hf_model(temp)
        publish(temp, final)
        seconds = time.perf_counter() - start
        say(f"checkpoint: exported the actor as a Hugging Face folder to {final} in {seconds:.2f} s")
        return seconds

    def merges(self) -> bool:
        """trainer.merge_on_finish: true or false as given; null (the default) merges when
        save_freq > 0, where the last step is saved anyway, so save_freq=-1 writes nothing."""
        cfg = self.config.trainer
        return cfg.save_freq > 0 if cfg.merge_on_finish is None else bool(cfg.merge_on_finish)

    def save(self, state: TrainerState, groups: dict, last_step: bool = False) -> float:
        """Save every role's state and `state` into global_step_N; returns seconds taken."""
        import torch

        cfg = self.config.trainer
        start = time.perf_counter()
        step = int(state.global_step)
        final = step_dir(self.root, step)
        temp = final + PARTIAL_SUFFIX
        if self.lead:
            shutil.rmtree(temp, ignore_errors=True)  # left by a crash at this very step
            os.makedirs(temp)
        groups["actor_rollout"].save_checkpoint(
            os.path.join(temp, "actor"), global_step=step, max_ckpt_to_keep=cfg.max_actor_ckpt_to_keep
        )
        if self.use_critic:
            groups["critic"].save_checkpoint(
                os.path.join(temp, "critic"), global_step=step, max_ckpt_to_keep=cfg.max_critic_ckpt_to_keep
            )
        if not self.lead:
            self.last = (step, final)
            return time.perf_counter() - start
        torch.save(state.state_dict(), os.path.join(temp, DATA_FILE))
        write_manifest(temp)  # last: a folder whose files match it was written whole
        publish(temp, final)
        write_tracker(self.root, step)
        self.last = (step, final)
        keep = {"actor": cfg.max_actor_ckpt_to_keep, "critic": cfg.max_critic_ckpt_to_keep}
        apply_retention(self.root, step, keep)
        seconds = time.perf_counter() - start
        say(f"checkpoint: saved {final} in {seconds:.2f} s")
        if last_step and self.merges():
            merge_final_actor(os.path.join(final, "actor"))
        return seconds

    def save_on_stop(self, state: TrainerState, groups: dict) -> str | None:
        """The checkpoint of the last finished step for a run stopped by a signal: saved now,
        whatever trainer.save_freq says (a preempted job keeps its work), unless this run saved
        or resumed from that very step; None with trainer.save_on_stop=false or before the first
        step."""
        step = int(state.global_step)
        if not self.config.trainer.save_on_stop or step <= 0:
            return None
        if self.last is not None and self.last[0] == step:
            return self.last[1]
        self.save(state, groups)
        return step_dir(self.root, step)


def merge_final_actor(actor_dir: str) -> str:
    """trainer.merge_on_finish: the final actor checkpoint as a Hugging Face folder in its own
    `huggingface/` (beside the config and tokenizer already there), written by the merge
    tool's library (hybrid/model_merge.py). A failure there leaves the checkpoint itself
    untouched and is reported as the merge's."""
    from hybrid.errors import InputError
    from hybrid.model_merge import merge

    target = os.path.join(actor_dir, "huggingface")
    start = time.perf_counter()
    try:
        merge(actor_dir, target, progress=False)
    except (InputError, CheckpointError, OSError, ValueError) as err:
        raise CheckpointError(f"trainer.merge_on_finish: merging {actor_dir} into {target} failed: {err}") from err
    say(f"checkpoint: merged the final actor into {target} in {time.perf_counter() - start:.1f} s")
    return target


__all__ = ["RunCheckpoints", "merge_final_actor"]
