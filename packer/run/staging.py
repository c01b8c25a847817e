"""The staging lifecycle: one object for what every operation does with its output folder.

Convert, append, repack, combine, a node of a split conversion and its merge, and the early start
all write an output the same way: take the output's lock and repair what a run killed while
publishing left; start a staging folder beside the output (or continue an interrupted run's, for
``--resume``) with a plan record; write the shards into it; then publish it into place with its
manifest, or discard it. ``Staging`` owns those steps; the operations only say what they write.
The folder's files and records themselves are ``packer.output.files``'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import IO, Callable, Iterator, Optional

from packer import __version__
from packer.output.files import (
    discard,
    finished_shards,
    forget_renamed,
    lock_output,
    publish,
    read_plan,
    recover,
    release_output,
    staging_dir,
    start_staging,
    write_plan,
)
from packer.output.finish import name_shards, write_output
from packer.output.shard_uploads import sink_for
from packer.records import ShardResult, ShardTask
from packer.run.executor import Executor, Handoff, ProgressFn
from packer.run.resume import (
    SOURCES_PER_SHARD,
    current_digests,
    current_hashes,
    current_layout,
    plan_record,
    unchanged_sources,
)
from packer.run.shard_job import ShardJob
from packer.spec.errors import OutputError
from packer.spec.manifest import Manifest

log = logging.getLogger(__name__)


class Staging:
    """An operation's hold on the output folder ``output``: its lock, its staging folder (``folder``),
    the plan recorded there, and publishing or discarding it.

    ``with Staging(output) as staging:`` holds the lock for the block (see ``lock``). A node of a
    split conversion, which shares the folder with other nodes under locks of its own, uses the
    folder without ``lock``.
    """

    def __init__(self, output: Path) -> None:
        self.output = Path(output)
        self.folder = staging_dir(self.output)
        self._lock: Optional[IO] = None
        self.held = False
        """Whether this process holds the output's lock."""
        self.sink = sink_for(self.output)
        """Where the finished shards go as they finish when the output goes to a bucket
        (``packer.output.shard_uploads``), else None: they stay in the folder."""

    @property
    def on_result(self) -> Optional[Handoff]:
        """What an executor calls with each finished shard (None when nothing is to be done with it);
        where the output goes to a bucket, it says where workers on other machines upload theirs."""
        if self.sink is None:
            return None
        return Handoff(lambda job, result: self.take(result, job), self.sink.target(self.output))

    def take(self, result: ShardResult, job: Optional[ShardJob] = None) -> None:
        """A shard of the folder is finished: uploaded now where the output goes to a bucket
        (``ShardUploads.take``), else left in the folder. A shard that its worker uploaded itself
        (``result.parts``) is recorded here when its ``job`` asked its worker to record it."""
        if self.sink is None:
            return
        if result.parts:
            fingerprint = job.plan_fingerprint if job is not None and job.record else None
            self.sink.take_uploaded(self.output, self.folder, result, fingerprint)
        else:
            self.sink.take(self.output, self.folder, result)

    @property
    def shown(self) -> str:
        """The output as messages name it: its URL when it goes to a bucket, not the local folder."""
        return self.sink.shown(self.output) if self.sink is not None else str(self.output)

    def move(self, old: str, new: str) -> None:
        """Rename the shard file ``old`` of the staging folder to ``new``: where it was uploaded, if
        it was (``packer.output.shard_uploads``), else in the folder."""
        if self.sink is not None and self.sink.holds(self.output, old):
            self.sink.move(self.output, old, new)
        else:
            os.replace(self.folder / old, self.folder / new)

    def name_shards(self, results: list[ShardResult], planned: list[str], first: int = 0) -> list[ShardResult]:
        """``packer.output.finish.name_shards`` of this folder's shards, uploaded ones included."""
        return name_shards(self.folder, results, planned, first, move=self.move)

    # the lock ------------------------------------------------------------------------------------
    def lock(self, *, repair: bool = True) -> Staging:
        """Take the output's lock for this run (OutputError when another run holds it), then, with
        ``repair``, repair what a run killed while publishing left (``packer.output.files.recover``); a failed
        repair releases the lock again. Once only: later calls do nothing."""
        if self.held:
            return self
        try:
            self._lock = lock_output(self.output)
            self.held = True
            if repair:
                recover(self.output)
        except BaseException as e:
            self.release()  # a with-block's __exit__ never runs when its __enter__ fails
            if isinstance(e, OSError):
                raise OutputError(f"cannot write the output in {self.folder.parent}: {describe_os_error(e)}") from None
            raise
        return self

    def release(self) -> None:
        """Release the lock, if held."""
        if self.held:
            release_output(self.output, self._lock)
            self._lock, self.held = None, False

    def __enter__(self) -> Staging:
        return self.lock()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # the folder and its plan ---------------------------------------------------------------------
    def plan(self) -> Optional[dict]:
        """The plan recorded in the staging folder by an interrupted (or a sharing) run, if any."""
        return read_plan(self.folder)

    def start(self, plan: Optional[dict] = None) -> Path:
        """A new, empty staging folder (an interrupted run's is removed), with ``plan`` recorded."""
        try:
            start_staging(self.output)
            if self.sink is not None:
                self.sink.records.restart(self.folder)
            if plan is not None:
                self.record_plan(plan)
        except OSError as e:
            raise OutputError(f"cannot create {self.folder}: {describe_os_error(e)}") from None
        return self.folder

    def record_plan(self, plan: dict) -> None:
        """Record ``plan`` in the staging folder, once it is known (the early start's, after the walk);
        a bucket output's is kept in the store too, for ``--resume``."""
        write_plan(self.folder, plan)
        if self.sink is not None:
            self.sink.records.keep_plan(self.folder)

    def share_plan(self) -> None:
        """The plan a node of a split conversion made or joined in the folder, kept in the store too
        where the output goes to a bucket: there it is the nodes' shared record of the run."""
        if self.sink is not None:
            self.sink.records.keep_plan(self.folder)

    def finished(self, names: list[str]) -> dict[str, ShardResult]:
        """The shards of ``names`` recorded in the folder as finished whose files are intact (a bucket
        output's: in the store, ``ShardUploads.finished``)."""
        if self.sink is not None:
            return self.sink.finished(self.output, self.folder, names)
        return finished_shards(self.folder, names)

    def resume_or_start(
        self,
        tasks: list[ShardTask],
        previous: Optional[dict],
        resume: bool,
        *,
        expected: str,
        recorded: str,
        version: int,
        workers: int,
    ) -> dict[str, ShardResult]:
        """The shards of ``tasks`` that an interrupted run finished and that still hold, when there is
        one to resume (``previous``, its plan record; refused unless its fingerprint is ``expected``);
        otherwise none, in a new staging folder whose plan records ``recorded`` and ``workers``.
        ``version``: the format version this run writes (shards written at another are written again)."""
        if resume and previous is None:
            log.warning("--resume: no interrupted run of %s to continue; starting a new one", self.shown)
        if previous is None:
            if self.folder.exists() and not resume:
                log.warning("discarding the unfinished run of %s (pass --resume to continue it)", self.shown)
            self.start(plan_record(recorded, workers))
            return {}
        if previous.get("fingerprint") != expected:
            started = previous.get("packer")
            other = (
                ""
                if started == __version__
                else (
                    f" (or its plan: it was started by packer {started or 'before 0.8.3'}, whose plans of some runs, "
                    f"such as those with --shuffle or of a large source with --shard-size auto, packer {__version__} "
                    "draws otherwise)"
                )
            )
            raise OutputError(
                f"the source files or options changed since the interrupted run of {self.shown}{other}; "
                "run without --resume to start over"
            )
        finished = current_hashes(current_layout(current_digests(self.finished([t.name for t in tasks])), version))
        if previous.get("sources") == SOURCES_PER_SHARD:
            finished = unchanged_sources(finished, tasks)
        for task in tasks:
            if task.name not in finished:
                forget_renamed(self.folder, task.name)  # written again: its files of an interrupted publish go
        log.info("resuming: %d of %d shards already finished", len(finished), len(tasks))
        return finished

    # writing, then publishing or discarding ------------------------------------------------------
    def run_unfinished(
        self,
        executor: Executor,
        jobs: list[ShardJob],
        finished: dict[str, ShardResult],
        progress: Optional[ProgressFn],
        timeout: float,
    ) -> tuple[list[ShardJob], list[ShardResult]]:
        """Count the files of the ``finished`` shards as done, then run the other ``jobs``, each shard
        recorded in the folder for --resume by its worker as it finishes, under the plan's fingerprint.
        Returns the jobs run and their results (their per-sample values left in their records)."""
        if progress is not None:
            done_items = sum(len(j.task.items) for j in jobs if j.task.name in finished)
            if done_items:
                progress(done_items)
        fingerprint = (self.plan() or {}).get("fingerprint")
        fingerprint = fingerprint if isinstance(fingerprint, str) else ""  # no plan record (or an odd one): none
        todo = [
            replace(j, directory=str(self.folder), record=True, plan_fingerprint=fingerprint)
            for j in jobs
            if j.task.name not in finished
        ]
        fresh = executor.run(todo, progress=progress, timeout=timeout, on_result=self.on_result) if todo else []
        return todo, fresh

    @contextlib.contextmanager
    def writing(
        self, *, resumable: bool = True, shared: bool = False, kept: Optional[Callable[[], bool]] = None
    ) -> Iterator[Path]:
        """The work in the staging folder up to its publishing. A failure discards the folder (an
        OSError becomes an OutputError naming where and what to do), but for a Ctrl-C of a
        ``resumable`` run, which leaves the finished shards for --resume, and a failure when ``kept()``
        says the work done so far is worth keeping for --resume (a token conversion's tokenizing),
        which is said; a ``shared`` folder (the nodes' of a split conversion) is never discarded
        here, their shards are other runs' work."""
        try:
            yield self.folder
        except KeyboardInterrupt:
            if not resumable and not shared:
                self.discard()
            raise
        except BaseException as e:
            if shared:
                pass
            elif kept is not None and kept():
                log.warning(
                    "the work done so far is kept in %s: once the cause is fixed, run the same command with --resume",
                    self.folder,
                )
            else:
                self.discard()
            if isinstance(e, OSError):
                raise OutputError(f"cannot write the output in {self.folder.parent}: {describe_os_error(e)}") from None
            raise

    def publish(self, manifest: Manifest, *, overwrite: bool, source: Optional[Path] = None) -> None:
        """Write ``manifest`` last, then move the folder into place as the output (replacing an older
        output where ``overwrite`` allows it; ``source``: what the output must not be inside)."""
        write_output(self.folder, manifest)
        publish(self.folder, self.output, overwrite, source)

    def discard(self) -> None:
        """Remove the staging folder (only one packer made)."""
        discard(self.folder)


def describe_os_error(e: OSError) -> str:
    """An OSError as a message: what failed, on which file, and what to do for the common causes."""
    where = f" ({e.filename})" if e.filename else ""
    hint = {
        28: "; free some space or write elsewhere",
        13: "; check the folder's permissions",
        30: "; the filesystem is read-only",
    }.get(e.errno or 0, "")
    return f"{e.strerror or e}{where}{hint}"
