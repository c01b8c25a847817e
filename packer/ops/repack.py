"""Repacking: a packer output converted into another format, codec or shard size from its own shards.

``packer convert OUT_A -f wds -o OUT_B`` (or ``packer.repack``) needs no source folder: every
sample is read back from OUT_A's shards (``packer.sources.repack_shard``) and written as a conversion
writes it, in the same order, with the same keys, labels, class map, preprocessing record,
statistics, skipped-file and duplicate reports. Pixels are equal when the stored form is lossless
(raw, png, or the same codec, whose bytes are copied); a change to jpeg encodes once. What the
preprocessing made (size, crop, normalization, dtype) cannot change: that needs the source files.
The output's manifest ``history`` records the repack. A packer output given as a conversion's
source is always repacked, never walked for files (its ``report.txt`` would become a text sample).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from packer import __version__
from packer.config import DEFAULT_QUALITY, ShardSize
from packer.ops.convert import ConvertResult
from packer.output.assemble import class_counts, shard_entries
from packer.output.files import check_output, local_output
from packer.records import ShardResult, ShardTask, Skipped, SourceItem
from packer.run.executor import DEFAULT_TIMEOUT, Executor, LocalExecutor, ProgressFn
from packer.run.plan import plan_shards
from packer.run.shard_job import ShardWork
from packer.run.staging import Staging
from packer.sources.repack_shard import RepackJob, overlapping
from packer.spec.errors import ConfigError, InputError, OutputError
from packer.spec.listed_files import sha256_of
from packer.spec.manifest import Manifest, read_manifest
from packer.spec.registry import get_format
from packer.spec.sample_layout import ImageCodec, SampleLayout
from packer.system import usable_cpus

log = logging.getLogger(__name__)

REPACK_OPTIONS = (
    "source",
    "fmt",
    "output",
    "codec",
    "quality",
    "shard_size",
    "workers",
    "overwrite",
    "resume",
    "timeout",
    "quiet",
    "executor_name",
    "address",
)
"""The ``packer convert`` options a repack takes (their parameter names); any other given with a
packer output as SOURCE is refused, as a repack cannot honour it."""


def target_layout(root: Path, layout: SampleLayout, codec: Optional[str], quality: Optional[int]) -> SampleLayout:
    """The layout of the repacked samples: the source's with its image codec changed to ``codec``
    (None: the same). ConfigError for a codec that cannot hold what the source stores."""
    if not layout.has_image:
        if codec is not None:
            raise ConfigError(f"{root} holds samples without images: --codec has nothing to encode; leave it out")
        return layout
    name = codec or layout.codec.name
    if name == layout.codec.name:
        if name in ("jpeg", "source") and quality is not None and quality != layout.codec.quality:
            raise ConfigError(
                f"the {name} images of {root} are copied as they are (quality {layout.codec.quality}); "
                f"encoding them again at quality {quality} would lose detail twice: convert the "
                f"source folder with --quality {quality}, or leave --quality out"
            )
        return layout
    if name == "source":
        raise ConfigError(
            f"--codec source keeps each source file's own bytes, which {root} does not hold (its images "
            f"are stored {layout.codec.name}); choose raw, jpeg or png"
        )
    if name != "raw" and layout.dtype != "uint8":
        raise ConfigError(
            f"--codec {name} stores 8-bit images, and {root} holds {layout.dtype} pixels (normalized "
            "at conversion): choose --codec raw"
        )
    return replace(layout, codec=ImageCodec(name, quality or DEFAULT_QUALITY) if name == "jpeg" else ImageCodec(name))


def repack(
    source: str | os.PathLike,
    output: str | os.PathLike,
    fmt: str,
    *,
    codec: Optional[str] = None,
    quality: Optional[int] = None,
    shard_size: ShardSize = ShardSize(),
    workers: Optional[int] = None,
    overwrite: bool = False,
    resume: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Optional[ProgressFn] = None,
    on_plan: Optional[Callable[[int, list[ShardTask]], None]] = None,
    executor: Optional[Executor] = None,
) -> ConvertResult:
    """Write the packer output ``source`` again as ``fmt`` at ``output`` (see the module): its images
    stored as ``codec`` (default: as they are; ``quality`` for jpeg), cut by ``shard_size``.
    ``workers``, ``resume``, ``timeout``, ``progress`` and ``executor`` work as for
    ``packer.convert``; ``on_plan(samples, tasks)`` is called once the shards are planned.
    Raises a PackerError subclass for anything the user must fix (a damaged source included: every
    sample's CRC-32 is checked as it is read, and nothing is published then)."""
    started = time.perf_counter()
    source, output = Path(source), local_output(output)
    src = read_manifest(source)
    if src.tokens is not None:
        raise InputError(
            f"{source} holds token blocks, which are not repacked yet: convert its corpus again with -f {fmt} "
            "(the same --tokenizer and --pack)"
        )
    src_layout = SampleLayout.from_manifest(src)
    layout = target_layout(source, src_layout, codec, quality)
    spec = get_format(fmt)
    spec.version(layout)  # ConfigError now for a format that cannot store this layout
    check_output(output, overwrite, source)
    if source.resolve() in output.resolve().parents:
        raise OutputError(f"{output} is inside the output {source} it repacks; choose an output outside it")
    first_files = [str((source / s.files[0].path).resolve()) for s in src.shards]
    items = [
        SourceItem(start + local, first_files[n], f"{s.name}/{local}")
        for n, (s, start) in enumerate(zip(src.shards, src.shard_offsets))
        for local in range(s.samples)
    ]
    if not items:
        raise InputError(f"{source} holds no samples to repack")
    executor = executor or LocalExecutor(max(1, workers or usable_cpus()))
    with Staging(output) as staging:
        result = _repack_locked(
            source,
            staging,
            src,
            src_layout,
            layout,
            fmt,
            items,
            shard_size,
            executor,
            overwrite,
            resume,
            timeout,
            progress,
            on_plan,
        )
    result.seconds = time.perf_counter() - started
    return result


def _repack_locked(
    source: Path,
    staging: Staging,
    src: Manifest,
    src_layout: SampleLayout,
    layout: SampleLayout,
    fmt: str,
    items: list[SourceItem],
    shard_size: ShardSize,
    executor: Executor,
    overwrite: bool,
    resume: bool,
    timeout: float,
    progress: Optional[ProgressFn],
    on_plan: Optional[Callable[[int, list[ShardTask]], None]],
) -> ConvertResult:
    """The part of ``repack`` that runs while this process holds the output's lock."""
    previous = staging.plan() if resume else None
    plan_workers = previous.get("workers", executor.workers) if previous else executor.workers
    tasks = plan_shards(items, shard_size, _sample_bytes(src, layout), plan_workers)
    fingerprint = _fingerprint(source, fmt, layout, shard_size, tasks)
    finished = staging.resume_or_start(
        tasks,
        previous,
        resume,
        expected=fingerprint,
        recorded=fingerprint,
        version=get_format(fmt).version(layout),
        workers=plan_workers,
    )
    if on_plan is not None:
        on_plan(len(items), tasks)
    root = str(source.resolve())
    with staging.writing() as stage:
        work = ShardWork(fmt, layout, str(stage))
        jobs = [
            work.job(
                i,
                t,
                repack=RepackJob(
                    root, src.format, src_layout, overlapping(src.shards, t.items[0].index, t.items[-1].index + 1)
                ),
            )
            for i, t in enumerate(tasks)
        ]
        todo, fresh = staging.run_unfinished(executor, jobs, finished, progress, timeout)
        by_name = {**finished, **{r.name: r for r in fresh}}
        results = staging.name_shards([by_name[t.name] for t in tasks], [t.name for t in tasks])
        manifest = repacked_manifest(source, src, layout, fmt, results, shard_size, plan_workers)
        staging.publish(manifest, overwrite=overwrite, source=source)
    skipped = [Skipped(s["path"], s["reason"]) for s in manifest.skipped]
    return ConvertResult(staging.output, manifest, 0.0, skipped, {}, sum(len(j.task.items) for j in todo))


def repacked_manifest(
    source: Path,
    src: Manifest,
    layout: SampleLayout,
    fmt: str,
    results: list[ShardResult],
    shard_size: ShardSize,
    workers: int,
) -> Manifest:
    """The manifest of the repacked output: the source's record of its samples (classes, counts,
    statistics, preprocessing, skipped files, duplicates, annotations), the new shards, and one more
    ``history`` entry. OutputError when the shards written do not hold exactly the source's samples."""
    samples = sum(r.samples for r in results)
    counts = class_counts(results, len(src.classes)) if src.classes is not None else None
    if samples != src.samples or (src.class_counts is not None and counts != list(src.class_counts)):
        raise OutputError(
            f"repacking {source} wrote {samples} samples (class counts {counts}) where its manifest "
            f"lists {src.samples} ({src.class_counts}); nothing was published: run packer verify "
            f"{source}"
        )
    shards = shard_entries(results, layout)
    sharding: dict = {"shard_size": shard_size.describe(), "shuffle_seed": src.sharding.get("shuffle_seed")}
    if shard_size.is_auto:
        sharding["balanced_for_workers"] = workers
    entry = {
        "action": "repack",
        "packer_version": __version__,
        "samples": samples,
        "from": {
            "format": src.format,
            "format_version": src.format_version,
            "codec": src.image_codec if src.has_image else None,
            "manifest_sha256": sha256_of(source / "manifest.json"),
        },
    }
    return Manifest(
        format=fmt,
        format_version=get_format(fmt).version(layout),
        packer_version=__version__,
        samples=samples,
        classes=src.classes,
        fields=layout.fields(),
        preprocess=src.preprocess,
        shards=shards,
        skipped=src.skipped,
        source=src.source,
        sharding=sharding,
        class_counts=counts if src.class_counts is not None else None,
        stats=src.stats,
        duplicates=src.duplicates,
        annotations=src.annotations,
        history=[*src.history, entry],
    )


def _sample_bytes(src: Manifest, layout: SampleLayout) -> float:
    """Stored bytes per sample, for the shard size: exact for fixed raw images, else the source's mean
    (the stored size of the same images: close for every codec but raw from encoded, which holds
    the pixels)."""
    if layout.sample_bytes is not None and not layout.codec.encoded:
        return float(layout.sample_bytes)
    total = sum(f.bytes for s in src.shards for f in s.files)
    mean = total / max(src.samples, 1)
    if layout.has_image and not layout.codec.encoded and src.image_codec != "raw":
        return mean * 10  # raw pixels from a compressed store: about ten times the bytes of a JPEG
    return mean


def _fingerprint(source: Path, fmt: str, layout: SampleLayout, shard_size: ShardSize, tasks: list[ShardTask]) -> str:
    """What --resume must find unchanged: the source output (its manifest's SHA-256), the options, the plan."""
    h = hashlib.sha256()
    options = {
        "repack": sha256_of(source / "manifest.json"),
        "format": fmt,
        "fields": layout.fields(),
        "shard_size": shard_size.describe(),
    }
    h.update(json.dumps(options, sort_keys=True).encode())
    for task in tasks:
        h.update(f"\0{task.name}\0{task.items[0].index}\0{len(task.items)}".encode())
    return h.hexdigest()
