"""Which indices each batch holds: a seeded per-epoch shuffle, split over distributed ranks, resumable.

``EpochBatchSampler`` is a batch sampler for the map-style readers (any ``Dataset`` with a length):

- the order of an epoch is a seeded random permutation (``readers.loading.permutation``, keyed by
  ``(seed, epoch)``): the same on every rank and in every run, different in every epoch. It is
  evaluated batch by batch as the epoch goes, never built whole, so that an epoch of 10^8 samples
  starts at once and holds no list of them (order version ``ORDER_VERSION``; packer 0.6.0 and
  earlier drew ``torch.randperm``);
- with ``world_size`` ranks, rank ``r`` takes positions ``r, r + world_size, ...`` of that order,
  so the ranks are disjoint and together see every sample exactly once per epoch;
- every rank yields the same number of batches (DDP hangs when one rank runs out first): sizes are
  ``batch_size`` except at the end of the epoch, where a rank with one sample fewer than another
  spreads its samples so that its batch count still matches (no sample repeated, none dropped).
  ``drop_last=True`` instead drops the tail so that every batch is full, on every rank;
- ``state_dict()`` / ``load_state_dict()`` record the epoch and how many batches were consumed, and
  the next iteration starts at the first batch not consumed, in the same order as an uninterrupted
  run.

``LengthBucketSampler`` (``readers.loading.length_sampler``) does the same for variable-length
samples (token ids), but puts samples of similar length in the same batch, so that padding them to
the batch maximum wastes little; ``AspectBucketSampler`` (``readers.loading.bucket_sampler``) puts
images of one aspect-ratio bucket in each batch.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

from readers.loading.permutation import Permutation

ORDER_VERSION = 2
"""Which epoch order ``EpochBatchSampler`` draws: 2, the lazy ``Permutation``; 1 (states that do not say),
``torch.randperm``. A state saved mid-epoch under another version cannot be continued exactly."""

_CHUNK = 16384
"""Positions of the epoch order evaluated at once: enough to make numpy's per-call cost vanish,
few enough that the first batch does not wait for much more of the epoch than it needs."""


def distributed_rank() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised ``torch.distributed`` process group, else ``(0, 1)``."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class EpochBatch(list):
    """A batch of indices (a list) that carries the epoch it belongs to, for the reader that reads
    it in whichever DataLoader worker: its random crops and flips are that epoch's (``readers.augment.crops``)."""

    def __init__(self, indices: Sequence[int], epoch: int) -> None:
        super().__init__(indices)
        self.epoch = int(epoch)

    def __reduce__(self) -> tuple:
        return (EpochBatch, (list(self), self.epoch))


class ChunkOfBatches(list):
    """Consecutive batches of one epoch as one list of indices (``BatchChunks``): ``sizes`` says how
    many each batch takes, in order; ``epoch`` as an ``EpochBatch``'s."""

    def __init__(self, indices: Sequence[int], sizes: Sequence[int], epoch: int) -> None:
        super().__init__(indices)
        self.sizes, self.epoch = tuple(int(s) for s in sizes), int(epoch)

    def __reduce__(self) -> tuple:
        return (ChunkOfBatches, (list(self), self.sizes, self.epoch))


class BatchChunks(Sampler[list[int]]):
    """The batches of ``batches`` (an ``EpochBatchSampler``, which keeps the epoch, the resume point
    and the order), ``per_chunk`` consecutive ones at a time as one ``ChunkOfBatches``: a DataLoader
    worker reads a chunk as one item and sends it as one message, which ``PackedLoader`` hands out
    batch by batch. Small batches then cost the processes' hand-over once a chunk, not once a batch
    (token blocks: ``readers.loading.token_loader``)."""

    def __init__(self, batches: "EpochBatchSampler", per_chunk: int) -> None:
        self.batches, self.per_chunk = batches, max(1, int(per_chunk))

    def __len__(self) -> int:
        return math.ceil(len(self.batches) / self.per_chunk)

    def __iter__(self) -> Iterator[list[int]]:
        indices: list[int] = []
        sizes: list[int] = []
        epoch = self.batches.epoch
        for batch in self.batches:
            indices += batch
            sizes.append(len(batch))
            epoch = batch.epoch
            if len(sizes) == self.per_chunk:
                yield ChunkOfBatches(indices, sizes, epoch)
                indices, sizes = [], []
        if sizes:
            yield ChunkOfBatches(indices, sizes, epoch)


class EpochChoice:
    """What every batch sampler of ``make_loader`` has: the epoch to iterate, the batches of it to skip
    (``start``, after a resume), and whom to tell when someone else calls ``set_epoch``.

    A training framework (Lightning) calls ``set_epoch`` on ``loader.sampler``: ``make_loader``'s
    loader follows that call (``follow``), and sets the epoch it chose itself through ``begin``.
    """

    epoch: int = 0
    start: int = 0  # batches of this epoch to skip (set when resuming)
    _follower: Optional[weakref.WeakMethod] = None

    def set_epoch(self, epoch: int) -> None:
        """Select the order of epoch ``epoch``; call before iterating each epoch."""
        self.begin(int(epoch), 0 if int(epoch) != self.epoch else self.start)
        follower = self._follower() if self._follower is not None else None
        if follower is not None:
            follower(int(epoch))

    def begin(self, epoch: int, start: int) -> None:
        """Iterate epoch ``epoch`` from its batch ``start`` next (no one is told: the caller chose it)."""
        self.epoch, self.start = int(epoch), int(start)

    def __getstate__(self) -> dict:
        """Pickled (or copied) without its follower: a copy follows no loader."""
        state = dict(self.__dict__)
        state.pop("_follower", None)
        return state

    def follow(self, follower: Optional[Callable[[int], None]]) -> None:
        """Call ``follower(epoch)``, a bound method, after each ``set_epoch`` (None: call no one).

        Held weakly: its object (the loader) holds this sampler, and a cycle between them would keep
        a DataLoader's worker processes alive until the garbage collector happens to run.
        """
        self._follower = None if follower is None else weakref.WeakMethod(follower)  # type: ignore[arg-type]


class EpochBatchSampler(EpochChoice, Sampler[list[int]]):
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

    def permutation(self, epoch: int) -> Permutation:
        """The order of epoch ``epoch`` (all ranks): its position ``i`` holds the ``i``-th index drawn."""
        return Permutation(self.size, self.seed * 1_000_003 + epoch)

    def order(self, epoch: int) -> list[int]:
        """Every index of the dataset in epoch ``epoch``'s order (all ranks)."""
        if not self.shuffle:
            return list(range(self.size))
        return self.permutation(epoch).take(0, self.size).tolist()

    def batch_bounds(self) -> np.ndarray:
        """Where this rank's batches start in its share of the order, and where the last one ends
        (``len(self) + 1`` offsets; the same in every epoch)."""
        b = self.batch_size
        mine = (self.size - self.rank + self.world_size - 1) // self.world_size  # positions r, r + world, ...
        if self.drop_last:
            full = self.size // self.world_size // b  # the smallest rank's count of full batches
            return np.arange(full + 1, dtype=np.int64) * b
        count = len(self)
        sizes = np.full(count, b, dtype=np.int64)
        sizes[-1] = mine - b * (count - 1)
        # A rank with fewer samples may be short of one for its last batch: take them from the end
        # of the batches before it, one each, so every batch keeps at least one sample.
        k = count - 2
        while sizes[-1] < 1 and k >= 0:
            if sizes[k] > 1:
                sizes[k] -= 1
                sizes[-1] += 1
            k -= 1
        if sizes[-1] < 1:  # batch_size 1 and uneven ranks
            raise ValueError(
                f"rank {self.rank} has {mine} samples for {count} batches of {b}: "
                "use drop_last=True, or a batch size above 1"
            )
        return np.concatenate(([0], np.cumsum(sizes)))

    def iter_batches(self, epoch: int, start: int = 0) -> Iterator[list[int]]:
        """This rank's batches of epoch ``epoch`` from batch ``start`` on, evaluated a chunk of the
        order at a time (see ``readers.loading.permutation``)."""
        bounds = self.batch_bounds()
        perm = self.permutation(epoch) if self.shuffle else None
        per_chunk = max(1, _CHUNK // self.batch_size)
        for first in range(start, len(bounds) - 1, per_chunk):
            last = min(first + per_chunk, len(bounds) - 1)
            positions = np.arange(bounds[first], bounds[last], dtype=np.int64) * self.world_size + self.rank
            indices = (perm[positions] if perm is not None else positions).tolist()
            base = int(bounds[first])
            for k in range(first, last):
                yield indices[int(bounds[k]) - base : int(bounds[k + 1]) - base]

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of epoch ``epoch``, in order."""
        return list(self.iter_batches(epoch))

    def __len__(self) -> int:
        per_rank = self.size // self.world_size
        if self.drop_last:
            return per_rank // self.batch_size
        return math.ceil(math.ceil(self.size / self.world_size) / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        start, self.start = self.start, 0
        for batch in self.iter_batches(self.epoch, start):
            yield EpochBatch(batch, self.epoch)

    def state_dict(self, consumed: int = 0) -> dict:
        """The position after ``consumed`` batches of the current epoch (see ``load_state_dict``)."""
        epoch = self.epoch
        if consumed >= len(self):
            epoch, consumed = epoch + 1, 0
        return {
            "epoch": epoch,
            "batches": int(consumed),
            "seed": self.seed,
            "size": self.size,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "order": ORDER_VERSION,
        }

    regroups = True
    """Whether a state saved on another number of ranks can continue here (same global batch): true
    for one global order cut into per-rank strides; a sampler that groups samples into batches by
    something else (lengths) says False."""

    def load_state_dict(self, state: dict) -> None:
        """Continue at batch ``state["batches"]`` of epoch ``state["epoch"]`` on the next iteration.

        The seed and dataset size must be those the state was taken with: otherwise the remaining
        batches would not be the ones an uninterrupted run yields. A state saved on another number
        of ranks continues here when the global batch (batch size x ranks) is the same: the rest of
        the epoch is then every sample the saving run had not seen, each once, split over these
        ranks, and the next epochs are those of a run on this many ranks (see ``resumed_batches``).
        """
        for key in ("seed", "size"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"cannot resume: the state was saved with {key}={state[key]}, "
                    f"this sampler has {key}={getattr(self, key)}"
                )
        if self.shuffle and state.get("order", 1) != ORDER_VERSION and int(state["batches"]) > 0:
            raise ValueError(
                f"cannot resume in the middle of epoch {state['epoch']}: the state was saved by a packer "
                "that shuffled epochs in another order (packer 0.6.0 or earlier), so the rest of the "
                "epoch would repeat some samples and miss others. Resume at the next epoch: set "
                "state['epoch'] += 1 and state['batches'] = 0"
            )
        self.epoch = int(state["epoch"])
        self.start = self.resumed_batches(state)

    def resumed_batches(self, state: dict) -> int:
        """The batches of ``state``'s epoch this rank skips: the state's own count on the same ranks
        and batch size. From another number of ranks with the same global batch, the same count too:
        rank ``r`` of ``W`` takes positions ``r, r + W, ...`` of the epoch's one order, so ``k``
        full batches on every rank are exactly the first ``k x global batch`` positions, whatever
        ``W``. Refused, with the reason, where that does not hold: another global batch, a state
        taken among the last batches of an epoch whose ranks' batches are not all full, or a sampler
        that does not regroup (``regroups``)."""
        consumed = int(state["batches"])
        world, batch = int(state.get("world_size", self.world_size)), int(state.get("batch_size", self.batch_size))
        if (world, batch) == (self.world_size, self.batch_size):
            return consumed
        saved, here = world * batch, self.world_size * self.batch_size
        if not self.regroups:
            raise ValueError(
                f"cannot resume: the state was saved with world_size={world} and batch_size={batch}, this "
                f"sampler has {self.world_size} and {self.batch_size}; {type(self).__name__} groups the "
                "samples of each rank's batches itself, so only the same ranks and batch size continue its "
                "epoch (or resume at the next epoch: state['epoch'] += 1 and state['batches'] = 0)"
            )
        if saved != here:
            keep = (
                f"keep the global batch (batch_size={saved // self.world_size} here) and the rest of the epoch "
                "continues exactly"
                if saved % self.world_size == 0
                else f"{saved} samples do not split evenly over {self.world_size} ranks: resume on a number of "
                f"ranks that divides {saved}, or at the next epoch (state['epoch'] += 1, state['batches'] = 0)"
            )
            raise ValueError(
                f"cannot resume on {self.world_size} ranks: the state was saved with a global batch of "
                f"{batch} x {world} ranks = {saved} samples, this sampler has {self.batch_size} x "
                f"{self.world_size} = {here}; {keep}"
            )
        if consumed == 0:
            return 0
        ranks = [self._like(r, world, batch) for r in range(world)]
        full = all(consumed < len(s) and int(s.batch_bounds()[consumed]) == consumed * batch for s in ranks)
        if not (full and consumed < len(self) and int(self.batch_bounds()[consumed]) == consumed * self.batch_size):
            raise ValueError(
                f"cannot resume epoch {state['epoch']} after batch {consumed} on {self.world_size} ranks: the "
                f"state was saved on {world} ranks among the last batches of the epoch, where the ranks' "
                "batches are not all full, so the samples seen are not the first of the epoch's order. "
                f"Resume on {world} ranks, or at the next epoch (state['epoch'] += 1, state['batches'] = 0)"
            )
        return consumed

    def _like(self, rank: int, world_size: int, batch_size: int) -> "EpochBatchSampler":
        """This sampler's order for another rank, world size and batch size."""
        return EpochBatchSampler(
            self.size,
            batch_size,
            shuffle=self.shuffle,
            seed=self.seed,
            rank=rank,
            world_size=world_size,
            drop_last=self.drop_last,
        )


class SamplerBatches(EpochChoice):
    """Batches of indices from a sampler of the caller's (``make_loader(ds, n,
    sampler=WeightedRandomSampler(...))``: ``batch_size`` indices at a time; or, with ``batched``,
    a batch sampler's own lists), with what ``make_loader``'s loader asks of its batch sampler:
    ``set_epoch`` (passed to the sampler when it has one, as ``DistributedSampler`` does) and
    ``start``, batches of the epoch to skip after a resume. Skipping gives the batches an
    uninterrupted run would have given only when the sampler draws the same order for the same
    epoch (a ``DistributedSampler``, or a generator the caller seeds per epoch)."""

    def __init__(self, sampler: Any, batch_size: int, drop_last: bool = False, batched: bool = False) -> None:
        self.sampler, self.batch_size, self.drop_last, self.batched = sampler, int(batch_size), bool(drop_last), batched

    def begin(self, epoch: int, start: int) -> None:
        """Iterate epoch ``epoch`` from its batch ``start`` next, the sampler's epoch too when it takes one."""
        super().begin(epoch, start)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)

    def __len__(self) -> int:
        n = len(self.sampler)
        if self.batched:
            return n
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _batches(self) -> Iterator[list[int]]:
        if self.batched:
            yield from ([int(i) for i in batch] for batch in self.sampler)
            return
        batch: list[int] = []
        for index in self.sampler:
            batch.append(int(index))
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __iter__(self) -> Iterator[list[int]]:
        start, self.start = self.start, 0
        for number, batch in enumerate(self._batches()):
            if number >= start:
                yield EpochBatch(batch, self.epoch)

    def load_state_dict(self, state: dict) -> None:
        """Nothing to check beyond the loader's own: the sampler is the caller's."""


def epoch_order(
    size: int, batch_size: int, shuffle: bool, seed: int, drop_last: bool, rank: int, world: int
) -> tuple[EpochBatchSampler, dict]:
    """make_loader's own batch sampler over ``size`` samples, and what its order depends on (the
    loader's ``state_dict`` records it, ``load_state_dict`` checks it)."""
    sampler = EpochBatchSampler(
        size, batch_size, shuffle=shuffle, seed=seed, rank=rank, world_size=world, drop_last=drop_last
    )
    order = {
        "batch_size": batch_size,
        "world_size": world,
        "seed": seed,
        "bucket_by_length": False,
        "sampler": None,
        "order": ORDER_VERSION,
    }
    return sampler, order


__all__ = ["BatchChunks", "ChunkOfBatches", "EpochBatchSampler", "SamplerBatches", "distributed_rank", "epoch_order"]
