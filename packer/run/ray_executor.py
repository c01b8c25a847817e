"""The Ray executor: one Ray task per shard on a cluster, the plan and manifest on the driver.

The driver (the ``packer convert`` process) plans the shards, keeps the staging folder and its lock
exactly as a local run does (``packer.ops.convert``), and only hands the running of shard jobs to Ray.
Each task writes its shard and then its shard's record straight into the staging folder, as a local
worker does; the folder must be on a filesystem every node sees, so a task carries paths, never data.
Where the output goes to a bucket (the executor's ``on_result`` is a ``Handoff`` with ``parts``), the
staging folder is the driver's own: each task writes its shard in a folder of its node, uploads it as
the run's parts (``packer.output.part_target``) and returns them, and the driver records the shard.

A task runs its shard the way the local executor does, through ``run_jobs`` with one worker
process: a file that crashes or hangs the decoder is skipped with the reason there too, and partial
files of an earlier attempt are removed first. A task whose Ray worker dies (node lost, killed, out
of memory) is retried by Ray (``max_retries``); a task that fails by packer's own error (a bad
file with ``--strict``, a full disk) returns that error instead of raising it, so Ray never
retries it. Progress comes from the tasks through a small actor (the run's board), so the driver's
bar moves with files, not only with finished shards.

A run that fails or is interrupted stops its tasks through the same board: the driver marks the
run stopped, each task asks about once a second and ends its shard's process, so nothing more is
written. ``ray.cancel`` is not used: in Ray 2.x a forced cancel that meets a task just finishing
can abort the driver's core worker (``Check failed: it != submissible_tasks_.end()``,
ray-project/ray#54798), taking the whole ``packer convert`` process, or a notebook, with it.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from packer.output.part_target import PartTarget
from packer.records import ShardResult
from packer.run.executor import DEFAULT_TIMEOUT, RunStopped, run_jobs
from packer.run.shard_job import ShardJob
from packer.run.worker import ProgressFn
from packer.spec.errors import PackerError

log = logging.getLogger(__name__)

DEFAULT_RETRIES = 3  # times Ray reruns a task whose worker died before the run fails
POLL_SECONDS = 0.5  # how often the driver looks for finished tasks and progress
REPORT_SECONDS = 0.5  # least time between two progress messages of one task
STOP_POLL_SECONDS = 1.0  # how often a task asks the board whether its run was stopped
STOP_WAIT_SECONDS = 15.0  # how long the driver waits for stopped tasks to end before returning
INSTALL_HINT = "pip install 'packer-datasets[ray]' (or pip install ray)"


def import_ray() -> Any:
    """The ``ray`` module, or a PackerError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise PackerError(f"--executor ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


class RayExecutor:
    """Runs shard jobs as Ray tasks (see the module docstring); a context manager.

    ``address``: the cluster to join (``"auto"``: the one ``ray start`` runs on this machine, or
    ``ray://HOST:10001``); None starts a Ray instance on this machine for the run (with ``num_cpus``
    CPUs when given) and stops it at ``close``. An already initialised Ray (``ray.init`` in the
    caller) is used as it is and left running. ``workers`` (shards at once, which
    ``--shard-size auto`` balances for) is ``num_cpus`` when given, else the cluster's CPU count.
    """

    def __init__(
        self, address: Optional[str] = None, num_cpus: Optional[int] = None, max_retries: int = DEFAULT_RETRIES
    ) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self.max_retries = max_retries
        self._ray = import_ray()
        self._started = False
        self._board: Any = None  # the RunBoard actor, made on first use and kept for later runs

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Join (or start) the Ray cluster, once."""
        ray = self._ray
        if ray.is_initialized():
            return
        # "local": a Ray instance of this run's own, even when RAY_ADDRESS or a `ray start` cluster
        # exists (ray.init would join those, and refuse num_cpus there).
        options: dict = {"address": self.address or "local", "logging_level": logging.WARNING}
        if self.address is None:
            options.update(num_cpus=self.num_cpus, include_dashboard=False)
        try:
            ray.init(**options)
        except (ValueError, RuntimeError) as e:
            raise PackerError(f"cannot start Ray: {e}") from None
        except ConnectionError as e:
            raise PackerError(
                f"cannot reach a Ray cluster at --address {self.address}: {e}. Start one with "
                "`ray start --head` (then --address auto), or leave out --address to run Ray on "
                "this machine alone"
            ) from None
        self._started = True

    def close(self) -> None:
        """Leave the cluster; stops the Ray instance if this executor started it."""
        if self._board is not None and self._ray.is_initialized():
            self._ray.kill(self._board)
        self._board = None
        if self._started:
            self._ray.shutdown()
            self._started = False

    @property
    def workers(self) -> int:
        """Shards written at once: ``num_cpus``, else the cluster's CPUs (connecting if needed)."""
        if self.num_cpus:
            return self.num_cpus
        self.connect()
        return max(1, int(self._ray.cluster_resources().get("CPU", 1)))

    def run(
        self,
        jobs: list[ShardJob],
        *,
        progress: Optional[ProgressFn] = None,
        on_result: Optional[Callable[[ShardJob, ShardResult], None]] = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> list[ShardResult]:
        """Write every shard as a Ray task; results in job order.

        ``progress(n)`` and ``on_result(job, result)`` run on the driver, as with ``run_jobs``.
        Raises the error a shard raised (DecodeError with ``strict``, OutputError, ...), a
        PackerError naming the shard when Ray gave up on it, and KeyboardInterrupt after
        cancelling the tasks still running.
        """
        ray = self._ray
        self.connect()
        board = self._run_board()
        run = uuid.uuid4().hex
        task = ray.remote(_write_shard_task).options(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False)
        level = logging.getLogger("packer").getEffectiveLevel()
        parts = getattr(on_result, "parts", None)  # a bucket output: each task uploads its own shard
        pending = {
            task.remote(absolute(job), board, run, progress is not None, timeout, level, parts): job for job in jobs
        }
        results: dict[int, ShardResult] = {}
        reported = 0
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=POLL_SECONDS)
                for ref in ready:
                    job = pending.pop(ref)
                    result = self._outcome(ref, job)
                    for skipped in result.skipped:  # logged here, on the driver, where the CLI shows it
                        log.info("skipped %s: %s", skipped.path, skipped.reason)
                    results[job.number] = result
                    if on_result is not None:
                        on_result(job, result)
                if progress is not None:
                    counts: dict[int, int] = {}
                    if board is not None:
                        try:
                            counts = ray.get(board.counts.remote(run))
                        except ray.exceptions.RayError:  # its node is gone: count finished shards only
                            board = None
                    done = sum(len(j.task.items) if j.number in results else counts.get(j.number, 0) for j in jobs)
                    if done != reported:
                        progress(done - reported)
                        reported = done
        except BaseException:
            self._stop(board, run, list(pending))
            raise
        return [results[j.number] for j in jobs]

    def _run_board(self) -> Any:
        """The board actor (starting one costs a worker process: kept for later runs)."""
        if self._board is None:
            self._board = self._ray.remote(num_cpus=0)(RunBoard).remote()
        return self._board

    def _outcome(self, ref: Any, job: ShardJob) -> ShardResult:
        """The ShardResult of a finished task; its error raised as packer's own."""
        ray = self._ray
        try:
            kind, value = ray.get(ref)
        except ray.exceptions.RayError as e:  # its worker died more often than max_retries, or a bug
            cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise PackerError(
                f"the Ray task writing {job.task.name} failed ({type(e).__name__}: {cause}); Ray "
                f"retries a task only when its worker dies, up to {self.max_retries} times"
            ) from None
        if kind == "error":
            raise value
        if kind == "stopped":  # only a stopped run's tasks stop, and that run is not waiting for them
            raise PackerError(f"the Ray task writing {job.task.name} was stopped")
        return value

    def _stop(self, board: Any, run: str, refs: list) -> None:
        """Stop the run's tasks still running or queued (see the module docstring) and wait for them a
        while: a stopped task ends its shard's process, so it writes nothing more."""
        ray = self._ray
        if not refs:
            return
        try:
            ray.get(board.stop.remote(run), timeout=STOP_WAIT_SECONDS)
        except Exception:  # noqa: BLE001 - the board is gone with its node: the tasks end with the driver
            return
        ray.wait(refs, num_returns=len(refs), timeout=STOP_WAIT_SECONDS)


def absolute(job: ShardJob) -> ShardJob:
    """``job`` with absolute paths: a task runs in another process (and directory), maybe on another node."""
    items = tuple(
        replace(item, path=os.path.abspath(item.path), parts=tuple((f, os.path.abspath(p)) for f, p in item.parts))
        for item in job.task.items
    )
    return replace(job, task=replace(job.task, items=items), directory=os.path.abspath(job.directory))


class RunBoard:
    """What the driver and the tasks of its runs tell each other (a Ray actor on the cluster): files
    finished per shard, and whether a run was stopped.

    Each attempt at a shard starts its count afresh under a new token, so a retried task's first
    attempt (whose last messages may still arrive) is not counted twice.
    """

    def __init__(self) -> None:
        self._counts: dict[str, dict[int, int]] = {}
        self._tokens: dict[tuple[str, int], str] = {}
        self._stopped: set[str] = set()

    def start(self, run: str, number: int, token: str) -> bool:
        """A new attempt at shard ``number`` of ``run`` begins; False if the run was stopped."""
        self._tokens[run, number] = token
        self._counts.setdefault(run, {})[number] = 0
        return run not in self._stopped

    def add(self, run: str, number: int, token: str, n: int) -> None:
        """``n`` more files of shard ``number`` done (negative: a shard redone from its start)."""
        if self._tokens.get((run, number)) == token:
            self._counts[run][number] += n

    def counts(self, run: str) -> dict[int, int]:
        """Files done so far in ``run``, per shard number."""
        return dict(self._counts.get(run, {}))

    def stop(self, run: str) -> None:
        """Tell ``run``'s tasks to end; its counts are forgotten."""
        self._stopped.add(run)
        self._counts.pop(run, None)
        self._tokens = {k: v for k, v in self._tokens.items() if k[0] != run}

    def stopped(self, run: str) -> bool:
        """Whether ``run`` was stopped."""
        return run in self._stopped


def _write_shard_task(
    job: ShardJob,
    board: Any,
    run: str,
    counting: bool,
    timeout: float,
    log_level: int,
    parts: Optional[PartTarget] = None,
) -> tuple[str, Any]:
    """Body of one Ray task: ``("result", ShardResult)``, ``("error", PackerError)`` or ``("stopped",
    None)`` when the driver stopped the run.

    Runs in a Ray worker process: the shard is written by ``run_jobs`` in a child process, with
    the crash and hang isolation of local runs. Packer's own errors are returned, not raised, so
    that Ray does not retry them. With ``parts`` (the output goes to a bucket, and the driver's
    staging folder is on the driver's disk) the shard is written into a folder of this node's and
    uploaded from there as the run's parts (``packer.output.part_target``): the node's disk holds
    one shard a task, and the driver records it. A task that outlives the driver's wait for stopped
    tasks (``STOP_WAIT_SECONDS``: one in the middle of a large upload) may leave parts behind a failed
    run; the next run into the prefix removes them.
    """
    import ray

    logging.getLogger("packer").setLevel(max(log_level, logging.WARNING))  # skipped files: the driver logs them
    token = uuid.uuid4().hex
    try:
        if not ray.get(board.start.remote(run, job.number, token), timeout=STOP_WAIT_SECONDS):
            return "stopped", None
    except ray.exceptions.RayError:  # the board's node is gone: the shard is written without it
        board = None
    pending, last = 0, time.monotonic()
    asked, stopped = time.monotonic(), False

    def progress(n: int) -> None:
        nonlocal pending, last
        pending += n
        if board is not None and counting and time.monotonic() - last >= REPORT_SECONDS:
            board.add.remote(run, job.number, token, pending)
            pending, last = 0, time.monotonic()

    def should_stop() -> bool:
        nonlocal asked, stopped
        if board is not None and not stopped and time.monotonic() - asked >= STOP_POLL_SECONDS:
            try:
                stopped = ray.get(board.stopped.remote(run), timeout=STOP_WAIT_SECONDS)
            except ray.exceptions.RayError:  # slow (asked again) or gone with its node (the driver decides)
                pass
            asked = time.monotonic()
        return stopped

    shared = () if parts is not None else (job.directory,)
    unseen = [p for p in (*shared, *(job.task.items[0].paths if job.task.items else ())) if not os.path.exists(p)]
    if unseen:  # every file would be skipped as missing: a partial output, not a failure, unless said here
        where = "the source" if parts is not None else "the source and the output"
        return "error", PackerError(
            f"{socket.gethostname()} cannot see {unseen[0]}: on a Ray cluster {where} must be on a "
            "filesystem every node mounts at the same path"
        )
    own = tempfile.mkdtemp(prefix="packer-ray-shard-") if parts is not None else None
    try:
        if own is not None:  # recorded by the driver, which has the staging folder: not here
            job = replace(job, directory=own, record=False)
        [result] = run_jobs([job], 1, progress=progress, timeout=timeout, should_stop=should_stop)
        if parts is not None:
            uploaded = parts.put_parts(Path(job.directory), result, should_stop)
            if uploaded is None:
                return "stopped", None
            result.parts = uploaded
    except RunStopped:
        return "stopped", None
    except PackerError as e:
        return "error", e
    finally:
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)
    return "result", result
