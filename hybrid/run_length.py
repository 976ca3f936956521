"""How long a run is, as verl's trainers decide it (the PPO fit loop and the SFT trainer alike):
the steps it trains, the steps its learning-rate schedules span, and the console line for a
run whose epochs end before the steps asked for."""

from __future__ import annotations

from typing import NamedTuple


class RunLength(NamedTuple):
    steps: int  # the steps the run trains
    schedule_steps: int  # the steps the learning-rate schedules span
    steps_per_epoch: int  # one pass over the training data
    cap: int | None = None  # SkyRL's trainer.max_training_steps, when it was given


def run_steps(trainer, steps_per_epoch, cap: int | None = None) -> RunLength:
    """The length of a run, as verl's fit decides it: its loop is over `trainer.total_epochs`
    passes of the data and ends at step `trainer.total_training_steps` if that comes first, so
    an explicit total_training_steps shortens a run, never lengthens it; the learning-rate
    schedules span total_training_steps when given (verl writes it into the optimizers even when
    the epochs end first), else total_epochs x `steps_per_epoch()`. `trainer.max_training_steps`
    (SkyRL's cap, given as `cap`; the SFT trainer has none) caps both: the run and its schedules
    end at the smaller."""
    per_epoch = steps_per_epoch()
    epoch_steps = per_epoch * int(trainer.total_epochs)
    schedule = trainer.total_training_steps or epoch_steps
    if cap:
        schedule = min(schedule, int(cap))
    return RunLength(min(schedule, epoch_steps), schedule, per_epoch, int(cap) if cap else None)


def epochs_ran_out(trainer, length: RunLength) -> str | None:
    """The console line for a run that the epochs end before total_training_steps (or the
    SkyRL cap) would; None otherwise."""
    if length.steps >= length.schedule_steps:
        return None
    cap = length.cap
    asked = (
        f"trainer.max_training_steps={cap}"
        if cap and cap == length.schedule_steps
        else f"trainer.total_training_steps={trainer.total_training_steps}"
    )
    return (
        f"hybrid: the run ends with its epochs at step {length.steps}, before {asked}: "
        f"trainer.total_epochs={trainer.total_epochs} x {length.steps_per_epoch} steps "
        f"per epoch (as verl; the learning-rate schedules still span {length.schedule_steps} steps); "
        f"raise trainer.total_epochs to train longer"
    )
