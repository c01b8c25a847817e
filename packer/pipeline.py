"""The conversion: discover, plan shards, write them in parallel, merge into one manifest, publish.

Shards are planned up front from the sorted source list, so each is written by one worker without
talking to any other; the parent only collects their results and writes the manifest last.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import stat
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
from PIL import Image

from packer import __version__
from packer.config import DEFAULT_SHARD_BYTES, ConvertConfig, ShardSize
from packer.discover import IMAGE_EXTENSIONS, Discovery, discover
from packer.errors import DecodeError, InputError, OutputError
from packer.executor import DEFAULT_TIMEOUT, Executor, LocalExecutor, ProgressFn
from packer.formats import ImageLayout
from packer.manifest import Manifest, ShardEntry, format_version, write_manifest
from packer.output import (
    check_output,
    discard,
    finished_shards,
    is_packer_output,
    lock_output,
    publish,
    read_plan,
    record_shard,
    recover,
    release_output,
    staging_dir,
    start_staging,
    write_plan,
)
from packer.records import SOURCE_DIGEST, ShardResult, ShardStats, ShardTask, Skipped, SourceItem, TextField
from packer.report import REPORT_NAME, reason_kind, write_report
from packer.stats import auto_normalize, summarize
from packer.system import usable_cpus
from packer.text import TEXT_EXTENSIONS, TextConfig
from packer.worker import ShardJob, fields_stamp, files_stamp, sources_digest

log = logging.getLogger(__name__)



@dataclass
class ConvertResult:
    """The outcome of a conversion: where it went, its manifest and what was left out."""

    output: Path
    manifest: Manifest
    seconds: float
    skipped: list[Skipped] = field(default_factory=list)
    ignored: dict[str, int] = field(default_factory=dict)
    processed: int = 0
    """Source files decoded by this run (fewer than all with --resume)."""

    @property
    def bytes(self) -> int:
        """Total size of the shard files."""
        return sum(f.bytes for s in self.manifest.shards for f in s.files)


def shard_name(i: int) -> str:
    """Name of the ``i``-th shard; every file of the shard starts with it."""
    return f"shard-{i:05d}"


def plan_shards(
    items: Sequence[SourceItem], size: ShardSize, sample_bytes: float, workers: int = 1
) -> list[ShardTask]:
    """Cut the sorted items into contiguous shards.

    A sample count or byte size gives shards of that size (the last one smaller). ``auto`` gives
    shards of at most 256 MiB, as many as a multiple of ``workers`` and of equal size, so that no
    worker waits for another at the end.
    """
    n = len(items)
    if n == 0:
        return []
    if size.samples is not None:
        per = size.samples
    elif size.bytes is not None:
        per = max(1, int(size.bytes // max(sample_bytes, 1)))
    else:
        most = max(1, int(DEFAULT_SHARD_BYTES // max(sample_bytes, 1)))  # samples in 256 MiB
        shards = min(n, math.ceil(math.ceil(n / most) / workers) * workers)
        base, extra = divmod(n, shards)
        bounds, start = [], 0
        for i in range(shards):
            end = start + base + (1 if i < extra else 0)
            bounds.append((start, end))
            start = end
        return [ShardTask(shard_name(i), tuple(items[a:b])) for i, (a, b) in enumerate(bounds)]
    return [ShardTask(shard_name(i), tuple(items[a : a + per])) for i, a in enumerate(range(0, n, per))]


def stored_order(items: Sequence[SourceItem], seed: Optional[int]) -> list[SourceItem]:
    """The order samples are stored in: sorted source order, or with a seed the permutation
    ``numpy.random.default_rng(seed).permutation(len(items))`` of it."""
    if seed is None:
        return list(items)
    return [items[i] for i in np.random.default_rng(seed).permutation(len(items))]


def estimate_sample_bytes(layout: ImageLayout, items: Sequence[SourceItem]) -> float:
    """Stored bytes per sample: exact for fixed image shapes; for images kept at their own size, the
    mean of up to 64 evenly spread files' sizes, read from their headers (no decoding); text fields
    add the mean size of their files (stored text is about its file's size)."""
    sample = items[:: max(1, len(items) // 64)]
    text = 0.0
    if layout.text:
        sizes = [_file_size(p) for item in sample for f, p in item.parts if f != "image"]
        text = float(sum(sizes) / len(sample)) if sample else 0.0
    if layout.sample_bytes is not None:
        return float(layout.sample_bytes) + text
    per_pixel = layout.channels * np.dtype(layout.dtype).itemsize
    sizes = []
    for item in sample:
        path = dict(item.parts).get("image", item.path)
        if not _file_size(path):
            continue  # a FIFO would block here; workers report such files
        try:
            with Image.open(path) as img:
                sizes.append(img.size[0] * img.size[1] * per_pixel)
        except Exception:  # noqa: BLE001 - a bad file is reported later by its worker; here it only has no size
            continue
    return (float(sum(sizes) / len(sizes)) if sizes else float(1024**2)) + text


def _file_size(path: str) -> int:
    """Size of a regular file, 0 for anything else or an unreadable path."""
    try:
        st = os.stat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def sample_layout(config: ConvertConfig, fields: Sequence[str]) -> ImageLayout:
    """The stored layout of samples of ``fields`` (see ``packer.discover``) under ``config``."""
    pre, text = config.preprocess, config.text
    extra = []
    for name in fields:
        if name == "text" and text.tokenizer is not None:
            extra.append(TextField("text", "tokens", text.tokenizer_info(), text.encoding, text.allow_missing))
        elif name in ("text", "json"):
            extra.append(TextField(name, name, None, text.encoding, text.allow_missing))
    return ImageLayout(pre.dtype, pre.image_shape, pre.channels, config.codec, "image" in fields, tuple(extra))


def convert(
    source: str | os.PathLike,
    output: str | os.PathLike,
    config: ConvertConfig,
    *,
    labels_file: Optional[str | os.PathLike] = None,
    workers: Optional[int] = None,
    overwrite: bool = False,
    strict: bool = False,
    resume: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Optional[ProgressFn] = None,
    on_plan: Optional[Callable[[Discovery, list[ShardTask]], None]] = None,
    executor: Optional[Executor] = None,
) -> ConvertResult:
    """Convert the image (or text) folder ``source`` into a packed output folder ``output``.

    ``workers`` defaults to the usable core count. Bad image files are skipped and listed, or with
    ``strict`` the first one raises DecodeError and nothing is written. ``resume`` continues an
    interrupted run from its finished shards (checked by SHA-256); the result equals an
    uninterrupted run. A file that takes more than ``timeout`` seconds hangs the decoder and is
    skipped. ``progress`` is called with the number of source files finished since its last call;
    ``on_plan`` once the work is known. ``executor`` runs the shards (default: ``workers`` local
    processes; ``packer.ray_executor.RayExecutor`` for a Ray cluster; ``workers`` is then unused).
    Raises a PackerError subclass for anything the user must fix; on KeyboardInterrupt the staging
    folder is kept for ``resume``.
    """
    started = time.perf_counter()
    output = Path(output)
    if resume and not staging_dir(output).exists() and output.is_dir() and is_packer_output(output):
        raise OutputError(f"{output} is already complete: nothing to resume (pass --overwrite to convert again)")
    found = discover_checked(source, output, labels_file, overwrite, strict, config.text)
    layout = sample_layout(config, found.fields)
    executor = executor or LocalExecutor(max(1, workers or usable_cpus()))
    run = RunOptions(executor.workers, overwrite, strict, resume, timeout)
    lock = lock_output(output)
    try:
        recover(output)
        result = _convert_locked(Path(source), output, config, layout, found, run, progress, on_plan, executor)
    finally:
        release_output(output, lock)
    result.seconds = time.perf_counter() - started
    return result


def discover_checked(
    source: str | os.PathLike, output: Path, labels_file: Optional[str | os.PathLike], overwrite: bool, strict: bool,
    text: TextConfig = TextConfig(),
) -> Discovery:
    """The checks every conversion makes before any work: the output may be written, the source
    has samples, and with ``strict`` discovery skipped none; then what discovery found (``text``
    says which fields make a sample)."""
    check_output(output, overwrite, Path(source))
    found = discover(source, labels_file, text.fields, text.allow_missing)
    if not found.items:
        if labels_file is not None and found.skipped:
            raise InputError(f"none of the {len(found.skipped)} samples under {source} is listed in {labels_file}; "
                             "its paths must be relative to the source folder, e.g. 'cat/001.jpg'")
        if found.skipped:
            raise InputError(f"no usable samples in {source}: all {len(found.skipped)} were skipped; first: "
                             f"{found.skipped[0].path}: {found.skipped[0].reason}")
        looked = ", ".join(sorted(IMAGE_EXTENSIONS | TEXT_EXTENSIONS))
        raise InputError(f"no images or texts found in {source} (looked for {looked})")
    if (text.tokenizer is not None or text.max_length is not None) and "text" not in found.fields:
        raise InputError(f"--tokenizer tokenizes text, but the samples in {source} have no text field "
                         f"(fields: {', '.join(found.fields)}); pass --fields with text, or leave --tokenizer out")
    if strict and found.skipped:
        first = found.skipped[0]
        raise DecodeError(first.path, first.reason)
    return found


@dataclass(frozen=True)
class RunOptions:
    """How a conversion runs; none of it changes what the output holds (see ``convert``)."""

    workers: int
    overwrite: bool = False
    strict: bool = False
    resume: bool = False
    timeout: float = DEFAULT_TIMEOUT


def _convert_locked(
    source: Path,
    output: Path,
    config: ConvertConfig,
    layout: ImageLayout,
    found: Discovery,
    run: RunOptions,
    progress: Optional[ProgressFn],
    on_plan: Optional[Callable[[Discovery, list[ShardTask]], None]],
    executor: Executor,
) -> ConvertResult:
    """The part of ``convert`` that runs while this process holds the output's lock."""
    stage = staging_dir(output)
    previous = read_plan(stage) if run.resume else None
    plan_workers = previous.get("workers", run.workers) if previous else run.workers
    tasks = plan_tasks(found, config, layout, plan_workers)
    finished: dict[str, ShardResult] = {}
    if run.resume and previous is None:
        log.warning("--resume: no interrupted run of %s to continue; starting a new one", output)
    if previous is not None:
        per_shard = previous.get("sources") == SOURCES_PER_SHARD
        if previous.get("fingerprint") != plan_fingerprint(config, tasks, run.strict, stamps=not per_shard):
            raise OutputError(
                f"the source files or options changed since the interrupted run in {stage}; "
                "run without --resume to start over"
            )
        finished = current_digests(finished_shards(stage, [t.name for t in tasks]))
        if per_shard:
            finished = unchanged_sources(finished, tasks)
        log.info("resuming: %d of %d shards already finished", len(finished), len(tasks))
    else:
        if stage.exists() and not run.resume:
            log.warning("discarding the unfinished run in %s (pass --resume to continue it)", stage)
        try:
            start_staging(output)  # replaces an unfinished run's folder with a new one
        except OSError as e:
            raise OutputError(f"cannot create {stage}: {_describe_os_error(e)}") from None
        write_plan(stage, {"fingerprint": plan_fingerprint(config, tasks, run.strict), "workers": plan_workers,
                           "sources": SOURCES_PER_SHARD})
    if on_plan is not None:
        on_plan(found, tasks)
    try:
        jobs = [ShardJob(i, t, config.format, layout, config.preprocess, str(stage), run.strict, text=config.text)
                for i, t in enumerate(tasks)]
        todo, fresh = run_unfinished(executor, jobs, finished, stage, progress, run.timeout)
        by_name = {**finished, **{r.name: r for r in fresh}}
        results = [by_name[t.name] for t in tasks]
        if not any(r.samples for r in results):
            kinds = Counter(reason_kind(s.reason) for r in results for s in r.skipped)
            raise InputError(f"no sample in {source} could be packed: all {sum(kinds.values())} were skipped ("
                             + ", ".join(f"{n} x {k}" for k, n in kinds.most_common()) + ")")
        manifest = build_manifest(config, layout, found, results, plan_workers)
        write_manifest(stage, manifest)
        write_report(stage / REPORT_NAME, manifest)
        publish(stage, output, run.overwrite, source)
    except KeyboardInterrupt:
        raise  # the staging folder stays, with its finished shards, for --resume
    except OSError as e:
        discard(stage)
        raise OutputError(f"cannot write the output in {stage.parent}: {_describe_os_error(e)}") from None
    except BaseException:
        discard(stage)
        raise
    skipped = [Skipped(s["path"], s["reason"]) for s in manifest.skipped]
    processed = sum(len(j.task.items) for j in todo)
    return ConvertResult(output, manifest, 0.0, skipped, found.ignored, processed)


def plan_tasks(found: Discovery, config: ConvertConfig, layout: ImageLayout, workers: int) -> list[ShardTask]:
    """The shards of a conversion of ``found``: its samples in stored order, cut by ``plan_shards``."""
    items = stored_order(found.items, config.shuffle)
    return plan_shards(items, config.shard_size, estimate_sample_bytes(layout, items), workers)


def run_unfinished(
    executor: Executor, jobs: list[ShardJob], finished: dict[str, ShardResult], stage: Path,
    progress: Optional[ProgressFn], timeout: float,
) -> tuple[list[ShardJob], list[ShardResult]]:
    """Count the files of the ``finished`` shards as done, then run the other ``jobs``, each result
    recorded in ``stage`` for --resume as it comes. Returns the jobs run and their results."""
    if progress is not None:
        done_items = sum(len(j.task.items) for j in jobs if j.task.name in finished)
        if done_items:
            progress(done_items)
    todo = [j for j in jobs if j.task.name not in finished]
    fresh = executor.run(todo, progress=progress, timeout=timeout,
                         on_result=lambda job, result: record_shard(stage, result)) if todo else []
    return todo, fresh


def _describe_os_error(e: OSError) -> str:
    where = f" ({e.filename})" if e.filename else ""
    hint = {28: "; free some space or write elsewhere", 13: "; check the folder's permissions",
            30: "; the filesystem is read-only"}.get(e.errno or 0, "")
    return f"{e.strerror or e}{where}{hint}"


SOURCES_PER_SHARD = "per-shard"
"""The plan record's ``sources`` when the workers stamp each shard's source files (``worker.sources_digest``)
and the fingerprint covers only options and plan. Plans without it (older packers', and split runs',
whose nodes must all see the same files) have each file's stamp in the fingerprint, taken before
any worker started."""


def plan_fingerprint(config: ConvertConfig, tasks: list[ShardTask], strict: bool = False, stamps: bool = False) -> str:
    """SHA-256 of everything that decides the output but the source files' contents: options and
    shard plan (each sample's index, key, label and fields). With ``stamps``, also each source
    file's size, inode and modification and change times, as older packers recorded it (the
    same bytes: their interrupted runs still resume)."""
    h = hashlib.sha256()
    options = {"format": config.format, "preprocess": config.preprocess.to_dict(), "strict": strict,
               "shard_size": config.shard_size.describe(), "shuffle": config.shuffle, "codec": config.codec.to_dict()}
    if config.text != TextConfig():  # absent for image outputs, so their fingerprints stay as they were
        options["text"] = {**asdict(config.text), "tokenizer": config.text.tokenizer_info()}
    h.update(json.dumps(options, sort_keys=True).encode())
    for task in tasks:
        h.update(task.name.encode())
        lines = []  # one update per shard: the same bytes as one per item, in less time
        for item in task.items:
            stamp = files_stamp(item) if stamps else fields_stamp(item)
            lines.append(f"\0{item.index}\0{item.relpath}\0{item.label}\0{stamp}")
        h.update("".join(lines).encode())
    return h.hexdigest()


def current_digests(finished: dict[str, ShardResult]) -> dict[str, ShardResult]:
    """The ``finished`` shards whose source digests are this packer's (``records.SOURCE_DIGEST``).
    The others, recorded by an older packer, are written again, so that every digest of the run
    can be compared for the duplicate report."""
    kept = {}
    for name, result in finished.items():
        if result.digest == SOURCE_DIGEST:
            kept[name] = result
        else:
            log.warning("%s: recorded by an older packer (%s source digests); writing it again", name, result.digest)
    return kept


def unchanged_sources(finished: dict[str, ShardResult], tasks: list[ShardTask]) -> dict[str, ShardResult]:
    """The ``finished`` shards whose source files are as their worker found them (size, times,
    inode; see ``worker.sources_digest``). The others are written again, from the files as they are
    now, as an uninterrupted run would; so is a shard recorded without stamps."""
    kept = {}
    for task in tasks:
        result = finished.get(task.name)
        if result is None:
            continue
        if result.sources and result.sources == sources_digest(task.items):
            kept[task.name] = result
        else:
            log.warning("%s: its source files changed since the interrupted run; writing it again", task.name)
    return kept


def build_manifest(
    config: ConvertConfig, layout: ImageLayout, found: Discovery, results: list[ShardResult], workers: int
) -> Manifest:
    """Merge the shard results, in shard order, into the manifest; with ``--normalize auto`` the
    computed pixel statistics become ``preprocess.normalize``."""
    shards = [ShardEntry(r.name, r.samples, r.files) for r in results]
    skipped = [s.to_dict() for s in found.skipped] + [s.to_dict() for r in results for s in r.skipped]
    sharding: dict = {"shard_size": config.shard_size.describe(), "shuffle_seed": config.shuffle}
    if config.shard_size.is_auto:
        sharding["balanced_for_workers"] = workers  # auto layouts depend on it; see plan_shards
    counts = None
    if found.classes is not None:
        labels = [label for r in results for label in r.labels]
        counts = [0] * len(found.classes)
        for label in labels:
            if 0 <= label < len(counts):
                counts[label] += 1
    stats = summarize(ShardStats.merged(r.stats for r in results), config.preprocess)
    preprocess = config.preprocess.to_dict()
    if config.preprocess.auto_normalize and stats["pixels"] is not None:
        preprocess["normalize"] = auto_normalize(stats["pixels"])
    return Manifest(
        format=config.format,
        format_version=format_version(config.format, config.codec.name, uses_version_3(config.format, layout)),
        packer_version=__version__,
        samples=sum(r.samples for r in results),
        classes=found.classes,
        class_counts=counts,
        stats=stats,
        fields=layout.fields(),
        preprocess=preprocess,
        sharding=sharding,
        shards=shards,
        skipped=skipped,
        duplicates=find_duplicates(results),
        source=source_counts(found),
    )


def uses_version_3(fmt: str, layout: ImageLayout) -> bool:
    """Whether an output needs format version 3: text fields, no image, or (npy, hdf5) raw images of
    varying sizes."""
    varying_raw = layout.has_image and layout.shape is None and not layout.codec.encoded
    return bool(layout.text) or not layout.has_image or (varying_raw and fmt in ("npy", "hdf5"))


def source_counts(found: Discovery) -> dict:
    """The manifest's ``source`` entry: image files counted (packed plus skipped) and ignored files."""
    return {"files": len(found.items) + len(found.skipped), "ignored": found.ignored}


def find_duplicates(results: list[ShardResult]) -> list[list[str]]:
    """Groups of sample keys whose source files have identical bytes, in key order."""
    groups: dict[str, list[str]] = {}
    for r in results:
        for key, digest in zip(r.keys, r.digests):
            groups.setdefault(digest, []).append(key)
    return sorted(keys for keys in groups.values() if len(keys) > 1)
