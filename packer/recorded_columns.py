"""A shard record's per-sample columns (keys, labels, digests, image hashes): written compactly into the record
(``per_sample_record``), read back as columns (``read_per_sample_record``), and left on disk until
asked for (``RecordedColumn``), so that the parent holds a path and a count per finished shard."""

from __future__ import annotations

import base64
import functools
import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from packer.columns import HexColumn, IntColumn, StrColumn, ValueSequence
from packer.spec.file_stamp import FileStamp


class _LastRecord:
    """The last shard record read, parsed, so that reading its labels and then its digests parses it
    once; dropped before the next one is read (an lru_cache would hold both while reading)."""

    key: Optional[tuple] = None
    parsed: Optional[dict] = None

    @classmethod
    def get(cls, path: str, stamp: FileStamp) -> dict:
        if cls.key != (path, stamp) or cls.parsed is None:
            cls.cache_clear()
            cls.parsed, cls.key = json.loads(Path(path).read_bytes()), (path, stamp)
        return cls.parsed

    @classmethod
    def cache_clear(cls) -> None:
        cls.key = cls.parsed = None


_record = _LastRecord.get


def forget_read_records() -> None:
    """Drop what was kept of the shard records read last (``build_manifest`` is done with them)."""
    _LastRecord.cache_clear()
    _recorded.cache_clear()


@functools.lru_cache(maxsize=2)
def _recorded(path: str, stamp: FileStamp, which: int) -> Sequence:
    """Column ``which`` of the shard record at ``path`` (as its ``stamp`` says it is now)."""
    column = read_per_sample_record(_record(path, stamp), (which,))[which]
    assert column is not None
    return column


class RecordedColumn(ValueSequence, Sequence):
    """One per-sample column (0 keys, 1 labels, 2 digests, 3 image hashes) of a shard record on disk,
    read when asked for (the last two columns read are kept): the parent holds ``count`` and a path,
    not the values."""

    __slots__ = ("path", "which", "count")

    def __init__(self, path: str, which: int, count: int) -> None:
        self.path, self.which, self.count = path, which, count

    def column(self) -> Sequence:
        """The values, read from the record (OSError or ValueError where it is gone or damaged)."""
        column = _recorded(self.path, FileStamp.at(self.path), self.which)
        if len(column) != self.count:
            raise ValueError(f"{self.path} no longer holds the {self.count} samples it was written with")
        return column

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i):
        return self.column()[i]

    def __iter__(self):
        return iter(self.column())

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.column(), dtype=dtype)

    def __repr__(self) -> str:
        which = ["keys", "labels", "digests", "looks"][self.which]
        return f"RecordedColumn({which} of {self.path}, {self.count} values)"


def in_memory(column: Sequence) -> Sequence:
    """``column`` itself, or a ``RecordedColumn``'s values read from its record."""
    return column.column() if isinstance(column, RecordedColumn) else column


def per_sample_record(
    keys: Sequence[str], labels: Sequence[int], digests: Sequence[str], looks: Optional[Sequence] = None
) -> dict:
    """A shard record's per-sample values, each as one JSON string where it can be: ``keys_nul``, the
    keys joined by NUL (never in a file name); ``labels_i32``, base64 of little-endian int32s;
    ``digests_hex``, the 128-bit digests back to back. A record of JSON lists cost the parent an
    object a value to write, and as many to read back on --resume. Values that
    do not fit (a NUL in a key, a label past int32, another kind of digest) are JSON lists, as
    packers before 0.8.0 wrote them all. ``looks_u64``: base64 of the images' perceptual hashes
    (little-endian uint64, ``packer.pixels.looks.LOOKS`` a sample), where they were hashed."""
    record: dict = {}
    if isinstance(keys, StrColumn):
        joined = keys.joined_by_nul()  # None: a key holds a NUL itself
    else:
        joined = "\0".join(keys)
        joined = joined if joined.count("\0") == max(len(keys) - 1, 0) else None
    if joined is None:
        record["keys"] = list(keys)
    else:
        record["keys_nul"], record["count"] = joined, len(keys)
    wide = np.asarray(labels, dtype=np.int64).reshape(-1)
    if wide.size and (wide.min() < -(2**31) or wide.max() >= 2**31):
        record["labels"] = wide.tolist()
    else:
        record["labels_i32"] = base64.b64encode(wide.astype("<i4").tobytes()).decode("ascii")
    if isinstance(digests, HexColumn) and digests.width == 16:
        record["digests_hex"] = digests.raw.hex()
    else:
        record["digests"] = list(digests)
    if looks is not None:
        table = np.asarray(looks, dtype="<u8")
        record["looks_u64"] = base64.b64encode(table.tobytes()).decode("ascii")
        record["looks_per_sample"] = table.shape[1]
    return record


def read_per_sample_record(d: dict, which: tuple[int, ...] = (0, 1, 2)) -> list[Optional[Sequence]]:
    """Keys, labels, digests and image hashes (those ``which`` names: 0, 1, 2, 3; None for the others)
    of a shard record (``per_sample_record``'s or a list form), as columns made without an object a
    value; the hashes (samples x LOOKS uint64) are None in a record without them."""
    out: list[Optional[Sequence]] = [None, None, None, None]
    if 0 in which:
        out[0] = (
            StrColumn.from_joined(d["keys_nul"], int(d["count"])) if "keys_nul" in d else StrColumn.of(list(d["keys"]))
        )
    if 1 in which:
        out[1] = (
            IntColumn(np.frombuffer(base64.b64decode(d["labels_i32"]), "<i4").astype(np.int32))
            if "labels_i32" in d
            else IntColumn.of([int(v) for v in d["labels"]])
        )
    if 2 in which:
        out[2] = (
            HexColumn(bytes.fromhex(d["digests_hex"]), 16) if "digests_hex" in d else HexColumn.of(list(d["digests"]))
        )
    if 3 in which and "looks_u64" in d:
        flat = np.frombuffer(base64.b64decode(d["looks_u64"]), "<u8").astype(np.uint64)
        out[3] = flat.reshape(-1, int(d["looks_per_sample"]))
    return out
