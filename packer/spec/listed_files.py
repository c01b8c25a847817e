"""The files an output lists: their size and SHA-256 for the manifest (``file_entry``, ``sha256_of``),
and which of them must not be opened (``unsafe_file``)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Callable, Optional

from packer.spec.entries import FileEntry


def unsafe_file(path: Path, root: Path) -> Optional[str]:
    """Why a file an output lists must not be opened, or None: a FIFO or device would block or
    feed any reader forever, a folder is not a shard file, and a symbolic link may point outside
    the output (the manifest's names are plain files inside it). A missing file is not unsafe."""
    try:
        if path.is_symlink() and not path.resolve().is_relative_to(root.resolve()):
            return "is a symbolic link to a file outside the output"
        st = path.stat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a FIFO, device or folder)"
    return None


def file_entry(
    directory: Path, relpath: str, sha256: Optional[str] = None, structure: Optional[Callable[[Path], int]] = None
) -> FileEntry:
    """Size and SHA-256 of one written file, for the manifest (the file is read for its SHA-256
    unless the writer hashed it as it wrote it: ``sha256``), and its structure checksum when the
    format has one (``structure``, see FormatSpec)."""
    path = directory / relpath
    return FileEntry(
        relpath, path.stat().st_size, sha256 or sha256_of(path), structure(path) if structure is not None else None
    )


def sha256_of(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()
