"""Asking the kernel for a shard's source files before the worker reaches them, when they come
from the disk.

A worker reads its files one at a time, between decodes. When they are not in the page cache (the
first conversion of a dataset, files the kernel has dropped since, a network filesystem), each
read waits for the storage while the core idles. Once the worker sees its reads are slow
(``reads_are_slow``, then ``start``), a ``Prefetcher`` thread beside the decoder opens the files
of the samples ahead of it and asks the kernel to read them (``posix_fadvise(WILLNEED)``: the
reads are queued at once, many at a time, and the thread does not wait for the data); the worker
then finds them cached. The thread keeps a window of files requested ahead of the decoder, which
reports its position (``advance``). It neither returns nor keeps any data: the worker still stats
and reads every file itself, so what is stored, the stamps ``--resume`` keeps, the errors reported
and the file a hang is blamed on are those of the worker's own reads. While reads are fast the
thread is not started.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections import deque
from typing import Optional, Sequence

from packer.pixels.read import SOURCE_OPEN_FLAGS

log = logging.getLogger(__name__)

AHEAD_FILES = 64
"""Samples whose files the thread keeps requested ahead of the decoder (64 photographs: ~0.2 s of
one worker's decoding)."""

AHEAD_BYTES = 64 * 1024**2
"""Bytes requested ahead of the decoder at most (the next sample's files are always requested)."""

SLOW_READ_SECONDS = 80e-6
CACHED_READ_BYTES_PER_SECOND = 1.5e9
MIN_SLOW_FILES = 4
"""Reads are slow, and worth prefetching, when a run of at least MIN_SLOW_FILES of them took longer
than SLOW_READ_SECONDS a file plus their bytes at CACHED_READ_BYTES_PER_SECOND. From the page cache
a stat and read took ~33 us per 44 KB photograph in a worker's loop here, 62 us for 500 KB, 609
for 5 MB; from this VM's disk 110-140 us per photograph."""

ADVICE_CHUNK = 2 * 1024**2
"""Bytes per ``posix_fadvise`` call: Linux reads at most its read-ahead window (``read_ahead_kb``,
often 128 KB) for one call, so a larger file is asked for piece by piece."""

_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)


def available() -> bool:
    """Whether this system can prefetch (``posix_fadvise``: Linux and most Unix, not macOS or Windows)."""
    return _WILLNEED is not None and hasattr(os, "posix_fadvise")


def reads_are_slow(files: int, nbytes: int, seconds: float) -> bool:
    """Whether ``files`` reads of ``nbytes`` in all, taking ``seconds``, came from the storage rather
    than the page cache (see SLOW_READ_SECONDS)."""
    return files >= MIN_SLOW_FILES and seconds > files * SLOW_READ_SECONDS + nbytes / CACHED_READ_BYTES_PER_SECOND


class Prefetcher:
    """Requests the files of ``paths`` (a tuple of paths per sample, None for a sample to leave
    alone) ahead of the decoder's position, once ``start``-ed; files over ``max_file_bytes`` (which
    the worker refuses) are left alone. A context manager: leaving it stops the thread. Where
    ``posix_fadvise`` is missing it does nothing."""

    def __init__(
        self,
        paths: Sequence[Optional[Sequence[str]]],
        max_file_bytes: Optional[int] = None,
        ahead_files: int = AHEAD_FILES,
        ahead_bytes: int = AHEAD_BYTES,
    ) -> None:
        self._paths = paths
        self._max_file_bytes = max_file_bytes
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
    def started(self) -> bool:
        """Whether ``start`` started the thread (it may have finished since)."""
        return self._thread is not None

    @property
    def alive(self) -> bool:
        """Whether the thread is running now."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, first: int) -> None:
        """Start requesting files ahead of the decoder, from sample ``first`` on (the samples before
        it the worker has read already); a second call does nothing."""
        if self._thread is None and not self._stop and available():
            self._next = max(first, self._position)
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
        """Stop requesting files. A thread stuck in a hung ``open`` is left behind (a daemon: it
        does not keep the worker from exiting), with a warning."""
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            if self._thread.is_alive():
                log.warning(
                    "prefetching source files: a file's open has not returned for a second; "
                    "the storage may hang (the worker's own read will tell)"
                )

    def _room(self) -> bool:
        """Whether the thread may request the next sample now."""
        while self._sizes and self._sizes[0][0] < self._position:
            self._requested -= self._sizes.popleft()[1]
        return self._next - self._position < self._ahead_files and (
            self._requested < self._ahead_bytes or not self._sizes
        )

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
        missing file, a FIFO or device, which is not even opened, one over ``max_file_bytes``, or
        any error: the worker's own read reports what is wrong)."""
        try:
            st = os.stat(path)  # never open a FIFO or device: see read.read_source
            size = st.st_size
            too_large = self._max_file_bytes is not None and size > self._max_file_bytes
            if not stat.S_ISREG(st.st_mode) or not size or too_large:
                return 0
            fd = os.open(path, SOURCE_OPEN_FLAGS)
        except OSError:
            return 0
        try:
            for offset in range(0, size, ADVICE_CHUNK):
                os.posix_fadvise(fd, offset, min(ADVICE_CHUNK, size - offset), _WILLNEED)  # type: ignore[arg-type]
            self.requested_files += 1
        except OSError:
            size = 0
        finally:
            try:
                os.close(fd)
            except OSError:
                pass  # nothing was written; the worker opens the file anew
        return size
