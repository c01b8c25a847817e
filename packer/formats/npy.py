"""npy-memmap shards: plain ``.npy`` files that ``np.load(path, mmap_mode="r")`` opens.

Per shard: ``NAME.images.npy`` (N x H x W x C), ``NAME.labels.npy`` (N, int64),
``NAME.keys.npy`` (N, fixed-width unicode) and ``NAME.crc32.npy`` (N, uint32). Images are streamed
to disk as they arrive; the header is written first for the planned count and rewritten with the
final count at the end (numpy pads npy headers so the first axis can grow without moving the data).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Iterator

import numpy as np

from packer.errors import ConfigError
from packer.formats.base import ImageLayout
from packer.layout import NPY_CRC32, NPY_IMAGES, NPY_KEYS, NPY_LABELS
from packer.manifest import ShardEntry
from packer.records import Sample, StoredSample

SUFFIXES = (NPY_IMAGES, NPY_LABELS, NPY_KEYS, NPY_CRC32)


def _write_header(f, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(f, header)


class NpyWriter:
    """Writes one shard as four ``.npy`` files."""

    name: ClassVar[str] = "npy"
    variable_shape: ClassVar[bool] = False

    def __init__(self, directory: Path, shard: str, layout: ImageLayout, capacity: int) -> None:
        if layout.shape is None:
            raise ConfigError("the npy format stores one N x H x W x C array and needs a fixed image size")
        self.directory, self.shard, self.layout = Path(directory), shard, layout
        self.dtype = np.dtype(layout.dtype)
        self.names = [f"{shard}{suffix}" for suffix in SUFFIXES]
        self._f = open(self.directory / self.names[0], "wb")
        _write_header(self._f, self.dtype, (capacity, *layout.shape))
        self._data_start = self._f.tell()
        self.labels: list[int] = []
        self.keys: list[str] = []
        self.crcs: list[int] = []

    def add(self, sample: Sample) -> None:
        """Append one image (must have the layout's shape) with its label and key."""
        image = np.ascontiguousarray(sample.image, dtype=self.dtype)
        if image.shape != self.layout.shape:
            raise ValueError(f"image of shape {image.shape} in a shard of shape {self.layout.shape}")
        self._f.write(image.data)
        self.labels.append(sample.label)
        self.keys.append(sample.key)
        self.crcs.append(sample.crc32)

    def close(self) -> list[str]:
        """Fix the image header to the final count and write labels, keys and checksums."""
        n = len(self.labels)
        self._f.seek(0)
        _write_header(self._f, self.dtype, (n, *self.layout.shape))  # type: ignore[misc]
        if self._f.tell() != self._data_start:  # cannot happen with numpy's padded headers
            raise RuntimeError("npy header changed length; refusing to write a corrupt file")
        self._f.truncate(self._data_start + n * (self.layout.sample_bytes or 0))
        self._f.close()
        keys = np.asarray(self.keys, dtype=str) if self.keys else np.zeros(0, dtype="<U1")
        arrays = (np.asarray(self.labels, np.int64), keys, np.asarray(self.crcs, np.uint32))
        for name, array in zip(self.names[1:], arrays):
            np.save(self.directory / name, array, allow_pickle=False)
        return list(self.names)


def scan_shard(directory: Path, shard: ShardEntry) -> Iterator[StoredSample]:
    """Every sample of one shard, in order, read with numpy alone.

    A truncated images file yields the samples it still holds, then fails naming the first missing.
    """
    labels, keys, crcs = (np.load(directory / shard.file(s), mmap_mode="r", allow_pickle=False) for s in SUFFIXES[1:])
    images = _complete_rows(directory / shard.file(SUFFIXES[0]))
    if not len(labels) == len(keys) == len(crcs) == shard.samples:
        raise ValueError(f"{shard.name}: {len(labels)} labels, {len(keys)} keys, {len(crcs)} checksums; "
                         f"the manifest says {shard.samples}")
    for i in range(shard.samples):
        if i >= len(images):
            raise ValueError(f"{shard.file(SUFFIXES[0])} is truncated: it ends before sample {i}")
        yield StoredSample(i, str(keys[i]), int(labels[i]), np.asarray(images[i]), int(crcs[i]))


def _complete_rows(path: Path) -> np.ndarray:
    """Memory-map the whole rows that an .npy file really holds (fewer than its header says if cut)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
    if dtype.hasobject or fortran or len(shape) != 4:
        raise ValueError(f"{path.name} holds {dtype} {shape}{' in Fortran order' if fortran else ''}, "
                         "not a packer image array (N x H x W x C of plain numbers)")
    row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    available = (path.stat().st_size - offset) // row if row else shape[0]
    rows = min(shape[0], available)
    if rows == 0:
        return np.zeros((0, *shape[1:]), dtype)
    order = "F" if fortran else "C"
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(rows, *shape[1:]), order=order)
