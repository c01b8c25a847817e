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

from packer.output.part_target import PartTarget
from packer.records import ShardResult, ShardTask, SourceItem
from packer.run.shard_job import ShardJob
from packer.run.worker import FINISHING, ProgressFn, run_shard_process
from packer.spec.errors import PackerError
from packer.spec.registry import get_format
from packer.system import as_child_process, process_context, stop_signals_held

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
    slot: object
    """The worker's position (``run_shard_process``), a lock-free shared one-element array."""
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
    runner = JobRunner(workers, progress=progress, on_result=on_result, timeout=timeout)
    try:
        runner.add(jobs)
        results = runner.finish(should_stop)
    except BaseException:
        runner.stop()
        raise
    return [results[j.number] for j in jobs]


class JobRunner:
    """``run_jobs``' loop as an object, for a parent that has other work while its shards run: jobs
    can be added while others run (``packer.run.early_start`` adds shards as discovery walks), the loop
    advanced a step at a time, and jobs cancelled. Job numbers are unique among its jobs."""

    def __init__(
        self,
        workers: int,
        *,
        progress: Optional[ProgressFn] = None,
        on_result: Optional[Callable[[ShardJob, ShardResult], None]] = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.workers = workers
        self.progress = progress
        self.on_result = on_result
        self.timeout = timeout
        self.results: dict[int, ShardResult] = {}
        """Finished shards by job number."""
        self._ctx = process_context()
        self._log_level = logging.getLogger("packer").getEffectiveLevel()
        self._queue: deque[ShardJob] = deque()
        self._running: list[_Running] = []
        self._failures: dict[int, int] = {}
        self._formats: set[str] = set()
        self._jobs: dict[int, ShardJob] = {}
        self._reported: dict[int, int] = {}  # files each finished job counted in progress

    @property
    def busy(self) -> bool:
        """Whether a job is queued or running."""
        return bool(self._queue or self._running)

    @property
    def queued(self) -> int:
        """Jobs waiting for a worker."""
        return len(self._queue)

    def add(self, jobs: list[ShardJob]) -> None:
        """Queue ``jobs`` after those already queued."""
        for fmt in {job.format for job in jobs} - self._formats:
            get_format(fmt).import_modules()  # before the forks: every worker starts with its writer imported
            self._formats.add(fmt)
        self._queue.extend(jobs)
        self._jobs.update((job.number, job) for job in jobs)

    def cancel(self, numbers: set[int]) -> None:
        """Forget the jobs ``numbers``: dequeued, their workers ended, the files they wrote deleted (their
        records too), their finished results dropped and their files counted back from ``progress``."""
        for job in [j for j in self._queue if j.number in numbers]:
            remove_partial_files(job, records=True)  # an attempt that died left its files, and waits to run again
        self._queue = deque(j for j in self._queue if j.number not in numbers)
        for r in [r for r in self._running if r.job.number in numbers]:
            r.proc.kill()
            r.proc.join()
            r.conn.close()
            self._running.remove(r)
            if self.progress is not None and r.reported:
                self.progress(-r.reported)
            remove_partial_files(r.job, records=True)
        for number in numbers:
            if self.results.pop(number, None) is not None:
                remove_partial_files(self._jobs[number], records=True)
                if self.progress is not None and self._reported.get(number):
                    self.progress(-self._reported[number])
            self._jobs.pop(number, None)
            self._failures.pop(number, None)  # a new job of that number starts with none

    def step(self, timeout: float) -> None:
        """Start queued jobs on free workers, wait up to ``timeout`` seconds for news from the running
        ones, and take it (see ``run_jobs`` for what it raises)."""
        while self._queue and len(self._running) < self.workers:
            self._start(self._queue.popleft())
        if not self._running:
            return
        wait([r.conn for r in self._running] + [r.proc.sentinel for r in self._running], timeout=timeout)
        now = time.monotonic()
        for r in list(self._running):
            outcome = _collect(r, self.progress)
            if r.slot[0] != r.position:
                r.position, r.since = r.slot[0], now
            if outcome is None and r.proc.is_alive():
                if r.position != FINISHING and time.monotonic() - r.since > self.timeout:
                    log.warning("%s: no progress for %.0f s; ending its worker", r.job.task.name, self.timeout)
                    r.proc.kill()
                    r.proc.join()
                    outcome = ("died", None)
                else:
                    continue
            self._running.remove(r)
            r.conn.close()
            r.proc.join()
            kind, value = outcome if outcome is not None else ("died", None)
            if kind == "result":
                for skipped in value.skipped:  # logged here, in the parent, where the CLI shows it
                    log.info("skipped %s: %s", skipped.path, skipped.reason)
                self.results[r.job.number] = value
                self._reported[r.job.number] = r.reported
                # All that cancel needs of a finished job is where its files are: not its items.
                self._jobs[r.job.number] = replace(r.job, task=ShardTask(r.job.task.name, ()), poisoned={})
                if self.on_result is not None:
                    self.on_result(r.job, value)  # may wait (a bucket's uploads, packer.output.shard_uploads)
                    waited, now = time.monotonic() - now, time.monotonic()
                    for other in self._running:  # time the parent spent here is not the workers' to answer for
                        other.since += waited
            elif kind == "error":
                raise value
            else:
                if self.progress is not None and r.reported:
                    self.progress(-r.reported)  # the shard runs again from its start
                self._queue.appendleft(_after_failure(r, self._failures, self.timeout))

    def finish(self, should_stop: Optional[Callable[[], bool]] = None) -> dict[int, ShardResult]:
        """Run until every job is done; the results by job number. ``should_stop``: see ``run_jobs``."""
        while self.busy:
            if should_stop is not None and should_stop():
                raise RunStopped()
            self.step(1.0)
        return self.results

    def stop(self) -> None:
        """End every running worker (after an error or an interrupt); the queue is dropped."""
        self._queue.clear()
        for r in self._running:
            r.proc.kill()
        for r in self._running:
            r.proc.join()
            r.conn.close()
        self._running.clear()

    def _start(self, job: ShardJob) -> None:
        remove_partial_files(job)
        receive, send = self._ctx.Pipe(duplex=False)
        slot = self._ctx.Array("q", 1, lock=False)
        proc = self._ctx.Process(
            target=run_shard_process, args=(job, send, slot, os.getpid(), self._log_level), daemon=True
        )
        with stop_signals_held():  # a Ctrl-C during fork would otherwise be lost
            proc.start()
            # Recorded before the held signals arrive: an interrupt then ends this worker too.
            self._running.append(_Running(job, proc, receive, slot, since=time.monotonic()))
        send.close()


@dataclass(frozen=True)
class Handoff:
    """What a run does with each finished shard, on the driver: an executor's ``on_result``, called as
    ``on_result(job, result)``. ``parts``: where the output goes to a bucket, where a worker that
    writes on another machine (a Ray task) uploads its shard's files itself, since it cannot see
    the staging folder (``packer.output.part_target``); None where the shards stay in that folder
    until the driver takes them. Executors whose workers write in the staging folder ignore it."""

    take: Callable[[ShardJob, ShardResult], None]
    parts: Optional[PartTarget] = None

    def __call__(self, job: ShardJob, result: ShardResult) -> None:
        self.take(job, result)


class Executor(Protocol):
    """Runs shard jobs somewhere: ``LocalExecutor`` on this machine's cores, or a cluster
    (``packer.run.ray_executor.RayExecutor``). The pipeline plans, records and publishes either way."""

    @property
    def workers(self) -> int:
        """Shards it runs at once: what ``--shard-size auto`` balances the shard count for."""
        ...

    def run(
        self,
        jobs: list[ShardJob],
        *,
        progress: Optional[ProgressFn] = None,
        on_result: Optional[Callable[[ShardJob, ShardResult], None]] = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> list[ShardResult]:
        """Write every shard; results in job order (see ``run_jobs`` for the arguments and errors)."""
        ...


@dataclass(frozen=True)
class LocalExecutor:
    """The default executor: ``run_jobs`` with ``workers`` processes on this machine."""

    workers: int

    def run(
        self,
        jobs: list[ShardJob],
        *,
        progress: Optional[ProgressFn] = None,
        on_result: Optional[Callable[[ShardJob, ShardResult], None]] = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> list[ShardResult]:
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


def remove_partial_files(job: ShardJob, records: bool = False) -> None:
    """Delete what an earlier attempt at ``job``'s shard left (crash, kill): every file of a shard
    starts with its name; the record of a finished shard is kept, unless ``records``."""
    for path in Path(job.directory).glob(f"{job.task.name}.*"):
        if records or not path.name.endswith(".done.json"):
            path.unlink(missing_ok=True)


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
    from packer.run.worker import read_sample
    from packer.spec.errors import DecodeError

    as_child_process(ignore_ctrl_c=False)
    try:
        read_sample(item, job)
    except DecodeError:
        pass  # a clean failure: the worker would have skipped it, it is not what killed the worker
