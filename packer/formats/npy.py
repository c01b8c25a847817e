"""npy-memmap shards: plain ``.npy`` files that ``np.load(path, mmap_mode="r")`` opens.

Per shard: ``NAME.images.npy`` (N x H x W x C), ``NAME.labels.npy`` (N, int64),
``NAME.keys.npy`` (N, fixed-width unicode) and ``NAME.crc32.npy`` (N, uint32). Encoded images
(jpeg, png) replace the images file with a variable-length field: ``NAME.images.bytes.npy`` (flat
uint8) and ``NAME.images.offsets.npy`` (N + 1, int64). Images are streamed to disk as they arrive
(see ``varlen.NpyStream``).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Iterator

import numpy as np

from packer.errors import ConfigError
from packer.formats.base import ImageLayout, encoded_bytes
from packer.formats.varlen import NpyStream, NpyVarlenWriter, iter_varlen
from packer.layout import NPY_CRC32, NPY_IMAGE_BYTES, NPY_IMAGE_OFFSETS, NPY_IMAGES, NPY_KEYS, NPY_LABELS
from packer.manifest import ShardEntry
from packer.records import Sample, StoredSample

SUFFIXES = (NPY_IMAGES, NPY_LABELS, NPY_KEYS, NPY_CRC32)


class NpyWriter:
    """Writes one shard as four ``.npy`` files (five with encoded images)."""

    name: ClassVar[str] = "npy"
    variable_shape: ClassVar[bool] = False

    def __init__(self, directory: Path, shard: str, layout: ImageLayout, capacity: int) -> None:
        if layout.shape is None:
            raise ConfigError("the npy format stores one N x H x W x C array and needs a fixed image size")
        self.directory, self.shard, self.layout = Path(directory), shard, layout
        self.dtype = np.dtype(layout.dtype)
        self.names = [f"{shard}{suffix}" for suffix in SUFFIXES[1:]]
        if layout.codec.encoded:
            self._encoded = NpyVarlenWriter(self.directory, shard, "images")
        else:
            self._images = NpyStream(self.directory / f"{shard}{NPY_IMAGES}", self.dtype, layout.shape, capacity)
        self.labels: list[int] = []
        self.keys: list[str] = []
        self.crcs: list[int] = []

    def add(self, sample: Sample) -> None:
        """Append one image (must have the layout's shape) with its label and key."""
        if sample.image.shape != self.layout.shape:
            raise ValueError(f"image of shape {sample.image.shape} in a shard of shape {self.layout.shape}")
        if self.layout.codec.encoded:
            self._encoded.add(encoded_bytes(sample, self.layout))
        else:
            self._images.write(np.ascontiguousarray(sample.image, dtype=self.dtype).data)
        self.labels.append(sample.label)
        self.keys.append(sample.key)
        self.crcs.append(sample.crc32)

    def close(self) -> list[str]:
        """Finish the images and write labels, keys and checksums."""
        if self.layout.codec.encoded:
            images = self._encoded.close()
        else:
            self._images.close(len(self.labels))
            images = [f"{self.shard}{NPY_IMAGES}"]
        keys = np.asarray(self.keys, dtype=str) if self.keys else np.zeros(0, dtype="<U1")
        arrays = (np.asarray(self.labels, np.int64), keys, np.asarray(self.crcs, np.uint32))
        for name, array in zip(self.names, arrays):
            np.save(self.directory / name, array, allow_pickle=False)
        return images + self.names


def scan_shard(directory: Path, shard: ShardEntry, codec: str = "raw") -> Iterator[StoredSample]:
    """Every sample of one shard, in order, read with numpy alone (encoded images as their bytes).

    A truncated images file yields the samples it still holds, then fails naming the first missing.
    """
    labels, keys, crcs = (np.load(directory / shard.file(s), mmap_mode="r", allow_pickle=False) for s in SUFFIXES[1:])
    if not len(labels) == len(keys) == len(crcs) == shard.samples:
        raise ValueError(f"{shard.name}: {len(labels)} labels, {len(keys)} keys, {len(crcs)} checksums; "
                         f"the manifest says {shard.samples}")
    if codec != "raw":
        flat = _complete_rows(directory / shard.file(NPY_IMAGE_BYTES), ndim=1)
        offsets = np.load(directory / shard.file(NPY_IMAGE_OFFSETS), allow_pickle=False)
        for i, data in enumerate(iter_varlen(flat, offsets, shard.samples, shard.file(NPY_IMAGE_BYTES))):
            yield StoredSample(i, str(keys[i]), int(labels[i]), None, int(crcs[i]), data)
        return
    images = _complete_rows(directory / shard.file(SUFFIXES[0]))
    for i in range(shard.samples):
        if i >= len(images):
            raise ValueError(f"{shard.file(SUFFIXES[0])} is truncated: it ends before sample {i}")
        yield StoredSample(i, str(keys[i]), int(labels[i]), np.asarray(images[i]), int(crcs[i]))


def _complete_rows(path: Path, ndim: int = 4) -> np.ndarray:
    """Memory-map the whole rows that an .npy file of ``ndim`` dimensions really holds (fewer than its
    header says if cut)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
    if dtype.hasobject or fortran or len(shape) != ndim:
        what = "image array (N x H x W x C of plain numbers)" if ndim == 4 else "byte array (N of uint8)"
        raise ValueError(f"{path.name} holds {dtype} {shape}{' in Fortran order' if fortran else ''}, "
                         f"not a packer {what}")
    row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    available = (path.stat().st_size - offset) // row if row else shape[0]
    rows = min(shape[0], available)
    if rows == 0:
        return np.zeros((0, *shape[1:]), dtype)
    order = "F" if fortran else "C"
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(rows, *shape[1:]), order=order)
