"""Text records (a discovery's relative paths) held in small zlib-compressed blocks.

A discovery of N files held their relative paths as one UTF-8 buffer and N int64 end offsets:
about 23 bytes a file of the parent's memory for paths like ``c042/0012345.jpg``, ~2.3 GB at 10^8
files before any worker starts (docs/BENCHMARKS.md, the scale benchmark). Sorted paths repeat
most of their neighbours' bytes, so blocks of ``BLOCK`` records compress to 2-4 bytes a path for
class-folder trees (a random hex name keeps its ~16 bytes of entropy). Sequential reads decompress
each block once; a random read decompresses one block (a few microseconds), which is what a
shuffled plan's shards pay per item.

A block is ``zlib(lengths as little-endian uint32 x n, then the n records' UTF-8 bytes)``; blocks
hold up to ``BLOCK`` records (fewer where two listings were joined), and ``rows`` gives each
block's cumulative record count, so joining listings never recompresses them.
"""

from __future__ import annotations

import bisect
import struct
import zlib
from array import array
from itertools import accumulate
from typing import Iterable, Iterator, Sequence

import numpy as np

BLOCK = 64
"""Records per block: ~2.5 bytes a path on class-folder trees against ~2 with 256, while a random
read decompresses a quarter of the bytes."""

_LEVEL = 1  # level 6 saves ~5% of the bytes for 1.5x the time, in the walk that workers wait for


def _pack(records: Sequence[bytes]) -> bytes:
    return zlib.compress(struct.pack(f"<{len(records)}I", *map(len, records)) + b"".join(records), _LEVEL)


class RecordBlocks:
    """Records in compressed blocks (see the module docstring), appended with ``add``, read by
    position; a read seals the records added since the last block into a block of their own."""

    __slots__ = ("data", "ends", "rows", "_open", "_cache", "__weakref__")

    def __init__(self) -> None:
        self.data: bytes | bytearray = bytearray()  # the blocks back to back
        self.ends = array("q")  # each block's end in data
        self.rows = array("q")  # records in the blocks up to and including each one
        self._open: list[bytes] = []  # records not yet in a block
        self._cache: tuple[int, list[str]] = (-1, [])  # the block read last, decoded

    @classmethod
    def from_arrays(cls, data: bytes | bytearray, ends: np.ndarray, rows: np.ndarray) -> "RecordBlocks":
        """Blocks written by ``arrays`` (``packer.sources.saved_discovery``); ValueError if they do not fit."""
        out = cls()
        ends, rows = np.asarray(ends, np.int64), np.asarray(rows, np.int64)
        steps = (np.diff(ends, prepend=0), np.diff(rows, prepend=0)) if ends.ndim == 1 and len(ends) else ()
        if (
            ends.ndim != 1
            or ends.shape != rows.shape
            or (int(ends[-1]) if len(ends) else 0) != len(data)
            or any(int(s.min()) <= 0 for s in steps)
        ):
            raise ValueError("the record blocks' arrays do not match")
        out.data = data  # made a bytearray by the first block appended (a loaded one is never added to)
        out.ends.frombytes(ends.tobytes())
        out.rows.frombytes(rows.tobytes())
        return out

    def arrays(self) -> tuple[bytearray, np.ndarray, np.ndarray]:
        """(blocks, their byte ends, their cumulative record counts): what ``from_arrays`` takes."""
        self.seal()
        return self.data, np.frombuffer(self.ends, np.int64).copy(), np.frombuffer(self.rows, np.int64).copy()

    def __len__(self) -> int:
        return (self.rows[-1] if self.rows else 0) + len(self._open)

    @property
    def nbytes(self) -> int:
        """Bytes held (blocks and their bounds, not the records still open)."""
        return len(self.data) + 16 * len(self.ends)

    # writing ------------------------------------------------------------------------------------
    def add(self, record: bytes) -> None:
        """Append one record (UTF-8 bytes)."""
        self._open.append(record)
        if len(self._open) == BLOCK:
            self.seal()

    def add_all(self, records: Iterable[bytes]) -> None:
        """Append each of ``records``."""
        for r in records:
            self.add(r)

    def seal(self) -> None:
        """Close the records added since the last block into a block."""
        if self._open:
            self._append_block(_pack(self._open), len(self._open))
            self._open = []

    def extend(self, other: "RecordBlocks", start: int = 0, stop: int | None = None) -> None:
        """Append records ``start:stop`` of ``other``: its whole blocks as they are (no
        recompression), records of blocks cut at either end one by one."""
        other.seal()
        stop = len(other) if stop is None else stop
        i = start
        while i < stop:
            b = other._block_of(i)
            first, last = other._first_row(b), other.rows[b]
            if i == first and last <= stop:
                self.seal()
                self._append_block(bytes(other._compressed(b)), last - first)
                i = last
            else:
                end = min(last, stop)
                self.add_all(s.encode("utf-8") for s in other._decoded(b)[i - first : end - first])
                i = end

    # reading ------------------------------------------------------------------------------------
    def record(self, i: int) -> str:
        """The ``i``-th record."""
        self.seal()
        b = self._block_of(i)
        return self._decoded(b)[i - self._first_row(b)]

    def run(self, start: int, stop: int) -> list[str]:
        """Records ``start:stop``, in order (each block decoded once)."""
        self.seal()
        out: list[str] = []
        i = start
        while i < stop:
            b = self._block_of(i)
            first, last = self._first_row(b), self.rows[b]
            end = min(last, stop)
            out += self._decoded(b)[i - first : end - first]
            i = end
        return out

    def take(self, rows: np.ndarray) -> list[str]:
        """The records at ``rows`` (any order), read in the order of their positions, so that each
        block is decompressed once however the rows are scattered among them."""
        if len(rows) and int(rows[-1]) - int(rows[0]) == len(rows) - 1 and bool((np.diff(rows) == 1).all()):
            return self.run(int(rows[0]), int(rows[-1]) + 1)
        order = np.argsort(rows, kind="stable")
        out: list[str] = [""] * len(rows)
        record = self.record
        for at, row in zip(order.tolist(), rows[order].tolist()):
            out[at] = record(row)
        return out

    def __iter__(self) -> Iterator[str]:
        self.seal()
        for b in range(len(self.rows)):
            yield from self._decoded(b)

    @property
    def blocks(self) -> int:
        """The number of blocks (records still open sealed first)."""
        self.seal()
        return len(self.rows)

    def block(self, b: int) -> list[str]:
        """The records of block ``b``, decoded."""
        self.seal()
        return self._decoded(b)

    # blocks -------------------------------------------------------------------------------------
    def _append_block(self, packed: bytes, count: int) -> None:
        if not isinstance(self.data, bytearray):
            self.data = bytearray(self.data)
        self.data += packed
        self.ends.append(len(self.data))
        self.rows.append((self.rows[-1] if self.rows else 0) + count)

    def _block_of(self, i: int) -> int:
        n = len(self)
        if not 0 <= i < n:
            raise IndexError(f"record {i} of {n}")
        return bisect.bisect_right(self.rows, i)  # the first block whose cumulative count is above i

    def _first_row(self, b: int) -> int:
        return self.rows[b - 1] if b else 0

    def _compressed(self, b: int) -> memoryview:
        return memoryview(self.data)[self.ends[b - 1] if b else 0 : self.ends[b]]

    def _decoded(self, b: int) -> list[str]:
        cached, records = self._cache
        if cached == b:
            return records
        raw = zlib.decompress(self._compressed(b))
        n = self.rows[b] - self._first_row(b)
        lengths = struct.unpack_from(f"<{n}I", raw)
        text = raw[4 * n :].decode("utf-8")
        if text.isascii():  # byte offsets are character offsets
            bounds = [0, *accumulate(lengths)]
            records = [text[a:z] for a, z in zip(bounds, bounds[1:])]
        else:
            body, pos, records = raw[4 * n :], 0, []
            for length in lengths:
                records.append(body[pos : pos + length].decode("utf-8"))
                pos += length
        self._cache = (b, records)
        return records

    def __reduce__(self):
        # Pickled (the walk's pool, spawn, Ray) as its arrays: plain bytes, no object per record.
        data, ends, rows = self.arrays()
        return (RecordBlocks.from_arrays, (bytes(data), ends, rows))
