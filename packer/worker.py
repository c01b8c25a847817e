"""The work of one shard, run inside a worker process (or inline): decode, preprocess, write, hash.

A worker gets a plain ``ShardJob`` and never any open object, so the same function serves a
local process pool and, later, tasks on other machines.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from packer.config import PreprocessConfig
from packer.errors import DecodeError
from packer.formats import ImageLayout, get_writer
from packer.manifest import file_entry
from packer.preprocess import load_image
from packer.records import Sample, ShardResult, ShardTask, Skipped

log = logging.getLogger(__name__)

ProgressFn = Callable[[int], None]
_progress: Optional[ProgressFn] = None
PROGRESS_EVERY = 16  # items per progress message: often enough for a live bar, cheap on the queue


@dataclass(frozen=True)
class ShardJob:
    """Everything a worker needs to write one shard."""

    task: ShardTask
    format: str
    layout: ImageLayout
    preprocess: PreprocessConfig
    directory: str


def init_worker(queue) -> None:
    """Pool initializer: route progress counts to the parent through ``queue``.

    Workers ignore Ctrl-C: the terminal sends it to the whole process group, and the parent alone
    decides how to stop (it cancels the queued shards and ends the workers).
    """
    global _progress
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _progress = queue.put


def write_shard(job: ShardJob, progress: Optional[ProgressFn] = None) -> ShardResult:
    """Write one shard and return its manifest entry data and the files it skipped."""
    report = progress or _progress
    directory = Path(job.directory)
    writer = get_writer(job.format)(directory, job.task.name, job.layout, len(job.task.items))
    skipped: list[Skipped] = []
    count = pending = 0
    for item in job.task.items:
        try:
            image = load_image(item.path, job.preprocess)
        except DecodeError as e:
            skipped.append(Skipped(item.relpath, e.reason))
            log.info("skipped %s: %s", item.relpath, e.reason)
        else:
            writer.add(Sample(item.index, item.relpath, image, item.label))
            count += 1
        pending += 1
        if report is not None and pending >= PROGRESS_EVERY:
            report(pending)
            pending = 0
    # Closed only after the last item: a shard cut short by an error never looks finished.
    files = writer.close()
    if report is not None and pending:
        report(pending)
    entries = [file_entry(directory, name) for name in files]
    return ShardResult(job.task.name, count, entries, skipped)
