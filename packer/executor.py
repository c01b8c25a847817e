"""The local executor: one worker process per shard, at most ``workers`` at a time.

Each shard runs in a process of its own and talks to the parent
through its own pipe (progress counts, then its result or its error), so nothing is shared that a
killed process could leave locked. That makes bad files cheap to survive: when a shard's process
dies (a decoder crash) or makes no progress for ``timeout`` seconds (a decoder hang), the parent
knows exactly which file it was on, tries that file alone in a throw-away process to be sure, skips
it with the reason, and runs the shard again.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from pathlib import Path
from typing import Callable, Optional, Protocol

from packer.errors import PackerError
from packer.records import ShardResult, SourceItem
from packer.registry import get_format
from packer.system import process_context, release_stop_signals, stop_signals_held
from packer.worker import FINISHING, ProgressFn, ShardJob, die_with_parent, run_shard_process

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 120.0  # seconds one file may take before it is treated as hanging the decoder
MAX_RETRIES = 3  # times one shard may fail for no file's fault (out of memory, ...) before giving up


class RunStopped(Exception):
    """``run_jobs`` ended because its ``should_stop`` said so; its workers are ended, nothing is written."""


@dataclass
class _Running:
    job: ShardJob
    proc: object
    conn: object
    reported: int = 0
    position: int = 0
    since: float = 0.0


def run_jobs(
    jobs: list[ShardJob],
    workers: int,
    *,
    progress: Optional[ProgressFn] = None,
    on_result: Optional[Callable[[ShardJob, ShardResult], None]] = None,
    timeout: float = DEFAULT_TIMEOUT,
    should_stop: Optional[Callable[[], bool]] = None,
) -> list[ShardResult]:
    """Write every shard with up to ``workers`` processes; results in job order.

    ``progress(n)`` gets the number of source files finished since its last call (negative when a
    shard that failed is counted again); ``on_result`` is called in the parent as each shard
    finishes. ``should_stop()``, asked about once a second, ends the run (RunStopped) when true.
    Raises DecodeError in strict mode, whatever error a shard raised, PackerError when a shard's
    process keeps dying for no file's fault, and KeyboardInterrupt after ending the workers.
    """
    ctx = process_context()
    for fmt in {job.format for job in jobs}:
        get_format(fmt).import_modules()  # before the forks: every worker starts with its writer imported
    log_level = logging.getLogger("packer").getEffectiveLevel()
    positions = ctx.Array("q", max((j.number for j in jobs), default=0) + 1, lock=False)
    queue = deque(jobs)
    running: list[_Running] = []
    results: dict[int, ShardResult] = {}
    failures: dict[int, int] = {}
    try:
        while queue or running:
            if should_stop is not None and should_stop():
                raise RunStopped()
            while queue and len(running) < workers:
                job = queue.popleft()
                remove_partial_files(job)
                receive, send = ctx.Pipe(duplex=False)
                positions[job.number] = 0
                proc = ctx.Process(target=run_shard_process, args=(job, send, positions, os.getpid(), log_level),
                                   daemon=True)
                with stop_signals_held():  # a Ctrl-C during fork would otherwise be lost
                    proc.start()
                    # Recorded before the held signals arrive: an interrupt then ends this worker too.
                    running.append(_Running(job, proc, receive, since=time.monotonic()))
                send.close()
            wait([r.conn for r in running] + [r.proc.sentinel for r in running], timeout=1.0)
            now = time.monotonic()
            for r in list(running):
                outcome = _collect(r, progress)
                if positions[r.job.number] != r.position:
                    r.position, r.since = positions[r.job.number], now
                if outcome is None and r.proc.is_alive():
                    if r.position != FINISHING and time.monotonic() - r.since > timeout:
                        log.warning("%s: no progress for %.0f s; ending its worker", r.job.task.name, timeout)
                        r.proc.kill()
                        r.proc.join()
                        outcome = ("died", None)
                    else:
                        continue
                running.remove(r)
                r.conn.close()
                r.proc.join()
                kind, value = outcome if outcome is not None else ("died", None)
                if kind == "result":
                    for skipped in value.skipped:  # logged here, in the parent, where the CLI shows it
                        log.info("skipped %s: %s", skipped.path, skipped.reason)
                    results[r.job.number] = value
                    if on_result is not None:
                        on_result(r.job, value)
                elif kind == "error":
                    raise value
                else:
                    if progress is not None and r.reported:
                        progress(-r.reported)  # the shard runs again from its start
                    queue.appendleft(_after_failure(r, failures, timeout))
    except BaseException:
        for r in running:
            r.proc.kill()
        for r in running:
            r.proc.join()
            r.conn.close()
        raise
    return [results[j.number] for j in jobs]


class Executor(Protocol):
    """Runs shard jobs somewhere: ``LocalExecutor`` on this machine's cores, or a cluster
    (``packer.ray_executor.RayExecutor``). The pipeline plans, records and publishes either way."""

    @property
    def workers(self) -> int:
        """Shards it runs at once: what ``--shard-size auto`` balances the shard count for."""
        ...

    def run(self, jobs: list[ShardJob], *, progress: Optional[ProgressFn] = None,
            on_result: Optional[Callable[[ShardJob, ShardResult], None]] = None,
            timeout: float = DEFAULT_TIMEOUT) -> list[ShardResult]:
        """Write every shard; results in job order (see ``run_jobs`` for the arguments and errors)."""
        ...


@dataclass(frozen=True)
class LocalExecutor:
    """The default executor: ``run_jobs`` with ``workers`` processes on this machine."""

    workers: int

    def run(self, jobs: list[ShardJob], *, progress: Optional[ProgressFn] = None,
            on_result: Optional[Callable[[ShardJob, ShardResult], None]] = None,
            timeout: float = DEFAULT_TIMEOUT) -> list[ShardResult]:
        """Write every shard with ``run_jobs``; results in job order."""
        return run_jobs(jobs, self.workers, progress=progress, on_result=on_result, timeout=timeout)


def _collect(r: _Running, progress: Optional[ProgressFn]) -> Optional[tuple]:
    """Read what a shard's process sent; return ("result"|"error", value) once it is finished."""
    try:
        while r.conn.poll():
            kind, value = r.conn.recv()
            if kind == "progress":
                r.reported += value
                if progress is not None:
                    progress(value)
            else:
                return kind, value
    except (EOFError, OSError):
        return "died", None
    if not r.proc.is_alive() and not r.conn.poll():
        return "died", None
    return None


def _after_failure(r: _Running, failures: dict[int, int], timeout: float) -> ShardJob:
    """The job to run again after its process died or hung: without the file to blame, if any."""
    job = r.job
    if r.position > 0:
        item = job.task.items[r.position - 1]
        reason = probe(job, item, timeout)
        if reason is not None:
            log.warning("%s: %s; skipping it", item.relpath, reason)
            return replace(job, poisoned={**job.poisoned, item.index: reason})
    failures[job.number] = failures.get(job.number, 0) + 1
    if failures[job.number] > MAX_RETRIES:
        raise PackerError(
            f"the worker writing {job.task.name} died {failures[job.number]} times and no single file explains it "
            "(out of memory?); try fewer --workers"
        )
    return job


def remove_partial_files(job: ShardJob) -> None:
    """Delete what an earlier attempt at ``job``'s shard left (crash, kill): every file of a shard
    starts with its name; the record of a finished shard is kept."""
    for path in Path(job.directory).glob(f"{job.task.name}.*"):
        if not path.name.endswith(".done.json"):
            path.unlink()


def probe(job: ShardJob, item: SourceItem, timeout: float) -> Optional[str]:
    """Read one sample of ``job`` as its worker does (every file of it: image, text, tokenizer) in a
    throw-away process: None if that works (or fails cleanly), else why not."""
    proc = process_context().Process(target=_probe_target, args=(job, item), daemon=True)
    with stop_signals_held():
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


def _probe_target(job: ShardJob, item: SourceItem) -> None:
    from packer.errors import DecodeError
    from packer.worker import read_sample

    die_with_parent()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # ended quietly, as a shard worker (run_shard_process)
    release_stop_signals()
    try:
        read_sample(item, job)
    except DecodeError:
        pass  # a clean failure: the worker would have skipped it, it is not what killed the worker


