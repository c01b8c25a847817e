"""packer.worker: writing one shard in a worker process."""

from __future__ import annotations

import itertools

import pytest

import packer.prefetch
import packer.worker
from packer.config import PreprocessConfig
from packer.discover import discover
from packer.formats import ImageLayout
from packer.records import ShardTask
from packer.worker import PROGRESS_SECONDS, ShardJob, write_shard


def _job(image_tree, tmp_path) -> ShardJob:
    items = tuple(discover(image_tree).items)
    layout = ImageLayout("uint8", (16, 12, 3), 3)
    return ShardJob(0, ShardTask("shard-00000", items), "npy", layout, PreprocessConfig(size=(12, 16)), str(tmp_path))


@pytest.mark.parametrize("tick,expected", [
    (0.0, [15]),  # a fast shard: one message, at the end
    (PROGRESS_SECONDS / 2, [2] * 7 + [1]),  # a message every other file, the rest at the end
    (PROGRESS_SECONDS * 2, [1] * 15),  # slow files: one message each
])
def test_progress_is_reported_by_time_not_per_file(image_tree, tmp_path, monkeypatch, tick, expected):
    """Workers report at most every PROGRESS_SECONDS: a count per file made the parent wake
    hundreds of times a second for small images. Whatever the timing, every file is counted once."""
    clock = itertools.count()
    monkeypatch.setattr(packer.worker.time, "monotonic", lambda: next(clock) * tick)
    reports: list[int] = []
    result = write_shard(_job(image_tree, tmp_path), progress=reports.append)
    assert result.samples == 15
    assert reports == expected


@pytest.mark.skipif(not packer.prefetch.available(), reason="no posix_fadvise here")
def test_slow_reads_start_the_prefetcher_and_change_nothing_written(image_tree, tmp_path, monkeypatch):
    """Reads slower than SLOW_READ_SECONDS a file start the thread that asks the disk for the files
    ahead; fast ones do not. Either way the worker reads every file itself: the same shard."""
    started: list[bool] = []

    class Spy(packer.prefetch.Prefetcher):
        def close(self) -> None:
            started.append(self.running)
            super().close()

    monkeypatch.setattr(packer.worker, "Prefetcher", Spy)
    results = {}
    for name, threshold in (("fast", 1e9), ("slow", 0.0)):
        monkeypatch.setattr(packer.worker, "SLOW_READ_SECONDS", threshold)
        out = tmp_path / name
        out.mkdir()
        results[name] = write_shard(_job(image_tree, out))
    assert started == [False, True]
    fast, slow = results["fast"], results["slow"]
    assert fast.samples == slow.samples == 15
    assert [(f.path, f.bytes, f.sha256) for f in fast.files] == [(f.path, f.bytes, f.sha256) for f in slow.files]
    assert (fast.keys, fast.digests, fast.sources) == (slow.keys, slow.digests, slow.sources)
