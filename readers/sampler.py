"""Which indices each batch holds: a seeded per-epoch shuffle, split over distributed ranks, resumable.

``EpochBatchSampler`` is a batch sampler for the map-style readers (any ``Dataset`` with a length):

- the order of an epoch is ``torch.randperm`` seeded by ``(seed, epoch)``: the same on every rank
  and in every run, different in every epoch;
- with ``world_size`` ranks, rank ``r`` takes positions ``r, r + world_size, ...`` of that order,
  so the ranks are disjoint and together see every sample exactly once per epoch;
- every rank yields the same number of batches (DDP hangs when one rank runs out first): sizes are
  ``batch_size`` except at the end of the epoch, where a rank with one sample fewer than another
  spreads its samples so that its batch count still matches (no sample repeated, none dropped).
  ``drop_last=True`` instead drops the tail so that every batch is full, on every rank;
- ``state_dict()`` / ``load_state_dict()`` record the epoch and how many batches were consumed, and
  the next iteration starts at the first batch not consumed, in the same order as an uninterrupted
  run.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
from torch.utils.data import Sampler


def distributed_rank() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised ``torch.distributed`` process group, else ``(0, 1)``."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class EpochBatchSampler(Sampler[list[int]]):
    """Batches of indices into a dataset of ``size`` samples for one rank (see the module docstring)."""

    def __init__(
        self,
        size: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
        if size < world_size:
            raise ValueError(f"{size} samples cannot be split over {world_size} ranks")
        self.size, self.batch_size, self.shuffle, self.seed = int(size), int(batch_size), bool(shuffle), int(seed)
        self.rank, self.world_size, self.drop_last = int(rank), int(world_size), bool(drop_last)
        self.epoch = 0
        self.start = 0  # batches of this epoch to skip (set when resuming)

    def set_epoch(self, epoch: int) -> None:
        """Select the order of epoch ``epoch``; call before iterating each epoch."""
        if int(epoch) != self.epoch:
            self.start = 0
        self.epoch = int(epoch)

    def order(self, epoch: int) -> list[int]:
        """Every index of the dataset in epoch ``epoch``'s order (all ranks)."""
        if not self.shuffle:
            return list(range(self.size))
        g = torch.Generator()
        g.manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of epoch ``epoch``, in order."""
        mine = self.order(epoch)[self.rank::self.world_size]
        b = self.batch_size
        if self.drop_last:
            full = self.size // self.world_size // b  # the smallest rank's count of full batches
            return [mine[i * b:(i + 1) * b] for i in range(full)]
        count = len(self)
        sizes = [b] * (count - 1) + [len(mine) - b * (count - 1)]
        # A rank with fewer samples may be short of one for its last batch: take them from the end
        # of the batches before it, one each, so every batch keeps at least one sample.
        k = count - 2
        while sizes[-1] < 1 and k >= 0:
            if sizes[k] > 1:
                sizes[k] -= 1
                sizes[-1] += 1
            k -= 1
        if sizes[-1] < 1:  # batch_size 1 and uneven ranks
            raise ValueError(f"rank {self.rank} has {len(mine)} samples for {count} batches of {b}: "
                             "use drop_last=True, or a batch size above 1")
        out, pos = [], 0
        for n in sizes:
            out.append(mine[pos:pos + n])
            pos += n
        return out

    def __len__(self) -> int:
        per_rank = self.size // self.world_size
        if self.drop_last:
            return per_rank // self.batch_size
        return math.ceil(math.ceil(self.size / self.world_size) / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        start, self.start = self.start, 0
        yield from self.batches(self.epoch)[start:]

    def state_dict(self, consumed: int = 0) -> dict:
        """The position after ``consumed`` batches of the current epoch (see ``load_state_dict``)."""
        epoch = self.epoch
        if consumed >= len(self):
            epoch, consumed = epoch + 1, 0
        return {"epoch": epoch, "batches": int(consumed), "seed": self.seed, "size": self.size,
                "world_size": self.world_size, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        """Continue at batch ``state["batches"]`` of epoch ``state["epoch"]`` on the next iteration.

        The seed, dataset size, world size and batch size must be those the state was taken with:
        otherwise the remaining batches would not be the ones an uninterrupted run yields.
        """
        for key in ("seed", "size", "world_size", "batch_size"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"cannot resume: the state was saved with {key}={state[key]}, "
                                 f"this sampler has {key}={getattr(self, key)}")
        self.epoch = int(state["epoch"])
        self.start = int(state["batches"])


__all__ = ["EpochBatchSampler", "distributed_rank"]
