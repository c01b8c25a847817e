"""The local executor: shards written by a pool of worker processes, robust to bad files.

A file that crashes its decoder (a worker dies) or hangs it (no progress for ``timeout``
seconds) does not end the run. The executor reads which item each unfinished shard was on, tries
each such item alone in a throw-away process to tell the culprit from the bystanders, records the
culprit as skipped with the reason, and runs the unfinished shards again in a fresh pool.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from packer.config import PreprocessConfig
from packer.errors import PackerError
from packer.records import ShardResult, SourceItem
from packer.worker import ShardJob, init_worker, write_shard

log = logging.getLogger(__name__)

ProgressFn = Callable[[int], None]
DEFAULT_TIMEOUT = 120.0  # seconds one file may take before it is treated as hanging the decoder
MAX_FRUITLESS_RESTARTS = 2  # pool breaks in a row that no single file explains


@dataclass(frozen=True)
class Suspect:
    """An item a shard was working on when its pool broke, and whether its worker had stalled."""

    job: ShardJob
    item: SourceItem
    stalled: bool


class _PoolBroke(Exception):
    def __init__(self, suspects: list[Suspect]) -> None:
        super().__init__(f"{len(suspects)} suspect file(s)")
        self.suspects = suspects


def run_jobs(
    jobs: list[ShardJob],
    workers: int,
    *,
    progress: Optional[ProgressFn] = None,
    on_result: Optional[Callable[[ShardJob, ShardResult], None]] = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[ShardResult]:
    """Write every shard with ``workers`` processes; results in job order.

    ``progress(n)`` gets the number of source files finished since its last call (negative when
    a restarted shard's work is counted again); ``on_result`` is called in the parent as each
    shard finishes. Raises DecodeError in strict mode, PackerError when workers keep dying for no
    file's fault, KeyboardInterrupt after stopping the workers.
    """
    results: dict[int, ShardResult] = {}
    poisoned: dict[int, str] = {}
    fruitless = 0
    while len(results) < len(jobs):
        todo = [
            replace(j, poisoned={i.index: poisoned[i.index] for i in j.task.items if i.index in poisoned})
            for j in jobs if j.number not in results
        ]
        for job in todo:
            _remove_partial_files(job)
        try:
            _run_pool(todo, workers, progress, on_result, results, timeout)
        except _PoolBroke as broke:
            found = _convict(broke.suspects, timeout)
            fruitless = 0 if found else fruitless + 1
            if fruitless > MAX_FRUITLESS_RESTARTS:
                raise PackerError(
                    "worker processes keep dying and no single file explains it (out of memory?); "
                    "try fewer --workers"
                ) from None
            poisoned.update(found)
    return [results[j.number] for j in jobs]


def _remove_partial_files(job: ShardJob) -> None:
    # A shard cut short (crash, kill) may have left files; every file of a shard starts with its name.
    for path in Path(job.directory).glob(f"{job.task.name}.*"):
        if not path.name.endswith(".done.json"):
            path.unlink()


def _run_pool(
    jobs: list[ShardJob],
    workers: int,
    progress: Optional[ProgressFn],
    on_result: Optional[Callable[[ShardJob, ShardResult], None]],
    results: dict[int, ShardResult],
    timeout: float,
) -> None:
    ctx = _context()
    queue = ctx.SimpleQueue()
    current = ctx.Array("q", max(j.number for j in jobs) + 1, lock=False)
    reported: dict[int, int] = {}
    drain = threading.Thread(target=_drain, args=(queue, progress, reported), daemon=True)
    drain.start()
    pool = ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx, initializer=init_worker,
                               initargs=(queue, current, os.getpid()))
    futures: dict[Future, ShardJob] = {pool.submit(write_shard, job): job for job in jobs}
    watch: dict[int, tuple[int, float]] = {}
    stalled: set[int] = set()
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for fut in done:
                job = futures[fut]
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    raise _PoolBroke(_suspects(jobs, current, stalled)) from None
                results[job.number] = result
                if on_result is not None:
                    on_result(job, result)
            stalled |= _stalled_shards(jobs, current, watch, timeout)
            if stalled:
                log.warning("no progress for %.0f s; ending the workers to find the file that hangs", timeout)
                _stop(pool)
                raise _PoolBroke(_suspects(jobs, current, stalled))
    except _PoolBroke:
        _stop(pool)
        if progress is not None:  # the unfinished shards run again: take back what they reported
            for job in jobs:
                if job.number not in results and reported.get(job.number):
                    progress(-reported[job.number])
        raise
    except BaseException:
        _stop(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        queue.put(None)
        drain.join(timeout=5)


def _stalled_shards(jobs: list[ShardJob], current, watch: dict[int, tuple[int, float]], timeout: float) -> set[int]:
    now = time.monotonic()
    stalled = set()
    for job in jobs:
        position = current[job.number]
        last = watch.get(job.number)
        if last is None or last[0] != position:
            watch[job.number] = (position, now)
        elif position > 0 and now - last[1] > timeout:
            stalled.add(job.number)
    return stalled


def _suspects(jobs: list[ShardJob], current, stalled: set[int]) -> list[Suspect]:
    return [
        Suspect(job, job.task.items[current[job.number] - 1], job.number in stalled)
        for job in jobs if current[job.number] > 0
    ]


def _convict(suspects: list[Suspect], timeout: float) -> dict[int, str]:
    """Try each suspect alone in a fresh process; return {item index: reason} for the guilty."""
    guilty: dict[int, str] = {}
    for s in suspects:
        reason = probe(s.item.path, s.job.preprocess, timeout)
        if reason is not None:
            log.warning("%s: %s; skipping it", s.item.relpath, reason)
            guilty[s.item.index] = reason
    return guilty


def probe(path: str, preprocess: PreprocessConfig, timeout: float) -> Optional[str]:
    """Decode one file in a throw-away process: None if that works (or fails cleanly), else why not."""
    proc = _context().Process(target=_probe_target, args=(path, preprocess), daemon=True)
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return f"decoder hangs: no result after {timeout:.0f} s"
    if proc.exitcode != 0:
        code = proc.exitcode or 0
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        return f"decoder crashed ({how})"
    return None


def _probe_target(path: str, preprocess: PreprocessConfig) -> None:
    from packer.errors import DecodeError
    from packer.preprocess import load_image

    try:
        load_image(path, preprocess)
    except DecodeError:
        pass  # a clean failure: the worker would have skipped it, it is not what broke the pool


def _context():
    # forkserver: workers start from a clean process, not a copy of one that may hold threads,
    # open files or CUDA state; the preload imports the worker code once for all of them.
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["packer.worker"])
        return ctx
    return mp.get_context("spawn")


def _drain(queue, progress: Optional[ProgressFn], reported: dict[int, int]) -> None:
    while (message := queue.get()) is not None:
        shard, n = message
        reported[shard] = reported.get(shard, 0) + n
        if progress is not None:
            progress(n)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel queued shards and end running workers at once (used on errors and Ctrl-C)."""
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        if proc.is_alive():
            proc.kill()
