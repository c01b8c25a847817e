"""The work of one shard, run inside a worker process: read, decode, preprocess, write, hash.

A worker gets a plain ``ShardJob`` and never any open object, so the same function serves the
local process pool and, later, tasks on other machines. It reports to the parent through two
channels set up by ``init_worker``: a queue of progress counts, and a shared array holding the
position of the item each shard is working on, which lets the parent name the file that was
being decoded when a worker died or hung.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from packer.config import PreprocessConfig
from packer.errors import DecodeError
from packer.formats import ImageLayout, get_writer
from packer.manifest import file_entry
from packer.preprocess import decode_image, read_source
from packer.records import Sample, ShardResult, ShardTask, Skipped

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]
"""``progress(shard_number, items_done_since_last_call)``."""

PROGRESS_EVERY = 16  # items per progress message: often enough for a live bar, cheap on the queue


@dataclass(frozen=True)
class ShardJob:
    """Everything a worker needs to write one shard.

    ``number`` is the shard's position in the plan; ``poisoned`` maps item indices to a reason
    for items known to crash or hang the decoder, which are skipped without being opened.
    ``strict`` makes the first bad file an error instead of a skip.
    """

    number: int
    task: ShardTask
    format: str
    layout: ImageLayout
    preprocess: PreprocessConfig
    directory: str
    strict: bool = False
    poisoned: dict[int, str] = field(default_factory=dict)


class _Channels:
    progress: Optional[Any] = None  # queue of (shard number, count) messages
    current: Optional[Any] = None  # shared array: item position each shard is at, +1 (0 = idle)
    parent: Optional[int] = None


def init_worker(queue, current, parent: int) -> None:
    """Pool initializer: connect the progress queue and the current-item array.

    ``parent`` is the converter's process id: a worker whose converter was killed stops at once
    rather than finish its shard into a folder that another run may be resuming.

    Workers ignore Ctrl-C: the terminal sends it to the whole process group, and the parent alone
    decides how to stop (it cancels the queued shards and ends the workers).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _Channels.progress, _Channels.current, _Channels.parent = queue, current, parent


def _exit_if_orphaned() -> None:
    if _Channels.parent is None:
        return
    try:
        os.kill(_Channels.parent, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        os._exit(1)
    except PermissionError:
        pass  # exists, owned by someone else (cannot happen for our own parent, but harmless)


def _queue_reporter() -> Optional[ProgressFn]:
    queue = _Channels.progress
    if queue is None:
        return None
    return lambda shard, n: queue.put((shard, n))


def write_shard(job: ShardJob, progress: Optional[ProgressFn] = None) -> ShardResult:
    """Write one shard; return its files with checksums, the files it skipped, and per-sample facts."""
    report = progress or _queue_reporter()
    current = _Channels.current
    directory = Path(job.directory)
    writer = get_writer(job.format)(directory, job.task.name, job.layout, len(job.task.items))
    result = ShardResult(job.task.name, 0, [])
    pending = 0
    for position, item in enumerate(job.task.items):
        if current is not None:
            current[job.number] = position + 1
            _exit_if_orphaned()
        try:
            if item.index in job.poisoned:
                raise DecodeError(item.path, job.poisoned[item.index])
            data = read_source(item.path)
            image = decode_image(data, job.preprocess, item.path)
        except DecodeError as e:
            if job.strict:
                raise DecodeError(item.relpath, e.reason) from None
            result.skipped.append(Skipped(item.relpath, e.reason))
            log.info("skipped %s: %s", item.relpath, e.reason)
        else:
            writer.add(Sample(item.index, item.relpath, image, item.label))
            result.samples += 1
            result.keys.append(item.relpath)
            result.labels.append(item.label)
            result.digests.append(hashlib.blake2b(data, digest_size=8).hexdigest())
        pending += 1
        if report is not None and pending >= PROGRESS_EVERY:
            report(job.number, pending)
            pending = 0
    # Closed only after the last item: a shard cut short by an error never looks finished.
    files = writer.close()
    if current is not None:
        current[job.number] = 0
    if report is not None and pending:
        report(job.number, pending)
    result.files = [file_entry(directory, name) for name in files]
    return result
