"""packer.run.worker: writing one shard in a worker process."""

from __future__ import annotations

import itertools
import time

import pytest
from helpers import wait_for

import packer.pixels.prefetch
import packer.run.worker
from packer.config import PreprocessConfig
from packer.records import ShardTask
from packer.run.shard_job import ShardJob
from packer.run.worker import PROGRESS_SECONDS, write_shard
from packer.sources.discover import discover
from packer.spec.sample_layout import SampleLayout


def _job(image_tree, tmp_path) -> ShardJob:
    items = tuple(discover(image_tree).items)
    layout = SampleLayout("uint8", (16, 12, 3), 3)
    return ShardJob(0, ShardTask("shard-00000", items), "npy", layout, PreprocessConfig(size=(12, 16)), str(tmp_path))


@pytest.mark.parametrize(
    "tick,expected",
    [
        (0.0, [15]),  # a fast shard: one message, at the end
        (PROGRESS_SECONDS / 2, [2] * 7 + [1]),  # a message every other file, the rest at the end
        (PROGRESS_SECONDS * 2, [1] * 15),  # slow files: one message each
    ],
)
def test_progress_is_reported_by_time_not_per_file(image_tree, tmp_path, monkeypatch, tick, expected):
    """Workers report at most every PROGRESS_SECONDS: a count per file made the parent wake
    hundreds of times a second for small images. Whatever the timing, every file is counted once."""
    clock = itertools.count()
    monkeypatch.setattr(packer.run.worker.time, "monotonic", lambda: next(clock) * tick)
    reports: list[int] = []
    result = write_shard(_job(image_tree, tmp_path), progress=reports.append)
    assert result.samples == 15
    assert reports == expected


@pytest.mark.skipif(not packer.pixels.prefetch.available(), reason="no posix_fadvise here")
def test_slow_reads_start_the_prefetcher_and_change_nothing_written(image_tree, tmp_path, monkeypatch):
    """Slow reads start the thread that asks the disk for the files ahead; fast ones do not. Either
    way the worker reads every file itself: the same shard."""
    started: list[bool] = []

    class Spy(packer.pixels.prefetch.Prefetcher):
        def close(self) -> None:
            started.append(self.started)
            super().close()

    monkeypatch.setattr(packer.run.worker, "Prefetcher", Spy)
    results = {}
    for name, slow in (("fast", False), ("slow", True)):
        monkeypatch.setattr(packer.run.worker, "reads_are_slow", lambda files, nbytes, seconds, slow=slow: slow)
        out = tmp_path / name
        out.mkdir()
        results[name] = write_shard(_job(image_tree, out))
    assert started == [False, True]
    fast, slow = results["fast"], results["slow"]
    assert fast.samples == slow.samples == 15
    assert [(f.path, f.bytes, f.sha256) for f in fast.files] == [(f.path, f.bytes, f.sha256) for f in slow.files]
    assert (fast.keys, fast.digests, fast.sources) == (slow.keys, slow.digests, slow.sources)


@pytest.mark.skipif(not packer.pixels.prefetch.available(), reason="no posix_fadvise here")
def test_prefetch_follows_the_decoder_past_its_window_and_never_opens_a_poisoned_file(
    image_tree, tmp_path, monkeypatch
):
    """Started after the first run of reads, it asks for every later file, the window moving with the
    decoder, but never for a file known to crash or hang the decoder."""
    requested: list[str] = []

    class Spy(packer.pixels.prefetch.Prefetcher):
        def __init__(self, paths, max_file_bytes=None):
            super().__init__(paths, max_file_bytes, ahead_files=2)

        def advance(self, position: int) -> None:
            super().advance(position)
            deadline = time.monotonic() + 120  # let the thread catch up, so that what it asks for is known
            while self.alive and self._next < min(len(self._paths), position + 2) and time.monotonic() < deadline:
                time.sleep(0.001)

        def _request(self, path: str) -> int:
            requested.append(path)
            return super()._request(path)

    monkeypatch.setattr(packer.run.worker, "Prefetcher", Spy)
    monkeypatch.setattr(packer.run.worker, "READ_AHEAD_FILES", 4)
    monkeypatch.setattr(packer.run.worker, "reads_are_slow", lambda files, nbytes, seconds: True)
    job = _job(image_tree, tmp_path)
    items = job.task.items
    poisoned = items[9]
    job = ShardJob(
        job.number,
        job.task,
        job.format,
        job.layout,
        job.preprocess,
        job.directory,
        poisoned={poisoned.index: "decoder crashed (signal SIGSEGV)"},
    )
    result = write_shard(job)
    assert result.samples == 14 and [s.path for s in result.skipped] == [poisoned.relpath]
    assert requested == [item.path for item in items[4:] if item is not poisoned]  # 0-3: the first run of reads


def test_a_recording_worker_leaves_the_per_sample_values_in_the_shard_record(image_tree, tmp_path):
    """With ``record`` the worker writes the shard's record itself: what crosses the pipe to the
    parent names that record and counts, and holds no key, label or digest."""
    import dataclasses
    import pickle

    from packer.output.files import finished_shards
    from packer.recorded_columns import RecordedColumn
    from packer.run.executor import run_jobs

    plain = write_shard(_job(image_tree, tmp_path))
    job = dataclasses.replace(_job(image_tree, tmp_path), record=True)
    [result] = run_jobs([job], 1)
    assert all(isinstance(c, RecordedColumn) for c in (result.keys, result.labels, result.digests))
    assert len(pickle.dumps(result)) < len(pickle.dumps(plain)) - 16 * plain.samples  # no digests, no keys
    assert list(result.keys) == list(plain.keys) and list(result.labels) == list(plain.labels)
    assert list(result.digests) == list(plain.digests)
    kept = finished_shards(tmp_path, [job.task.name])
    assert list(kept[job.task.name].keys) == list(plain.keys)  # the record --resume reads


def test_a_record_that_cannot_be_written_is_an_output_error_naming_the_shard(image_tree, tmp_path, monkeypatch):
    """A full disk when the worker writes its shard's record is the clear OutputError that a full disk
    gets when it writes the shard's files (Ray returns it instead of retrying a failed task)."""
    import dataclasses
    import errno

    import packer.run.worker
    from packer.spec.errors import OutputError

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(packer.run.worker, "record_shard", full)
    with pytest.raises(OutputError, match="cannot write shard-00000's record in .*No space left on device"):
        write_shard(dataclasses.replace(_job(image_tree, tmp_path), record=True))


def test_a_worker_ends_on_sigterm_whatever_handler_its_converter_had(image_tree, tmp_path, monkeypatch, capfd):
    """multiprocessing terminates (SIGTERM) the daemonic children still running when a converter
    exits: a worker started as the run was interrupted must end there, quietly, not run the
    converter's handler, which raises KeyboardInterrupt (a traceback on the user's terminal)."""
    import logging
    import multiprocessing as mp
    import os
    import signal

    from packer.system import request_stop

    inside = tmp_path / "inside"

    def shard(*args, **kwargs) -> None:
        inside.touch()
        time.sleep(60)

    monkeypatch.setattr(packer.run.worker, "write_shard", shard)
    previous = signal.signal(signal.SIGTERM, request_stop)  # as the CLI installs it
    try:
        ctx = mp.get_context("fork")
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=packer.run.worker.run_shard_process,
            args=(_job(image_tree, tmp_path), send, None, os.getpid(), logging.WARNING),
            daemon=True,
        )
        proc.start()
    finally:
        signal.signal(signal.SIGTERM, previous)
    wait_for(inside.exists, "the worker never got to its shard")
    proc.terminate()
    proc.join(120)  # a safety net: the worker ends at once, or runs its minute out and exits 0
    assert proc.exitcode == -signal.SIGTERM and not receive.poll()  # ended, nothing sent
    assert "Traceback" not in capfd.readouterr().err
