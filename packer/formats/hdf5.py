"""HDF5 shards: one ``NAME.h5`` file per shard with one dataset per field.

Datasets: ``images`` (N x H x W x C, chunked one sample per chunk for random access),
``labels`` (N, int64), ``crc32`` (N, uint32), and the keys as a variable-length field of their
UTF-8 bytes (``keys_bytes``, ``keys_offsets``; format versions 1 to 3 held ``keys``, N UTF-8
strings, which HDF5 keeps in its global heap, where one damaged length made libhdf5 loop forever). Encoded images (jpeg,
png) replace ``images`` with a variable-length field: ``images_bytes`` (flat uint8) and
``images_offsets`` (N + 1, int64); text fields are variable-length fields too (``text_bytes`` and
``text_offsets``, likewise ``json``), and text-only shards have no ``images``. Raw images of varying
sizes (``--resize none``) are a variable-length field of their pixels' bytes with ``images_shapes``
(N x 3, int64).
Timestamps are off so equal inputs give byte-identical files.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import ClassVar, Iterator, Optional

import h5py
import numpy as np

from packer.formats.base import TokenBuffer, encoded_bytes
from packer.formats.varlen import Hdf5VarlenWriter, iter_varlen, varlen_images
from packer.records import Sample, StoredSample
from packer.spec.codecs import raw_bytes
from packer.spec.manifest import ShardEntry
from packer.spec.sample_layout import ImageStorage, SampleLayout, choose
from packer.spec.shard_names import (
    HDF5_BLOCKS,
    HDF5_CRC32,
    HDF5_DOCUMENTS,
    HDF5_IMAGE_SHAPES,
    HDF5_IMAGES,
    HDF5_KEY_BYTES,
    HDF5_KEY_OFFSETS,
    HDF5_KEYS,
    HDF5_LABELS,
    HDF5_SUFFIX,
    HDF5_TOKENS,
    hdf5_varlen_names,
)
from packer.spec.token_blocks import POSITION_DTYPE

BATCH = 64  # samples buffered per write: h5py's per-call overhead dominates single-sample writes


class _FixedImages:
    """Raw images of one shape: dataset ``images`` (N x H x W x C, one sample per chunk), written
    ``BATCH`` samples at a time."""

    def __init__(self, file: h5py.File, layout: SampleLayout) -> None:
        self.layout = layout
        self._images = file.create_dataset(
            HDF5_IMAGES,
            shape=(0, *layout.shape),
            maxshape=(None, *layout.shape),
            dtype=layout.dtype,
            chunks=(1, *layout.shape),
            track_times=False,
        )
        self._batch = np.empty((BATCH, *layout.shape), dtype=layout.dtype)
        self._pending = 0

    def add(self, sample: Sample) -> None:
        self.layout.check_image(sample.image)
        if self._pending == BATCH:  # a full batch goes out before the next sample, after the last one's fields
            self._flush()
        self._batch[self._pending] = sample.image
        self._pending += 1

    def _flush(self) -> None:
        if not self._pending:
            return
        start = self._images.shape[0]
        self._images.resize(start + self._pending, axis=0)
        self._images[start:] = self._batch[: self._pending]
        self._pending = 0

    def close(self) -> None:
        self._flush()


class _EncodedImages:
    """JPEG/PNG bytes: the variable-length field ``images`` (``images_bytes``, ``images_offsets``)."""

    def __init__(self, file: h5py.File, layout: SampleLayout) -> None:
        self.layout, self._file = layout, file
        self._bytes = Hdf5VarlenWriter(file, "images")
        self._shapes: Optional[list[tuple[int, ...]]] = [] if layout.sizes_indexed else None

    def add(self, sample: Sample) -> None:
        self.layout.check_image(sample.image)
        self._bytes.add(encoded_bytes(sample, self.layout))
        if self._shapes is not None:
            self._shapes.append(sample.image.shape)

    def close(self) -> None:
        self._bytes.close()
        if self._shapes is not None:  # their sizes vary: (H, W, C) of each, apart from the bytes
            shapes = np.asarray(self._shapes, np.int64).reshape(-1, 3)
            self._file.create_dataset(HDF5_IMAGE_SHAPES, data=shapes, track_times=False)


class _VariableImages:
    """Raw images of their own sizes: the variable-length field ``images`` of their pixels' bytes,
    and ``images_shapes`` (N x 3 int64)."""

    def __init__(self, file: h5py.File, layout: SampleLayout) -> None:
        self.layout, self._file = layout, file
        self._bytes = Hdf5VarlenWriter(file, "images")
        self._shapes: list[tuple[int, ...]] = []

    def add(self, sample: Sample) -> None:
        self.layout.check_image(sample.image)
        self._bytes.add(raw_bytes(sample.image, self.layout.np_dtype))
        self._shapes.append(sample.image.shape)

    def close(self) -> None:
        self._bytes.close()
        shapes = np.asarray(self._shapes, np.int64).reshape(-1, 3)
        self._file.create_dataset(HDF5_IMAGE_SHAPES, data=shapes, track_times=False)


_IMAGES = {
    ImageStorage.FIXED: _FixedImages,
    ImageStorage.ENCODED: _EncodedImages,
    ImageStorage.VARIABLE: _VariableImages,
    ImageStorage.NONE: None,
}


class Hdf5Writer:
    """Writes one shard as an HDF5 file."""

    name: ClassVar[str] = "hdf5"

    def __init__(self, directory: Path, shard: str, layout: SampleLayout, capacity: int) -> None:
        self.file_name = f"{shard}{HDF5_SUFFIX}"
        self.layout = layout
        images = choose(layout, _IMAGES, self.name)
        self._file = h5py.File(Path(directory) / self.file_name, "w", track_order=False)
        self._text = {f.name: Hdf5VarlenWriter(self._file, f.name) for f in layout.text}
        self._images = images(self._file, layout) if images is not None else None
        self._keys = bytearray()  # every key's UTF-8 bytes: written whole at close, not chunked
        self.key_offsets = [0]
        self.labels: list[int] = []
        self.crcs: list[int] = []
        self.digests: dict[str, str] = {}  # none: HDF5 does not write the file in order

    def add(self, sample: Sample) -> None:
        """Buffer one sample; full buffers go to the file in one write."""
        if self._images is not None:
            self._images.add(sample)
        for name, writer in self._text.items():
            writer.add(sample.fields[name])
        self._keys += sample.key.encode("utf-8")
        self.key_offsets.append(len(self._keys))
        self.labels.append(sample.label)
        self.crcs.append(sample.crc32)

    def close(self) -> list[str]:
        """Write labels, keys and checksums and close the file."""
        if self._images is not None:
            self._images.close()
        for writer in self._text.values():
            writer.close()
        self._file.create_dataset(HDF5_LABELS, data=np.asarray(self.labels, dtype=np.int64), track_times=False)
        self._file.create_dataset(HDF5_CRC32, data=np.asarray(self.crcs, dtype=np.uint32), track_times=False)
        self._file.create_dataset(HDF5_KEY_BYTES, data=np.frombuffer(self._keys, np.uint8), track_times=False)
        self._file.create_dataset(HDF5_KEY_OFFSETS, data=np.asarray(self.key_offsets, np.int64), track_times=False)
        self._file.close()
        return [self.file_name]


class Hdf5TokenWriter(TokenBuffer):
    """One HDF5 token shard ``NAME.h5``: datasets ``tokens`` (its stream, 1-D and contiguous, so that a
    reader may also map it), ``blocks`` (N x 2 uint32: each block's start and length in it) and
    ``documents`` (uint32: where each document, or the piece of one, starts)."""

    def __init__(self, directory: Path, shard: str, dtype: np.dtype, tokens: int) -> None:
        super().__init__(dtype, tokens)
        self.path = Path(directory) / f"{shard}{HDF5_SUFFIX}"

    def close(self, spans: np.ndarray, documents: np.ndarray) -> list[str]:
        """Write the shard's file; its name."""
        with h5py.File(self.path, "w", track_order=False) as f:
            f.create_dataset(HDF5_TOKENS, data=self.stream, track_times=False)
            f.create_dataset(HDF5_BLOCKS, data=np.asarray(spans).astype(POSITION_DTYPE), track_times=False)
            f.create_dataset(HDF5_DOCUMENTS, data=np.asarray(documents).astype(POSITION_DTYPE), track_times=False)
        return [self.path.name]


def scan_shard(directory: Path, shard: ShardEntry, layout: SampleLayout, start: int = 0) -> Iterator[StoredSample]:
    """Every sample of one shard from sample ``start`` on, in order, read with h5py alone (encoded
    images as their bytes, the text fields as theirs)."""
    with h5py.File(directory / shard.file(HDF5_SUFFIX), "r") as f:
        labels, keys, crcs = f[HDF5_LABELS][:], read_keys(f, shard.name), f[HDF5_CRC32][:]
        if not len(labels) == len(keys) == len(crcs) == shard.samples:
            raise ValueError(
                f"{shard.name}: {len(labels)} labels, {len(keys)} keys, {len(crcs)} checksums; "
                f"the manifest says {shard.samples}"
            )
        streams = {t.name: _varlen(f, shard, t.name, start) for t in layout.text}
        images = _scan_images(f, shard, layout, start)
        for i in range(start, shard.samples):
            pixels, data, shape = next(images)
            fields = {name: next(stream) for name, stream in streams.items()}
            yield StoredSample(i, str(keys[i]), int(labels[i]), pixels, int(crcs[i]), data, fields, shape)


def scan_index(directory: Path, shard: ShardEntry, layout: SampleLayout) -> tuple[list[str], np.ndarray]:
    """The keys and stored CRC-32s of a shard's samples, read without any image."""
    with h5py.File(directory / shard.file(HDF5_SUFFIX), "r") as f:
        return read_keys(f, shard.name), f[HDF5_CRC32][:].astype(np.int64)


def read_keys(f: h5py.File, where: str) -> list[str]:
    """Every key of an open shard: from the UTF-8 bytes field (format version 4 on), else from the
    strings dataset ``keys`` of earlier versions."""
    if HDF5_KEY_BYTES not in f:
        return list(f[HDF5_KEYS].asstr()[:])
    offsets = f[HDF5_KEY_OFFSETS][:]
    return [b.decode("utf-8") for b in iter_varlen(f[HDF5_KEY_BYTES][:], offsets, len(offsets) - 1, where)]


def _scan_images(f: h5py.File, shard: ShardEntry, layout: SampleLayout, start: int = 0) -> Iterator[tuple]:
    """``(pixels, encoded bytes, recorded shape)`` of each sample of a shard (any None), as its layout stores them."""
    if layout.image is ImageStorage.NONE:
        return itertools.repeat((None, None, None))
    if layout.image is ImageStorage.FIXED:
        images = f[HDF5_IMAGES]
        if len(images) != shard.samples:
            raise ValueError(f"{shard.name}: {len(images)} images; the manifest says {shard.samples}")
        return ((images[i], None, None) for i in range(start, shard.samples))
    shapes = f[HDF5_IMAGE_SHAPES][:] if layout.sizes_indexed and HDF5_IMAGE_SHAPES in f else None
    if layout.image is ImageStorage.VARIABLE and shapes is None:
        raise ValueError(f"{shard.name}: no {HDF5_IMAGE_SHAPES} for its raw images of varying size")
    return varlen_images(_varlen(f, shard, "images", start), layout, shapes, shard.name, start)


def _varlen(f: h5py.File, shard: ShardEntry, field: str, start: int = 0) -> Iterator[bytes]:
    """The bytes of each sample of variable-length field ``field``, from its two datasets."""
    data, offsets = hdf5_varlen_names(field)
    return iter_varlen(f[data], f[offsets][:], shard.samples, f"{shard.name} {data}", start)
