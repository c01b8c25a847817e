"""A read-only binary file over a ``RangeSource``, for libraries that take a file object (h5py reads
an HDF5 shard in a bucket through it): each read served from the source's blocks, fetched when no
cache holds them (``readers.remote.ranges``)."""

from __future__ import annotations

import io
from typing import Any

from readers.remote.ranges import RangeSource


class RangeFile(io.RawIOBase):
    """A read-only binary file over a RangeSource, for libraries that take a file object (h5py):
    each read served from the blocks, fetched when no cache holds them."""

    def __init__(self, source: RangeSource) -> None:
        super().__init__()
        self.source, self.at = source, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.at, io.SEEK_END: self.source.size}[whence]
        self.at = max(0, base + int(offset))
        return self.at

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self.source.size, self.at + len(view))
        if end <= self.at:
            return 0
        data = self.source.read(self.at, end)
        view[: len(data)] = data
        self.at = end
        return len(data)


__all__ = ["RangeFile"]
