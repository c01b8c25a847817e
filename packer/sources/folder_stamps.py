"""What discovery saw of each folder it listed, to tell later whether the tree is still the same.

Adding, removing or renaming a file changes its folder's modification time, and so does anything
that changes a folder's entries; a change of permissions changes its change time. So a tree whose
every listed folder still has the device, inode and both times discovery recorded holds the same
files under the same names, and ``--resume`` can take the plan it saved instead of walking the
tree again (the files' contents are checked per shard, by their own stamps). A folder changed in
the last ``RACY_SECONDS`` before the walk is never trusted: on filesystems with coarse timestamps
a file added in the same tick as the walk would leave no trace.
"""

from __future__ import annotations

import os
import time
from array import array
from pathlib import Path
from typing import Optional

import numpy as np

from packer.spec.file_stamp import MISSING_FOLDER_RECORD, FileStamp

RACY_SECONDS = 2.0

STAMP_FIELDS = len(MISSING_FOLDER_RECORD)
"""Per folder: its ``FileStamp.as_folder_record``, device, inode, modification time and change time in
nanoseconds (``MISSING_FOLDER_RECORD``, all -1, when the folder could not be read: it must still be
unreadable)."""


class FolderStamps:
    """The folders one walk listed (paths relative to its root) and their stamps, in flat buffers
    (a tree of one folder per sample has as many folders as files)."""

    def __init__(self, walked_at_ns: Optional[int] = None) -> None:
        self.walked_at_ns = walked_at_ns if walked_at_ns is not None else time.time_ns()
        self.blob = bytearray()
        self.ends = array("q", [0])
        self.stamps = array("q")

    def __len__(self) -> int:
        return len(self.ends) - 1

    def add(self, rel: str, stamp: Optional[FileStamp]) -> None:
        """One folder, as its stamp found it (None: it could not be read)."""
        self.blob += rel.encode("utf-8", "surrogateescape")
        self.ends.append(len(self.blob))
        self.stamps.extend(_record(stamp))

    def extend(self, blob: bytearray, ends: array, stamps: array) -> None:
        """Add the folders another walk's FolderStamps holds (its ``blob``, ``ends`` and ``stamps``)."""
        shift = len(self.blob)
        self.blob += blob
        self.ends.extend(e + shift for e in ends[1:])
        self.stamps.extend(stamps)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(UTF-8 paths as uint8, their N + 1 offsets, N x STAMP_FIELDS stamps), to save."""
        return (
            np.frombuffer(bytes(self.blob), np.uint8),
            np.frombuffer(self.ends, np.int64).copy(),
            np.frombuffer(self.stamps, np.int64).reshape(-1, STAMP_FIELDS).copy(),
        )

    @classmethod
    def from_arrays(cls, walked_at_ns: int, blob: np.ndarray, ends: np.ndarray, stamps: np.ndarray) -> "FolderStamps":
        """Inverse of ``arrays`` (ValueError for arrays that do not fit together)."""
        n = len(ends) - 1
        if (
            n < 0
            or stamps.shape != (n, STAMP_FIELDS)
            or int(ends[0]) != 0
            or int(ends[-1]) != len(blob)
            or (n and int(np.diff(ends).min()) < 0)
        ):
            raise ValueError("the saved folder stamps do not fit together")
        out = cls(walked_at_ns)
        out.blob = bytearray(blob.tobytes())
        out.ends = array("q", ends.tolist())
        out.stamps = array("q", stamps.reshape(-1).tolist())
        return out

    def first_change(self, root: Path) -> Optional[str]:
        """The first folder under ``root`` that is not as recorded, or changed too close to the walk
        to tell (its relative path, ``/`` for the root), else None: the tree is the same."""
        racy = self.walked_at_ns - int(RACY_SECONDS * 1e9)
        stamps = np.frombuffer(self.stamps, np.int64).reshape(-1, STAMP_FIELDS)
        ends = self.ends
        for i in range(len(self)):
            rel = self.blob[ends[i] : ends[i + 1]].decode("utf-8", "surrogateescape")
            now = FileStamp.at_or_none(os.path.join(root, rel) if rel else root)
            # equal records: ``now``'s times are the recorded ones (an unreadable folder has none)
            if _record(now) != tuple(stamps[i].tolist()) or (now is not None and now.changed_at_ns >= racy):
                return rel or "/"
        return None


def _record(stamp: Optional[FileStamp]) -> tuple[int, int, int, int]:
    return MISSING_FOLDER_RECORD if stamp is None else stamp.as_folder_record()
