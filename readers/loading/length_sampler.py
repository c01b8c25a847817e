"""Batches of samples of similar length (token ids, texts), so that padding them to the batch's
longest wastes little: ``LengthBucketSampler``, and ``padding_ratio`` to measure what is padded."""

from __future__ import annotations

import heapq
from typing import Iterator, Sequence

import numpy as np
import torch

from readers.loading.sampler import EpochBatchSampler, distributed_rank


class LengthBucketSampler(EpochBatchSampler):
    """Batches of indices of similar length, for one rank; resumable like ``EpochBatchSampler``.

    ``lengths`` holds each sample's length (``dataset.lengths()``). Every epoch, on every rank alike:

    - the indices in ``order(epoch)`` (the seeded permutation of ``EpochBatchSampler``; index order
      with ``shuffle=False``) are cut into pools of ``batch_size * bucket_batches``;
    - each pool is sorted by length (ties keep the permuted order) and cut into batches;
    - the list of all batches is shuffled (seeded by seed and epoch; not with ``shuffle=False``);
    - rank ``r`` takes batches ``r, r + world_size, ...``. For equal batch counts on every rank the
      largest batches (most samples, then most padded tokens) are split in two until the count is a
      multiple of ``world_size``; each half is still of similar lengths, and no sample is repeated
      or dropped. ``drop_last=True`` instead drops samples at the end of the permutation so that
      every batch is full and every rank has ``len(self)`` of them.

    Larger pools pad less and mix less: ``bucket_batches`` trades one for the other.
    ``rank`` and ``world_size`` default to those of ``torch.distributed`` when it is initialised.
    """

    regroups = False  # its batches group samples of similar length, per rank: another world regroups them

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray | torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        bucket_batches: int = 50,
    ) -> None:
        lengths = np.asarray(lengths)
        if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
            raise ValueError(f"lengths must be a 1-D sequence of ints, got {lengths.dtype} of shape {lengths.shape}")
        if lengths.size and lengths.min() < 0:
            raise ValueError(f"lengths must not be negative (sample {int(lengths.argmin())} has {lengths.min()})")
        if bucket_batches < 1:
            raise ValueError(f"bucket_batches must be at least 1, got {bucket_batches}")
        found_rank, found_world = distributed_rank()
        rank = found_rank if rank is None else rank
        world_size = found_world if world_size is None else world_size
        super().__init__(
            len(lengths), batch_size, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size, drop_last=drop_last
        )
        if batch_size == 1 and not drop_last and len(lengths) % world_size:
            raise ValueError(
                f"{len(lengths)} samples in batches of 1 cannot give {world_size} ranks equal batch "
                "counts: use drop_last=True, or a batch size above 1"
            )
        self.lengths = lengths.astype(np.int64)
        self._length_rank = np.unique(self.lengths, return_inverse=True)[1].reshape(-1)  # same order, values < size
        self.bucket_batches = int(bucket_batches)

    def all_batches(self, epoch: int) -> list[list[int]]:
        """Every rank's batches of epoch ``epoch``, interleaved: rank ``r`` takes ``[r::world_size]``."""
        g = torch.Generator()
        g.manual_seed(self.seed * 1_000_003 + epoch)  # shuffles the batches
        order = self.permutation(epoch).take(0, self.size) if self.shuffle else np.arange(self.size)
        b = self.batch_size
        if self.drop_last:
            order = order[: len(self) * self.world_size * b]
        pool = np.arange(len(order)) // (b * self.bucket_batches)
        # Sort by pool, then length, ties in the permuted order (a stable sort of one int64 key: 3x
        # faster than np.lexsort; length ranks instead of lengths keep the key from overflowing).
        order = order[np.argsort(pool * self.size + self._length_rank[order], kind="stable")]
        flat = order.tolist()
        batches = [flat[i : i + b] for i in range(0, len(flat), b)]
        if not self.drop_last and len(batches) % self.world_size:
            batches = self._split_to_multiple(batches)
        if self.shuffle:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
        return batches

    def _split_to_multiple(self, batches: list[list[int]]) -> list[list[int]]:
        """``batches`` with the largest split in two until their count is a multiple of world_size.

        Largest: most samples, then most padded tokens. Always possible: with ``size >= world_size``
        and ``batch_size >= 2`` (checked in __init__) the count needed never exceeds the number of
        samples. The halves take the place of the batch they come from.
        """
        need = -len(batches) % self.world_size

        def key(i: int, lo: int, hi: int) -> tuple[int, int, int, int, int]:
            # A batch's lengths ascend, so its last sample is its longest.
            return lo - hi, (lo - hi) * int(self.lengths[batches[i][hi - 1]]), i, lo, hi

        # Only the `need` largest batches can be split: while one of them is left, it is larger
        # than every other batch, and there are only `need` splits.
        sizes = np.array([len(x) for x in batches])
        longest = self.lengths[[x[-1] for x in batches]]
        first = np.lexsort((np.arange(len(batches)), -sizes * longest, -sizes))[:need]
        heap = [key(i, 0, len(batches[i])) for i in first.tolist()]
        heapq.heapify(heap)
        for _ in range(need):
            _, _, i, lo, hi = heapq.heappop(heap)
            heapq.heappush(heap, key(i, lo, (lo + hi) // 2))
            heapq.heappush(heap, key(i, (lo + hi) // 2, hi))
        pieces: dict[int, list[tuple[int, int]]] = {}
        for _, _, i, lo, hi in sorted(heap, key=lambda k: k[2:]):
            pieces.setdefault(i, []).append((lo, hi))
        out = []
        for i, batch in enumerate(batches):
            out.extend([batch[lo:hi] for lo, hi in pieces[i]] if i in pieces else [batch])
        return out

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of epoch ``epoch``, in order."""
        return self.all_batches(epoch)[self.rank :: self.world_size]

    def iter_batches(self, epoch: int, start: int = 0) -> Iterator[list[int]]:
        """This rank's batches of epoch ``epoch`` from batch ``start`` on: bucketing sorts the whole
        epoch by length, so they are made up front (O(samples) per epoch, unlike EpochBatchSampler)."""
        return iter(self.batches(epoch)[start:])

    def state_dict(self, consumed: int = 0) -> dict:
        """The position after ``consumed`` batches of the current epoch (see ``load_state_dict``)."""
        return {**super().state_dict(consumed), "bucket_batches": self.bucket_batches}

    def load_state_dict(self, state: dict) -> None:
        """Continue where ``state`` says; refused if it was saved with other settings (as EpochBatchSampler)."""
        if "bucket_batches" in state and state["bucket_batches"] != self.bucket_batches:
            raise ValueError(
                f"cannot resume: the state was saved with bucket_batches={state['bucket_batches']}, "
                f"this sampler has bucket_batches={self.bucket_batches}"
            )
        super().load_state_dict(state)


def padding_ratio(batches: Sequence[Sequence[int]], lengths: Sequence[int] | np.ndarray | torch.Tensor) -> float:
    """Share of padding when each batch is padded to its longest sample: padded slots / all slots."""
    lengths = np.asarray(lengths, dtype=np.int64)
    slots = tokens = 0
    for batch in batches:
        if len(batch):
            got = lengths[np.asarray(batch)]
            slots += len(got) * int(got.max())
            tokens += int(got.sum())
    return (slots - tokens) / slots if slots else 0.0


__all__ = ["LengthBucketSampler", "padding_ratio"]
