"""The conversion: discover, plan shards, write them in parallel, merge into one manifest, publish.

Shards are planned up front from the sorted source list, so each is written by one worker without
talking to any other; the parent only collects their results and writes the manifest last.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

from packer.config import ConvertConfig
from packer.ops.dedupe import without_near_copies
from packer.output.assemble import build_manifest
from packer.output.files import is_packer_output, local_output
from packer.output.report import reason_kind
from packer.records import ShardResult, ShardTask, Skipped
from packer.run.early_start import EarlyStart, early_start_allowed
from packer.run.executor import DEFAULT_TIMEOUT, Executor, LocalExecutor, ProgressFn
from packer.run.job import ConvertJob, Selection
from packer.run.plan import plan_tasks
from packer.run.resume import SOURCES_PER_SHARD, plan_fingerprint
from packer.run.shard_job import ShardJob, ShardWork
from packer.run.staging import Staging
from packer.sources.containers import job_for
from packer.sources.discover import Discovery
from packer.sources.item_table import ItemTable
from packer.sources.origin import Walked, checked, sample_source
from packer.sources.saved_discovery import discovery_options
from packer.sources.saved_discovery import save as save_discovery
from packer.spec.errors import InputError, OutputError
from packer.spec.manifest import Manifest
from packer.spec.registry import get_format
from packer.spec.sample_layout import SampleLayout
from packer.system import usable_cpus
from packer.targets.attached import Targets, targets_for

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
    classes: Optional[Sequence[str]] = None,
    add_classes: bool = False,
    discovery: Optional[Discovery] = None,
    drop_against: Sequence[str | os.PathLike] = (),
) -> ConvertResult:
    """Convert the image (or text) folder ``source`` into a packed output folder ``output``.

    ``workers`` defaults to the usable core count. Bad image files are skipped and listed, or with
    ``strict`` the first one raises DecodeError and nothing is written. ``resume`` continues an
    interrupted run from its finished shards (checked by SHA-256); the result equals an
    uninterrupted run. A file that takes more than ``timeout`` seconds hangs the decoder and is
    skipped. ``progress`` is called with the number of source files finished since its last call;
    ``on_plan`` once the work is known. ``executor`` runs the shards (default: ``workers`` local
    processes; ``packer.run.ray_executor.RayExecutor`` for a Ray cluster; ``workers`` is then unused).
    ``classes`` gives the class map (names in index order) instead of the source's sorted class
    folders, or with ``config.detection`` the categories' order instead of the annotations' own; a
    class it lacks is refused, or appended with ``add_classes``. ``discovery``: the samples
    to convert, already found under ``source`` (a split of it; see ``packer.ops.splits``).
    ``drop_against``: with ``config.drop_duplicates``, outputs (earlier splits) whose images' near-duplicates
    are left out too. Raises a PackerError subclass for anything the user must fix; on KeyboardInterrupt the staging
    folder is kept for ``resume``.
    """
    job = ConvertJob(
        Path(source),
        local_output(output),
        config,
        Selection(labels_file, classes, add_classes),
        workers,
        overwrite,
        strict,
        resume,
        timeout,
        executor,
        progress,
        on_plan,
        discovery,
        drop_against=tuple(Path(p) for p in drop_against),
    )
    return run_convert(job.validate())


def run_convert(job: ConvertJob) -> ConvertResult:
    """Run a validated ``job`` (see ``convert``): open staging, find the samples, attach their targets,
    plan, run and publish."""
    started = time.perf_counter()
    source, output, config, chosen = job.source, job.output, job.config, job.selection
    staging = Staging(output)
    if job.resume and not staging.folder.exists() and output.is_dir() and is_packer_output(output):
        raise OutputError(f"{output} is already complete: nothing to resume (pass --overwrite to convert again)")
    options = discovery_options(
        chosen.labels_file, config.text.fields, config.text.allow_missing, chosen.classes, chosen.add_classes
    )
    processes = max(1, job.workers or usable_cpus())
    early = None
    if early_start_allowed(
        source,
        output,
        config,
        labels_file=chosen.labels_file,
        classes=chosen.classes,
        resume=job.resume,
        executor=job.executor,
        discovery=job.discovery,
    ):
        early = EarlyStart(
            staging, config, processes, strict=job.strict, timeout=job.timeout, fields=config.text.fields
        )
    # With --annotations, --classes orders the boxes' categories, not class folders
    folder_classes = chosen.classes if config.detection is None else None
    walk = Walked(
        source,
        output,
        chosen.labels_file,
        job.overwrite,
        job.strict,
        config.text,
        folder_classes,
        chosen.add_classes and folder_classes is not None,
        processes,
        on_walk=early,
    )
    samples = sample_source(walk, job.discovery, job.resume and staging.folder.is_dir(), options, staging.lock)
    try:
        found = samples.find()
        walked = samples.to_save(found)
        staging.lock()  # held already where the early start began writing shards during the walk
        targets = targets_for(config)
        attached = targets.attach(found, chosen.classes, chosen.add_classes)
        if attached is not found:  # images left out for want of their targets: checked again
            found = checked(attached, job.strict, config.text)
        layout = SampleLayout.from_config(config, found.fields)
        if config.drop_duplicates and not layout.has_image:
            raise InputError(f"--drop-duplicates compares images, and the samples of {source} have none")
        executor = job.executor or LocalExecutor(processes)
        run = RunOptions(executor.workers, job.overwrite, job.strict, job.resume, job.timeout, job.discovery is None)
        result = _convert_locked(
            source,
            staging,
            config,
            layout,
            found,
            run,
            job.progress,
            job.on_plan,
            executor,
            targets,
            walked,
            options,
            early if early is not None and early.runner is not None else None,
            job.drop_against,
        )
    except BaseException:
        if early is not None:
            early.abandon()
        raise
    finally:
        staging.release()
    result.seconds = time.perf_counter() - started
    return result


@dataclass(frozen=True)
class RunOptions:
    """How a conversion runs; none of it changes what the output holds (see ``convert``)."""

    workers: int
    overwrite: bool = False
    strict: bool = False
    resume: bool = False
    timeout: float = DEFAULT_TIMEOUT
    own_items: bool = False
    """The discovery is this conversion's own (not a caller's, as a split's): its items are released
    once the shards are written (``ItemTable.release``), so that the manifest step's memory does not
    add to theirs."""


def _convert_locked(
    source: Path,
    staging: Staging,
    config: ConvertConfig,
    layout: SampleLayout,
    found: Discovery,
    run: RunOptions,
    progress: Optional[ProgressFn],
    on_plan: Optional[Callable[[Discovery, list[ShardTask]], None]],
    executor: Executor,
    targets: Targets,
    walked: Optional[Discovery] = None,
    options: Optional[dict] = None,
    early: Optional[EarlyStart] = None,
    drop_against: tuple[Path, ...] = (),
) -> ConvertResult:
    """The part of ``convert`` that runs while this process holds the output's lock, once the samples
    are found and their ``targets`` attached (``walked``: the discovery a walk made, saved in the
    staging folder with its ``options`` for --resume; ``early``: the shards that started while it
    walked, which the plan keeps or writes again; ``drop_against``: see ``convert``)."""
    previous = staging.plan() if run.resume else None
    plan_workers = previous.get("workers", run.workers) if previous else run.workers
    shard_plan = plan_tasks(found, config, layout, plan_workers)
    tasks = shard_plan.tasks
    per_shard = previous is None or previous.get("sources") == SOURCES_PER_SHARD
    extra = targets.digest()
    recorded = plan_fingerprint(config, tasks, run.strict, extra=extra)
    # Plans of older packers (and of split runs) also covered each file's stamp.
    expected = recorded if per_shard else plan_fingerprint(config, tasks, run.strict, stamps=True, extra=extra)
    if early is not None:
        kept_early = early.settle(tasks, layout, recorded, plan_workers)
        finished: dict[str, ShardResult] = {}
    else:
        finished = staging.resume_or_start(
            tasks,
            previous,
            run.resume,
            expected=expected,
            recorded=recorded,
            version=get_format(config.format).version(layout),
            workers=plan_workers,
        )
    if walked is not None:
        save_discovery(staging.folder, walked, options or {})
    if on_plan is not None:
        on_plan(found, tasks)
    with staging.writing() as stage:
        work = ShardWork.of(config, layout, str(stage), run.strict)

        def job_of(number: int, t: ShardTask) -> ShardJob:
            container = job_for(found.places, t.items) if found.places is not None else None
            return work.job(number, t, container=container, **targets.job_for(t))

        jobs = [job_of(i, t) for i, t in enumerate(tasks)]
        if early is not None:
            todo = [replace(j, record=True, plan_fingerprint=recorded) for j in jobs if j.task.name not in kept_early]
            results = early.finish(todo, progress)
            todo = jobs  # every shard was written by this run
        else:
            todo, fresh = staging.run_unfinished(executor, jobs, finished, progress, run.timeout)
            by_name = {**finished, **{r.name: r for r in fresh}}
            results = [by_name[t.name] for t in tasks]
        if config.drop_duplicates:  # the shards holding near-duplicates written again without them
            distance = config.dup_distance
            results = without_near_copies(
                results, jobs, job_of, executor, distance, drop_against, run.timeout, staging.on_result
            )
        if not any(r.samples for r in results):
            kinds = Counter(reason_kind(s.reason) for r in results for s in r.skipped)
            raise InputError(
                f"no sample in {source} could be packed: all {sum(kinds.values())} were skipped ("
                + ", ".join(f"{n} x {k}" for k, n in kinds.most_common())
                + ")"
            )
        results = staging.name_shards(results, [t.name for t in tasks])
        processed = sum(len(j.task.items) for j in todo)
        del jobs, todo
        if run.own_items and isinstance(found.items, ItemTable):
            found.items.release()
        manifest = build_manifest(
            config,
            layout,
            found,
            results,
            plan_workers,
            targets.summary(),
            scratch=stage,
            fixed_samples=shard_plan.fixed_samples,
            stage=stage,
        )
        staging.publish(manifest, overwrite=run.overwrite, source=source)
    skipped = [Skipped(s["path"], s["reason"]) for s in manifest.skipped]
    return ConvertResult(staging.output, manifest, 0.0, skipped, found.ignored, processed)
