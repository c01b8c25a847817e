"""Reading one source file whole: checked to be a regular, non-empty file of a bounded size first.

A FIFO or device named like an image would block, never end, or do something when opened; a file
larger than any image could need would be read whole into memory. The converter's workers, its
containers and the profiler read every source file through ``read_source``.
"""

from __future__ import annotations

import math
import os
import stat
from typing import Optional

from packer.spec.errors import DecodeError

SOURCE_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
"""How source files are opened. O_NONBLOCK: a path swapped for a FIFO after the check opens at once
(and is refused) instead of waiting for a writer; reads of regular files ignore it."""

READ_CHUNK = 64 * 1024**2
"""Bytes per read past the first, for files that changed size since they were opened or are large."""

_NOT_REGULAR = "not a regular file (a pipe, device or socket)"


def read_source(
    path: str | os.PathLike,
    max_bytes: Optional[int] = None,
    limit: str = "more than any image of --max-pixels could need",
    st: Optional[os.stat_result] = None,
) -> bytes:
    """The bytes of one source file; DecodeError for anything that is not a readable, non-empty file.

    Checked before opening (a FIFO or device named ``x.jpg`` would block, never end, or do something
    when opened) by its ``os.stat``, ``st`` if the caller took it, and again on the open file, before
    reading: a file over ``max_bytes`` would be read whole into memory (``limit`` says why there is
    one). stat, open, fstat and one read cost less per cached file than ``stat`` then
    ``open().read()`` (an isatty, a seek and a second read more).
    """
    where = str(path)
    try:
        if not stat.S_ISREG((st or os.stat(path)).st_mode):
            raise DecodeError(where, _NOT_REGULAR)
        fd = os.open(path, SOURCE_OPEN_FLAGS)
    except FileNotFoundError:
        reason = "broken symbolic link" if os.path.islink(path) else "file not found (removed while packer ran?)"
        raise DecodeError(where, reason) from None
    except OSError as e:
        raise DecodeError(where, f"cannot read file: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DecodeError(where, _NOT_REGULAR)
        if st.st_size == 0:
            raise DecodeError(where, "empty file: 0 bytes")
        if max_bytes is not None and st.st_size > max_bytes:
            raise DecodeError(where, f"file too large: {st.st_size:,} bytes, {limit} ({max_bytes:,})")
        data = _read_to_end(fd, st.st_size, max_bytes)
    except OSError as e:
        raise DecodeError(where, f"cannot read file: {e.strerror}") from None
    finally:
        try:
            os.close(fd)
        except OSError:
            pass  # the bytes are read (or an error is on its way); nothing was written
    if max_bytes is not None and len(data) > max_bytes:
        raise DecodeError(where, f"file too large: it grew past {max_bytes:,} bytes while read, {limit}")
    return data


def _read_to_end(fd: int, size: int, max_bytes: Optional[int] = None) -> bytes:
    """Everything from ``fd`` to the end of the file, ``size`` being its size when opened, but no more
    than one chunk past ``max_bytes``: one read when the file still has that size (a read asking for
    one byte more that returns less has reached the end)."""
    parts: list[bytes] = []
    if size < READ_CHUNK:
        first = os.read(fd, size + 1)
        if len(first) == size:
            return first
        parts.append(first)  # the file changed since fstat
    total, stop = sum(map(len, parts)), max_bytes if max_bytes is not None else math.inf
    while total <= stop:
        part = os.read(fd, READ_CHUNK)
        if not part:
            break
        parts.append(part)
        total += len(part)
    return b"".join(parts)
