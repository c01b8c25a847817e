"""The source items of a conversion held in a few flat arrays instead of one Python object each.

Discovery of a folder of N files used to hold N ``SourceItem`` objects, with two strings each, in
the parent for the whole run (and every worker forked from it started with them): most of the
parent's memory per file (docs/BENCHMARKS.md, the scale benchmark). An ``ItemTable`` holds the same
items as one buffer of UTF-8 relative paths, an array of their end offsets and an array of labels,
about the length of a path plus 12 bytes a file, in buffers that forked workers share and never copy
(numpy's data is not touched by reference counting). It is a ``Sequence[SourceItem]``: each item is
made when it is asked for, and slices and ``take`` are views over the same buffers.
"""

from __future__ import annotations

from array import array
from typing import Iterator, Optional, Sequence, overload

import numpy as np

from packer.columns import ValueSequence
from packer.records import UNLABELLED, SourceItem

IMAGES = "images"
"""Each record is an image file's relative path, which is also the sample's key (``parts`` empty)."""
SINGLE = "single"
"""Each record is the relative path of the sample's one file of field ``fields[0]`` (a text)."""
PAIRED = "paired"
"""Each record is ``key NUL field NUL relpath [NUL field NUL relpath ...]``: a sample of several files."""

_SEP = "\0"  # never in a file name, so it can join a paired record's parts


class _Buffers:
    """The arrays an ``ItemTable`` and all its views share, released together (``ItemTable.release``)."""

    __slots__ = ("blob", "offsets", "labels", "indices", "count")

    def __init__(self, blob, offsets: np.ndarray, labels: Optional[np.ndarray], indices: Optional[np.ndarray]) -> None:
        self.blob, self.offsets, self.labels, self.indices = blob, offsets, labels, indices
        self.count = len(offsets) - 1


class ReleasedItems(RuntimeError):
    """An ``ItemTable`` read after ``release``."""


def _released(name: str):
    def get(self):
        value = getattr(self._b, name)
        if value is None and self._b.offsets is None:
            raise ReleasedItems("these source items were released once their shards were written "
                                "(ItemTable.release); keep a compact() copy to read them later")
        return value
    return property(get)


class ItemTable(ValueSequence, Sequence[SourceItem]):
    """Source items in flat arrays (see the module docstring); read-only.

    ``base`` is prepended to every relative path (the source root with a separator at its end);
    ``blob`` holds the records back to back (``mode`` says what a record is), ``offsets`` the
    N + 1 byte offsets that bound them; ``labels`` (int32) each item's label, None for unlabelled
    items. ``indices``, when given, are the items' ``SourceItem.index`` (by default the record's
    position). ``rows`` selects and orders the records this table shows: None for all of them, a
    ``range`` for a run of them (what the plan's shards are), an int64 array for any other choice.
    """

    __slots__ = ("base", "_b", "mode", "fields", "rows")

    def __init__(self, base: str, blob: bytes | bytearray, offsets: np.ndarray,
                 labels: Optional[np.ndarray] = None, mode: str = IMAGES, fields: tuple[str, ...] = ("image",),
                 indices: Optional[np.ndarray] = None, rows: Optional[range | np.ndarray] = None) -> None:
        self.base = base
        self._b = _Buffers(blob, offsets, labels, indices)
        self.mode = mode
        self.fields = fields
        self.rows = rows

    blob = _released("blob")
    offsets = _released("offsets")
    labels = _released("labels")
    indices = _released("indices")

    def __len__(self) -> int:
        return self._b.count if self.rows is None else len(self.rows)

    def release(self) -> None:
        """Drop the arrays this table and every view of it share (their memory is freed once nothing
        else holds them): a conversion's parent does so once its shards are written, before the
        manifest step, which needs only the count. Any later read raises ``ReleasedItems``."""
        b = self._b
        b.blob = b.offsets = b.labels = b.indices = None

    @overload
    def __getitem__(self, i: int) -> SourceItem: ...

    @overload
    def __getitem__(self, i: slice) -> "ItemTable": ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._select(self._rows()[i])
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"item {i} of a table of {n}")
        return self._item(int(self._rows()[i]))

    def __iter__(self) -> Iterator[SourceItem]:
        for row in self._row_list():
            yield self._item(row)

    def __repr__(self) -> str:
        return f"ItemTable({len(self)} {self.mode} items under {self.base!r})"

    def take(self, positions: Sequence[int] | np.ndarray) -> "ItemTable":
        """The items at ``positions`` of this table, in that order (a view)."""
        positions = np.asarray(positions, dtype=np.int64)
        return self._select(self._row_array()[positions])

    def plan_lines(self) -> str:
        """``"\0{index}\0{key}\0{label}\0{field stamp}"`` of every item, joined: the plan fingerprint's
        bytes for these items (``packer.resume``), without making the items (paired samples, whose
        field stamp differs per item, from their items)."""
        if self.mode == PAIRED:
            return "".join([f"\0{it.index}\0{it.relpath}\0{it.label}\0{it.fields_stamp}" for it in self])
        stamp = "" if self.mode == IMAGES else f"\0{self.fields[0]}"
        rows = self._row_array()
        indices = rows.tolist() if self.indices is None else self.indices[rows].tolist()
        labels = [UNLABELLED] * len(rows) if self.labels is None else self.labels[rows].tolist()
        return "".join([f"\0{i}\0{key}\0{label}\0{stamp}"
                        for i, key, label in zip(indices, self._records(), labels)])

    def compact(self, renumber: bool = False) -> "ItemTable":
        """A copy holding only this table's records, in its order (what crosses a process boundary);
        the items keep their ``index``, or with ``renumber`` are numbered by their new position."""
        rows = self._row_array()
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        blob = bytearray()
        for a, b in zip(starts.tolist(), ends.tolist()):
            blob += self.blob[a:b]
        offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(ends - starts, out=offsets[1:])
        labels = None if self.labels is None else self.labels[rows].copy()
        if renumber:
            indices = None
        else:
            indices = rows.astype(np.int64) if self.indices is None else self.indices[rows].copy()
        return ItemTable(self.base, bytes(blob), offsets, labels, self.mode, self.fields, indices)

    def __reduce__(self):
        # Pickled (spawn, Ray) as its own records only, never the buffers of the whole discovery.
        t = self.compact()
        return (ItemTable, (t.base, t.blob, t.offsets, t.labels, t.mode, t.fields, t.indices))

    # ------------------------------------------------------------------------------------------
    def _rows(self) -> range | np.ndarray:
        return range(self._b.count) if self.rows is None else self.rows

    def _row_array(self) -> np.ndarray:
        rows = self._rows()
        return np.arange(rows.start, rows.stop, rows.step, dtype=np.int64) if isinstance(rows, range) else rows

    def _row_list(self) -> Sequence[int]:
        rows = self._rows()
        return rows if isinstance(rows, range) else rows.tolist()

    def _select(self, rows: range | np.ndarray) -> "ItemTable":
        if not isinstance(rows, range):
            rows = np.ascontiguousarray(rows, dtype=np.int64)
        view = ItemTable.__new__(ItemTable)  # over the same buffers, released with them
        view.base, view._b, view.mode, view.fields, view.rows = self.base, self._b, self.mode, self.fields, rows
        return view

    def _records(self) -> list[str]:
        """Every record of this table, decoded, in order (a run of ASCII records in one decode)."""
        rows = self._rows()
        if isinstance(rows, range) and rows.step == 1 and len(rows):
            base = int(self.offsets[rows.start])
            text = self.blob[base:int(self.offsets[rows.stop])].decode("utf-8")
            if text.isascii():  # byte offsets are character offsets
                bounds = (self.offsets[rows.start:rows.stop + 1] - base).tolist()
                return [text[a:b] for a, b in zip(bounds, bounds[1:])]
        rows = self._row_array()
        blob = self.blob
        return [blob[a:b].decode("utf-8") for a, b in zip(self.offsets[rows].tolist(), self.offsets[rows + 1].tolist())]

    def _record(self, row: int) -> str:
        offsets = self.offsets
        return self._b.blob[int(offsets[row]):int(offsets[row + 1])].decode("utf-8")

    def _item(self, row: int) -> SourceItem:
        record = self._record(row)  # raises ReleasedItems after release
        b = self._b
        index = row if b.indices is None else int(b.indices[row])
        label = UNLABELLED if b.labels is None else int(b.labels[row])
        base = self.base
        if self.mode == IMAGES:
            return SourceItem(index, base + record, record, label)
        if self.mode == SINGLE:
            path = base + record
            return SourceItem(index, path, record, label, ((self.fields[0], path),))
        key, *rest = record.split(_SEP)
        parts = tuple((rest[i], base + rest[i + 1]) for i in range(0, len(rest), 2))
        return SourceItem(index, parts[0][1], key, label, parts)


class TableBuilder:
    """Appends records one by one into the buffers of an ``ItemTable`` (no object kept per item)."""

    def __init__(self, base: str, mode: str = IMAGES, fields: tuple[str, ...] = ("image",)) -> None:
        self.base, self.mode, self.fields = base, mode, fields
        self.blob = bytearray()
        self.ends = array("q", [0])
        self.labels = array("i")

    def __len__(self) -> int:
        return len(self.ends) - 1

    def add(self, key: str, label: int = UNLABELLED, files: tuple[tuple[str, str], ...] = ()) -> None:
        """One item: its key and label; ``files`` are a paired sample's (field, relative path)."""
        record = key if self.mode != PAIRED else _SEP.join([key, *(s for f in files for s in f)])
        self.blob += record.encode("utf-8")
        self.ends.append(len(self.blob))
        self.labels.append(label)

    def build(self) -> ItemTable:
        """The table of every record added."""
        labels = np.frombuffer(self.labels, dtype=np.int32) if len(self.labels) else np.zeros(0, np.int32)
        if len(labels) and (labels == UNLABELLED).all():
            labels = None
        return ItemTable(self.base, self.blob, np.frombuffer(self.ends, dtype=np.int64), labels, self.mode,
                         self.fields)
