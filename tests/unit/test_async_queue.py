"""The pieces of asynchronous training that need no engine: the prompt stream (positions in the
data loader's order, every prompt trained exactly once across a save and a resume), the group
queue (the staleness bound, enforced at `take`, over random producer and trainer timings),
and the producer's budget (verl's staleness_threshold)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from hybrid.async_producer import GroupProducer
from hybrid.data import collate_fn
from hybrid.data_loader import RLSampler, StatefulDataLoader
from hybrid.group_queue import Group, GroupQueue, check_staleness, staleness
from hybrid.prompt_stream import PromptStream
from protocol.data_proto import DataProto


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": torch.tensor([i, i]), "row": i}


def stream(n: int = 10, batch: int = 4, seed: int = 3, epochs: int | None = None) -> PromptStream:
    loader = StatefulDataLoader(Rows(n), batch, RLSampler(n, shuffle=True, seed=seed), collate_fn=collate_fn)
    return PromptStream(loader, epochs)


def test_the_stream_follows_the_loaders_order_by_position():
    s = stream()
    loader_rows = [int(r) for b in iter(s.loader) for r in b["row"]]  # epoch 0: two whole batches of 4
    taken = [s.take() for _ in range(10)]
    assert [row.non_tensor_batch["row"][0] for _, row in taken[:8]] == loader_rows
    assert [p for p, _ in taken] == [(0, i) for i in range(8)] + [(1, 0), (1, 1)]  # drop_last: 8 rows an epoch
    order_1 = RLSampler(10, shuffle=True, seed=3).indices_for_epoch(1)
    assert [row.non_tensor_batch["row"][0] for _, row in taken[8:]] == order_1[:2]


def test_the_stream_ends_with_its_epochs_but_hands_out_a_dropped_prompt_again():
    """trainer.total_epochs=2 over 8 rows an epoch (drop_last): 16 prompts, then none, as verl's
    fully async rollouter stops after its epochs; a group dropped at the staleness bound after
    that still has its prompt generated again."""
    s = stream(n=10, batch=4, epochs=2)
    taken = [s.take() for _ in range(16)]
    assert [p for p, _ in taken] == [(0, i) for i in range(8)] + [(1, i) for i in range(8)]
    assert s.take() is None and s.exhausted()
    s.trained((1, 7))
    s.again((1, 3))
    assert not s.exhausted()
    position, _ = s.take()
    assert position == (1, 3) and s.take() is None and s.exhausted()
    resumed = stream(n=10, batch=4, epochs=2)
    resumed.load_state_dict(s.state_dict())  # the open prompts come back first, then the end
    again = [resumed.take()[0] for _ in range(15)]
    assert sorted(again) == sorted([(0, i) for i in range(8)] + [(1, i) for i in range(7)])
    assert resumed.take() is None


def test_a_take_returns_short_once_no_group_will_come():
    queue = GroupQueue(bound=1)
    queue.put(Group((0, 0), DataProto.from_dict({"x": torch.zeros(2, 1)}), 0, {}, {}))
    assert len(queue.take(2, current=0, on_stale=lambda g: None, ended=lambda: True)) == 1
    assert queue.take(2, current=0, on_stale=lambda g: None, ended=lambda: True) == []


def test_every_prompt_is_trained_exactly_once_across_a_kill():
    """Prompts are taken ahead, trained out of order, some dropped and taken again; a save in
    the middle, a kill, a resume from the save: over both runs each position up to the end is
    trained once, whatever was open (generating, queued) at the save included."""
    rng = random.Random(0)
    for trial in range(50):
        s = stream(n=12, batch=4)
        trained: list = []
        open_now: list = []
        for _ in range(rng.randint(5, 20)):
            position, _ = s.take()
            open_now.append(position)
            if len(open_now) > 3 and rng.random() < 0.7:
                done = open_now.pop(rng.randrange(len(open_now)))
                if rng.random() < 0.2:
                    s.again(done)  # dropped stale: a later take hands it out again
                else:
                    s.trained(done)
                    trained.append(done)
        saved = s.state_dict()
        for _ in range(rng.randint(0, 5)):  # work after the save is lost with the kill
            s.take()
        resumed = stream(n=12, batch=4)
        resumed.load_state_dict(saved)
        target = min(saved["offset"] + 6, 12)
        while True:
            position, _ = resumed.take()
            resumed.trained(position)
            trained.append(position)
            if not resumed.open and not resumed.redo and resumed.offset >= target:
                break
        epoch0 = [p for p in trained if p[0] == 0]
        assert sorted(epoch0) == sorted(set(epoch0)), trial  # none twice
        assert set(epoch0) == {(0, i) for i in range(max(o for _, o in epoch0) + 1)}, trial  # none lost


def _group(position, version) -> Group:
    batch = DataProto.from_dict(
        tensors={"x": torch.zeros(2, 1)}, non_tensors={"uid": np.array(["u", "u"], dtype=object)}
    )
    return Group(position, batch, version)


def test_no_group_past_the_bound_is_ever_trained_over_random_timings():
    """A simulated run: the producer starts groups on the engines' current version within the
    budget; they finish in random order and after random delays; the trainer takes a step's
    worth, trains, and every `sync` steps the engines get new weights. Whatever the timings,
    every group trained is at most `bound` versions stale, and stale ones are regenerated."""
    rng = random.Random(1)
    for trial in range(200):
        _simulate(rng, trial)


def _simulate(rng: random.Random, trial: int) -> None:
    if True:
        bound, per_step, sync = rng.randint(0, 3), rng.randint(1, 4), rng.randint(1, 3)
        queue = GroupQueue(bound, every=sync)
        threshold = rng.choice([0.0, 0.5, 1.0, 2.5])
        budget = GroupProducer(None, None, None, queue, per_step * sync, threshold, cap=10**6)
        in_flight: list = []  # (finish tick, position, version)
        next_position, engine_version, tick = 0, 0, 0
        redo: list = []
        trained = []
        for step in range(1, 12):
            taken: list = []
            while len(taken) < per_step:
                tick += 1
                while budget.started < budget.allowed():  # the submitter fills the budget
                    position = redo.pop(0) if redo else next_position
                    next_position += 0 if position < next_position else 1
                    in_flight.append((tick + rng.randint(0, 6), position, engine_version))
                    budget.started += 1
                for item in [i for i in in_flight if i[0] <= tick]:
                    in_flight.remove(item)
                    queue.put(_group(item[1], item[2]))
                taken += queue.take(
                    per_step - len(taken),
                    engine_version,
                    on_stale=lambda g, redo=redo, budget=budget: (redo.append(g.position), budget.discard()),
                    wait=False,  # one thread plays both sides here
                )
            assert all(staleness(g.version, engine_version, sync) <= bound for g in taken), trial
            trained += [g.position for g in taken]
            if step % sync == 0:
                engine_version = step
                budget.new_window(step // sync)
        assert len(trained) == len(set(trained)), trial


def test_the_budget_is_verls_staleness_threshold():
    queue = GroupQueue(1)
    budget = GroupProducer(None, None, None, queue, window_groups=8, threshold=0.5, cap=100)
    assert budget.allowed() == 12  # window 0's 8 groups and half a window ahead
    budget.new_window(2)
    assert budget.allowed() == 28
    budget.discard(3)  # dropped groups give their budget back
    assert budget.allowed() == 31
    synchronous = GroupProducer(None, None, None, queue, window_groups=8, threshold=0.0, cap=100)
    assert synchronous.allowed() == 8  # nothing ahead of the weights: synchronous training


def test_a_schedule_that_overshoots_the_bound_is_a_loud_error():
    assert list(check_staleness([4, 3, 4], current=4, bound=1)) == [0, 1, 0]
    assert list(check_staleness([0, 4, 8], current=8, bound=2, every=4)) == [2, 1, 0]  # pushes, not steps
    with pytest.raises(RuntimeError, match=r"data 2 weight versions old, past the staleness bound of 1"):
        check_staleness([2, 4], current=4, bound=1)
