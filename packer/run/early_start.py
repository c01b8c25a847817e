"""Shards that start while discovery is still walking the source tree.

At 10^8 files the walk alone takes minutes, and every worker would wait for it. Where the cut of the
shards does not depend on the number of samples (``--shard-size N`` samples, or ``auto`` on a large
source: ``packer.run.plan.auto_cut``), the shards over the files that the walk has listed for good are
known before it ends. ``EarlyStart`` watches the walk (``packer.sources.walk.WalkWatcher``) and hands
those shards to workers as they become known.

When the walk ends, the pipeline plans every shard exactly as it does without an early start. Each
shard started early is kept only where it is the final plan's shard of its name, with the same
samples (index, key, label), fields and layout. Any other is cancelled, its files deleted, and it is
written again from the final plan. The output is therefore the one a run without an early start
writes: a file listed late that changes the fields (auto-detected) or the sample count's cut costs
time, never correctness.

The workers are driven from inside the walk (its watcher, every ``CHECK_EVERY`` seconds), so what the executor does in
the parent happens there too: a file that crashes or hangs its decoder is tried alone in a throw-away
process (``executor.probe``) while the walk waits, up to ``--timeout``. Early shards are recorded
without the plan's fingerprint, which is not known before the walk ends; ``--resume`` keeps such
records by their source stamps, as those of packers before 0.8.1 (the plan record itself is written
by ``settle``, after the shards the final plan does not have are deleted).
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Optional, Sequence

from packer.config import ConvertConfig
from packer.output.files import staging_dir
from packer.records import ShardResult, ShardTask, SourceItem
from packer.run.executor import JobRunner
from packer.run.plan import auto_cut, fixed_size, shard_name
from packer.run.resume import hash_plan_lines, plan_record
from packer.run.shard_job import ShardJob, ShardWork
from packer.run.staging import Staging
from packer.run.worker import ProgressFn
from packer.sources.containers import container_kind
from packer.sources.discover import prefix_samples
from packer.sources.item_table import ItemTable
from packer.spec.sample_layout import SampleLayout

log = logging.getLogger(__name__)

EARLY_AFTER = 0.25
"""Seconds of walking before any shard starts early (as ``walk.PARALLEL_AFTER`` starts the walk's
pool): a tree listed in less is planned whole, as before, and never pays for watching its walk."""

CHECK_EVERY = 0.05
"""Seconds between two looks at the walk (and at the workers started early)."""

REBUILD_GROWTH = 1.25
"""The listing's final files must have grown by this factor before the samples over them are found
again (only when every shard known is handed out): each time costs work in proportion to all of them."""


def early_start_allowed(
    source: Path,
    output: Path,
    config: ConvertConfig,
    *,
    labels_file: object,
    classes: object,
    resume: bool,
    executor: object,
    discovery: object,
) -> bool:
    """Whether a conversion may start shards while it walks: a folder of single-file samples in
    sorted order, whose labels come from its class folders, with a cut known from its first samples
    (see the module). ``--resume`` plans from what the interrupted run saved; other executors (Ray) run
    the plan they are given. Not either where an interrupted run's staging folder is there: a run
    without ``--resume`` discards it only once its walk is done, so that a Ctrl-C during the walk of a
    run that forgot ``--resume`` loses nothing; nor with the output inside the source, where the
    folders that taking the output's lock makes would be walked as classes."""
    size = config.shard_size
    if not (
        discovery is None
        and not resume
        and executor is None
        and labels_file is None
        and classes is None
        and config.detection is None
        and config.masks is None
        and config.shuffle is None
        and (size.samples is not None or size.is_auto)
        and source.is_dir()
        and container_kind(source) is None
        and not staging_dir(output).exists()
    ):
        return False
    return source.resolve() not in output.resolve().parents


class EarlyStart:
    """Watches a walk (``packer.sources.walk.WalkWatcher``) and runs the shards it makes known, in the
    conversion's ``staging`` folder, with up to ``workers`` processes; then ``settle`` keeps those that
    the final plan has, and ``finish`` runs the rest (see the module)."""

    def __init__(
        self,
        staging: Staging,
        config: ConvertConfig,
        workers: int,
        *,
        strict: bool = False,
        timeout: float,
        fields: Optional[Sequence[str]] = None,
    ) -> None:
        self.staging = staging
        self.config = config
        self.workers = workers
        self.strict = strict
        self.timeout = timeout
        self.fields = tuple(fields) if fields else None
        self.runner: Optional[JobRunner] = None
        self.planned = False
        """Whether ``settle`` has recorded the final plan in the staging folder."""
        self._next_look = time.monotonic() + EARLY_AFTER
        # Shards started early, by number: what settle compares (name, samples, layout, plan lines' digest),
        # not their items, which would add up to a copy of the listing.
        self._jobs: dict[int, tuple[str, int, SampleLayout, str]] = {}
        self._layout: Optional[SampleLayout] = None  # the layout they were made for
        self._per: Optional[int] = None  # samples per shard
        self._built = 0  # final files of the listing the samples were last found in
        self._items: Optional[Sequence[SourceItem]] = None  # the samples found over them
        self._shards = 0  # the whole shards they hold
        self._given_up = False
        self._progress: Optional[ProgressFn] = None
        self._pending = 0  # files finished before the progress bar exists

    # the walk's watcher -------------------------------------------------------------------------
    def __call__(self, root: Path, listing, stable: int, walk) -> None:
        """``packer.sources.walk.WalkWatcher``: start the shards over the first ``stable`` files listed."""
        now = time.monotonic()
        if now < self._next_look or self._given_up:
            return
        self._next_look = now + CHECK_EVERY
        if self.runner is not None:
            self.runner.step(0)
            if self.runner.queued >= self.workers:
                return  # work enough queued: the listing is looked at again when it runs short
        if len(self._jobs) >= self._shards:  # every shard known so far is handed out: look at the walk
            if stable == 0 or stable < self._built * REBUILD_GROWTH:
                return
            self._built = stable
            if not self._known(prefix_samples(root, listing, stable, walk, self.fields)):
                return
        self._feed()

    def _known(self, found) -> bool:
        """Take the samples found over the listing's final files (``prefix_samples``); whether shards
        can be cut from them."""
        if found is None:
            return False
        layout = SampleLayout.from_config(self.config, found.fields)
        if self._layout is not None and layout != self._layout:
            self._give_up(f"the fields found so far changed ({', '.join(found.fields)})")
            return False
        if self._per is None and not self._choose_cut(layout, found.items):
            return False
        self._layout = layout
        self._items = found.items
        self._shards = len(found.items) // self._per  # type: ignore[operator]
        return True

    def _choose_cut(self, layout: SampleLayout, items: Sequence[SourceItem]) -> bool:
        """Decide the samples per shard once enough samples are known for it; whether it is decided."""
        size = self.config.shard_size
        if size.samples is not None:
            self._per = size.samples
            return True
        if not fixed_size(layout):
            self._give_up(
                "--shard-size auto balances shards of images of their own sizes, or with texts, "
                "for the sample count, which the end of the walk gives"
            )
            return False
        self._per = auto_cut(items, size, layout)  # None while not known to be a large source
        return self._per is not None

    def _feed(self) -> None:
        """Queue the next known shards until ``workers`` wait. Each holds a compact copy of its own
        samples (``ItemTable.compact``), dropped once it is written (``JobRunner``): no queued shard
        keeps a copy of the listing alive. What the early start adds to the parent is the samples
        over the listing's final files (``_items``, ~3 B a file of a class-folder tree, two while
        they are found again), until the walk ends."""
        per, items = self._per, self._items
        if per is None or items is None or len(self._jobs) >= self._shards:
            return
        if self.runner is None:
            self._start_staging()
        assert self.runner is not None and self._layout is not None
        stage, jobs = str(self.staging.folder), []
        while len(self._jobs) < self._shards and self.runner.queued + len(jobs) < self.workers:
            k = len(self._jobs)
            part = items[k * per : (k + 1) * per]
            task = ShardTask(shard_name(k), part.compact() if isinstance(part, ItemTable) else part)
            job = ShardWork.of(self.config, self._layout, stage, self.strict).job(k, task, record=True)
            self._jobs[k] = (task.name, len(task.items), self._layout, lines_digest(task.items))
            jobs.append(job)
        log.debug("walking on; shards %d to %d start early", jobs[0].number, jobs[-1].number)
        self.runner.add(jobs)
        self.runner.step(0)

    def _start_staging(self) -> None:
        """Lock the output and start its staging folder, as the pipeline does after a walk."""
        self.staging.lock()
        self.staging.start()  # none was there (early_start_allowed); the plan is recorded by settle
        self.runner = JobRunner(
            self.workers, progress=self._count, on_result=self.staging.on_result, timeout=self.timeout
        )

    def _give_up(self, why: str) -> None:
        log.info("no more shards start early: %s", why)
        self._given_up = True

    def _count(self, n: int) -> None:
        if self._progress is None:
            self._pending += n
        else:
            self._progress(n)

    # after the walk -----------------------------------------------------------------------------
    def settle(self, tasks: list[ShardTask], layout: SampleLayout, fingerprint: str, workers: int) -> set[str]:
        """Keep the shards started early that are ``tasks``' shards of their names (same samples,
        same ``layout``), cancel the others, and record the plan (``fingerprint``, ``workers``) in the
        staging folder; the names of the shards kept."""
        kept, dropped = set(), set()
        for k, (name, count, early_layout, digest) in self._jobs.items():
            final = tasks[k] if k < len(tasks) else None
            if (
                final is not None
                and final.name == name
                and early_layout == layout
                and len(final.items) == count
                and lines_digest(final.items) == digest
            ):
                kept.add(k)
            else:
                dropped.add(k)
        if dropped:
            log.warning(
                "%d of the %d shards started early do not match the final plan; writing them again",
                len(dropped),
                len(self._jobs),
            )
            assert self.runner is not None
            self.runner.cancel(dropped)
            for k in dropped:
                del self._jobs[k]
        self.staging.record_plan(plan_record(fingerprint, workers))
        self.planned = True
        self._items = None
        log.info("%d shard(s) started while the source was walked", len(kept))
        return {tasks[k].name for k in kept}

    def finish(self, jobs: list[ShardJob], progress: Optional[ProgressFn]) -> list[ShardResult]:
        """Run ``jobs`` (the final plan's shards not kept by ``settle``) beside those still running, until
        all are done; the results of every shard of the plan, in plan order. ``progress`` gets the files
        finished, those finished before it was given first."""
        assert self.runner is not None
        self._progress = progress
        if progress is not None and self._pending:
            progress(self._pending)
        self._pending = 0
        self.runner.add(jobs)
        results = self.runner.finish()
        numbers = sorted(set(self._jobs) | {j.number for j in jobs})
        return [results[k] for k in numbers]

    def abandon(self) -> None:
        """End the workers started early after a failure or an interrupt; a staging folder without a
        plan yet holds nothing --resume could use, and goes."""
        if self.runner is not None:
            self.runner.stop()
            if not self.planned:
                self.staging.discard()


def lines_digest(items: Sequence[SourceItem]) -> str:
    """SHA-256 of a shard's plan lines (``packer.run.resume.hash_plan_lines``), what ``settle`` compares."""
    h = hashlib.sha256()
    hash_plan_lines(h, items)
    return h.hexdigest()
