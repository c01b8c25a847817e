"""``packer combine``: outputs of one format and one preprocessing as one output, without decoding
(token outputs: ``packer.ops.combine_tokens``).

The inputs' shards become the output's shards in input order: hard-linked where the filesystem
allows (copied otherwise, and always for LMDB), so combining costs a directory entry per file. The class
maps are unified by name (the first input's map, then the classes a later input adds, sorted, at
the end); a shard whose labels mean other indices in the unified map is written again with its
labels remapped, its stored bytes copied (``packer.sources.repack_shard``: nothing decoded). Samples with
identical stored bytes in two inputs are reported as duplicates, found by their stored CRC-32s and
confirmed byte for byte. The manifest's statistics are merged from the inputs' (exact means and
stds up to float rounding; size histograms added; a merged median is unknown, so it is null).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Optional, Sequence

from packer import __version__
from packer.ops.combine_tokens import combine_tokens
from packer.ops.convert import ConvertResult
from packer.output.assemble import merged_groups, shard_entries
from packer.output.files import check_output, local_output
from packer.output.finish import name_shards
from packer.output.held_files import HeldFiles
from packer.output.placed_shards import combine_entry, input_names, place_shard
from packer.pixels.stats import auto_normalize
from packer.records import ShardResult, ShardTask, Skipped, SourceItem, StoredSample
from packer.run.executor import Executor, LocalExecutor, ProgressFn
from packer.run.plan import shard_name
from packer.run.shard_job import ShardWork
from packer.run.staging import Staging
from packer.sources.repack_shard import RepackJob
from packer.spec.class_map import differences, extend_class_map
from packer.spec.errors import InputError, ManifestError, OutputError
from packer.spec.manifest import Manifest, read_manifest
from packer.spec.registry import get_format
from packer.spec.sample_layout import SampleLayout
from packer.system import usable_cpus

log = logging.getLogger(__name__)

DUPLICATES_SHOWN = 5


def combine(
    inputs: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    *,
    overwrite: bool = False,
    link: bool = True,
    workers: Optional[int] = None,
    executor: Optional[Executor] = None,
    progress: Optional[ProgressFn] = None,
) -> ConvertResult:
    """Combine the packer outputs ``inputs`` into ``output`` (see the module). ``link`` False copies
    every file instead of hard-linking it. InputError when the inputs differ in format, fields or
    preprocessing (naming the difference), or in detection categories or mask classes."""
    started = time.perf_counter()
    roots = [Path(p) for p in inputs]
    output = local_output(output)
    if len(roots) < 2:
        raise InputError("packer combine takes at least two outputs")
    if len({r.resolve() for r in roots}) != len(roots):
        raise InputError("an output is given twice; each input must be another output")
    manifests = [read_manifest(r) for r in roots]
    for root in roots:
        check_output(output, overwrite, root)
        if root.resolve() in output.resolve().parents:
            raise OutputError(f"{output} is inside the input {root}; choose an output outside it")
    if any(m.tokens is not None for m in manifests):  # blocks of token ids: their own rules
        return combine_tokens(roots, manifests, output, overwrite=overwrite, link=link, progress=progress)
    layout = _check_alike(roots, manifests)
    classes, maps = unified_classes(roots, manifests)
    executor = executor or LocalExecutor(max(1, workers or usable_cpus()))
    with Staging(output) as staging:
        staging.start()
        with staging.writing(resumable=False) as stage:  # nothing to resume: a combine is run again
            results, rewritten = _write_shards(stage, roots, manifests, layout, maps, link, executor, progress)
            duplicates = cross_duplicates(roots, manifests, layout)
            planned = [shard_name(i) for i in range(len(results))]
            results = name_shards(stage, results, planned)
            manifest = combined_manifest(roots, manifests, layout, classes, maps, results, duplicates)
            staging.publish(manifest, overwrite=overwrite)
    skipped = [Skipped(s["path"], s["reason"]) for s in manifest.skipped]
    return ConvertResult(output, manifest, time.perf_counter() - started, skipped, {}, rewritten)


def _check_alike(roots: list[Path], manifests: list[Manifest]) -> SampleLayout:
    """The inputs' common layout; InputError naming the first input that differs, and how."""
    first, layout = manifests[0], SampleLayout.from_manifest(manifests[0])
    for root, m in zip(roots[1:], manifests[1:]):
        if m.format != first.format:
            raise InputError(
                f"{root} is a {m.format} output and {roots[0]} a {first.format} one: repack it first "
                f"(packer convert {root} -f {first.format} -o {root}-{first.format})"
            )
        if SampleLayout.from_manifest(m) != layout:
            raise InputError(
                f"{root} and {roots[0]} store other fields ({differing(m.fields, first.fields)}): "
                "convert them alike to combine them"
            )
        if m.format_version != first.format_version:
            raise InputError(
                f"{root} is {m.format} version {m.format_version} and {roots[0]} version "
                f"{first.format_version}: repack the older one with this packer first (packer convert "
                "OLD -f FORMAT -o NEW), so that every shard of the result has the same files"
            )
        mine, theirs = dict(m.preprocess), dict(first.preprocess)
        norms = mine.pop("normalize", None), theirs.pop("normalize", None)
        if mine != theirs:
            raise InputError(
                f"{root} and {roots[0]} were preprocessed differently ({differing(mine, theirs)}): "
                "their samples are not alike, convert them with the same options"
            )
        auto = [isinstance(n, dict) and bool(n.get("auto")) for n in norms]
        if norms[0] != norms[1] and not all(auto):
            raise InputError(
                f"{root} and {roots[0]} are normalized differently ({norms[0]} and {norms[1]}): "
                "convert them with the same --normalize"
            )
        if (m.annotations is None) != (first.annotations is None):
            raise InputError(f"{root} and {roots[0]}: only one holds detection targets")
        if m.annotations is not None and m.annotations.get("categories") != first.annotations.get("categories"):
            how = differences(first.annotations.get("categories") or [], m.annotations.get("categories") or [])
            raise InputError(
                f"{root} and {roots[0]} have other categories ({how}): their boxes' labels cannot be "
                "remapped without rewriting every target; convert them with one category list "
                f"(packer convert ... --annotations ... --classes {roots[0]})"
            )
        if any(f.kind_of.class_indices for f in layout.text) and m.classes != first.classes:
            raise InputError(
                f"{root} and {roots[0]} have other mask classes: a mask's pixels are class indices, "
                "so their maps must be equal to combine them"
            )
    return layout


def differing(a: dict, b: dict) -> str:
    """The keys of two records whose values differ, with both values."""
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k}: {a.get(k)!r} against {b.get(k)!r}" for k in keys[:3])


def unified_classes(roots: list[Path], manifests: list[Manifest]) -> tuple[Optional[list[str]], list[Optional[list]]]:
    """The combined class map and, per input, its label map (old label -> new; None where labels
    stay): the first input's classes, then each later input's new ones, sorted, at the end."""
    labelled = [m.classes is not None for m in manifests]
    if not any(labelled):
        return None, [None] * len(manifests)
    if not all(labelled):
        odd = roots[labelled.index(False)]
        raise InputError(
            f"{odd} is unlabelled and {roots[labelled.index(True)]} is labelled: their samples cannot "
            "share one class map"
        )
    classes: list[str] = list(manifests[0].classes or [])
    for root, m in zip(roots[1:], manifests[1:]):
        classes = extend_class_map(classes, m.classes or [], True, str(root))
    maps: list[Optional[list]] = []
    for m in manifests:
        mapping = [classes.index(c) for c in (m.classes or [])]
        maps.append(None if mapping == list(range(len(mapping))) else mapping)
    return classes, maps


def _write_shards(
    stage: Path,
    roots: list[Path],
    manifests: list[Manifest],
    layout: SampleLayout,
    maps: list[Optional[list]],
    link: bool,
    executor: Executor,
    progress: Optional[ProgressFn],
) -> tuple[list[ShardResult], int]:
    """Every input shard placed in ``stage`` under its planned name: linked (or copied) where its
    labels stay, written again by the repack worker with remapped labels otherwise. Returns the
    results in output order and the count of samples written again."""
    results: list[Optional[ShardResult]] = []
    jobs = []
    fmt = manifests[0].format
    work = ShardWork(fmt, layout, str(stage))
    for root, m, mapping in zip(roots, manifests, maps):
        for shard, start in zip(m.shards, m.shard_offsets):
            planned = shard_name(len(results))
            if mapping is None:
                results.append(place_shard(stage, root, shard, planned, link))
                if progress is not None:
                    progress(shard.samples)
                continue
            first_file = str((root / shard.files[0].path).resolve())
            items = tuple(SourceItem(start + i, first_file, f"{shard.name}/{i}") for i in range(shard.samples))
            repack = RepackJob(str(root.resolve()), fmt, layout, ((shard, start),), tuple(mapping))
            jobs.append(work.job(len(results), ShardTask(planned, items), repack=repack))
            results.append(None)
    if jobs:
        for result in executor.run(jobs, progress=progress):
            results[int(result.name.rsplit("-", 1)[1])] = result
    return [r for r in results if r is not None], sum(len(j.task.items) for j in jobs)


def cross_duplicates(
    roots: list[Path], manifests: list[Manifest], layout: SampleLayout, files: Optional[list[HeldFiles]] = None
) -> list[list[str]]:
    """Groups of keys of samples stored with identical bytes in different inputs (``INPUT:KEY``):
    candidates by their stored CRC-32 (read without images), confirmed by comparing the bytes.
    ``files``: where each input's shard files are (default: in its folder of ``roots``)."""
    spec = get_format(manifests[0].format)
    names = input_names(roots)
    files = files or [HeldFiles(root) for root in roots]
    seen: dict[int, list[tuple[int, int, int, str]]] = defaultdict(list)  # crc -> (input, shard, local, key)
    for n, (root, m) in enumerate(zip(roots, manifests)):
        for s, shard in enumerate(m.shards):
            try:
                keys, crcs = files[n].index(m, shard, layout)
            except (KeyError, ValueError) as e:
                raise ManifestError(
                    f"{root}: {shard.name} has no per-sample checksums to compare ({e}): an output of "
                    "a packer before 0.2; convert its source folder again"
                ) from None
            for local, (key, crc) in enumerate(zip(keys, crcs.tolist())):
                seen[int(crc)].append((n, s, local, key))
    wanted = {entry for group in seen.values() if len({e[0] for e in group}) > 1 for entry in group}
    if not wanted:
        return []
    stored: dict[tuple[int, int, int], bytes] = {}  # the SHA-256 of each candidate's stored bytes
    by_shard = defaultdict(set)
    for n, s, local, _ in wanted:
        by_shard[(n, s)].add(local)
    for (n, s), locals_ in by_shard.items():
        shard = manifests[n].shards[s]
        with files[n].shard_folder(shard) as folder:
            stored.update(_stored_digests(spec.scan(folder, shard, layout), locals_, n, s))
    groups = []
    for group in seen.values():
        by_bytes = defaultdict(list)
        for n, s, local, key in group:
            if (n, s, local) in stored:
                by_bytes[stored[(n, s, local)]].append((n, key))
        for members in by_bytes.values():
            if len({n for n, _ in members}) > 1:
                groups.append(sorted(f"{names[n]}:{key}" for n, key in members))
    return sorted(groups)


def _stored_digests(
    samples: Iterable[StoredSample], wanted: set[int], n: int, s: int
) -> dict[tuple[int, int, int], bytes]:
    """The SHA-256 of the stored bytes (image, then each field with its length) of the ``wanted``
    samples (by position in their shard) of ``samples``, by ``(n, s, position)``."""
    digests = {}
    for sample in samples:
        if sample.local in wanted:
            image = (
                sample.encoded
                if sample.encoded is not None
                else (sample.image.tobytes() if sample.image is not None else b"")
            )
            h = hashlib.sha256(bytes(image))
            for value in sample.fields.values():
                h.update(len(value).to_bytes(8, "little") + bytes(value))
            digests[(n, s, sample.local)] = h.digest()
    return digests


def merged_stats(manifests: list[Manifest]) -> Optional[dict]:
    """The inputs' ``stats`` merged: pixel means and stds from the counts, size histograms added, min
    and max kept, medians null (not known from the inputs' summaries)."""
    if any(m.stats is None for m in manifests):
        return None
    pixels = [m.stats.get("pixels") for m in manifests if m.stats.get("pixels")]  # type: ignore[union-attr]
    merged_pixels = None
    if pixels:
        n = sum(p["count"] for p in pixels)
        means = [sum(p["count"] * p["mean"][c] for p in pixels) / n for c in range(len(pixels[0]["mean"]))]
        second = [
            sum(p["count"] * (p["std"][c] ** 2 + p["mean"][c] ** 2) for p in pixels) / n for c in range(len(means))
        ]
        merged_pixels = {
            "scale": pixels[0]["scale"],
            "count": n,
            "mean": means,
            "std": [math.sqrt(max(s - m * m, 0.0)) for s, m in zip(second, means)],
        }
        counted = {p.get("counted") for p in pixels} - {None}
        if counted:
            merged_pixels["counted"] = sorted(counted)[0]
    sizes = [m.stats["original_sizes"] for m in manifests if m.stats.get("original_sizes")]  # type: ignore[index]
    merged_sizes = None
    if sizes:
        merged_sizes = {"bins": sizes[0]["bins"]}
        for side in ("width", "height"):
            parts = [s[side] for s in sizes]
            found = [p for p in parts if p["min"] is not None]
            merged_sizes[side] = {
                "counts": [sum(c) for c in zip(*(p["counts"] for p in parts))],
                "min": min((p["min"] for p in found), default=None),
                "median": None,
                "max": max((p["max"] for p in found), default=None),
            }
    return {"pixels": merged_pixels, "original_sizes": merged_sizes}


def combined_manifest(
    roots: list[Path],
    manifests: list[Manifest],
    layout: SampleLayout,
    classes: Optional[list[str]],
    maps: list[Optional[list]],
    results: list[ShardResult],
    duplicates: list[list[str]],
) -> Manifest:
    """The manifest of the combined output (see the module)."""
    first = manifests[0]
    counts = None
    if classes is not None:
        counts = [0] * len(classes)
        for m, mapping in zip(manifests, maps):
            for label, n in enumerate(m.class_counts or []):
                counts[mapping[label] if mapping is not None else label] += n
    stats = merged_stats(manifests)
    preprocess = dict(first.preprocess)
    if (
        isinstance(preprocess.get("normalize"), dict)
        and preprocess["normalize"].get("auto")
        and stats
        and stats["pixels"] is not None
    ):
        preprocess["normalize"] = auto_normalize(stats["pixels"])  # the combined data's own, as --normalize auto
    shards = shard_entries(results, layout)
    ignored: dict[str, int] = defaultdict(int)
    for m in manifests:
        for ext, n in (m.source.get("ignored") or {}).items():
            ignored[ext] += n
    # The inputs' orders one after another are no seed's permutation of the whole (a single input's is)
    sharding = {
        "shard_size": "as the inputs'",
        "shuffle_seed": manifests[0].sharding.get("shuffle_seed") if len(manifests) == 1 else None,
    }
    names = input_names(roots)
    skipped = [{**s, "input": name} for name, m in zip(names, manifests) for s in m.skipped]
    own = [[f"{name}:{key}" for key in group] for name, m in zip(names, manifests) for group in m.duplicates]
    annotations = first.annotations
    if annotations is not None:
        annotations = dict(annotations)
        for key in ("boxes", "boxes_dropped", "images_without_boxes"):
            if key in annotations:
                annotations[key] = sum(int((m.annotations or {}).get(key, 0)) for m in manifests)
    entry = combine_entry(names, roots, manifests, sum(r.samples for r in results))
    if duplicates:
        shown = "; ".join(", ".join(g) for g in duplicates[:DUPLICATES_SHOWN])
        log.warning("%d group(s) of samples are stored in more than one input: %s", len(duplicates), shown)
    return Manifest(
        format=first.format,
        format_version=first.format_version,
        packer_version=__version__,
        samples=sum(r.samples for r in results),
        classes=classes,
        fields=layout.fields(),
        preprocess=preprocess,
        shards=shards,
        skipped=skipped,
        source={"files": sum(int(m.source.get("files", 0)) for m in manifests), "ignored": dict(ignored)},
        sharding=sharding,
        class_counts=counts,
        stats=stats,
        duplicates=merged_groups(own + duplicates),
        annotations=annotations,
        history=[entry],
    )


__all__ = ["combine", "unified_classes", "merged_stats", "cross_duplicates"]
