"""Reader of npy-memmap outputs: each shard's ``images.npy`` is memory-mapped, never read whole."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from packer.layout import NPY_IMAGES, NPY_KEYS, NPY_LABELS
from packer.manifest import ShardEntry
from readers.base import PackedDataset


class _NpyShard(NamedTuple):
    images: np.ndarray
    keys: np.ndarray
    labels_path: str


class NpyDataset(PackedDataset):
    """Map-style dataset over an npy output (see PackedDataset for what items look like)."""

    format_name = "npy"

    def open_shard(self, shard: ShardEntry) -> _NpyShard:
        def mmap(suffix: str) -> np.ndarray:
            return np.load(self.path(shard.file(suffix)), mmap_mode="r", allow_pickle=False)

        return _NpyShard(mmap(NPY_IMAGES), mmap(NPY_KEYS), str(self.path(shard.file(NPY_LABELS))))

    def read_image(self, handle: _NpyShard, local: int) -> np.ndarray:
        return handle.images[local]

    def read_labels(self, handle: _NpyShard) -> np.ndarray:
        return np.load(handle.labels_path, allow_pickle=False)

    def read_key(self, handle: _NpyShard, local: int) -> str:
        return str(handle.keys[local])
