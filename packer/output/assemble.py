"""The manifest of a conversion, merged from its shards' results in shard order.

Workers never coordinate: each returns its shard's files, labels, source digests and statistics,
and the parent assembles them here, once every shard is written.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

import numpy as np

from packer import __version__
from packer.columns import HexColumn
from packer.config import ConvertConfig
from packer.output.files import SCRATCH_PREFIX
from packer.output.image_hashes import gathered_looks, keys_in_results, near_duplicates, write_hashes
from packer.output.shard_samples import digest_words, forget_samples, read_samples
from packer.pixels.source_codec import SOURCE_STATS
from packer.pixels.stats import auto_normalize, summarize
from packer.recorded_columns import forget_read_records, in_memory
from packer.records import ShardResult, ShardStats
from packer.sources.discover import Discovery
from packer.spec.manifest import Manifest, ShardEntry
from packer.spec.registry import get_format
from packer.spec.sample_layout import SampleLayout

log = logging.getLogger(__name__)


def build_manifest(
    config: ConvertConfig,
    layout: SampleLayout,
    found: Discovery,
    results: list[ShardResult],
    workers: int,
    annotations: Optional[dict] = None,
    scratch: Optional[Path] = None,
    fixed_samples: Optional[int] = None,
    stage: Optional[Path] = None,
) -> Manifest:
    """Merge the shard results, in shard order, into the manifest; with ``--normalize auto`` the
    computed pixel statistics become ``preprocess.normalize``. ``annotations``: a detection output's
    summary of its annotations (``packer.targets.detection.Matched.summary``), completed with the box counts.
    ``scratch``: a folder the duplicate search may spill to (``find_duplicates``). ``fixed_samples``:
    ``packer.run.plan.ShardPlan.fixed_samples``. ``stage``: the folder the output is made in, where
    ``image_hashes.npy`` is written when every shard hashed its images (``packer.output.image_hashes``)."""
    source = layout.has_image and layout.codec.name == "source"
    shards = shard_entries(results, layout)
    skipped = [s.to_dict() for s in found.skipped] + [s.to_dict() for r in results for s in r.skipped]
    sharding: dict = {"shard_size": config.shard_size.describe(), "shuffle_seed": config.shuffle}
    if config.shard_size.is_auto and fixed_samples is not None:
        sharding["samples_per_shard"] = fixed_samples  # a large source's cut (packer.run.plan.auto_cut)
    elif config.shard_size.is_auto:
        sharding["balanced_for_workers"] = workers  # auto layouts depend on it; see plan_shards
    # One pass over the shards' records (each parsed once, on disk): labels counted as the digests are read.
    counts = np.zeros(len(found.classes), np.int64) if found.classes is not None else None
    duplicates = find_duplicates(results, None if counts is None else lambda r: _add_labels(counts, r), scratch)
    hashes, near = _image_hashes(config, results, duplicates, stage if layout.has_image else None)
    forget_read_records()
    forget_samples()
    stats = summarize(ShardStats.merged(r.stats for r in results), config.preprocess)
    preprocess = config.preprocess.to_dict()
    if config.preprocess.auto_normalize and stats["pixels"] is not None:
        preprocess["normalize"] = auto_normalize(stats["pixels"])
    elif source and stats["pixels"] is not None and any(r.scaled_counts for r in results):
        stats["pixels"]["counted"] = SOURCE_STATS  # kept JPEGs were decoded at 1/8 scale (packer.pixels.source_codec)
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
        image_hashes=hashes,
        near_duplicates=near,
    )


def _image_hashes(
    config: ConvertConfig, results: list[ShardResult], duplicates: list[list[str]], stage: Optional[Path]
) -> tuple[Optional[dict], Optional[dict]]:
    """The manifest's ``image_hashes`` and ``near_duplicates`` entries, ``image_hashes.npy`` written
    into ``stage``; (None, None) where the images were not hashed (or there are none: no ``stage``)."""
    if stage is None or not config.image_hashes:
        return None, None
    looks = gathered_looks(results)
    if looks is None:
        if any(r.samples and r.looks is None for r in results):
            log.warning(
                "near-duplicates not searched: some shards were written by an earlier run of a packer that "
                "did not hash images (convert again without --resume to have them)"
            )
        return None, None
    near = near_duplicates(looks, config.dup_distance, duplicates, keys_in_results(results))
    return write_hashes(stage, looks), near


def shard_entries(results: list[ShardResult], layout: SampleLayout) -> list[ShardEntry]:
    """The manifest's entries of the shards written (those without samples are not published, see
    ``packer.output.finish``), with which images are source files' own bytes for ``--codec source``."""
    source = layout.has_image and layout.codec.name == "source"
    return [
        ShardEntry(
            r.name, r.samples, r.files, (r.image_sources or {"kept": [], "jpeg": 0, "png": 0}) if source else None
        )
        for r in results
        if r.samples
    ]


def class_counts(results: list[ShardResult], classes: int, start: Optional[list[int]] = None) -> list[int]:
    """Samples per class of ``classes`` in the shards written, added to ``start`` (counts already held)."""
    counts = np.zeros(max(classes, len(start or [])), dtype=np.int64)
    counts[: len(start or [])] = start or []
    for r in results:
        _add_labels(counts[:classes], r)
    return counts.tolist()


def _add_labels(counts: np.ndarray, result: ShardResult) -> None:
    """Add ``result``'s samples per class to ``counts`` (one per class; labels outside, such as
    ``UNLABELLED``, are not counted)."""
    side = read_samples(result)
    labels = np.asarray(result.labels, dtype=np.int64) if side is None else side["label"]
    counts += np.bincount(labels[(labels >= 0) & (labels < len(counts))], minlength=len(counts))


def _with_box_counts(annotations: dict, results: list[ShardResult]) -> dict:
    """The manifest's ``annotations``: the summary, then the boxes stored, those the crop dropped, and the
    images stored without any box."""
    counts = {k: sum(r.boxes.get(k, 0) for r in results) for k in ("kept", "dropped", "without_boxes")}
    return {
        **annotations,
        "boxes": counts["kept"],
        "boxes_dropped": counts["dropped"],
        "images_without_boxes": counts["without_boxes"],
    }


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


SPILL_WORDS = 1 << 16
"""Digest words (8 bytes each) the duplicate search keeps in memory at most, when it has a folder
to spill to: beyond, they are parted by their top bits into up to ``SPILL_BUCKETS`` files there and
searched one file at a time (a sorted array of 10^8 words was 800 MB of the parent's memory)."""
SPILL_BUCKETS = 256  # at most 256: bucket numbers are uint8


def find_duplicates(
    results: list[ShardResult], each: Optional[Callable[[ShardResult], None]] = None, scratch: Optional[Path] = None
) -> list[list[str]]:
    """Groups of sample keys whose source files have identical bytes (each group in stored order,
    the groups sorted). ``each``, when given, is called with every result just before its digests are
    read (``build_manifest`` counts its labels then, while its record is the one read).

    The first 64 bits of every 128-bit digest are sorted in numpy, 8 bytes a sample, in memory or,
    with a ``scratch`` folder and more than ``SPILL_WORDS`` samples, in bucket files there; only the
    samples whose first 64 bits another one shares (the duplicates, and almost never any other)
    are compared whole and have their keys decoded, in a second pass over the shards. The digests
    are read one shard at a time (a finished shard's are in its record's side file on disk). A dict
    of N lists, the way before, cost an object per sample and made the garbage collector walk the heap."""
    counts = [len(r.digests) for r in results]
    buckets = 1 if scratch is None else min(SPILL_BUCKETS, -(-sum(counts) // SPILL_WORDS))
    words_of = _words_of(results, counts, each)
    if buckets <= 1:
        shared = _repeated_in_memory(words_of, sum(counts))
    else:
        assert scratch is not None
        with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX, dir=scratch) as folder:
            shared = _repeated_in_buckets(words_of, (buckets - 1).bit_length(), Path(folder))
    if shared is None:  # digests that are not 128-bit hex (none this packer records)
        return _duplicates_by_dict(results)
    if not shared.size:
        return []
    groups: dict[bytes, list[str]] = {}
    for r in results:
        if not len(r.digests):
            continue  # nothing to group (keys without digests: an older record's shard without samples)
        words = _first_words(r)
        hits = np.flatnonzero(shared[np.minimum(np.searchsorted(shared, words), len(shared) - 1)] == words)
        if not len(hits):
            continue
        raw, keys = _raw128(r), in_memory(r.keys)
        for local in hits.tolist():  # in stored order
            groups.setdefault(raw[local * 16 : (local + 1) * 16], []).append(keys[local])  # type: ignore[index]
    return sorted(keys for keys in groups.values() if len(keys) > 1)


def _words_of(
    results: list[ShardResult], counts: list[int], each: Optional[Callable[[ShardResult], None]]
) -> Iterator[Optional[np.ndarray]]:
    """Each result's ``_first_words`` (None where they are not one per sample), after ``each(result)``."""
    for r, n in zip(results, counts):
        if each is not None:
            each(r)
        words = _first_words(r) if n else np.zeros(0, np.uint64)
        yield words if words is not None and len(words) == n else None


def _repeated_in_memory(words_of: Iterable[Optional[np.ndarray]], total: int) -> Optional[np.ndarray]:
    """The values found more than once among the arrays of ``words_of``, sorted (None if one is None)."""
    high = np.empty(total, np.uint64)
    at, whole = 0, True
    for words in words_of:  # every one, so that the caller's ``each`` sees every result
        whole = whole and words is not None
        if whole:
            high[at : at + len(words)] = words  # type: ignore[arg-type]
            at += len(words)  # type: ignore[arg-type]
    if not whole:
        return None
    high.sort()
    return _repeats(high)


def _repeated_in_buckets(words_of: Iterable[Optional[np.ndarray]], bits: int, folder: Path) -> Optional[np.ndarray]:
    """``_repeated_in_memory``, with the values parted by their top ``bits`` bits into files in
    ``folder`` and each file searched on its own (each value is in one file, and the files in
    order of their top bits give the repeats sorted)."""
    files = [open(folder / f"{b:03d}.u64", "wb") for b in range(1 << bits)]
    whole = True
    try:
        for words in words_of:  # every one, so that the caller's ``each`` sees every result
            whole = whole and words is not None
            if not whole:
                continue
            assert words is not None
            ids = (words >> np.uint64(64 - bits)).astype(np.uint8)  # bits <= 8: a radix sort's keys
            order = np.argsort(ids, kind="stable")
            ordered = words[order]
            bounds = np.searchsorted(ids[order], np.arange((1 << bits) + 1)).tolist()
            for b, f in enumerate(files):
                if bounds[b] < bounds[b + 1]:
                    f.write(ordered[bounds[b] : bounds[b + 1]].tobytes())
    finally:
        for f in files:
            f.close()
    if not whole:
        return None
    parts = []
    for b in range(1 << bits):
        high = np.fromfile(folder / f"{b:03d}.u64", np.uint64)
        high.sort()
        parts.append(_repeats(high))
    return np.concatenate(parts)


def _repeats(high: np.ndarray) -> np.ndarray:
    """Each value found more than once in the sorted ``high``, once."""
    shared = high[1:][high[1:] == high[:-1]]  # sorted, so each value once is a comparison away
    first = np.ones(shared.size, bool)
    first[1:] = shared[1:] != shared[:-1]
    return shared[first]  # (np.unique would import numpy.ma: a fixed cost in every run)


def _first_words(result: ShardResult) -> Optional[np.ndarray]:
    """The first 8 bytes of each of ``result``'s 128-bit digests as native-order uint64 (not their
    numeric order, but equal where the digests are): a view of its side file's rows where it has
    one (no copy of the digests), else of ``_raw128``'s bytes; None where ``_raw128`` gives None."""
    side = read_samples(result)
    if side is not None:
        return digest_words(side)
    raw = _raw128(result)
    return None if raw is None else np.frombuffer(raw, np.uint64)[::2]


def _raw128(result: ShardResult) -> Optional[bytes]:
    """The 16 bytes of each of ``result``'s digests back to back; None unless each is a lowercase
    128-bit hex digest and there is one per key. Read from the record's side file where it has one
    (``packer.output.shard_samples``: no parse of the record)."""
    side = read_samples(result)
    if side is not None:
        return side["digest"].tobytes()
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
