"""packer.prefetch: the thread that asks the kernel for the files ahead of a worker's reads."""

from __future__ import annotations

import os
import time

import pytest

import packer.prefetch
from packer.prefetch import Prefetcher

pytestmark = pytest.mark.skipif(not packer.prefetch.available(), reason="no posix_fadvise here")


def _files(tmp_path, count: int, size: int = 1000) -> list[tuple[str, ...]]:
    paths = []
    for i in range(count):
        path = tmp_path / f"{i:03d}.jpg"
        path.write_bytes(bytes([i % 256]) * size)
        paths.append((str(path),))
    return paths


def _settle(prefetch: Prefetcher, expected: int, patience: float = 5.0) -> int:
    """requested_files once the thread has reached ``expected`` (or ``patience`` seconds passed) and a
    moment later, to see it go no further."""
    deadline = time.monotonic() + patience
    while prefetch.requested_files < expected and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.05)
    return prefetch.requested_files


def test_nothing_is_requested_before_start(tmp_path):
    with Prefetcher(_files(tmp_path, 10)) as prefetch:
        prefetch.advance(5)
        time.sleep(0.05)
        assert not prefetch.running and prefetch.requested_files == 0


def test_a_window_ahead_of_the_decoder_refilled_when_half_used(tmp_path):
    with Prefetcher(_files(tmp_path, 20), ahead_files=4) as prefetch:
        prefetch.start()
        assert prefetch.running
        assert _settle(prefetch, 4) == 4  # samples 0-3
        prefetch.advance(1)  # three still ahead: not woken yet
        assert _settle(prefetch, 4) == 4
        prefetch.advance(2)  # two ahead, half the window: refilled to 2 + 4
        assert _settle(prefetch, 6) == 6
        prefetch.advance(19)
        assert _settle(prefetch, 20) == 20  # the last sample, and no further
    assert not prefetch.running


def test_a_start_mid_shard_begins_at_the_decoder(tmp_path):
    with Prefetcher(_files(tmp_path, 20), ahead_files=4) as prefetch:
        prefetch.advance(10)
        prefetch.start()
        assert _settle(prefetch, 14, patience=0.3) == 4  # samples 10-13, not the 10 the decoder is done with


def test_bytes_bound_the_window_but_one_sample_always_goes(tmp_path):
    with Prefetcher(_files(tmp_path, 10, size=3000), ahead_files=8, ahead_bytes=5000) as prefetch:
        prefetch.start()
        assert _settle(prefetch, 2) == 2  # 3,000 then 6,000 bytes: the second reaches the bound
        prefetch.advance(2)
        assert _settle(prefetch, 4) == 4
    with Prefetcher(_files(tmp_path, 3, size=9000), ahead_files=8, ahead_bytes=5000) as prefetch:
        prefetch.start()
        assert _settle(prefetch, 1) == 1  # larger than the bound on its own: requested all the same


def test_only_regular_files_are_opened(tmp_path):
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    good = _files(tmp_path, 2)
    samples = [(str(fifo),), (os.devnull,), (str(tmp_path / "gone.jpg"),), (str(empty),), None, good[0] + good[1]]
    with Prefetcher(samples) as prefetch:
        prefetch.start()
        assert _settle(prefetch, 2) == 2  # only the two files of the last sample


def test_without_posix_fadvise_it_does_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(packer.prefetch, "_WILLNEED", None)
    with Prefetcher(_files(tmp_path, 5)) as prefetch:
        prefetch.start()
        assert not prefetch.running and prefetch.requested_files == 0


def test_closed_it_stays_stopped(tmp_path):
    prefetch = Prefetcher(_files(tmp_path, 50), ahead_files=4)
    prefetch.start()
    _settle(prefetch, 4)
    prefetch.close()
    prefetch.start()
    prefetch.advance(40)
    time.sleep(0.05)
    assert not prefetch.running and prefetch.requested_files == 4
