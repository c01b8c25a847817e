"""npy-memmap shards: plain ``.npy`` files that ``np.load(path, mmap_mode="r")`` opens.

Per shard: ``NAME.images.npy`` (N x H x W x C), ``NAME.labels.npy`` (N, int64),
``NAME.keys.npy`` (N, fixed-width unicode) and ``NAME.crc32.npy`` (N, uint32). Encoded images
(jpeg, png) replace the images file with a variable-length field: ``NAME.images.bytes.npy`` (flat
uint8) and ``NAME.images.offsets.npy`` (N + 1, int64). Text fields are variable-length fields too:
``NAME.text.bytes.npy`` and ``NAME.text.offsets.npy`` (likewise ``json``); a text-only shard has no
images file. Raw images of varying sizes (``--resize none``) are a variable-length field of their
pixels' bytes with ``NAME.images.shapes.npy`` (N x 3, int64) beside it. Images are streamed to disk
as they arrive (see ``varlen.NpyStream``).

A token shard (format version 8, ``packer.spec.token_blocks``) is ``NAME.tokens.npy`` (its token
stream), ``NAME.blocks.npy`` (N x 2 uint32: each block's start and length in it) and
``NAME.documents.npy`` (uint32: where each document, or the piece of one, starts in it).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import ClassVar, Iterator, Optional

import numpy as np

from packer.formats.base import encoded_bytes
from packer.formats.varlen import NpyStream, NpyVarlenWriter, iter_varlen, varlen_images
from packer.records import Sample, StoredSample
from packer.spec.codecs import raw_bytes
from packer.spec.manifest import ShardEntry
from packer.spec.sample_layout import ImageStorage, SampleLayout, choose
from packer.spec.shard_names import (
    NPY_CRC32,
    NPY_IMAGE_SHAPES,
    NPY_IMAGES,
    NPY_KEYS,
    NPY_LABELS,
    npy_varlen_suffixes,
)
from packer.spec.token_blocks import POSITION_DTYPE
from packer.spec.token_shards import npy_token_files

SUFFIXES = (NPY_IMAGES, NPY_LABELS, NPY_KEYS, NPY_CRC32)


class _FixedImages:
    """Raw images of one shape: ``NAME.images.npy`` (N x H x W x C), streamed to disk as rows arrive."""

    def __init__(self, directory: Path, shard: str, layout: SampleLayout, capacity: int) -> None:
        self.layout, self.name = layout, f"{shard}{NPY_IMAGES}"
        self._stream = NpyStream(directory / self.name, layout.np_dtype, layout.shape, capacity)
        self._count = 0

    def add(self, sample: Sample) -> None:
        self.layout.check_image(sample.image)
        self._stream.write(np.ascontiguousarray(sample.image, dtype=self.layout.np_dtype).data)
        self._count += 1

    def close(self, digests: dict[str, str]) -> list[str]:
        self._stream.close(self._count)
        if self._stream.sha256 is not None:
            digests[self.name] = self._stream.sha256
        return [self.name]


class _EncodedImages:
    """JPEG/PNG bytes: the variable-length field ``images``; when their sizes vary,
    ``NAME.images.shapes.npy`` (N x 3 int64) beside it."""

    def __init__(self, directory: Path, shard: str, layout: SampleLayout, capacity: int) -> None:
        self.layout, self.directory, self.shard = layout, directory, shard
        self._bytes = NpyVarlenWriter(directory, shard, "images")
        self._shapes: Optional[list[tuple[int, ...]]] = [] if layout.sizes_indexed else None

    def add(self, sample: Sample) -> None:
        self.layout.check_image(sample.image)
        self._bytes.add(encoded_bytes(sample, self.layout))
        if self._shapes is not None:
            self._shapes.append(sample.image.shape)

    def close(self, digests: dict[str, str]) -> list[str]:
        names = self._bytes.close()
        if self._shapes is not None:
            names.append(f"{self.shard}{NPY_IMAGE_SHAPES}")
            np.save(self.directory / names[-1], np.asarray(self._shapes, np.int64).reshape(-1, 3), allow_pickle=False)
        return names


class _VariableImages:
    """Raw images of their own sizes: the variable-length field ``images`` of their pixels' bytes,
    and ``NAME.images.shapes.npy`` (N x 3 int64)."""

    def __init__(self, directory: Path, shard: str, layout: SampleLayout, capacity: int) -> None:
        self.layout, self.directory, self.shard = layout, directory, shard
        self._bytes = NpyVarlenWriter(directory, shard, "images")
        self._shapes: list[tuple[int, ...]] = []

    def add(self, sample: Sample) -> None:
        self.layout.check_image(sample.image)
        self._bytes.add(raw_bytes(sample.image, self.layout.np_dtype))
        self._shapes.append(sample.image.shape)

    def close(self, digests: dict[str, str]) -> list[str]:
        names = self._bytes.close() + [f"{self.shard}{NPY_IMAGE_SHAPES}"]
        np.save(self.directory / names[-1], np.asarray(self._shapes, np.int64).reshape(-1, 3), allow_pickle=False)
        return names


_IMAGES = {
    ImageStorage.FIXED: _FixedImages,
    ImageStorage.ENCODED: _EncodedImages,
    ImageStorage.VARIABLE: _VariableImages,
    ImageStorage.NONE: None,
}


class NpyWriter:
    """Writes one shard as four ``.npy`` files (five with encoded images)."""

    name: ClassVar[str] = "npy"

    def __init__(self, directory: Path, shard: str, layout: SampleLayout, capacity: int) -> None:
        self.directory, self.shard, self.layout = Path(directory), shard, layout
        self.names = [f"{shard}{suffix}" for suffix in SUFFIXES[1:]]
        images = choose(layout, _IMAGES, self.name)
        self._images = images(self.directory, shard, layout, capacity) if images is not None else None
        self._text = {f.name: NpyVarlenWriter(self.directory, shard, f.name) for f in layout.text}
        self.labels: list[int] = []
        self.keys: list[str] = []
        self.crcs: list[int] = []
        self.digests: dict[str, str] = {}

    def add(self, sample: Sample) -> None:
        """Append one sample (its image must have the layout's shape) with its label and key."""
        if self._images is not None:
            self._images.add(sample)
        for name, writer in self._text.items():
            writer.add(sample.fields[name])
        self.labels.append(sample.label)
        self.keys.append(sample.key)
        self.crcs.append(sample.crc32)

    def close(self) -> list[str]:
        """Finish the images and text fields and write labels, keys and checksums."""
        files = self._images.close(self.digests) if self._images is not None else []
        for writer in self._text.values():
            files += writer.close()
        keys = np.asarray(self.keys, dtype=str) if self.keys else np.zeros(0, dtype="<U1")
        arrays = (np.asarray(self.labels, np.int64), keys, np.asarray(self.crcs, np.uint32))
        for name, array in zip(self.names, arrays):
            np.save(self.directory / name, array, allow_pickle=False)
        return files + self.names


class NpyTokenWriter:
    """One npy token shard: ``write`` its stream's ids in order (``tokens`` of them in all), then
    ``close`` with its blocks and document starts. ``digests`` holds the token file's SHA-256, taken
    as it is written."""

    def __init__(self, directory: Path, shard: str, dtype: np.dtype, tokens: int) -> None:
        self.directory = Path(directory)
        self.names = npy_token_files(shard)
        self._stream = NpyStream(self.directory / self.names[0], np.dtype(dtype).newbyteorder("<"), (), tokens)
        self._count = 0
        self.digests: dict[str, str] = {}

    def write(self, ids: np.ndarray) -> None:
        """Append ids to the stream."""
        self._stream.write(np.ascontiguousarray(ids, dtype=self._stream.dtype).data)
        self._count += len(ids)

    def close(self, spans: np.ndarray, documents: np.ndarray) -> list[str]:
        """Finish the shard with its blocks' ``(start, length)`` and its document starts; its file names."""
        self._stream.close(self._count)
        if self._stream.sha256 is not None:
            self.digests[self.names[0]] = self._stream.sha256
        for name, values in zip(self.names[1:], (spans, documents)):
            np.save(self.directory / name, np.asarray(values).astype(POSITION_DTYPE), allow_pickle=False)
        return list(self.names)


def scan_shard(directory: Path, shard: ShardEntry, layout: SampleLayout, start: int = 0) -> Iterator[StoredSample]:
    """Every sample of one shard from sample ``start`` on, in order, read with numpy alone (encoded
    images as their bytes, the text fields as theirs).

    A truncated images file yields the samples it still holds, then fails naming the first missing.
    """
    labels, keys, crcs = (np.load(directory / shard.file(s), mmap_mode="r", allow_pickle=False) for s in SUFFIXES[1:])
    if not len(labels) == len(keys) == len(crcs) == shard.samples:
        raise ValueError(
            f"{shard.name}: {len(labels)} labels, {len(keys)} keys, {len(crcs)} checksums; "
            f"the manifest says {shard.samples}"
        )
    streams = {f.name: _varlen(directory, shard, f.name, start) for f in layout.text}
    images = _scan_images(directory, shard, layout, start)
    for i in range(start, shard.samples):
        pixels, data, shape = next(images)
        fields = {name: next(stream) for name, stream in streams.items()}
        yield StoredSample(i, str(keys[i]), int(labels[i]), pixels, int(crcs[i]), data, fields, shape)


def scan_index(directory: Path, shard: ShardEntry, layout: SampleLayout) -> tuple[list[str], np.ndarray]:
    """The keys and stored CRC-32s of a shard's samples, read without any image."""
    keys, crcs = (np.load(directory / shard.file(s), allow_pickle=False) for s in (NPY_KEYS, NPY_CRC32))
    return [str(k) for k in keys], crcs.astype(np.int64)


def _scan_images(directory: Path, shard: ShardEntry, layout: SampleLayout, start: int = 0) -> Iterator[tuple]:
    """``(pixels, encoded bytes, recorded shape)`` of each sample of a shard (any None), as its layout stores them."""
    if layout.image is ImageStorage.NONE:
        return itertools.repeat((None, None, None))
    if layout.image is ImageStorage.FIXED:
        return _rows(directory, shard, start)
    shapes = None
    if _has_shapes(shard, layout):
        shapes = np.load(directory / shard.file(NPY_IMAGE_SHAPES), allow_pickle=False)
    return varlen_images(_varlen(directory, shard, "images", start), layout, shapes, shard.name, start)


def _has_shapes(shard: ShardEntry, layout: SampleLayout) -> bool:
    """Whether the shard has ``NAME.images.shapes.npy``: raw images of varying size, and encoded ones
    written at format version 6 (older shards have none)."""
    return layout.image is ImageStorage.VARIABLE or (
        layout.sizes_indexed and any(f.path.endswith(NPY_IMAGE_SHAPES) for f in shard.files)
    )


def _rows(directory: Path, shard: ShardEntry, start: int = 0) -> Iterator[tuple]:
    """``(pixels, None)`` of each sample of an images file of one shape, from ``start`` on; a cut file
    fails at its end."""
    rows = _complete_rows(directory / shard.file(NPY_IMAGES))
    for i in range(start, shard.samples):
        if i >= len(rows):
            raise ValueError(f"{shard.file(NPY_IMAGES)} is truncated: it ends before sample {i}")
        yield np.asarray(rows[i]), None, None


def _varlen(directory: Path, shard: ShardEntry, field: str, start: int = 0) -> Iterator[bytes]:
    """The bytes of each sample of variable-length field ``field`` from ``start`` on, read from its two files."""
    data, offsets = npy_varlen_suffixes(field)
    flat = _complete_rows(directory / shard.file(data), ndim=1)
    return iter_varlen(
        flat, np.load(directory / shard.file(offsets), allow_pickle=False), shard.samples, shard.file(data), start
    )


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
        raise ValueError(
            f"{path.name} holds {dtype} {shape}{' in Fortran order' if fortran else ''}, not a packer {what}"
        )
    row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    available = (path.stat().st_size - offset) // row if row else shape[0]
    rows = min(shape[0], available)
    if rows == 0:
        return np.zeros((0, *shape[1:]), dtype)
    order = "F" if fortran else "C"
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(rows, *shape[1:]), order=order)
