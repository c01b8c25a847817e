"""Where a reader's whole batches are written: fresh tensors (in shared memory inside a DataLoader
worker, so they cross to the main process without a copy), or the reusable slots of a ``SlotRing``.
``BatchBuffers`` is what a loader chooses of these and hands to the reader it reads."""

from __future__ import annotations

import math
import os
import weakref
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np
import torch
from torch.utils.data import get_worker_info


def empty_batch(
    shape: tuple[int, int, int, int], dtype: torch.dtype, channels_last: bool = False, shared: bool = True
) -> torch.Tensor:
    """An uninitialized (N, C, H, W) tensor; in shared memory when ``shared`` and called in a DataLoader
    worker (only worth it when the batch crosses to the main process as it is: ``packed_collate``).

    ``channels_last=True`` lays the bytes out as N x H x W x C (the stored order), so filling it is
    a plain copy per sample; the tensor's shape is still (N, C, H, W).
    """
    n, c, h, w = shape
    physical = (n, h, w, c) if channels_last else (n, c, h, w)
    if not shared or get_worker_info() is None:
        # From numpy, which asks for huge pages for large arrays: a fresh batch then costs a few page
        # faults, not one per 4 KiB. torch.empty's memory, mapped afresh for each batch by some
        # processes' allocator and not by others, made uint8 reads in the main process run at one
        # of two very different rates from one process to the next.
        out = torch.from_numpy(np.empty(physical, dtype=torch.empty(0, dtype=dtype).numpy().dtype))
    else:
        # As default_collate does: fill shared memory directly instead of copying into it later.
        itemsize = torch.empty(0, dtype=dtype).element_size()
        storage = torch.UntypedStorage._new_shared(max(1, math.prod(physical) * itemsize))
        out = torch.empty(0, dtype=dtype).set_(storage, 0, physical)
    return out.permute(0, 3, 1, 2) if channels_last else out


class SlotRing:
    """Batch buffers in shared memory, made once and reused, between DataLoader workers and the loader.

    Every batch through a worker pipe normally lands in freshly mapped shared memory, and on a
    virtual machine faulting in those pages costs more than filling them. Here each worker owns
    ``per_worker`` slots made before the workers start. A worker fills a slot it owns that is free
    and sends only its number (``RingBatch``); ``make_loader``'s iterator hands out the slot itself,
    and the slot is free again once nothing refers to the batch any more (``hand_out``). When all of
    a worker's slots are held (a training loop that keeps batches), it falls back to the usual fresh
    shared memory: the ring only ever saves time, it never waits.
    """

    def __init__(
        self, workers: int, per_worker: int, shape: tuple[int, int, int, int], dtype: torch.dtype, channels_last: bool
    ) -> None:
        self.workers, self.per_worker, self.shape, self.dtype = workers, per_worker, shape, dtype
        self.channels_last = channels_last
        # Flat slots of the largest batch: a batch of another image size (an aspect-ratio bucket's)
        # is a view of the first of its bytes.
        self.capacity = math.prod(shape)
        self.slots = [torch.empty(self.capacity, dtype=dtype).share_memory_() for _ in range(workers * per_worker)]
        self.free = torch.ones(workers * per_worker, dtype=torch.uint8).share_memory_()
        self._out: dict[int, weakref.finalize] = {}  # slots handed out by the loader, by finalizer

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_out": {}}  # finalizers stay in the loader's process

    @staticmethod
    def bytes_needed(workers: int, per_worker: int, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        """Shared memory a ring of this size takes."""
        return workers * per_worker * math.prod(shape) * torch.empty(0, dtype=dtype).element_size()

    def _physical(self, n: int, size: Optional[tuple[int, int]]) -> tuple[int, int, int, int]:
        """The memory layout of a batch of ``n`` images of ``size`` (height, width; the ring's own by default)."""
        _, c, h, w = self.shape
        h, w = size if size is not None else (h, w)
        return (n, h, w, c) if self.channels_last else (n, c, h, w)

    def view(self, slot: int, n: int, size: Optional[tuple[int, int]] = None) -> torch.Tensor:
        """The (n, C, H, W) batch tensor over slot ``slot`` (images of ``size``, the ring's own by default)."""
        physical = self._physical(n, size)
        t = self.slots[slot][: math.prod(physical)].view(physical)
        return t.permute(0, 3, 1, 2) if self.channels_last else t

    def hand_out(self, slot: int, n: int, size: Optional[tuple[int, int]] = None) -> torch.Tensor:
        """In the loader: the batch in slot ``slot`` as a tensor that frees the slot when it dies.

        The tensor is made over a numpy view of the slot that only it (and every tensor sharing
        its memory: views, slices, numpy arrays of it) keeps alive; when the last of them goes,
        the view's finalizer marks the slot free. Exact, with no polling.
        """
        physical = self._physical(n, size)
        array = self.slots[slot].numpy()[: math.prod(physical)].reshape(physical)
        handed = self._out[slot] = weakref.finalize(array, self.release, slot)
        handed.atexit = False
        t = torch.from_numpy(array)
        return t.permute(0, 3, 1, 2) if self.channels_last else t

    def reset(self) -> None:
        """In the loader, before a pass: free the slots filled for batches never handed out (a pass
        left early, whose queued batches the DataLoader threw away)."""
        for slot in range(len(self.slots)):
            handed = self._out.get(slot)
            if handed is None or not handed.alive:
                self.free[slot] = 1

    def claim(
        self, n: int, dtype: torch.dtype, size: Optional[tuple[int, int]] = None
    ) -> tuple[int, torch.Tensor] | None:
        """In a worker: a free slot of its own and its tensor for ``n`` samples (of ``size``), or None."""
        info = get_worker_info()
        if info is None or info.id >= self.workers or dtype != self.dtype:
            return None
        if n > self.shape[0] or math.prod(self._physical(n, size)) > self.capacity:
            return None
        first = info.id * self.per_worker
        for slot in range(first, first + self.per_worker):
            if self.free[slot]:
                self.free[slot] = 0
                return slot, self.view(slot, n, size)
        return None

    def release(self, slot: int) -> None:
        """In the loader: slot ``slot`` may be filled again."""
        self.free[slot] = 1


class RingBatch(NamedTuple):
    """What a worker sends for a batch filled into a ``SlotRing`` slot."""

    slot: int
    n: int
    labels: np.ndarray  # numpy, pickled by value: a tensor would travel through its own shared memory
    size: Optional[tuple[int, int]] = None  # (height, width) of its images, where not the ring's own


def shared_memory_free() -> int | None:
    """Bytes free in /dev/shm (where PyTorch puts shared tensors on Linux), or None where unknown."""
    try:
        st = os.statvfs("/dev/shm")
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


@dataclass(frozen=True)
class BatchBuffers:
    """How a reader's batches travel, as the loader reading it chose (``make_loader``), handed to the
    reader with ``ReaderBase.for_loader``; it travels to DataLoader workers with the reader.

    ``ring``: reusable shared batch buffers (or None); ``shared``: fresh batches are made in shared
    memory inside a worker, to cross to the main process as they are (the loader's own collate);
    ``encoded``: ``decode="device"``, the workers send JPEG bytes and crops instead of pixels."""

    ring: Optional[SlotRing] = None
    shared: bool = False
    encoded: bool = False

    def batch_tensor(
        self, n: int, chw: tuple[int, int, int], dtype: torch.dtype, channels_last: bool
    ) -> tuple[Optional[int], torch.Tensor]:
        """``(ring slot or None, empty (n, C, H, W) batch tensor)``: a free slot of the ring when there is
        one, else fresh memory (``empty_batch``), laid out N x H x W x C when ``channels_last``."""
        claimed = self.ring.claim(n, dtype, tuple(chw[1:])) if self.ring is not None else None  # type: ignore[arg-type]
        if claimed is not None:
            return claimed
        return None, empty_batch((n, *chw), dtype, channels_last, shared=self.shared)  # type: ignore[arg-type]


__all__ = ["BatchBuffers", "SlotRing", "RingBatch", "empty_batch", "shared_memory_free"]
