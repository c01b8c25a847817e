"""packer.pixels.prefetch: the thread that asks the kernel for the files ahead of a worker's reads."""

from __future__ import annotations

import os
import threading
import time

import pytest

import packer.pixels.prefetch
from packer.pixels.prefetch import Prefetcher, reads_are_slow

pytestmark = pytest.mark.skipif(not packer.pixels.prefetch.available(), reason="no posix_fadvise here")


def _files(tmp_path, count: int, size: int = 1000) -> list[tuple[str, ...]]:
    paths = []
    for i in range(count):
        path = tmp_path / f"{i:03d}.jpg"
        path.write_bytes(bytes([i % 256]) * size)
        paths.append((str(path),))
    return paths


class _Watched(threading.Condition):
    """The Prefetcher's condition, telling when its thread has gone as far as it can: waiting for room
    with no wake-up pending (a notify clears ``idle`` under the lock, before the woken thread runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.idle = False

    def wait(self, timeout: float | None = None) -> bool:
        self.idle = True
        try:
            return super().wait(timeout)
        finally:
            self.idle = False

    def notify(self, n: int = 1) -> None:
        self.idle = False
        super().notify(n)


def _prefetcher(*args, **options) -> Prefetcher:
    """A Prefetcher whose thread ``_settle`` can watch."""
    prefetch = Prefetcher(*args, **options)
    prefetch._wake = _Watched()
    return prefetch


def _settle(prefetch: Prefetcher, patience: float = 60.0) -> int:
    """requested_files once the thread waits for the decoder or has finished: it then goes no further
    until told to. Knowing when, rather than sleeping a moment, keeps a slow machine from failing a
    count it has not reached yet or passing one it has not yet gone beyond."""
    deadline = time.monotonic() + patience
    while prefetch.alive:
        with prefetch._wake:
            if prefetch._wake.idle:
                break
        assert time.monotonic() < deadline, "the prefetch thread neither waits nor ends"
        time.sleep(0.001)
    return prefetch.requested_files


def test_nothing_is_requested_before_start(tmp_path):
    with _prefetcher(_files(tmp_path, 10)) as prefetch:
        prefetch.advance(5)
        # No thread runs to request anything, and none ran (it would have requested a file first).
        assert not prefetch.started and not _threads_left() and prefetch.requested_files == 0


def test_a_window_ahead_of_the_decoder_refilled_when_half_used(tmp_path):
    with _prefetcher(_files(tmp_path, 20), ahead_files=4) as prefetch:
        prefetch.start(0)
        assert prefetch.started
        assert _settle(prefetch) == 4  # samples 0-3
        prefetch.advance(1)  # three still ahead: not woken yet
        assert _settle(prefetch) == 4
        prefetch.advance(2)  # two ahead, half the window: refilled to 2 + 4
        assert _settle(prefetch) == 6
        prefetch.advance(19)
        assert _settle(prefetch) == 20  # the last sample, and no further
    assert not prefetch.alive and not _threads_left()


def test_a_start_mid_shard_begins_after_what_the_worker_has_read(tmp_path):
    with _prefetcher(_files(tmp_path, 20), ahead_files=4) as prefetch:
        prefetch.advance(10)
        prefetch.start(12)  # the worker read 10 and 11 already
        assert _settle(prefetch) == 2  # 12 and 13: four ahead of the decoder at 10
        prefetch.advance(12)
        assert _settle(prefetch) == 4
    with _prefetcher(_files(tmp_path, 20), ahead_files=4) as prefetch:
        prefetch.advance(10)
        prefetch.start(5)  # never behind the decoder
        assert _settle(prefetch) == 4  # 10-13, not 5-9 as well


def test_bytes_bound_the_window_but_one_sample_always_goes(tmp_path):
    with _prefetcher(_files(tmp_path, 10, size=3000), ahead_files=8, ahead_bytes=5000) as prefetch:
        prefetch.start(0)
        assert _settle(prefetch) == 2  # 3,000 then 6,000 bytes: the second reaches the bound
        prefetch.advance(2)
        assert _settle(prefetch) == 4
    with _prefetcher(_files(tmp_path, 3, size=9000), ahead_files=8, ahead_bytes=5000) as prefetch:
        prefetch.start(0)
        assert _settle(prefetch) == 1  # larger than the bound on its own: requested all the same


def test_only_regular_files_are_opened(tmp_path):
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    good = _files(tmp_path, 2)
    big = tmp_path / "big.jpg"
    big.write_bytes(bytes(5000))
    samples = [
        (str(fifo),),
        (os.devnull,),
        (str(tmp_path / "gone.jpg"),),
        (str(empty),),
        None,
        (str(big),),
        good[0] + good[1],
    ]
    with _prefetcher(samples, max_file_bytes=4000) as prefetch:  # big.jpg: refused by the worker, not asked for
        prefetch.start(0)
        assert _settle(prefetch) == 2  # only the two files of the last sample


def test_without_posix_fadvise_it_does_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(packer.pixels.prefetch, "_WILLNEED", None)
    with _prefetcher(_files(tmp_path, 5)) as prefetch:
        prefetch.start(0)
        assert not prefetch.started and prefetch.requested_files == 0


def test_closed_it_stays_stopped_and_leaves_no_thread(tmp_path):
    prefetch = _prefetcher(_files(tmp_path, 50), ahead_files=4)
    prefetch.start(0)
    assert _settle(prefetch) == 4 and prefetch.alive  # waiting for the decoder
    prefetch.close()
    assert not prefetch.alive and not _threads_left()
    prefetch.start(0)
    prefetch.advance(40)
    # No thread runs again to request more, and none ran (it would have requested a file first).
    assert not prefetch.alive and not _threads_left() and prefetch.requested_files == 4


def test_the_kernel_is_asked_for_whole_files_in_pieces(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(
        packer.pixels.prefetch.os,
        "posix_fadvise",
        lambda fd, offset, length, advice: calls.append((os.fstat(fd).st_size, offset, length, advice)),
    )
    big = tmp_path / "big.jpg"
    big.write_bytes(bytes(2 * packer.pixels.prefetch.ADVICE_CHUNK + 5))
    with _prefetcher(_files(tmp_path, 1) + [(str(big),)]) as prefetch:
        prefetch.start(0)
        assert _settle(prefetch) == 2
    chunk, willneed = packer.pixels.prefetch.ADVICE_CHUNK, os.POSIX_FADV_WILLNEED
    assert calls == [
        (1000, 0, 1000, willneed),
        (2 * chunk + 5, 0, chunk, willneed),
        (2 * chunk + 5, chunk, chunk, willneed),
        (2 * chunk + 5, 2 * chunk, 5, willneed),
    ]


def test_reads_are_slow_per_file_and_per_byte():
    per_file = packer.pixels.prefetch.SLOW_READ_SECONDS
    assert not reads_are_slow(16, 16 * 44_000, 16 * 33e-6)  # cached photographs
    assert reads_are_slow(16, 16 * 44_000, 16 * 120e-6)  # the same from this VM's disk
    assert not reads_are_slow(16, 16 * 5_000_000, 16 * 609e-6)  # cached 5 MB files take longer, by their bytes
    assert not reads_are_slow(packer.pixels.prefetch.MIN_SLOW_FILES - 1, 0, 1.0)  # too few to tell a preemption apart
    assert reads_are_slow(
        packer.pixels.prefetch.MIN_SLOW_FILES, 0, packer.pixels.prefetch.MIN_SLOW_FILES * per_file * 1.01
    )


def _threads_left() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "packer-prefetch"]
