"""Variable-length fields, one mechanism for the npy and hdf5 formats.

A field whose samples differ in size is stored as one flat uint8 array of every sample's bytes,
concatenated in sample order, plus an int64 array of N + 1 offsets: sample ``i`` is
``flat[offsets[i]:offsets[i + 1]]``. Both arrays open with the stock library alone (``np.load(path,
mmap_mode="r")``, h5py). Nothing here knows what the bytes are: encoded images today; text, or
images of varying shapes, can use it as they are.

Also here: ``NpyStream``, the ``.npy`` file that grows as rows arrive, which the npy format uses
for fixed-size images as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from packer.formats.base import HashedFile
from packer.spec.codecs import npy_header, raw_image
from packer.spec.sample_layout import ImageStorage, SampleLayout
from packer.spec.shard_names import hdf5_varlen_names, npy_varlen_suffixes

CHUNK_BYTES = 64 * 1024
"""HDF5 chunk of a flat array. Reading one sample reads every chunk it touches: with 8-20 KB
samples, 1 MiB chunks made a random read several times slower than 64 KiB ones, and smaller
chunks gained nothing."""

BUFFER_BYTES = 1024**2  # bytes buffered per HDF5 write: h5py's per-call overhead dominates small writes


class NpyStream:
    """A standard ``.npy`` file of ``dtype`` rows of ``row_shape``, written as rows arrive.

    The header is written first for ``capacity`` rows and rewritten with the real count at close:
    numpy pads npy headers so the first axis can grow to any count without moving the data. The
    bytes are hashed as they are written; when the header keeps its count, that is the file's
    SHA-256 (``sha256``), and nobody has to read the file back for it.
    """

    def __init__(self, path: Path, dtype: np.dtype | str, row_shape: tuple[int, ...] = (), capacity: int = 0) -> None:
        self.dtype, self.row_shape = np.dtype(dtype), tuple(row_shape)
        self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize
        self.capacity = capacity
        self.sha256: Optional[str] = None
        """Hex SHA-256 of the file once closed with ``capacity`` rows; None otherwise."""
        # Without a capacity the header is rewritten at close, so a hash of the bytes as written
        # would be of no use: it is not taken.
        self._f = HashedFile(path, hashing=capacity > 0)
        self.write(self._header(capacity))
        self._data_start = self._f.file.tell()

    def _header(self, rows: int) -> bytes:
        return npy_header(self.dtype.str, (rows, *self.row_shape))

    def write(self, data) -> None:
        """Append whole rows given as bytes or any buffer."""
        self._f.write(data)

    def close(self, rows: int) -> None:
        """Fix the header to ``rows`` rows and close."""
        header = self._header(rows)
        if len(header) != self._data_start:  # cannot happen with numpy's padded headers
            raise RuntimeError("npy header changed length; refusing to write a corrupt file")
        f = self._f.file
        if self._f.hashing and rows == self.capacity and f.tell() == self._data_start + rows * self.row_bytes:
            self.sha256 = self._f.hexdigest()  # the header as written, every row there
        else:
            f.seek(0)
            f.write(header)
            f.truncate(self._data_start + rows * self.row_bytes)
        f.close()


class NpyVarlenWriter:
    """One variable-length field of an npy shard: ``NAME.FIELD.bytes.npy`` (flat uint8, streamed to
    disk) and ``NAME.FIELD.offsets.npy`` (int64, N + 1, written at close)."""

    def __init__(self, directory: Path, shard: str, field: str) -> None:
        self.directory = Path(directory)
        self.names = [f"{shard}{suffix}" for suffix in npy_varlen_suffixes(field)]
        self._flat = NpyStream(self.directory / self.names[0], np.uint8)
        self.offsets = [0]

    def add(self, data: bytes) -> None:
        """Append one sample's bytes."""
        self._flat.write(data)
        self.offsets.append(self.offsets[-1] + len(data))

    def close(self) -> list[str]:
        """Finish both files; returns their names."""
        self._flat.close(self.offsets[-1])
        np.save(self.directory / self.names[1], np.asarray(self.offsets, np.int64), allow_pickle=False)
        return list(self.names)


class Hdf5VarlenWriter:
    """One variable-length field in an open HDF5 file: datasets ``FIELD_bytes`` (flat uint8, chunked,
    grown as samples arrive) and ``FIELD_offsets`` (int64, N + 1, written at close)."""

    def __init__(self, file, field: str) -> None:
        self.names = hdf5_varlen_names(field)
        self._file = file
        self._flat = file.create_dataset(
            self.names[0], shape=(0,), maxshape=(None,), dtype=np.uint8, chunks=(CHUNK_BYTES,), track_times=False
        )
        self._pending = bytearray()
        self.offsets = [0]

    def add(self, data: bytes) -> None:
        """Append one sample's bytes (buffered; written in blocks of about a megabyte)."""
        self._pending += data
        self.offsets.append(self.offsets[-1] + len(data))
        if len(self._pending) >= BUFFER_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        start = self._flat.shape[0]
        self._flat.resize(start + len(self._pending), axis=0)
        self._flat[start:] = np.frombuffer(self._pending, np.uint8)
        self._pending = bytearray()

    def close(self) -> None:
        """Write what is buffered and the offsets (the file stays open)."""
        self._flush()
        self._file.create_dataset(self.names[1], data=np.asarray(self.offsets, np.int64), track_times=False)


def iter_varlen(flat: Any, offsets: np.ndarray, count: int, where: str, start: int = 0) -> Iterator[bytes]:
    """The bytes of each of ``count`` samples of a flat array (numpy or h5py) and its offsets.

    ValueError naming ``where`` when the offsets are not N + 1 non-decreasing values from 0, or at
    the first sample that lies beyond the end of ``flat`` (a truncated file yields what it holds).
    """
    offsets = np.asarray(offsets)
    if flat.dtype != np.uint8:
        raise ValueError(f"{where} holds {flat.dtype}, not the uint8 bytes of a variable-length field")
    if offsets.shape != (count + 1,) or offsets.dtype.kind not in "iu":
        raise ValueError(f"{where}: offsets are {offsets.dtype} {offsets.shape}, expected {count + 1} integers")
    if count and (offsets[0] != 0 or np.any(np.diff(offsets) < 0)):
        raise ValueError(f"{where}: offsets do not start at 0 and grow; the shard is damaged")
    for i in range(start, count):
        begin, end = int(offsets[i]), int(offsets[i + 1])
        if end > len(flat):
            raise ValueError(f"{where} is truncated: it ends before sample {i}")
        yield bytes(flat[begin:end])


def varlen_images(
    stream: Iterator[bytes], layout: SampleLayout, shapes: Optional[np.ndarray], where: str, start: int = 0
) -> Iterator[tuple[Optional[np.ndarray], Optional[bytes], Optional[tuple[int, ...]]]]:
    """``(pixels, encoded bytes, recorded shape)`` of each sample of an image field stored as a
    variable-length field: encoded images as their bytes (with the (H, W, C) ``shapes`` records, if
    any), raw images of their own sizes rebuilt with ``shapes``."""
    encoded = layout.image is not ImageStorage.VARIABLE
    for i, data in enumerate(stream, start):
        shape = tuple(int(v) for v in shapes[i]) if shapes is not None and i < len(shapes) else None
        if encoded:
            yield None, data, shape
        else:
            yield raw_image(data, layout.dtype, shapes[i], where), None, shape
