"""How a loader has a tar-shard reader make whole batches: which shards each rank and DataLoader worker
reads, how many batches of which sizes each makes, and the pass (epoch, batches to skip) the loader
starts, in shared memory so that persistent workers see it. The loader owns a ``TarBatches`` and hands
it to the reader (``WdsDataset.batch_by``)."""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch
from torch.utils.data import get_worker_info

from readers.loading.collate import Numbered


@dataclass
class TarBatches:
    """Whole batches of ``batch_size`` samples, an equal number on every rank.

    Policy (documented in the README): shards are assigned once, rank ``r`` of ``world`` reading
    shards ``r, r + world, ...`` and, within a rank, DataLoader worker ``k`` of ``workers`` every
    ``workers``-th of those; each epoch a worker reads its shards in a shuffled order through a
    ``shuffle``-sample buffer (none for 0), in batches of ``batch_size`` with one partial batch at its
    end (none with ``drop_last``); a worker left without a shard reads none. So with one rank every
    sample comes exactly once per epoch, whatever the worker count. Ranks must yield equal batch
    counts (DDP waits for the slowest): a rank with fewer batches than the largest adds full batches
    drawn from another pass over its shards (a few samples repeat); with ``drop_last`` the ranks with
    more drop some instead. ``control`` is a shared ``[epoch, batches to skip]`` tensor that the loader
    sets before each pass (``start_pass``), also for persistent workers.
    """

    batch_size: int
    drop_last: bool = False
    rank: int = 0
    world: int = 1
    workers: int = 1
    shuffle: int = 0
    control: torch.Tensor = field(default_factory=lambda: torch.zeros(2, dtype=torch.int64))

    def __post_init__(self) -> None:
        self.batch_size, self.workers = int(self.batch_size), max(1, int(self.workers))

    def start_pass(self, epoch: int, skip: int) -> None:
        """Make the next pass epoch ``epoch``'s, from its batch ``skip`` on: written into the shared
        control tensor, so that the DataLoader's workers, persistent ones too, see it when the pass starts."""
        self.control.copy_(torch.tensor([int(epoch), int(skip)]))

    def this_pass(self) -> tuple[int, int]:
        """``(epoch, batches to skip)`` of the pass starting now (``start_pass``)."""
        epoch, skip = (int(v) for v in self.control.tolist())
        return epoch, skip

    def shares(self, samples: Sequence[int], rank: int, workers: int) -> list[list[int]]:
        """Shard numbers read by each DataLoader worker of ``rank``, for shards of ``samples`` samples
        each: every ``workers``-th of the rank's. A worker left without one reads none (another's would
        repeat samples within the epoch); a rank without one (fewer shards than ranks) borrows one, as
        DDP needs batches from every rank."""
        everything = list(range(len(samples)))
        mine = everything[rank :: self.world] or everything[rank % len(everything) :][:1]
        return [mine[k::workers] for k in range(workers)]

    def _natural_counts(self, samples: Sequence[int], rank: int, workers: int) -> list[int]:
        held = [sum(samples[s] for s in shards) for shards in self.shares(samples, rank, workers)]
        size = self.batch_size
        return [h // size if self.drop_last else -(-h // size) for h in held]

    def count(self, samples: Sequence[int]) -> int:
        """Batches per epoch on every rank."""
        totals = [sum(self._natural_counts(samples, r, self.workers)) for r in range(self.world)]
        return min(totals) if self.drop_last else max(totals)

    def plan(self, samples: Sequence[int], workers: int) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """For this rank: each worker's shards, each worker's batch sizes in order, and which worker
        makes each batch of the epoch in the order the DataLoader hands them out (one from each
        worker still going, in turn)."""
        size, count = self.batch_size, self.count(samples)
        shares = self.shares(samples, self.rank, workers)
        held = [sum(samples[s] for s in shards) for shards in shares]
        counts = self._natural_counts(samples, self.rank, workers)
        sizes = [[size] * c for c in counts]
        if not self.drop_last:
            for k, c in enumerate(counts):
                if c:
                    sizes[k][-1] = held[k] - size * (c - 1)  # the partial batch at the end of a worker's data
        k, reading = 0, [w for w in range(workers) if shares[w]]  # never an idle worker: it has nothing to read
        while sum(len(x) for x in sizes) < count:  # fewer than the largest rank: resampled full batches
            sizes[reading[k % len(reading)]].append(size)
            k += 1
        while sum(len(x) for x in sizes) > count:  # drop_last: more than the smallest rank
            max(sizes, key=len).pop()
        seq: list[int] = []
        left = [len(x) for x in sizes]
        while any(left):
            for k in range(workers):
                if left[k]:
                    seq.append(k)
                    left[k] -= 1
        return shares, sizes, seq

    def iterate(
        self,
        samples: Sequence[int],
        seed: int,
        items_of: Callable[[int], Iterable],
        make: Callable[[list, int], Any],
        passed: Optional[Callable[[list], None]] = None,
    ) -> Iterator[Numbered]:
        """This DataLoader worker's batches of the pass ``start_pass`` chose, numbered in the epoch's
        order: the items of its shards (``items_of(shard)``, for shards of ``samples`` samples each),
        each pass over them in a new shard order through the shuffle buffer, made into batches by
        ``make(items, epoch)``; those before the pass's first batch are drawn, not made (a resume),
        and given to ``passed`` where given."""
        epoch, skip = self.this_pass()
        info = get_worker_info()
        worker, workers = (info.id, self.workers) if info is not None else (0, 1)
        shares, sizes, seq = self.plan(samples, workers)
        rng = random.Random(((seed * 1_000_003 + epoch) * 4099 + worker) * 8191 + self.rank)
        shards = list(shares[worker])

        def endless() -> Iterator:  # passes over this worker's shards, each in a new order, through the buffer
            while True:
                if self.shuffle:
                    rng.shuffle(shards)
                one_pass = (item for shard in shards for item in items_of(shard))
                yield from shuffle_buffer(one_pass, self.shuffle, rng) if self.shuffle else one_pass

        stream = endless()
        mine = [g for g, k in enumerate(seq) if k == worker]  # the epoch's batches this worker makes
        for g, n in zip(mine, sizes[worker]):
            items = [next(stream) for _ in range(n)]
            if g < skip:
                if passed is not None:
                    passed(items)
                continue  # consumed before a resume: drawn, not made
            yield Numbered(g, make(items, epoch))  # make_loader puts them in order


def warn_few_shards(shards: int, world: int, workers: int) -> None:
    """Warn where ``shards`` tar shards are too few for ``world`` ranks of ``workers`` DataLoader workers."""
    if shards < world:
        warnings.warn(
            f"{shards} shard(s) for {world} rank(s): some ranks read the same shards, so samples "
            "repeat within an epoch; convert with a smaller --shard-size for more shards",
            stacklevel=3,
        )
    elif shards < world * workers:
        warnings.warn(
            f"{shards} shard(s) for {world} rank(s) x {workers} worker(s): some workers "
            "have no shard of their own and stay idle; convert with a smaller --shard-size for more "
            "shards",
            stacklevel=3,
        )


def shuffle_buffer(items: Iterator, size: int, rng: random.Random) -> Iterator:
    """Yield ``items`` in a random order drawn through a buffer of ``size`` items."""
    buf: list = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = rng.randrange(size)
        buf[j], item = item, buf[j]
        yield item
    rng.shuffle(buf)
    yield from buf


__all__ = ["TarBatches", "shuffle_buffer", "warn_few_shards"]
