"""Read-only columns of per-sample values in flat buffers: what a shard's result carries per sample.

A shard's result lists each written sample's key, label and source digest. As Python lists they cost
the parent a string object per key and per digest and an int per label for the whole run
(docs/BENCHMARKS.md, the scale benchmark); as columns they cost the bytes of the values plus 8 bytes
an offset for keys, the 16 bytes a 128-bit digest is for digests, 4 for labels. Every column is a
``Sequence`` equal to the list it holds.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Sequence, overload

import numpy as np


class ValueSequence:
    """Equality with any other such sequence, list or tuple of the same values, as a list has (the
    columns here, ``recorded_columns.RecordedColumn``, ``item_table.ItemTable``); unhashable, like a list."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (ValueSequence, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))  # type: ignore[arg-type]

    __hash__ = None  # type: ignore[assignment]

    def __len__(self) -> int:
        raise NotImplementedError

    def __iter__(self) -> Iterator:
        raise NotImplementedError


class StrColumn(ValueSequence, Sequence[str]):
    """Strings as their UTF-8 bytes back to back: ``offsets`` (N + 1) bound them, or, when every
    string has ``width`` bytes, nothing does."""

    __slots__ = ("blob", "offsets", "width", "count")

    def __init__(self, blob: bytes, offsets: Optional[np.ndarray], width: int = 0, count: int = 0) -> None:
        self.blob, self.offsets, self.width = blob, offsets, width
        self.count = len(offsets) - 1 if offsets is not None else count

    @classmethod
    def of(cls, values: Iterable[str]) -> "StrColumn":
        """The column of ``values`` (a list, or anything iterable of str)."""
        if isinstance(values, StrColumn):
            return values
        encoded = [v.encode("utf-8") if isinstance(v, str) else _not_str(v) for v in values]
        blob = b"".join(encoded)
        widths = {len(e) for e in encoded}
        if len(widths) == 1 and min(widths) > 0:
            return cls(blob, None, widths.pop(), len(encoded))
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        return cls(blob, offsets)

    @classmethod
    def from_joined(cls, joined: str, count: int) -> "StrColumn":
        """The column of ``count`` values joined by NUL (``joined_by_nul``), split in numpy, not one object
        a value (a NUL byte in UTF-8 is only ever the character); ValueError if the count is not there."""
        data = np.frombuffer(joined.encode("utf-8"), np.uint8)
        if count == 0:
            if len(data):
                raise ValueError("values where none were counted")
            return cls(b"", np.zeros(1, np.int64))
        nul = np.flatnonzero(data == 0)
        if len(nul) != count - 1:
            raise ValueError(f"{len(nul) + 1} values where {count} were counted")
        offsets = np.empty(count + 1, np.int64)
        offsets[0], offsets[-1] = 0, len(data) - len(nul)
        offsets[1:-1] = nul - np.arange(len(nul))
        return cls(data[data != 0].tobytes() if len(nul) else data.tobytes(), offsets)

    def __len__(self) -> int:
        return self.count

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.count))]
        if not -self.count <= i < self.count:
            raise IndexError(f"value {i} of a column of {self.count}")
        i %= self.count
        if self.offsets is None:
            return self.blob[i * self.width : (i + 1) * self.width].decode("utf-8")
        return self.blob[int(self.offsets[i]) : int(self.offsets[i + 1])].decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        if self.offsets is None:
            w = self.width
            for a in range(0, self.count * w, w):
                yield self.blob[a : a + w].decode("utf-8")
            return
        bounds = self.offsets.tolist()
        for a, b in zip(bounds, bounds[1:]):
            yield self.blob[a:b].decode("utf-8")

    def __repr__(self) -> str:
        return f"StrColumn({self.count} values)"

    def __reduce__(self):
        return (StrColumn, (self.blob, self.offsets, self.width, self.count))

    def joined_by_nul(self) -> Optional[str]:
        """Every value, NUL between each two, made from the buffer in one pass (no object a value);
        None when a value holds a NUL itself."""
        if b"\0" in self.blob:
            return None
        data = np.frombuffer(self.blob, np.uint8)
        if self.offsets is None:
            if not self.count:
                return ""
            cells = np.zeros((self.count, self.width + 1), np.uint8)
            cells[:, : self.width] = data.reshape(self.count, self.width)
            return cells.tobytes()[:-1].decode("utf-8")
        return np.insert(data, self.offsets[1:-1], 0).tobytes().decode("utf-8")


class HexColumn(ValueSequence, Sequence[str]):
    """Lowercase hexadecimal strings of ``width`` bytes each (source digests), held as those bytes."""

    __slots__ = ("raw", "width")

    def __init__(self, raw: bytes, width: int) -> None:
        self.raw, self.width = raw, width

    @classmethod
    def of(cls, values: Iterable[str]) -> "HexColumn | StrColumn":
        """The column of ``values``: a HexColumn when they are all lowercase hex of one even length,
        else a StrColumn (digests recorded by another packer)."""
        if isinstance(values, (HexColumn, StrColumn)):
            return values
        values = list(values)
        lengths = {len(v) if isinstance(v, str) else -1 for v in values}
        if len(lengths) == 1 and (n := lengths.pop()) > 0 and n % 2 == 0:
            joined = "".join(values)
            if joined == joined.lower():
                try:
                    return cls(bytes.fromhex(joined), n // 2)
                except ValueError:
                    pass
        return StrColumn.of(values)

    def __len__(self) -> int:
        return len(self.raw) // self.width if self.width else 0

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"value {i} of a column of {n}")
        i %= n
        return self.raw[i * self.width : (i + 1) * self.width].hex()

    def __iter__(self) -> Iterator[str]:
        w = self.width
        for a in range(0, len(self.raw), w):
            yield self.raw[a : a + w].hex()

    def __repr__(self) -> str:
        return f"HexColumn({len(self)} values of {self.width} bytes)"

    def __reduce__(self):
        return (HexColumn, (self.raw, self.width))


def _not_str(value: object) -> bytes:
    raise TypeError(f"a column of strings cannot hold {type(value).__name__} {value!r}")


class IntColumn(ValueSequence, Sequence[int]):
    """Integers in one numpy array (labels: int32)."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    @classmethod
    def of(cls, values: Iterable[int], dtype: type = np.int32) -> "IntColumn":
        """The column of ``values``, as ``dtype``, or int64 where one does not fit in it."""
        if isinstance(values, IntColumn):
            return values
        values = list(values) if not isinstance(values, (list, tuple, np.ndarray)) else values
        wide = np.asarray(values, dtype=np.int64).reshape(-1)
        narrow = wide.astype(dtype)
        return cls(narrow if np.array_equal(narrow, wide) else wide)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.values[i].tolist()
        return int(self.values[i])

    def __iter__(self) -> Iterator[int]:
        return iter(self.values.tolist())

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.values if dtype is None else self.values.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"IntColumn({len(self.values)} values)"

    def __reduce__(self):
        return (IntColumn, (self.values,))
