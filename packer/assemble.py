"""The manifest of a conversion, merged from its shards' results in shard order.

Workers never coordinate: each returns its shard's files, labels, source digests and statistics,
and the parent assembles them here, once every shard is written.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from packer import __version__
from packer.columns import HexColumn
from packer.config import ConvertConfig
from packer.discover import Discovery
from packer.manifest import Manifest, ShardEntry
from packer.records import ShardResult, ShardStats, forget_read_records, in_memory
from packer.registry import get_format
from packer.sample_layout import SampleLayout
from packer.source_codec import SOURCE_STATS
from packer.stats import auto_normalize, summarize


def build_manifest(
    config: ConvertConfig, layout: SampleLayout, found: Discovery, results: list[ShardResult], workers: int,
    annotations: Optional[dict] = None,
) -> Manifest:
    """Merge the shard results, in shard order, into the manifest; with ``--normalize auto`` the
    computed pixel statistics become ``preprocess.normalize``. ``annotations``: a detection output's
    summary of its annotations (``packer.detection.Matched.summary``), completed with the box counts."""
    source = layout.has_image and layout.codec.name == "source"
    shards = shard_entries(results, layout)
    skipped = [s.to_dict() for s in found.skipped] + [s.to_dict() for r in results for s in r.skipped]
    sharding: dict = {"shard_size": config.shard_size.describe(), "shuffle_seed": config.shuffle}
    if config.shard_size.is_auto:
        sharding["balanced_for_workers"] = workers  # auto layouts depend on it; see plan_shards
    # One pass over the shards' records (each parsed once, on disk): labels counted as the digests are read.
    counts = np.zeros(len(found.classes), np.int64) if found.classes is not None else None
    duplicates = find_duplicates(results, None if counts is None else lambda r: _add_labels(counts, r))
    forget_read_records()
    stats = summarize(ShardStats.merged(r.stats for r in results), config.preprocess)
    preprocess = config.preprocess.to_dict()
    if config.preprocess.auto_normalize and stats["pixels"] is not None:
        preprocess["normalize"] = auto_normalize(stats["pixels"])
    elif source and stats["pixels"] is not None and any(r.scaled_counts for r in results):
        stats["pixels"]["counted"] = SOURCE_STATS  # kept JPEGs were decoded at 1/8 scale (packer.source_codec)
    return Manifest(
        format=config.format,
        format_version=get_format(config.format).version(layout),
        packer_version=__version__,
        samples=sum(r.samples for r in results),
        classes=found.classes,
        class_counts=None if counts is None else counts.tolist(),
        stats=stats,
        fields=layout.fields(),
        preprocess=preprocess,
        sharding=sharding,
        shards=shards,
        skipped=skipped,
        duplicates=duplicates,
        source=source_counts(found),
        annotations=_with_box_counts(annotations, results) if annotations is not None else None,
    )


def shard_entries(results: list[ShardResult], layout: SampleLayout) -> list[ShardEntry]:
    """The manifest's entries of the shards written (those without samples are not published, see
    ``packer.finish``), with which images are source files' own bytes for ``--codec source``."""
    source = layout.has_image and layout.codec.name == "source"
    return [ShardEntry(r.name, r.samples, r.files, (r.image_sources or {"kept": [], "jpeg": 0, "png": 0})
                       if source else None) for r in results if r.samples]


def class_counts(results: list[ShardResult], classes: int, start: Optional[list[int]] = None) -> list[int]:
    """Samples per class of ``classes`` in the shards written, added to ``start`` (counts already held)."""
    counts = np.zeros(max(classes, len(start or [])), dtype=np.int64)
    counts[:len(start or [])] = start or []
    for r in results:
        _add_labels(counts[:classes], r)
    return counts.tolist()


def _add_labels(counts: np.ndarray, result: ShardResult) -> None:
    """Add ``result``'s samples per class to ``counts`` (one per class; labels outside, such as
    ``UNLABELLED``, are not counted)."""
    labels = np.asarray(result.labels, dtype=np.int64)
    counts += np.bincount(labels[(labels >= 0) & (labels < len(counts))], minlength=len(counts))


def _with_box_counts(annotations: dict, results: list[ShardResult]) -> dict:
    """The manifest's ``annotations``: the summary, then the boxes stored, those the crop dropped, and the
    images stored without any box."""
    counts = {k: sum(r.boxes.get(k, 0) for r in results) for k in ("kept", "dropped", "without_boxes")}
    return {**annotations, "boxes": counts["kept"], "boxes_dropped": counts["dropped"],
            "images_without_boxes": counts["without_boxes"]}


def source_counts(found: Discovery) -> dict:
    """The manifest's ``source`` entry: image files counted (packed plus skipped) and ignored files;
    ``labels: "file"`` when a ``--labels`` file gave them (``--append`` then needs one too)."""
    counts = {"files": len(found.items) + len(found.skipped), "ignored": found.ignored}
    if found.labels_from == "file":
        counts["labels"] = "file"
    return counts


def merged_groups(groups: Iterable[Sequence[str]]) -> list[list[str]]:
    """Duplicate groups with every two that share a key joined into one, each keeping its keys in the
    order first seen, the groups sorted: an append's or a combine's groups (the output's own, the new
    samples', and those across the two) overlap where a file has copies on both sides."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    seen: list[str] = []
    for group in groups:
        for key in group:
            if key not in parent:
                parent[key] = key
                seen.append(key)
        for key in group[1:]:
            a, b = root(group[0]), root(key)
            if a != b:
                parent[b] = a
    joined: dict[str, list[str]] = {}
    for key in seen:
        joined.setdefault(root(key), []).append(key)
    return sorted(group for group in joined.values() if len(group) > 1)


def find_duplicates(results: list[ShardResult], each: Optional[Callable[[ShardResult], None]] = None
                    ) -> list[list[str]]:
    """Groups of sample keys whose source files have identical bytes (each group in stored order,
    the groups sorted). ``each``, when given, is called with every result just before its digests are
    read (``build_manifest`` counts its labels then, while its record is the one parsed).

    The first 64 bits of every 128-bit digest are sorted in place in numpy, 8 bytes a sample; only
    the samples whose first 64 bits another one shares (the duplicates, and almost never any other)
    are compared whole and have their keys decoded, in a second pass over the shards. The digests
    are read one shard at a time (a finished shard's are in its record on disk). A dict of N lists,
    the way before, cost an object per sample and made the garbage collector walk the heap."""
    counts = [len(r.digests) for r in results]
    high = np.empty(sum(counts), np.uint64)
    at, by_dict = 0, False
    for r, n in zip(results, counts):
        if each is not None:
            each(r)
        raw = _raw128(r) if n and not by_dict else b""
        if raw is None or len(raw) != 16 * n:  # digests that are not 128-bit hex (none this packer records)
            by_dict = True
            continue
        # Native-order words of big-endian digests: not their numeric order, but equal where the digests are.
        high[at:at + n] = np.frombuffer(raw, np.uint64)[::2]
        at += n
    if by_dict:
        return _duplicates_by_dict(results)
    high.sort()
    shared = high[1:][high[1:] == high[:-1]]  # sorted, so each value once is a comparison away
    first = np.ones(shared.size, bool)
    first[1:] = shared[1:] != shared[:-1]
    shared = shared[first]  # (np.unique would import numpy.ma: a fixed cost in every run)
    del high
    if not shared.size:
        return []
    groups: dict[bytes, list[str]] = {}
    for r in results:
        if not len(r.digests):
            continue  # nothing to group (keys without digests: an older record's shard without samples)
        raw = _raw128(r)
        first = np.frombuffer(raw, np.uint64)[::2]  # type: ignore[arg-type]
        hits = np.flatnonzero(shared[np.minimum(np.searchsorted(shared, first), len(shared) - 1)] == first)
        keys = in_memory(r.keys) if len(hits) else ()
        for local in hits.tolist():  # in stored order
            groups.setdefault(raw[local * 16:(local + 1) * 16], []).append(keys[local])  # type: ignore[index]
    return sorted(keys for keys in groups.values() if len(keys) > 1)


def _raw128(result: ShardResult) -> Optional[bytes]:
    """The 16 bytes of each of ``result``'s digests back to back; None unless each is a lowercase
    128-bit hex digest and there is one per key."""
    digests = in_memory(result.digests)
    if len(result.keys) != len(digests):
        return None
    digests = HexColumn.of(digests) if len(digests) else HexColumn(b"", 16)  # a HexColumn stays itself
    return digests.raw if isinstance(digests, HexColumn) and digests.width == 16 else None


def _duplicates_by_dict(results: list[ShardResult]) -> list[list[str]]:
    groups: dict[str, list[str]] = {}
    for r in results:
        for key, digest in zip(r.keys, r.digests):
            groups.setdefault(digest, []).append(key)
    return sorted(keys for keys in groups.values() if len(keys) > 1)
