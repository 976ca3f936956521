"""The resumable data loader of prompt data: RLSampler (any epoch's order recomputed from the
seed) and StatefulDataLoader (batches over epochs with `state_dict()`/`load_state_dict()`).

The loader's state (epoch, seed, batches consumed) goes into checkpoints; a loader restored
from it yields the same next batches as the one that was saved.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from hybrid.data import DataError, collate_fn


class RLSampler(Sampler):
    """Indices per epoch: a permutation seeded by (seed, epoch), or 0..n-1 in order.

    Any epoch's order can be recomputed from the seed, which is what makes the loader's
    state small.
    """

    def __init__(self, data_len: int, shuffle: bool = True, seed: int = 1):
        self.data_len = int(data_len)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0

    def indices_for_epoch(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.data_len))
        return np.random.default_rng([self.seed, int(epoch)]).permutation(self.data_len).tolist()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices_for_epoch(self.epoch))

    def __len__(self) -> int:
        return self.data_len


# verl seeds its RandomSampler's torch.Generator only when data.seed is set; an unseeded
# generator starts from torch's default seed, so a null seed shuffles the same way each run.
UNSEEDED = torch.Generator().initial_seed()


def shuffle_seed(seed: int | None) -> int:
    """The shuffle's seed for `data.seed` (null: torch's default generator seed, as in verl)."""
    return UNSEEDED if seed is None else int(seed)


def create_rl_sampler(data_config, dataset) -> RLSampler:
    return RLSampler(len(dataset), shuffle=data_config.shuffle, seed=shuffle_seed(data_config.seed))


class StatefulDataLoader:
    """Batches over epochs with `state_dict()`/`load_state_dict()`.

    Iterating continues from the current position (epoch, batches consumed), and each
    finished pass moves to the next epoch. A torch DataLoader does the loading underneath.
    """

    def __init__(
        self,
        dataset,
        batch_size: int,
        sampler: RLSampler,
        collate_fn=collate_fn,
        drop_last: bool = True,
        num_workers: int = 0,
    ):
        if not hasattr(sampler, "indices_for_epoch"):
            raise TypeError(
                f"the sampler must recompute any epoch's order (an RLSampler), got {type(sampler).__name__}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and len(dataset) < batch_size:
            raise DataError(
                f"the dataset has {len(dataset)} rows, fewer than one batch of {batch_size}; lower the batch size "
                f"(data.train_batch_size) or add data"
            )
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.sampler = sampler
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.num_workers = int(num_workers)
        self.epoch = 0
        self.batches_consumed = 0
        self._iterator_id = 0

    def __len__(self) -> int:
        n = len(self.sampler)  # the rows it draws from (all of them, or the quota domains': hybrid/domains.py)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self):
        self._iterator_id += 1
        return self._iterate(self._iterator_id)

    def _iterate(self, iterator_id: int):
        if self.batches_consumed >= len(self):
            self.epoch, self.batches_consumed = self.epoch + 1, 0
        self.sampler.set_epoch(self.epoch)
        indices = self.sampler.indices_for_epoch(self.epoch)[: len(self) * self.batch_size]
        indices = indices[self.batches_consumed * self.batch_size :]
        loader = DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=indices,
            collate_fn=self.collate_fn,
            drop_last=self.drop_last,
            num_workers=self.num_workers,
            # Its own generator (seeded by seed and epoch): without one, every new iterator
            # draws from the global torch RNG, so a resumed run (whose iterator is created
            # at a different moment) would shift every later random draw in this process.
            generator=torch.Generator().manual_seed(self.sampler.seed * 100003 + self.epoch),
        )
        for batch in loader:
            # An older iterator resumed after a newer one started must not move the state.
            if iterator_id != self._iterator_id:
                return
            self.batches_consumed += 1
            yield batch
        if iterator_id == self._iterator_id:
            self.epoch, self.batches_consumed = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "batches_consumed": self.batches_consumed,
            "seed": self.sampler.seed,
            "shuffle": self.sampler.shuffle,
            "batch_size": self.batch_size,
            "dataset_len": len(self.dataset),
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict) -> None:
        for key, current in (("dataset_len", len(self.dataset)), ("batch_size", self.batch_size)):
            if state[key] != current:
                raise DataError(
                    f"the saved data loader state has {key}={state[key]}, this loader has {current}: the saved "
                    f"position does not apply; resume with the same data and batch size, or start fresh "
                    f"(trainer.resume_mode=disable)"
                )
        self.sampler.seed = int(state["seed"])
        self.sampler.shuffle = bool(state["shuffle"])
        self.epoch = int(state["epoch"])
        self.batches_consumed = int(state["batches_consumed"])
        self._iterator_id += 1  # iterators made before the load stop moving the state


def create_dataloader(
    dataset, batch_size: int, sampler=None, collate_fn=collate_fn, drop_last: bool = True, num_workers: int = 0
) -> StatefulDataLoader:
    if sampler is None:
        sampler = RLSampler(len(dataset), shuffle=False)
    return StatefulDataLoader(
        dataset, batch_size, sampler, collate_fn=collate_fn, drop_last=drop_last, num_workers=num_workers
    )
