"""Batches of one aspect-ratio bucket each (``make_loader(ds, n, buckets=AspectBuckets(...))``).

Every epoch, on every rank alike: the indices in the epoch's seeded order (``EpochBatchSampler``'s
permutation) are grouped by bucket, keeping that order within each bucket, and each bucket is cut
into batches of ``batch_size``; the batches of all buckets are shuffled (seeded by seed and epoch);
rank ``r`` takes batches ``r, r + world_size, ...``. Each bucket's last batch may be short; for equal
batch counts on every rank the largest batches are split in two until the count is a multiple of
``world_size`` (no sample repeated or dropped, each half still of one bucket). ``drop_last=True``
drops each bucket's short batch, then the batches past a multiple of ``world_size``. Every image is
in exactly one batch per epoch; resuming is exact on the same ranks (``LengthBucketSampler``'s).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from readers.loading.length_sampler import LengthBucketSampler


class AspectBucketSampler(LengthBucketSampler):
    """Batches of indices whose images share a bucket (``buckets[i]``: the bucket of sample ``i``), for
    one rank; ``areas[k]``: bucket ``k``'s pixels, which decide the largest batches to split."""

    def __init__(
        self,
        buckets: Sequence[int] | np.ndarray,
        batch_size: int,
        *,
        areas: Optional[Sequence[int]] = None,
        shuffle: bool = True,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        drop_last: bool = False,
    ) -> None:
        ids = np.asarray(buckets, dtype=np.int64).reshape(-1)
        if ids.size and ids.min() < 0:
            raise ValueError(f"bucket ids must not be negative (sample {int(ids.argmin())} has {ids.min()})")
        count = int(ids.max()) + 1 if ids.size else 0
        pixels = np.ones(count, np.int64) if areas is None else np.asarray(areas, dtype=np.int64)
        super().__init__(
            pixels[ids], batch_size, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size, drop_last=drop_last
        )
        self.buckets = ids
        self.counts = np.bincount(ids, minlength=count)

    def __len__(self) -> int:
        b, world = self.batch_size, self.world_size
        if self.drop_last:
            return int((self.counts // b).sum()) // world
        return -(-int((-(-self.counts // b)).sum()) // world)

    def all_batches(self, epoch: int) -> list[list[int]]:
        """Every rank's batches of epoch ``epoch``, interleaved: rank ``r`` takes ``[r::world_size]``."""
        g = torch.Generator()
        g.manual_seed(self.seed * 1_000_003 + epoch)  # shuffles the batches
        order = self.permutation(epoch).take(0, self.size) if self.shuffle else np.arange(self.size)
        grouped = order[np.argsort(self.buckets[order], kind="stable")].tolist()  # by bucket, in epoch order
        b, batches, start = self.batch_size, [], 0
        for n in self.counts.tolist():
            end = start + (n // b * b if self.drop_last else n)
            batches += [grouped[i : min(i + b, end)] for i in range(start, end, b)]
            start += n
        if not self.drop_last and len(batches) % self.world_size:
            batches = self._split_to_multiple(batches)
        if self.shuffle:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
        if self.drop_last:
            batches = batches[: len(batches) // self.world_size * self.world_size]
        return batches

    def state_dict(self, consumed: int = 0) -> dict:
        """The position after ``consumed`` batches of the current epoch, with the buckets' sizes (a
        state of other buckets is refused: its batches would differ)."""
        return {**super().state_dict(consumed), "bucket_counts": self.counts.tolist()}

    def load_state_dict(self, state: dict) -> None:
        """Continue where ``state`` says; refused for other buckets, or as ``LengthBucketSampler``."""
        if "bucket_counts" in state and list(state["bucket_counts"]) != self.counts.tolist():
            raise ValueError(
                "cannot resume: the state was saved with other aspect-ratio buckets (images per bucket "
                f"{state['bucket_counts']}, here {self.counts.tolist()}); pass the same buckets"
            )
        super().load_state_dict(state)


__all__ = ["AspectBucketSampler"]
