"""The conversion: discover, plan shards, write them in parallel, merge into one manifest, publish.

Shards are planned up front from the sorted source list, so each is written by one worker without
talking to any other; the parent only collects their results and writes the manifest last.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from packer import __version__
from packer.config import DEFAULT_SHARD_BYTES, ConvertConfig, ShardSize
from packer.discover import Discovery, discover
from packer.errors import ConfigError, PackerError
from packer.formats import ImageLayout, get_writer
from packer.manifest import FORMAT_VERSIONS, Manifest, ShardEntry, write_manifest
from packer.output import check_output, discard, publish, start_staging
from packer.records import ShardResult, ShardTask, Skipped, SourceItem
from packer.system import usable_cpus
from packer.worker import ShardJob, init_worker, write_shard

log = logging.getLogger(__name__)

ProgressFn = Callable[[int], None]
UNKNOWN_SIZE_FACTOR = 8  # stored bytes per source byte when image sizes vary (JPEG ~ 1:8 of raw)


@dataclass
class ConvertResult:
    """The outcome of a conversion: where it went, its manifest and what was left out."""

    output: Path
    manifest: Manifest
    seconds: float
    skipped: list[Skipped] = field(default_factory=list)
    ignored: dict[str, int] = field(default_factory=dict)

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


def estimate_sample_bytes(layout: ImageLayout, items: Sequence[SourceItem]) -> float:
    """Stored bytes per sample: exact for fixed shapes, a guess from file sizes otherwise."""
    if layout.sample_bytes is not None:
        return float(layout.sample_bytes)
    probe = items[:: max(1, len(items) // 64)]
    sizes = [os.path.getsize(i.path) for i in probe if os.path.exists(i.path)]
    return UNKNOWN_SIZE_FACTOR * (sum(sizes) / len(sizes)) if sizes else 1024**2


def convert(
    source: str | os.PathLike,
    output: str | os.PathLike,
    config: ConvertConfig,
    *,
    labels_file: Optional[str | os.PathLike] = None,
    workers: Optional[int] = None,
    overwrite: bool = False,
    progress: Optional[ProgressFn] = None,
    on_plan: Optional[Callable[[Discovery, list[ShardTask]], None]] = None,
) -> ConvertResult:
    """Convert the image folder ``source`` into a packed output folder ``output``.

    ``workers`` defaults to the usable core count. ``progress`` is called with the number of
    source files finished since its last call; ``on_plan`` once the work is known. Raises a
    PackerError subclass for anything the user must fix; bad image files are skipped and listed.
    """
    started = time.perf_counter()
    output = Path(output)
    writer_cls = get_writer(config.format)
    pre = config.preprocess
    layout = ImageLayout(pre.dtype, pre.image_shape, pre.channels)
    if layout.shape is None and not writer_cls.variable_shape:
        raise ConfigError(
            f"--resize none keeps each image's own size, but the {config.format} format stores one "
            "fixed-size array; use --format lmdb or wds, or choose a --size and --resize mode"
        )
    check_output(output, overwrite)
    found = discover(source, labels_file)
    workers = max(1, workers or usable_cpus())
    tasks = plan_shards(found.items, config.shard_size, estimate_sample_bytes(layout, found.items), workers)
    if on_plan is not None:
        on_plan(found, tasks)
    stage = start_staging(output)
    try:
        jobs = [ShardJob(t, config.format, layout, pre, str(stage)) for t in tasks]
        results = run_jobs(jobs, workers, progress)
        manifest = build_manifest(config, layout, found, results, workers)
        write_manifest(stage, manifest)
        publish(stage, output)
    except BaseException:
        discard(stage)
        raise
    skipped = list(found.skipped) + [s for r in results for s in r.skipped]
    return ConvertResult(output, manifest, time.perf_counter() - started, skipped, found.ignored)


def build_manifest(
    config: ConvertConfig, layout: ImageLayout, found: Discovery, results: list[ShardResult], workers: int
) -> Manifest:
    """Merge the shard results, in shard order, into the manifest."""
    shards = [ShardEntry(r.name, r.samples, r.files) for r in results]
    skipped = [s.to_dict() for s in found.skipped] + [s.to_dict() for r in results for s in r.skipped]
    sharding = {"shard_size": config.shard_size.describe()}
    if config.shard_size.is_auto:
        sharding["balanced_for_workers"] = workers  # auto layouts depend on it; see plan_shards
    return Manifest(
        format=config.format,
        format_version=FORMAT_VERSIONS[config.format],
        packer_version=__version__,
        samples=sum(r.samples for r in results),
        classes=found.classes,
        fields=layout.fields(),
        preprocess=config.preprocess.to_dict(),
        sharding=sharding,
        shards=shards,
        skipped=skipped,
        source={"files": len(found.items) + len(found.skipped), "ignored": found.ignored},
    )


def run_jobs(jobs: list[ShardJob], workers: int, progress: Optional[ProgressFn] = None) -> list[ShardResult]:
    """Write every shard, in a pool of ``workers`` processes (inline for one), results in job order."""
    if workers <= 1 or len(jobs) <= 1:
        return [write_shard(job, progress) for job in jobs]
    ctx = _context()
    queue = ctx.SimpleQueue()
    drain = threading.Thread(target=_drain, args=(queue, progress), daemon=True)
    drain.start()
    pool = ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx, initializer=init_worker, initargs=(queue,))
    try:
        futures = [pool.submit(write_shard, job) for job in jobs]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for job, fut in zip(jobs, futures):
            if fut.done() and fut.exception() is not None:
                exc = fut.exception()
                if isinstance(exc, BrokenProcessPool):
                    raise PackerError(
                        f"a worker process died while writing {job.task.name} (out of memory, or a crash in "
                        "an image decoder); run again with --workers 1 to find the file"
                    ) from None
                raise exc  # type: ignore[misc]
        return [f.result() for f in futures]
    except BaseException:
        _stop(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        queue.put(None)
        drain.join(timeout=5)


def _context():
    # forkserver: workers start from a clean process, not a copy of one that may hold threads,
    # open files or CUDA state; the preload imports the worker code once for all of them.
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["packer.worker"])
        return ctx
    return mp.get_context("spawn")


def _drain(queue, progress: Optional[ProgressFn]) -> None:
    while (n := queue.get()) is not None:
        if progress is not None:
            progress(n)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel queued shards and end running workers at once (used on errors and Ctrl-C)."""
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        if proc.is_alive():
            proc.terminate()
