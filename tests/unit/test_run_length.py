"""How long a run is (hybrid/run_length.py run_steps, as verl's fit): the console line for a run the
epochs end before trainer.total_training_steps, and the epoch the data loader's next batch comes
from, which bounds the loop on a resumed run. The trainer's run steps themselves are checked in
test_dialects_skyrl_off_policy.py; a run stopping at the epoch end in
tests/integration/test_epoch_end.py. Nothing here loads a model."""

from __future__ import annotations

from types import SimpleNamespace

from hybrid.run_length import epochs_ran_out, run_steps
from hybrid.trainer import _next_epoch


def _trainer(total, epochs):
    return SimpleNamespace(total_training_steps=total, total_epochs=epochs)


def test_the_console_says_when_the_epochs_end_the_run_first():
    trainer = _trainer(100, 2)
    assert epochs_ran_out(trainer, run_steps(trainer, lambda: 8)) == (
        "hybrid: the run ends with its epochs at step 16, before trainer.total_training_steps=100: "
        "trainer.total_epochs=2 x 8 steps per epoch (as verl; the learning-rate schedules still span 100 steps); "
        "raise trainer.total_epochs to train longer"
    )
    capped = _trainer(None, 1)  # SkyRL: epochs with a larger max_training_steps end at the epoch, silently
    assert epochs_ran_out(capped, run_steps(capped, lambda: 8, cap=20)) is None
    both = _trainer(100, 1)
    assert "before trainer.max_training_steps=20:" in epochs_ran_out(both, run_steps(both, lambda: 8, cap=20))
    default_job = _trainer(30, 1)  # 2000 rows / 8: 250 steps an epoch
    assert epochs_ran_out(default_job, run_steps(default_job, lambda: 250)) is None


def test_next_epoch_follows_the_loaders_position():
    from hybrid.data_loader import RLSampler, StatefulDataLoader

    sampler = RLSampler(8, shuffle=False, seed=1)
    loader = StatefulDataLoader(list(range(8)), batch_size=4, sampler=sampler, collate_fn=list)
    assert _next_epoch(loader) == 0
    batches = iter(loader)
    next(batches)
    assert _next_epoch(loader) == 0  # mid-epoch
    next(batches)
    # The epoch's last batch drawn, the iterator not yet exhausted (a checkpoint at the epoch's
    # last step records this position): the next batch is the next epoch's.
    assert (loader.epoch, loader.batches_consumed, _next_epoch(loader)) == (0, 2, 1)
    assert next(batches, None) is None
    assert (loader.epoch, loader.batches_consumed, _next_epoch(loader)) == (1, 0, 1)
