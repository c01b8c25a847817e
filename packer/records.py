"""Plain records passed between the converter's stages (discovery, workers, manifest)."""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import numpy as np

UNLABELLED = -1
"""Label stored for samples that have no class (a source folder without class subfolders)."""


@dataclass(frozen=True)
class SourceItem:
    """One source file found by discovery.

    ``index`` is its position in the sorted listing, stable across runs over the same tree;
    ``relpath`` is its POSIX path relative to the source root, which is also the sample key.
    """

    index: int
    path: str
    relpath: str
    label: int = UNLABELLED


@dataclass
class Sample:
    """One preprocessed sample, ready for a format writer.

    ``index`` is the source item's position in the sorted listing and ``key`` its relative path.
    ``encoded`` holds the image's JPEG or PNG bytes when the output's codec encodes images (what
    the writer stores), None for raw pixels.
    """

    index: int
    key: str
    image: np.ndarray
    label: int = UNLABELLED
    encoded: Optional[bytes] = None

    @property
    def crc32(self) -> int:
        """CRC-32 of what is stored, to find damaged samples: the encoded bytes, or the image's raw
        bytes (C order, stored dtype)."""
        return zlib.crc32(self.encoded) if self.encoded is not None else image_crc32(self.image)


def image_crc32(image: np.ndarray) -> int:
    """CRC-32 of an array's raw bytes in C order, as stored with every sample."""
    return zlib.crc32(np.ascontiguousarray(image).data)


@dataclass
class StoredSample:
    """One sample as read back from a shard by a format's scanner (used by ``packer verify``):
    ``image`` holds raw pixels, or ``encoded`` the stored JPEG/PNG bytes (and ``image`` is None)."""

    local: int
    key: str
    label: int
    image: Optional[np.ndarray]
    crc32: int
    encoded: Optional[bytes] = None


@dataclass(frozen=True)
class Skipped:
    """A source file left out of the output, and why."""

    path: str
    reason: str

    def to_dict(self) -> dict:
        """The manifest's form of this record."""
        return {"path": self.path, "reason": self.reason}


@dataclass(frozen=True)
class ShardTask:
    """The work of one shard: its name and the source items it holds, in order."""

    name: str
    items: tuple[SourceItem, ...]


@dataclass
class FileEntry:
    """One file of a shard, as the manifest records it."""

    path: str
    bytes: int
    sha256: str

    def to_dict(self) -> dict:
        """The manifest's form of this record."""
        return {"path": self.path, "bytes": self.bytes, "sha256": self.sha256}


@dataclass
class ShardStats:
    """Exact counts over one shard's samples (or, merged, over several shards).

    ``histogram`` holds, per channel, the number of pixels of each 8-bit value (256 per channel,
    channel after channel; empty before the first image); ``widths`` and ``heights`` count images
    by original width and height.
    """

    histogram: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    widths: Counter[int] = field(default_factory=Counter)
    heights: Counter[int] = field(default_factory=Counter)

    def add(self, histogram: Sequence[int], original_size: tuple[int, int]) -> None:
        """Count one image: its pixel histogram and original (width, height)."""
        if not len(self.histogram):
            self.histogram = np.zeros(len(histogram), np.int64)
        self.histogram += np.array(histogram, np.int64)  # a typed array: half the cost of adding the list
        self.widths[original_size[0]] += 1
        self.heights[original_size[1]] += 1

    @classmethod
    def merged(cls, parts: Iterable["ShardStats"]) -> "ShardStats":
        """The counts of all ``parts`` together (shards without images add nothing)."""
        total = cls()
        for part in parts:
            if len(part.histogram):
                total.histogram = total.histogram + part.histogram if len(total.histogram) else part.histogram.copy()
            total.widths.update(part.widths)
            total.heights.update(part.heights)
        return total

    def to_dict(self) -> dict:
        """JSON-ready form (kept with a finished shard for --resume)."""
        return {"histogram": self.histogram.tolist(), "widths": {str(k): v for k, v in sorted(self.widths.items())},
                "heights": {str(k): v for k, v in sorted(self.heights.items())}}

    @classmethod
    def from_dict(cls, d: dict) -> "ShardStats":
        """Inverse of ``to_dict``."""
        return cls(np.array(d["histogram"], np.int64), Counter({int(k): int(v) for k, v in d["widths"].items()}),
                   Counter({int(k): int(v) for k, v in d["heights"].items()}))


@dataclass
class ShardResult:
    """What a worker reports after writing one shard.

    ``keys``, ``labels`` and ``digests`` (a 128-bit SHA-256 prefix of each source file, to find identical
    files) are per written sample, in order; ``stats`` counts pixel values and original sizes.
    """

    name: str
    samples: int
    files: list[FileEntry]
    skipped: list[Skipped] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    stats: ShardStats = field(default_factory=ShardStats)

    def to_dict(self) -> dict:
        """JSON-ready form (the record of a finished shard kept for --resume)."""
        return {
            "name": self.name, "samples": self.samples, "files": [f.to_dict() for f in self.files],
            "skipped": [s.to_dict() for s in self.skipped],
            "keys": self.keys, "labels": self.labels, "digests": self.digests, "stats": self.stats.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ShardResult":
        """Inverse of ``to_dict``. KeyError for a record without ``stats`` (an older packer's), whose
        shard --resume then writes again."""
        return cls(
            d["name"], int(d["samples"]), [FileEntry(f["path"], int(f["bytes"]), f["sha256"]) for f in d["files"]],
            [Skipped(s["path"], s["reason"]) for s in d["skipped"]], list(d["keys"]), [int(v) for v in d["labels"]],
            list(d["digests"]), ShardStats.from_dict(d["stats"]),
        )
