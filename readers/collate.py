"""Batches built in one piece: the tensors a reader's ``__getitems__`` fills, and the collate that
passes them through.

A map-style reader given a whole batch of indices (PyTorch calls ``__getitems__`` when it exists)
writes every image straight into its slot of one batch tensor, normalizing on the way, instead of
making a tensor per sample that ``default_collate`` then copies again. Inside a DataLoader worker
the batch tensor is allocated in shared memory, so it crosses to the main process without a copy.

``packed_collate`` returns such a batch as it is; any other list of samples goes to PyTorch's
``default_collate``. A plain ``DataLoader`` with the default collate still gets correct batches
from a ``PackedBatch`` (it is also a list of per-sample views), only slower.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info


class PackedBatch(list):
    """The samples of one batch, already collated: ``images`` (N, C, H, W) and ``labels`` (N,).

    As a list it holds ``(images[i], labels[i])`` views, which is what ``default_collate`` expects.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        super().__init__(zip(images, labels))
        self.images = images
        self.labels = labels

    def collated(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images, labels)``, as ``default_collate`` would return them."""
        return self.images, self.labels


def packed_collate(batch: Any) -> Any:
    """Collate for packer readers: a ``PackedBatch`` as it is, anything else by ``default_collate``."""
    if isinstance(batch, PackedBatch):
        return batch.collated()
    return default_collate(batch)


def empty_batch(shape: tuple[int, int, int, int], dtype: torch.dtype, channels_last: bool = False) -> torch.Tensor:
    """An uninitialized (N, C, H, W) tensor; in shared memory when called in a DataLoader worker.

    ``channels_last=True`` lays the bytes out as N x H x W x C (the stored order), so filling it is
    a plain copy per sample; the tensor's shape is still (N, C, H, W).
    """
    n, c, h, w = shape
    physical = (n, h, w, c) if channels_last else (n, c, h, w)
    if get_worker_info() is None:
        out = torch.empty(physical, dtype=dtype)
    else:
        # As default_collate does: fill shared memory directly instead of copying into it later.
        itemsize = torch.empty(0, dtype=dtype).element_size()
        storage = torch.UntypedStorage._new_shared(max(1, math.prod(physical) * itemsize))
        out = torch.empty(0, dtype=dtype).set_(storage, 0, physical)
    return out.permute(0, 3, 1, 2) if channels_last else out


class BufferPool:
    """Reuses batch-sized CPU tensors once nobody else holds them.

    A fresh 38 MB float32 batch costs more in page faults than in arithmetic. ``take`` hands back a
    tensor of the pool only when the pool's references are the only ones left to it and to its
    memory (no caller kept it, a view of it or a numpy array over it); otherwise it allocates a
    new one. So a training loop that keeps a batch (for logging, say) never sees it overwritten.
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._tensors: list[torch.Tensor] = []
        self._use_count = getattr(torch._C, "_storage_Use_Count", None)  # private: without it, never reuse

    def _free(self, t: torch.Tensor) -> bool:
        # References: the pool's list and getrefcount's argument; storage users: t and the
        # temporary storage object made for the check.
        return sys.getrefcount(t) == 3 and self._use_count(t.untyped_storage()._cdata) == 2

    def take(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """An uninitialized contiguous CPU tensor of ``shape`` and ``dtype``."""
        if self._use_count is not None:
            for t in self._tensors:
                if t.shape == shape and t.dtype == dtype and self._free(t):
                    return t
        t = torch.from_numpy(np.empty(shape, dtype=_NUMPY[dtype]))  # numpy asks for huge pages when large
        if self._use_count is not None:
            if len(self._tensors) >= self.size:
                self._tensors.pop(0)
            self._tensors.append(t)
        return t


_NUMPY = {torch.float32: np.float32, torch.float16: np.float16, torch.uint8: np.uint8}


__all__ = ["PackedBatch", "packed_collate", "empty_batch", "BufferPool"]
