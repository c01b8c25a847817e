"""Asking the kernel for a shard's source files before the worker reaches them, when they come
from the disk.

A worker reads its files one at a time, between decodes. When they are not in the page cache (the
first conversion of a dataset, files the kernel has dropped since, a network filesystem), each
read waits for the storage while the core idles. Once the worker sees its reads are slow
(``start``), a ``Prefetcher`` thread beside the decoder opens the files of the samples ahead of it
and asks the kernel to read them (``posix_fadvise(WILLNEED)``: the reads are queued at once, many
at a time, and the thread does not wait for the data); the worker then finds them cached. The
thread keeps a window of files requested ahead of the decoder, which reports its position
(``advance``). It neither returns nor keeps any data: the worker still stats and reads every
file itself, so what is stored, the stamps ``--resume`` keeps, the errors reported and the file a
hang is blamed on are those of the worker's own reads. Files in the page cache cost nothing: the
thread is not started while reads are fast.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import deque
from typing import Optional, Sequence

from packer.preprocess import SOURCE_OPEN_FLAGS

AHEAD_FILES = 64
"""Samples whose files the thread keeps requested ahead of the decoder (64 photographs: ~0.2 s of
one worker's decoding)."""

AHEAD_BYTES = 64 * 1024**2
"""Bytes requested ahead of the decoder at most (the next sample's files are always requested)."""

SLOW_READ_SECONDS = 80e-6
"""A worker's reads are slow, and worth prefetching, when they take longer than this per file on
average over a run of reads: from the page cache a stat and read took ~33 us per photograph in a
worker's loop here, from this VM's disk 110-140 us."""

_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)


def available() -> bool:
    """Whether this system can prefetch (``posix_fadvise``: Linux and most Unix, not macOS or Windows)."""
    return _WILLNEED is not None and hasattr(os, "posix_fadvise")


class Prefetcher:
    """Requests the files of ``paths`` (a tuple of paths per sample, None for a sample to leave
    alone) ahead of the decoder's position, once ``start``-ed. A context manager: leaving it stops
    the thread. Where ``posix_fadvise`` is missing it does nothing."""

    def __init__(self, paths: Sequence[Optional[Sequence[str]]], ahead_files: int = AHEAD_FILES,
                 ahead_bytes: int = AHEAD_BYTES) -> None:
        self._paths = paths
        self._ahead_files, self._ahead_bytes = ahead_files, ahead_bytes
        self._position = 0  # the decoder's sample position
        self._next = 0  # the next sample whose files the thread requests
        self._sizes: deque[tuple[int, int]] = deque()  # (sample, bytes requested) the decoder has not passed
        self._requested = 0  # their bytes
        self._stop = False
        self._wake = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self.requested_files = 0
        """Files the kernel was asked for so far."""

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        """Whether the thread has been started (and not closed)."""
        return self._thread is not None

    def start(self) -> None:
        """Start requesting files ahead of the decoder (again: nothing)."""
        if self._thread is None and not self._stop and available():
            self._next = max(self._next, self._position)
            self._thread = threading.Thread(target=self._run, name="packer-prefetch", daemon=True)
            self._thread.start()

    def advance(self, position: int) -> None:
        """The decoder is at sample ``position`` (0-based): it is done with the samples before."""
        self._position = position
        # The thread is woken when half its window has been used, not after every sample.
        if self._thread is not None and self._next - position <= self._ahead_files // 2:
            with self._wake:
                self._wake.notify()

    def close(self) -> None:
        """Stop requesting files (a thread stuck in a hung ``open`` is left behind: it is a daemon)."""
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    def _room(self) -> bool:
        """Whether the thread may request the next sample now."""
        while self._sizes and self._sizes[0][0] < self._position:
            self._requested -= self._sizes.popleft()[1]
        return self._next - self._position < self._ahead_files and (
            self._requested < self._ahead_bytes or not self._sizes)

    def _run(self) -> None:
        while self._next < len(self._paths):
            with self._wake:
                while not self._stop and not self._room():
                    self._wake.wait()
                if self._stop:
                    return
            sample = self._paths[self._next]
            size = sum(self._request(path) for path in sample) if sample else 0
            self._sizes.append((self._next, size))
            self._requested += size
            self._next += 1

    def _request(self, path: str) -> int:
        """Ask the kernel to read the regular file ``path``; its size, 0 when it was left alone (a
        missing file, a FIFO or device, which is not even opened: the worker's read reports it)."""
        try:
            st = os.stat(path)  # never open a FIFO or device: see preprocess.read_source
            if not stat.S_ISREG(st.st_mode) or not st.st_size:
                return 0
            fd = os.open(path, SOURCE_OPEN_FLAGS)
        except OSError:
            return 0
        try:
            os.posix_fadvise(fd, 0, 0, _WILLNEED)  # type: ignore[arg-type]
            self.requested_files += 1
        except OSError:
            return 0
        finally:
            os.close(fd)
        return st.st_size
