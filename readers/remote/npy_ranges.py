"""An ``.npy`` file at a URL read by byte ranges: its header once, then only the rows asked for; or
any file as flat bytes (an HDF5 file's chunks, at the offsets HDF5's index gives)."""

from __future__ import annotations

import io
from typing import Union

import numpy as np

from packer.spec.errors import ManifestError
from readers.remote.ranges import RangeSource

_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


class RemoteArray:
    """The array of an ``.npy`` file read by ranges (``RangeSource``): ``a[i]`` is row ``i``,
    ``a[i:j]`` rows ``i`` to ``j`` (of a flat uint8 array: those bytes), each a read-only array of
    what arrived. ``span(i, j)`` gives the file's bytes of rows ``i`` to ``j``, for a batch's fetch.
    With ``flat``, the file has no header: it is read as its own bytes, a uint8 array of its size."""

    def __init__(self, source: RangeSource, flat: bool = False) -> None:
        self.source = source
        if flat:
            self.shape, self.dtype, self.offset, self.row_bytes = (source.size,), np.dtype(np.uint8), 0, 1
            return
        head = io.BytesIO(source.read(0, min(source.size, source.block)))
        try:
            version = np.lib.format.read_magic(head)
            if version not in _HEADERS:
                raise ValueError(f"npy format version {version} (packer writes 1.0)")
            shape, fortran, dtype = _HEADERS[version](head)
        except ValueError as e:
            raise ManifestError(f"{source.url} is not an .npy file packer can read by ranges: {e}") from None
        if fortran or dtype.hasobject:
            raise ManifestError(f"{source.url} holds a Fortran-order or object array, which packer never writes")
        self.shape: tuple[int, ...] = shape
        self.dtype: np.dtype = dtype
        self.offset = head.tell()
        self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        if self.offset + self.row_bytes * (shape[0] if shape else 1) != source.size:
            raise ManifestError(
                f"{source.url}: its header describes {shape} {dtype}, not the file's {source.size} bytes"
            )

    def __len__(self) -> int:
        return self.shape[0]

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The file's bytes ``[a, b)`` of rows ``start`` to ``end``."""
        return self.offset + int(start) * self.row_bytes, self.offset + int(end) * self.row_bytes

    def __getitem__(self, key: Union[int, np.integer, slice]) -> np.ndarray:
        if isinstance(key, slice):
            start, end, step = key.indices(len(self))
            if step != 1:
                raise IndexError("a RemoteArray is read by contiguous rows: no step")
            end = max(start, end)
            rows = np.frombuffer(self.source.read(*self.span(start, end)), self.dtype)
            return rows.reshape((end - start, *self.shape[1:]))
        index = int(key)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"row {key} of {self.source.url}, which has {len(self)}")
        return np.frombuffer(self.source.read(*self.span(index, index + 1)), self.dtype).reshape(self.shape[1:])
