"""Reader of npy-memmap outputs: each shard's images file is memory-mapped, never read whole."""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from packer.spec.codecs import raw_image
from packer.spec.entries import TextField
from packer.spec.manifest import ShardEntry
from packer.spec.sample_layout import ImageStorage
from packer.spec.shard_names import NPY_IMAGE_SHAPES, NPY_IMAGES, NPY_KEYS, NPY_LABELS, npy_varlen_suffixes
from readers.datasets.mapstyle import PackedDataset


class _NpyShard(NamedTuple):
    images: Optional[np.ndarray]  # N x H x W x C, or the flat bytes of encoded images; None without images
    offsets: Optional[np.ndarray]  # N + 1 offsets into ``images`` when encoded
    keys: np.ndarray
    labels: np.ndarray  # mapped at the open, with the other files: never read later from a newer output
    text: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # field: (flat bytes, N + 1 offsets)
    shapes: Optional[np.ndarray] = None  # N x 3, raw images of varying sizes (stored like encoded ones)
    where: str = ""  # the shard, for error messages


class NpyDataset(PackedDataset):
    """Map-style dataset over an npy output (see PackedDataset for what items look like)."""

    format_name = "npy"

    def open_shard(self, shard: ShardEntry) -> _NpyShard:
        def mmap(suffix: str) -> np.ndarray:
            # A plain ndarray over the map (it keeps the map alive): indexing a np.memmap costs
            # more per sample for its subclass bookkeeping.
            return np.asarray(np.load(self.files.path(shard.file(suffix)), mmap_mode="r", allow_pickle=False))

        def varlen(field: str) -> tuple[np.ndarray, np.ndarray]:
            data, offsets = npy_varlen_suffixes(field)
            return mmap(data), np.load(self.files.path(shard.file(offsets)), allow_pickle=False)

        labels = mmap(NPY_LABELS)
        text = {f.name: varlen(f.name) for f in self.text_fields}
        kind = self.layout.image
        if kind is ImageStorage.NONE:
            return _NpyShard(None, None, mmap(NPY_KEYS), labels, text)
        if kind is ImageStorage.FIXED:
            return _NpyShard(mmap(NPY_IMAGES), None, mmap(NPY_KEYS), labels, text)
        shapes = None
        if kind is ImageStorage.VARIABLE:
            shapes = np.load(self.files.path(shard.file(NPY_IMAGE_SHAPES)), allow_pickle=False)
        return _NpyShard(*varlen("images"), mmap(NPY_KEYS), labels, text, shapes, str(self.root / shard.name))

    def read_stored(self, handle: _NpyShard, local: int) -> np.ndarray:
        if handle.offsets is None:
            return handle.images[local]
        data = handle.images[handle.offsets[local] : handle.offsets[local + 1]]
        if handle.shapes is not None:
            return raw_image(data, self.layout.np_dtype, handle.shapes[local], handle.where)
        return data

    def read_labels(self, handle: _NpyShard) -> np.ndarray:
        return handle.labels  # a view of the mapped file (see ShardHandles.labels_of)

    def read_field(self, handle: _NpyShard, local: int, field: str) -> np.ndarray:
        flat, offsets = handle.text[field]
        return flat[offsets[local] : offsets[local + 1]]

    def read_lengths(self, handle: _NpyShard, field: TextField) -> np.ndarray:
        return np.diff(handle.text[field.name][1]) // field.itemsize

    def read_shapes(self, handle: _NpyShard, shard: ShardEntry) -> Optional[np.ndarray]:
        if handle.shapes is not None:
            return handle.shapes
        if not any(f.path.endswith(NPY_IMAGE_SHAPES) for f in shard.files):
            return None
        return np.load(self.files.path(shard.file(NPY_IMAGE_SHAPES)), allow_pickle=False)

    def read_key(self, handle: _NpyShard, local: int) -> str:
        return str(handle.keys[local])
