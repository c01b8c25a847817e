"""Plain records passed between the converter's stages (discovery, workers, manifest)."""

from __future__ import annotations

import functools
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from packer.columns import HexColumn, IntColumn, StrColumn
from packer.recorded_columns import RecordedColumn, per_sample_record, read_per_sample_record
from packer.spec.checksums import stored_crc32
from packer.spec.entries import FileEntry

UNLABELLED = -1
"""Label stored for samples that have no class (a source folder without class subfolders)."""


@dataclass(slots=True)
class SourceItem:
    """One source file found by discovery (treat it as read-only: it is not frozen because discovery
    makes one per file in the parent before any worker starts, and a frozen dataclass, which sets
    each field through ``object.__setattr__``, is several times slower to make).

    ``index`` is its position in the sorted listing, stable across runs over the same tree;
    ``relpath`` is its POSIX path relative to the source root, which is also the sample key.
    ``parts`` is empty for an image-only sample (the image is ``path``); otherwise it names the
    file of each field the sample has, ``(field, path)`` in field order (``text``, ``json``, and
    ``image`` for paired samples, whose key is the files' shared stem, ``cats/0001``).
    """

    index: int
    path: str
    relpath: str
    label: int = UNLABELLED
    parts: tuple[tuple[str, str], ...] = ()

    @property
    def paths(self) -> tuple[str, ...]:
        """Every source file of this sample."""
        return tuple(p for _, p in self.parts) if self.parts else (self.path,)

    @property
    def fields_stamp(self) -> str:
        """A paired sample's field names, each after a NUL, as the plan fingerprint and ``source_stamps.files_stamp``
        end a sample's line with them (empty for an image-only one)."""
        return "".join(f"\0{f}" for f, _ in self.parts)


@dataclass
class Sample:
    """One preprocessed sample, ready for a format writer.

    ``index`` is the source item's position in the sorted listing and ``key`` its relative path.
    ``image`` is None when the output has no image field. ``encoded`` holds the image's JPEG or PNG
    bytes when the output's codec encodes images (what the writer stores), None for raw pixels.
    ``fields`` holds the stored bytes of each variable-length field (UTF-8 text, int32 token ids),
    in the layout's order.
    """

    index: int
    key: str
    image: Optional[np.ndarray]
    label: int = UNLABELLED
    encoded: Optional[bytes] = None
    fields: dict[str, bytes] = field(default_factory=dict)

    @property
    def crc32(self) -> int:
        """CRC-32 of what is stored, to find damaged samples: the encoded bytes, or the image's raw
        bytes (C order, stored dtype), continued over each variable-length field's bytes in order."""
        return stored_crc32(self.encoded, self.image, self.fields.values())


@dataclass
class StoredSample:
    """One sample as read back from a shard by a format's scanner (used by ``packer verify``):
    ``image`` holds raw pixels, or ``encoded`` the stored JPEG/PNG bytes (and ``image`` is None);
    ``fields`` the stored bytes of each variable-length field."""

    local: int
    key: str
    label: int
    image: Optional[np.ndarray]
    crc32: int
    encoded: Optional[bytes] = None
    fields: dict[str, bytes] = field(default_factory=dict)
    shape: Optional[tuple[int, ...]] = None
    """The (H, W, C) the shard's index of sizes records for the image (images of varying size, format
    version 6; raw npy and hdf5 images are rebuilt from it), None where it has none."""


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
    items: Sequence[SourceItem]
    """A tuple, or a view of the discovery's ``packer.sources.item_table.ItemTable``."""


@functools.cache
def _int64s(count: int) -> struct.Struct:
    """Packs ``count`` ints as native int64."""
    return struct.Struct(f"={count}q")


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
        # Packed by struct, then viewed: quicker than numpy's conversion of a list of ints, once per image.
        self.histogram += np.frombuffer(_int64s(len(histogram)).pack(*histogram), np.int64)
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
        return {
            "histogram": self.histogram.tolist(),
            "widths": {str(k): v for k, v in sorted(self.widths.items())},
            "heights": {str(k): v for k, v in sorted(self.heights.items())},
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ShardStats":
        """Inverse of ``to_dict``."""
        return cls(
            np.array(d["histogram"], np.int64),
            Counter({int(k): int(v) for k, v in d["widths"].items()}),
            Counter({int(k): int(v) for k, v in d["heights"].items()}),
        )


SOURCE_DIGEST = "xxh3-128"
"""How ``ShardResult.digests`` are computed (``source_stamps.source_digest``; for a sample of several files,
one digest over all of them, each after its field name and length: ``worker.read_sample``).
Records of finished shards name it: --resume writes a shard recorded with another again, and
merge refuses a mix, so that every digest of a run can be compared (older packers recorded
128-bit SHA-256 prefixes, and no name)."""


@dataclass
class ShardResult:
    """What a worker reports after writing one shard.

    ``keys``, ``labels`` and ``digests`` (an XXH3-128 of each sample's source bytes, ``SOURCE_DIGEST``,
    to find identical files) are per written sample, in order; ``stats`` counts pixel values and original
    sizes. ``sources`` is a SHA-256 of every source file's size, times and inode as the worker found
    them before reading (``source_stamps.sources_digest``), for --resume; empty in records of older packers.
    ``digest`` names how ``digests`` were computed. ``format_version`` is the on-disk version the
    shard was written at (0 in records of packers before 0.3.0, which did not say).
    """

    name: str
    samples: int
    files: list[FileEntry]
    skipped: list[Skipped] = field(default_factory=list)
    keys: Sequence[str] = field(default_factory=list)
    labels: Sequence[int] = field(default_factory=list)
    digests: Sequence[str] = field(default_factory=list)
    stats: ShardStats = field(default_factory=ShardStats)
    sources: str = ""
    digest: str = SOURCE_DIGEST
    format_version: int = 0
    boxes: dict[str, int] = field(default_factory=dict)
    """Detection outputs: boxes ``kept`` and ``dropped`` (cut away by the crop), images ``without_boxes``."""
    scaled_counts: int = 0
    """``--codec source`` outputs: images whose pixels ``stats`` counted at 1/8 scale (kept JPEGs)."""
    image_sources: dict = field(default_factory=dict)
    """``--codec source`` outputs: ``kept``, the runs ``[start, stop)`` of the shard's samples stored as
    their source files' bytes, and how many were re-encoded as ``jpeg`` and as ``png``
    (``add_image_source``)."""
    samples_file: tuple = ()
    """Where the record's side file of digests and labels is, and its stamp as written
    (``packer.output.shard_samples``): empty where there is none. Not part of ``to_dict``."""
    looks: Optional[Sequence] = None
    """Each written sample's perceptual hashes (samples x ``packer.pixels.looks.LOOKS`` uint64), or a
    ``RecordedColumn`` of them; None where the shard's images were not hashed (``--no-image-hashes``,
    outputs without images, records of packers from before the image hashes)."""
    looks_kind: str = ""
    """The rule ``looks`` were hashed by (``packer.pixels.looks.HASH_KIND``; a record from before this
    field: ``dct64-trim5``); --resume writes a shard of another rule's hashes again."""
    parts: dict[str, str] = field(default_factory=dict)
    """Where a worker on another machine uploaded the shard's files, by each file's path: the run's
    part objects in the bucket (``packer.output.part_target``); empty where the files are in the
    staging folder. Not part of ``to_dict``."""

    def kept_in(self, record: Path, samples_file: tuple = ()) -> "ShardResult":
        """This result with its per-sample columns left in its shard's ``record`` on disk (read back
        when asked for, ``RecordedColumn``): what the parent holds of a finished shard, nothing a
        sample. ``samples_file``: the record's side file and its stamp (``packer.output.shard_samples``), if any."""
        n = len(self.keys)
        if len(self.labels) == n and len(self.digests) == n:
            self.keys, self.labels, self.digests = (RecordedColumn(str(record), which, n) for which in range(3))
            self.samples_file = samples_file
            if self.looks is not None and len(self.looks) == n:
                self.looks = RecordedColumn(str(record), 3, n)
        return self

    def packed(self) -> "ShardResult":
        """This result with its per-sample lists as columns (``packer.columns``): what the parent holds
        of a shard until its record is written (``kept_in``), its values' bytes instead of an object each."""
        self.keys, self.labels, self.digests = (
            StrColumn.of(self.keys),
            IntColumn.of(self.labels),
            HexColumn.of(self.digests),
        )
        return self

    def add_image_source(self, local: int, kept: bool, codec: str) -> None:
        """Record how the image of the shard's sample ``local`` (the next one) was stored."""
        if not self.image_sources:
            self.image_sources = {"kept": [], "jpeg": 0, "png": 0}
        sources = self.image_sources
        if not kept:
            sources[codec] += 1
        elif sources["kept"] and sources["kept"][-1][1] == local:
            sources["kept"][-1][1] = local + 1
        else:
            sources["kept"].append([local, local + 1])

    def to_dict(self) -> dict:
        """JSON-ready form (the record of a finished shard kept for --resume)."""
        return {
            "name": self.name,
            "samples": self.samples,
            "files": [f.to_dict() for f in self.files],
            "skipped": [s.to_dict() for s in self.skipped],
            **per_sample_record(self.keys, self.labels, self.digests, self.looks),
            "stats": self.stats.to_dict(),
            "sources": self.sources,
            "digest": self.digest,
            "format_version": self.format_version,
            **({"boxes": self.boxes} if self.boxes else {}),
            **({"image_sources": self.image_sources} if self.image_sources else {}),
            **({"scaled_counts": self.scaled_counts} if self.scaled_counts else {}),
            **({"looks_kind": self.looks_kind} if self.looks is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ShardResult":
        """Inverse of ``to_dict``. KeyError for a record without ``stats`` (an older packer's), whose
        shard --resume then writes again."""
        keys, labels, digests, looks = read_per_sample_record(d, (0, 1, 2, 3))
        return cls(
            d["name"],
            int(d["samples"]),
            [FileEntry.from_dict(f) for f in d["files"]],
            [Skipped(s["path"], s["reason"]) for s in d["skipped"]],
            keys,
            labels,
            digests,
            ShardStats.from_dict(d["stats"]),
            str(d.get("sources", "")),
            str(d.get("digest", "sha256-128")),
            int(d.get("format_version", 0)),
            {str(k): int(v) for k, v in d.get("boxes", {}).items()},
            int(d.get("scaled_counts", 0)),
            dict(d.get("image_sources", {})),
            looks=looks,
            looks_kind=str(d.get("looks_kind", "dct64-trim5")) if looks is not None else "",
        ).packed()
