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
from typing import Any

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


__all__ = ["PackedBatch", "packed_collate", "empty_batch"]
