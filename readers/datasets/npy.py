"""Reader of npy-memmap outputs: each shard's images file is memory-mapped, never read whole; from a
URL, read by byte ranges (``readers.remote.ranges``), each sample checked against its CRC-32."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

from packer.spec.codecs import raw_image
from packer.spec.entries import TextField
from packer.spec.manifest import ShardEntry
from packer.spec.sample_layout import ImageStorage
from packer.spec.shard_names import NPY_CRC32, NPY_IMAGE_SHAPES, NPY_IMAGES, NPY_KEYS, NPY_LABELS, npy_varlen_suffixes
from readers.datasets.mapstyle import PackedDataset
from readers.remote.npy_ranges import RemoteArray
from readers.remote.sample_checks import SampleChecks


class _NpyShard(NamedTuple):
    images: Any  # N x H x W x C, or the flat bytes of encoded images (an ndarray, or a RemoteArray); None without
    offsets: Optional[np.ndarray]  # N + 1 offsets into ``images`` when encoded
    keys: np.ndarray
    labels: np.ndarray  # mapped at the open, with the other files: never read later from a newer output
    text: dict[str, tuple[Any, np.ndarray]] = {}  # field: (flat bytes, N + 1 offsets)
    shapes: Optional[np.ndarray] = None  # N x 3, raw images of varying sizes (stored like encoded ones)
    where: str = ""  # the shard, for error messages
    checks: Optional[SampleChecks] = None  # read by ranges from a URL: each sample checked as it is read


class NpyDataset(PackedDataset):
    """Map-style dataset over an npy output (see PackedDataset for what items look like)."""

    format_name = "npy"
    reads_ranges = True

    def open_shard(self, shard: ShardEntry) -> _NpyShard:
        files = self.files

        def varlen(field: str) -> tuple[Any, np.ndarray]:
            data, offsets = npy_varlen_suffixes(field)
            return files.rows(shard.file(data)), files.array(shard.file(offsets))

        labels, keys = files.array(shard.file(NPY_LABELS), mapped=True), files.array(shard.file(NPY_KEYS), mapped=True)
        text = {f.name: varlen(f.name) for f in self.text_fields}
        where = files.where(shard.name)
        checks = SampleChecks(files.array(shard.file(NPY_CRC32)), where) if files.ranged else None
        kind = self.layout.image
        if kind is ImageStorage.NONE:
            return _NpyShard(None, None, keys, labels, text, None, where, checks)
        if kind is ImageStorage.FIXED:
            return _NpyShard(files.rows(shard.file(NPY_IMAGES)), None, keys, labels, text, None, where, checks)
        shapes = files.array(shard.file(NPY_IMAGE_SHAPES)) if kind is ImageStorage.VARIABLE else None
        return _NpyShard(*varlen("images"), keys, labels, text, shapes, where, checks)

    def image_bytes(self, handle: _NpyShard, local: int) -> np.ndarray:
        """The image of sample ``local`` as its file holds it: a row, or its slice of the flat bytes."""
        if handle.offsets is None:
            return handle.images[local]
        return handle.images[handle.offsets[local] : handle.offsets[local + 1]]

    def ranges_of(self, handle: _NpyShard, local: np.ndarray) -> list:
        if handle.checks is None:
            return []
        wanted = []
        if isinstance(handle.images, RemoteArray):
            rows, at = handle.images, handle.offsets
            spans = [rows.span(i, i + 1) if at is None else rows.span(at[i], at[i + 1]) for i in local.tolist()]
            wanted.append((rows.source, spans))
        for flat, offsets in handle.text.values():
            wanted.append((flat.source, [flat.span(offsets[i], offsets[i + 1]) for i in local.tolist()]))
        return wanted

    def read_stored(self, handle: _NpyShard, local: int) -> np.ndarray:
        data = self.checked_sample(handle, local)[0] if handle.checks is not None else self.image_bytes(handle, local)
        if handle.shapes is not None:
            return raw_image(data, self.layout.np_dtype, handle.shapes[local], handle.where)
        return data

    def read_labels(self, handle: _NpyShard) -> np.ndarray:
        return handle.labels  # a view of the mapped file (see ShardHandles.labels_of)

    def read_field(self, handle: _NpyShard, local: int, field: str) -> np.ndarray:
        if handle.checks is not None:
            return self.checked_sample(handle, local)[1][list(handle.text).index(field)]
        flat, offsets = handle.text[field]
        return flat[offsets[local] : offsets[local + 1]]

    def read_lengths(self, handle: _NpyShard, field: TextField) -> np.ndarray:
        return np.diff(handle.text[field.name][1]) // field.itemsize

    def read_shapes(self, handle: _NpyShard, shard: ShardEntry) -> Optional[np.ndarray]:
        if handle.shapes is not None:
            return handle.shapes
        if not any(f.path.endswith(NPY_IMAGE_SHAPES) for f in shard.files):
            return None
        return self.files.array(shard.file(NPY_IMAGE_SHAPES))

    def read_key(self, handle: _NpyShard, local: int) -> str:
        return str(handle.keys[local])
