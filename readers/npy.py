"""Reader of npy-memmap outputs: each shard's images file is memory-mapped, never read whole."""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from packer.codecs import decode_image
from packer.layout import NPY_IMAGE_BYTES, NPY_IMAGE_OFFSETS, NPY_IMAGES, NPY_KEYS, NPY_LABELS
from packer.manifest import ShardEntry
from readers.base import PackedDataset


class _NpyShard(NamedTuple):
    images: np.ndarray  # N x H x W x C, or the flat bytes of encoded images
    offsets: Optional[np.ndarray]  # N + 1 offsets into ``images`` when encoded
    keys: np.ndarray
    labels_path: str


class NpyDataset(PackedDataset):
    """Map-style dataset over an npy output (see PackedDataset for what items look like)."""

    format_name = "npy"

    def open_shard(self, shard: ShardEntry) -> _NpyShard:
        def mmap(suffix: str) -> np.ndarray:
            return np.load(self.path(shard.file(suffix)), mmap_mode="r", allow_pickle=False)

        labels = str(self.path(shard.file(NPY_LABELS)))
        if self.manifest.image_codec == "raw":
            return _NpyShard(mmap(NPY_IMAGES), None, mmap(NPY_KEYS), labels)
        offsets = np.load(self.path(shard.file(NPY_IMAGE_OFFSETS)), allow_pickle=False)
        return _NpyShard(mmap(NPY_IMAGE_BYTES), offsets, mmap(NPY_KEYS), labels)

    def read_image(self, handle: _NpyShard, local: int) -> np.ndarray:
        if handle.offsets is None:
            return handle.images[local]
        data = handle.images[handle.offsets[local]:handle.offsets[local + 1]]
        return decode_image(data, self.manifest.image_codec, self.manifest.preprocess["mode"])

    def read_labels(self, handle: _NpyShard) -> np.ndarray:
        return np.load(handle.labels_path, allow_pickle=False)

    def read_key(self, handle: _NpyShard, local: int) -> str:
        return str(handle.keys[local])
