"""A shard record's side file of per-sample digests and labels, read by the parent without the record.

After the workers, the parent reads every shard's digests (the duplicate report) and labels (the
class counts). From the JSON record that meant parsing all of it, keys included: about 50 bytes a
sample of the shard twice over (text and parsed values), the largest part of the parent's memory
after discovery (docs/BENCHMARKS.md, the scale benchmark). The worker therefore also writes
``NAME.done.samples.npy`` beside ``NAME.done.json``: a structured array of each sample's 16-byte
digest and int32 label, 20 bytes a sample, read with one ``numpy.load``. The record holds the side
file's stamp (size, times, inode: ``FileStamp.as_side_file_record``), so a side file that is not the
one written with the record is never read; the record's own columns stay the reference, read where
there is no side file (records of older packers, digests that are not 128-bit, labels past int32).
Never published.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np

from packer.columns import HexColumn, IntColumn
from packer.records import ShardResult
from packer.spec.file_stamp import FileStamp

SAMPLES_SUFFIX = ".done.samples.npy"
SAMPLES_FILE = "samples_file"
"""In a shard's record: the stamp of its side file as written (absent where there is none)."""
SAMPLE_DTYPE = np.dtype([("digest", "V16"), ("label", "<i4")])


def write_samples(stage: Path, name: str, result: ShardResult) -> Optional[list[int]]:
    """Write the side file of ``result``'s record ``name``; its stamp, or None where its columns do
    not fit the side file (the record alone then holds them). OSError if it cannot be written."""
    path = stage / f"{name}{SAMPLES_SUFFIX}"
    path.unlink(missing_ok=True)  # an earlier version of the shard's
    digests, labels = result.digests, result.labels
    if not (
        isinstance(digests, HexColumn)
        and digests.width == 16
        and isinstance(labels, IntColumn)
        and len(labels) == len(digests) == len(result.keys)
    ):
        return None
    values = labels.values
    if values.size and (int(values.min()) < -(2**31) or int(values.max()) >= 2**31):
        return None
    table = np.empty(len(values), SAMPLE_DTYPE)
    table["digest"] = np.frombuffer(digests.raw, "V16")
    table["label"] = values
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, table, allow_pickle=False)
    os.replace(tmp, path)
    return FileStamp.at(path).as_side_file_record()


class _Last:
    """The side file read last, so that the class counts and the duplicate search read it once."""

    key: Optional[tuple] = None
    table: Optional[np.ndarray] = None


def read_samples(result: ShardResult) -> Optional[np.ndarray]:
    """``result``'s samples as ``SAMPLE_DTYPE`` rows, from its side file; None where it has none, or
    the file is not the one recorded (the caller reads the record's columns)."""
    if not result.samples_file:
        return None
    path, stamp = result.samples_file
    key = (path, tuple(stamp))
    if _Last.key == key and _Last.table is not None:
        return _Last.table
    forget_samples()
    try:
        if FileStamp.at(path).as_side_file_record() != list(stamp):
            return None
        table = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    if table.dtype != SAMPLE_DTYPE or table.shape != (len(result.keys),):
        return None
    _Last.key, _Last.table = key, table
    return table


def digest_words(table: np.ndarray) -> np.ndarray:
    """The first 8 bytes of each row's digest as native-order uint64: a strided view, no copy."""
    return np.ndarray((len(table),), np.uint64, table, 0, (table.itemsize,))


def forget_samples() -> None:
    """Drop the side file kept from the last read."""
    _Last.key = _Last.table = None
