"""The training prompts one at a time, for asynchronous training: each with its position in the
data loader's order (epoch, offset), so that a checkpoint can say exactly which prompts are
trained and which are not.

The synchronous trainer draws whole batches and its checkpoint records how many were drawn.
Asynchronous training draws ahead: prompts are generating, queued, or dropped for being too
stale when a checkpoint is written. The stream keeps the next position and the positions that
were handed out and not yet trained (`open`); `trained` closes one, `again` hands one out anew
(a group dropped at the staleness bound). Its state holds the next position and every open
one, so a resumed run generates the open prompts first, then goes on: every prompt is trained
exactly once across a crash or SIGTERM, none lost, none twice.

Positions follow the data loader (hybrid/data_loader.py StatefulDataLoader: its sampler recomputes any
epoch's order from the seed, and with drop_last an epoch is its whole batches), so the order
is the synchronous trainer's.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from protocol.data_proto import DataProto

Position = tuple[int, int]  # (epoch, offset in that epoch's order)


class PromptStream:
    def __init__(self, dataloader, total_epochs: int | None = None):
        self.loader = dataloader
        # trainer.total_epochs: the stream ends after that many passes, as verl's fully async
        # rollouter stops feeding after its epochs (None: it never ends).
        self.total_epochs = total_epochs
        self.epoch = int(dataloader.epoch)
        self.offset = int(dataloader.batches_consumed) * dataloader.batch_size
        self.open: set[Position] = set()  # handed out, not trained yet
        self.redo: collections.deque[Position] = collections.deque()  # to hand out again first
        # The producer's thread takes while the trainer's closes, reopens and saves.
        self._lock = threading.RLock()

    @property
    def epoch_rows(self) -> int:
        """Rows per epoch the synchronous trainer draws (whole batches with drop_last)."""
        return len(self.loader) * self.loader.batch_size if self.loader.drop_last else len(self.loader.dataset)

    def take(self) -> tuple[Position, DataProto] | None:
        """The next prompt: one to generate again first, else the next in order; None once the
        last epoch's prompts are all handed out and none waits to be generated again."""
        with self._lock:
            position = self._next_position()
        return None if position is None else (position, self.row(position))

    def exhausted(self) -> bool:
        """Nothing left to hand out: every epoch's prompt handed out, none to generate again."""
        with self._lock:
            return not self.redo and self._past_the_end()

    def _past_the_end(self) -> bool:
        last_epoch = self.epoch + (1 if self.offset >= self.epoch_rows else 0)
        return self.total_epochs is not None and last_epoch >= self.total_epochs

    def _next_position(self) -> Position | None:
        if self.redo:
            position = self.redo.popleft()
        elif self._past_the_end():
            return None
        else:
            if self.offset >= self.epoch_rows:
                self.epoch, self.offset = self.epoch + 1, 0
            position = (self.epoch, self.offset)
            self.offset += 1
        self.open.add(position)
        return position

    def row(self, position: Position) -> DataProto:
        """The prompt at `position`, collated as the data loader collates a batch of one."""
        epoch, offset = position
        index = self.loader.sampler.indices_for_epoch(epoch)[offset]
        return DataProto.from_single_dict(self.loader.collate_fn([self.loader.dataset[index]]))

    def trained(self, position: Position) -> None:
        with self._lock:
            self.open.discard(position)

    def again(self, position: Position) -> None:
        """Generate this prompt anew (its group was dropped): it stays open."""
        with self._lock:
            if position in self.open and position not in self.redo:
                self.redo.append(position)

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"epoch": self.epoch, "offset": self.offset, "open": sorted(self.open)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
            # Whatever was generating or queued at the save was not trained: generate it first.
            self.open = {(int(e), int(o)) for e, o in state["open"]}
            self.redo = collections.deque(sorted(self.open))


__all__ = ["Position", "PromptStream"]
