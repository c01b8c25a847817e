"""The source items of a conversion held in a few compact arrays instead of one Python object each.

Discovery of a folder of N files used to hold N ``SourceItem`` objects, with two strings each, in
the parent for the whole run (and every worker forked from it started with them): most of the
parent's memory per file (docs/BENCHMARKS.md, the scale benchmark). An ``ItemTable`` holds the same
items as UTF-8 relative paths in compressed blocks (``packer.sources.record_blocks``, 2-4 bytes a path
for class-folder trees) and labels as runs (``LabelRuns``: a class folder's files are one run), in
buffers that forked workers share and never copy. It is a ``Sequence[SourceItem]``: each item is
made when it is asked for, and slices and ``take`` are views over the same buffers.
"""

from __future__ import annotations

import bisect
from array import array
from typing import Iterator, Optional, Sequence, Union, overload

import numpy as np

from packer.columns import ValueSequence
from packer.records import UNLABELLED, SourceItem
from packer.sources.record_blocks import RecordBlocks

IMAGES = "images"
"""Each record is an image file's relative path, which is also the sample's key (``parts`` empty)."""
SINGLE = "single"
"""Each record is the relative path of the sample's one file of field ``fields[0]`` (a text)."""
PAIRED = "paired"
"""Each record is ``key NUL field NUL relpath [NUL field NUL relpath ...]``: a sample of several files."""

_SEP = "\0"  # never in a file name, so it can join a paired record's parts

SCATTERED_CHUNK = 1 << 16
"""Items of a scattered view (a shuffled plan's shard) whose records are read at a time, in the
order of their rows: each block is then decompressed once a chunk, not once an item."""


class LabelRuns:
    """Labels of ``count`` items as runs: run ``k`` covers items ``starts[k]`` up to the next start
    and has label ``values[k]``. Indexed like the int32 array it stands for (an int gives an int, an
    array of positions an array), in memory that grows with the runs, not the items."""

    __slots__ = ("starts", "values", "count", "_starts")

    def __init__(self, starts: np.ndarray, values: np.ndarray, count: int) -> None:
        self.starts = np.ascontiguousarray(starts, np.int64)
        self.values = np.ascontiguousarray(values, np.int32)
        self.count = count
        self._starts = array("q", self.starts.tobytes())  # bisect's, for one item's label without numpy's cost
        starts = self.starts
        if (
            starts.shape != self.values.shape
            or starts.ndim != 1
            or (not count and len(starts))
            or (
                count
                and (
                    not len(starts)
                    or starts[0] != 0
                    or int(starts[-1]) >= count
                    or (len(starts) > 1 and int(np.diff(starts).min()) <= 0)
                )
            )
        ):
            raise ValueError("label runs must start at 0 and ascend within the items")

    @classmethod
    def of_spans(cls, spans: Sequence[tuple[int, int, int]], count: int) -> "LabelRuns":
        """Runs from disjoint (start, stop, label) spans; the items outside them are ``UNLABELLED``.
        Neighbouring spans of one label make one run."""
        starts: list[int] = []
        values: list[int] = []

        def run(start: int, label: int) -> None:
            if not values or values[-1] != label:
                starts.append(start)
                values.append(label)

        at = 0
        for a, b, label in sorted(s for s in spans if s[0] < s[1]):
            if a > at:
                run(at, UNLABELLED)
            run(a, label)
            at = b
        if at < count:
            run(at, UNLABELLED)
        return cls(np.array(starts, np.int64), np.array(values, np.int32), count)

    @classmethod
    def of_array(cls, labels: np.ndarray) -> "LabelRuns":
        """The runs of a label array."""
        labels = np.asarray(labels, np.int32)
        if not len(labels):
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int32), 0)
        starts = np.flatnonzero(np.diff(labels)) + 1
        starts = np.concatenate([np.zeros(1, np.int64), starts.astype(np.int64)])
        return cls(starts, labels[starts], len(labels))

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, rows):
        if isinstance(rows, slice):
            rows = np.arange(self.count)[rows]
        if isinstance(rows, (int, np.integer)):
            if not 0 <= rows < self.count:
                raise IndexError(f"label {rows} of {self.count}")
            return int(self.values[bisect.bisect_right(self._starts, rows) - 1])
        rows = np.asarray(rows, np.int64)
        return self.values[np.searchsorted(self.starts, rows, "right") - 1]

    def tolist(self) -> list[int]:
        """Every item's label (a list as long as the items: for tests and small tables)."""
        return np.repeat(self.values, np.diff([*self.starts.tolist(), self.count])).tolist()

    def unlabelled(self) -> bool:
        """True when every item is ``UNLABELLED``."""
        return bool((self.values == UNLABELLED).all())

    def spans(self) -> Iterator[tuple[int, int, int]]:
        """Each run as (start, stop, label)."""
        bounds = [*self.starts.tolist(), self.count]
        for k, label in enumerate(self.values.tolist()):
            yield bounds[k], bounds[k + 1], label

    def kept(self, keep: np.ndarray) -> "LabelRuns":
        """The runs of the items where the boolean ``keep`` is true, in order."""
        spans, at = [], 0
        for a, b, label in self.spans():
            n = int(np.count_nonzero(keep[a:b]))
            spans.append((at, at + n, label))
            at += n
        return LabelRuns.of_spans(spans, at)


Labels = Union[np.ndarray, LabelRuns]
"""An int32 label per item, or their runs."""


class _Buffers:
    """The arrays an ``ItemTable`` and all its views share, released together (``ItemTable.release``)."""

    __slots__ = ("records", "labels", "indices", "count")

    def __init__(
        self, records: Optional[RecordBlocks], labels: Optional[Labels], indices: Optional[np.ndarray]
    ) -> None:
        self.records, self.labels, self.indices = records, labels, indices
        self.count = len(records) if records is not None else 0


class ReleasedItems(RuntimeError):
    """An ``ItemTable`` read after ``release``."""


def _released(name: str):
    def get(self):
        value = getattr(self._b, name)
        if value is None and self._b.records is None:
            raise ReleasedItems(
                "these source items were released once their shards were written "
                "(ItemTable.release); keep a compact() copy to read them later"
            )
        return value

    return property(get)


class ItemTable(ValueSequence, Sequence[SourceItem]):
    """Source items in compact arrays (see the module docstring); read-only.

    ``base`` is prepended to every relative path (the source root with a separator at its end);
    ``records`` holds the records (``mode`` says what a record is); ``labels`` each item's label
    (an int32 array or ``LabelRuns``), None for unlabelled items. ``indices``, when given, are the
    items' ``SourceItem.index`` (by default the record's position). ``rows`` selects and orders the
    records this table shows: None for all of them, a ``range`` for a run of them (what the plan's
    shards are), an int64 array for any other choice.
    """

    __slots__ = ("base", "_b", "mode", "fields", "rows")

    def __init__(
        self,
        base: str,
        records: RecordBlocks,
        labels: Optional[Labels] = None,
        mode: str = IMAGES,
        fields: tuple[str, ...] = ("image",),
        indices: Optional[np.ndarray] = None,
        rows: Optional[range | np.ndarray] = None,
    ) -> None:
        records.seal()
        if labels is not None and len(labels) != len(records) or indices is not None and len(indices) != len(records):
            raise ValueError(f"{len(records)} records, but labels or indices of another length")
        self.base = base
        self._b = _Buffers(records, labels, indices)
        self.mode = mode
        self.fields = fields
        self.rows = rows

    records = _released("records")
    labels = _released("labels")
    indices = _released("indices")

    def __len__(self) -> int:
        return self._b.count if self.rows is None else len(self.rows)

    def release(self) -> None:
        """Drop the arrays this table and every view of it share (their memory is freed once nothing
        else holds them): a conversion's parent does so once its shards are written, before the
        manifest step, which needs only the count. Any later read raises ``ReleasedItems``."""
        b = self._b
        b.records = b.labels = b.indices = None

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
        if not self.scattered:  # a run: each block decompressed once as the rows reach it
            for row in self._row_list():
                yield self._item(row)
            return
        rows = self._row_array()
        for a in range(0, len(rows), SCATTERED_CHUNK):
            part = rows[a : a + SCATTERED_CHUNK]
            for row, record in zip(part.tolist(), self.records.take(part)):
                yield self._item(row, record)

    def __repr__(self) -> str:
        return f"ItemTable({len(self)} {self.mode} items under {self.base!r})"

    def take(self, positions: Sequence[int] | np.ndarray) -> "ItemTable":
        """The items at ``positions`` of this table, in that order (a view)."""
        positions = np.asarray(positions, dtype=np.int64)
        return self._select(self._row_array()[positions])

    @property
    def scattered(self) -> bool:
        """True for a view whose rows are not one run of the records (a shuffled plan's shard): its
        records are read ``SCATTERED_CHUNK`` at a time, in row order."""
        rows = self.rows
        return rows is not None and not (isinstance(rows, range) and rows.step == 1)

    def whole(self) -> "ItemTable":
        """The table of every record this view was taken from (the same buffers)."""
        return self._select(None)

    def row_bytes(self) -> bytes:
        """This view's rows as int64 bytes (what a shuffled plan's fingerprint holds of each shard)."""
        return self._row_array().astype("<i8").tobytes()

    def plan_lines(self) -> str:
        """``"\0{index}\0{key}\0{label}\0{field stamp}"`` of every item, joined: the plan fingerprint's
        bytes for these items (``packer.run.resume``), without making the items (paired samples, whose
        field stamp differs per item, from their items)."""
        if self.mode == PAIRED:
            return "".join([f"\0{it.index}\0{it.relpath}\0{it.label}\0{it.fields_stamp}" for it in self])
        stamp = "" if self.mode == IMAGES else f"\0{self.fields[0]}"
        rows = self._row_array()
        indices = rows.tolist() if self.indices is None else self.indices[rows].tolist()
        labels = [UNLABELLED] * len(rows) if self.labels is None else self.labels[rows].tolist()
        return "".join([f"\0{i}\0{key}\0{label}\0{stamp}" for i, key, label in zip(indices, self._records(), labels)])

    def compact(self, renumber: bool = False) -> "ItemTable":
        """A copy holding only this table's records, in its order (what crosses a process boundary);
        the items keep their ``index``, or with ``renumber`` are numbered by their new position."""
        records = RecordBlocks()
        rows = self._rows()
        if isinstance(rows, range) and rows.step == 1:
            records.extend(self.records, rows.start, rows.stop)
        else:
            records.add_all(r.encode("utf-8") for r in self._records())
        rows = self._row_array()
        labels = self.labels
        if labels is not None:
            labels = labels[rows]
            labels = LabelRuns.of_array(labels) if isinstance(self.labels, LabelRuns) else labels.copy()
        if renumber:
            indices = None
        else:
            indices = rows.astype(np.int64) if self.indices is None else self.indices[rows].copy()
        return ItemTable(self.base, records, labels, self.mode, self.fields, indices)

    def kept(self, keep: np.ndarray) -> "ItemTable":
        """A copy of this table (all of its records, ``rows`` None) holding only the items where the
        boolean array ``keep`` is true, numbered by their new position."""
        assert self.rows is None and self.indices is None
        records = RecordBlocks()
        src, at = self.records, 0
        for block in range(src.blocks):
            decoded = src.block(block)
            mask = keep[at : at + len(decoded)].tolist()
            records.add_all(r.encode("utf-8") for r, k in zip(decoded, mask) if k)
            at += len(decoded)
        labels = self.labels
        if isinstance(labels, LabelRuns):
            labels = labels.kept(keep)
        elif labels is not None:
            labels = labels[keep]
        return ItemTable(self.base, records, labels, self.mode, self.fields)

    def __reduce__(self):
        # Pickled (spawn, Ray) as its own records only, never the buffers of the whole discovery.
        t = self.compact()
        return (ItemTable, (t.base, t.records, t.labels, t.mode, t.fields, t.indices))

    # ------------------------------------------------------------------------------------------
    def _rows(self) -> range | np.ndarray:
        return range(self._b.count) if self.rows is None else self.rows

    def _row_array(self) -> np.ndarray:
        rows = self._rows()
        return np.arange(rows.start, rows.stop, rows.step, dtype=np.int64) if isinstance(rows, range) else rows

    def _row_list(self) -> Sequence[int]:
        rows = self._rows()
        return rows if isinstance(rows, range) else rows.tolist()

    def _select(self, rows: Optional[range | np.ndarray]) -> "ItemTable":
        if rows is not None and not isinstance(rows, range):
            rows = np.ascontiguousarray(rows, dtype=np.int64)
        view = ItemTable.__new__(ItemTable)  # over the same buffers, released with them
        view.base, view._b, view.mode, view.fields, view.rows = self.base, self._b, self.mode, self.fields, rows
        return view

    def _records(self) -> list[str]:
        """Every record of this table, decoded, in order (a run's blocks decoded once each)."""
        rows = self._rows()
        if isinstance(rows, range) and rows.step == 1:
            return self.records.run(rows.start, rows.stop)
        return self.records.take(self._row_array())

    def _item(self, row: int, record: Optional[str] = None) -> SourceItem:
        if record is None:
            record = self.records.record(row)  # raises ReleasedItems after release
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
        self.records = RecordBlocks()
        self.labels = array("i")

    def __len__(self) -> int:
        return len(self.records)

    def add(self, key: str, label: int = UNLABELLED, files: tuple[tuple[str, str], ...] = ()) -> None:
        """One item: its key and label; ``files`` are a paired sample's (field, relative path)."""
        record = key if self.mode != PAIRED else _SEP.join([key, *(s for f in files for s in f)])
        self.records.add(record.encode("utf-8"))
        self.labels.append(label)

    def build(self) -> ItemTable:
        """The table of every record added."""
        labels = np.frombuffer(self.labels, dtype=np.int32) if len(self.labels) else np.zeros(0, np.int32)
        runs = LabelRuns.of_array(labels)
        if not len(labels) or runs.unlabelled():
            return ItemTable(self.base, self.records, None, self.mode, self.fields)
        # Runs (12 bytes each) where labels come in runs (class folders), else the array (4 bytes an item).
        chosen: Labels = runs if 3 * len(runs.starts) <= len(labels) else labels
        return ItemTable(self.base, self.records, chosen, self.mode, self.fields)
