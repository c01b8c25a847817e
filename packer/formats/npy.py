"""npy-memmap shards: plain ``.npy`` files that ``np.load(path, mmap_mode="r")`` opens.

Per shard: ``NAME.images.npy`` (N x H x W x C), ``NAME.labels.npy`` (N, int64),
``NAME.keys.npy`` (N, fixed-width unicode) and ``NAME.crc32.npy`` (N, uint32). Encoded images
(jpeg, png) replace the images file with a variable-length field: ``NAME.images.bytes.npy`` (flat
uint8) and ``NAME.images.offsets.npy`` (N + 1, int64). Text fields are variable-length fields too:
``NAME.text.bytes.npy`` and ``NAME.text.offsets.npy`` (likewise ``json``); a text-only shard has no
images file. Raw images of varying sizes (``--resize none``) are a variable-length field of their
pixels' bytes with ``NAME.images.shapes.npy`` (N x 3, int64) beside it. Images are streamed to disk
as they arrive (see ``varlen.NpyStream``).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Iterator, Optional

import numpy as np

from packer.formats.base import ImageLayout, check_image, encoded_bytes, raw_bytes, raw_image
from packer.formats.varlen import NpyStream, NpyVarlenWriter, iter_varlen
from packer.layout import (
    NPY_CRC32,
    NPY_IMAGE_SHAPES,
    NPY_IMAGES,
    NPY_KEYS,
    NPY_LABELS,
    npy_varlen_suffixes,
)
from packer.manifest import ShardEntry
from packer.records import Sample, StoredSample, TextField

SUFFIXES = (NPY_IMAGES, NPY_LABELS, NPY_KEYS, NPY_CRC32)


class NpyWriter:
    """Writes one shard as four ``.npy`` files (five with encoded images)."""

    name: ClassVar[str] = "npy"

    def __init__(self, directory: Path, shard: str, layout: ImageLayout, capacity: int) -> None:
        self.directory, self.shard, self.layout = Path(directory), shard, layout
        self.dtype = np.dtype(layout.dtype)
        self.names = [f"{shard}{suffix}" for suffix in SUFFIXES[1:]]
        self._shapes: Optional[list[tuple[int, ...]]] = None  # of raw images of varying sizes
        if not layout.has_image:
            pass
        elif layout.codec.encoded or layout.shape is None:
            self._encoded = NpyVarlenWriter(self.directory, shard, "images")
            self._shapes = [] if not layout.codec.encoded else None
        else:
            self._images = NpyStream(self.directory / f"{shard}{NPY_IMAGES}", self.dtype, layout.shape, capacity)
        self._text = {f.name: NpyVarlenWriter(self.directory, shard, f.name) for f in layout.text}
        self.labels: list[int] = []
        self.keys: list[str] = []
        self.crcs: list[int] = []
        self.digests: dict[str, str] = {}

    def add(self, sample: Sample) -> None:
        """Append one sample (its image must have the layout's shape) with its label and key."""
        if self.layout.has_image:
            check_image(sample, self.layout)
            if self.layout.codec.encoded:
                self._encoded.add(encoded_bytes(sample, self.layout))
            elif self._shapes is not None:
                self._encoded.add(raw_bytes(sample.image, self.dtype))
                self._shapes.append(sample.image.shape)
            else:
                self._images.write(np.ascontiguousarray(sample.image, dtype=self.dtype).data)
        for name, writer in self._text.items():
            writer.add(sample.fields[name])
        self.labels.append(sample.label)
        self.keys.append(sample.key)
        self.crcs.append(sample.crc32)

    def close(self) -> list[str]:
        """Finish the images and text fields and write labels, keys and checksums."""
        if not self.layout.has_image:
            images = []
        elif self._shapes is not None:
            images = self._encoded.close() + [f"{self.shard}{NPY_IMAGE_SHAPES}"]
            shapes = np.asarray(self._shapes, np.int64).reshape(-1, 3)
            np.save(self.directory / images[-1], shapes, allow_pickle=False)
        elif self.layout.codec.encoded:
            images = self._encoded.close()
        else:
            self._images.close(len(self.labels))
            images = [f"{self.shard}{NPY_IMAGES}"]
            if self._images.sha256 is not None:
                self.digests[images[0]] = self._images.sha256
        for writer in self._text.values():
            images += writer.close()
        keys = np.asarray(self.keys, dtype=str) if self.keys else np.zeros(0, dtype="<U1")
        arrays = (np.asarray(self.labels, np.int64), keys, np.asarray(self.crcs, np.uint32))
        for name, array in zip(self.names, arrays):
            np.save(self.directory / name, array, allow_pickle=False)
        return images + self.names


def scan_shard(directory: Path, shard: ShardEntry, codec: str = "raw", text: tuple[TextField, ...] = (),
               image: bool = True, dtype: str = "uint8") -> Iterator[StoredSample]:
    """Every sample of one shard, in order, read with numpy alone (encoded images as their bytes,
    the ``text`` fields as theirs).

    A truncated images file yields the samples it still holds, then fails naming the first missing.
    """
    labels, keys, crcs = (np.load(directory / shard.file(s), mmap_mode="r", allow_pickle=False) for s in SUFFIXES[1:])
    if not len(labels) == len(keys) == len(crcs) == shard.samples:
        raise ValueError(f"{shard.name}: {len(labels)} labels, {len(keys)} keys, {len(crcs)} checksums; "
                         f"the manifest says {shard.samples}")
    streams = {f.name: _varlen(directory, shard, f.name) for f in text}
    variable = image and codec == "raw" and any(f.path.endswith(NPY_IMAGE_SHAPES) for f in shard.files)
    if variable:
        shapes = np.load(directory / shard.file(NPY_IMAGE_SHAPES), allow_pickle=False)
    if image and (codec != "raw" or variable):
        encoded = _varlen(directory, shard, "images")
    elif image:
        rows = _complete_rows(directory / shard.file(NPY_IMAGES))
    for i in range(shard.samples):
        pixels, data = None, None
        if variable:
            pixels = raw_image(next(encoded), dtype, shapes[i], shard.name)
        elif image and codec != "raw":
            data = next(encoded)
        elif image:
            if i >= len(rows):
                raise ValueError(f"{shard.file(NPY_IMAGES)} is truncated: it ends before sample {i}")
            pixels = np.asarray(rows[i])
        fields = {name: next(stream) for name, stream in streams.items()}
        yield StoredSample(i, str(keys[i]), int(labels[i]), pixels, int(crcs[i]), data, fields)


def _varlen(directory: Path, shard: ShardEntry, field: str) -> Iterator[bytes]:
    """The bytes of each sample of variable-length field ``field``, read from its two files."""
    data, offsets = npy_varlen_suffixes(field)
    flat = _complete_rows(directory / shard.file(data), ndim=1)
    return iter_varlen(flat, np.load(directory / shard.file(offsets), allow_pickle=False), shard.samples,
                       shard.file(data))


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
