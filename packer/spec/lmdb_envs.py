"""The LMDB environments a process has open for reading, shared by every reader of one file.

py-lmdb refuses to open one file twice in a process, and two datasets over the same output (train
and eval views, a copy) are common, so they share one environment. The key includes the inode
and modification time (``FileStamp.reader_identity``): an output converted again at the same path
is a new file, never served from a stale map, while a dataset that opened the old file keeps reading
it (py-lmdb opens the new file beside it: another inode). An environment inherited through fork is
closed, never used: the parent's map is not this process's to read.
"""

from __future__ import annotations

import os

import lmdb

from packer.spec.file_stamp import FileStamp

_ENVS: dict[tuple, list] = {}
"""Open environments of this process, by file identity, with a count of their users."""


def acquire(path: str) -> tuple[tuple, lmdb.Environment]:
    """The read-only environment of the LMDB file ``path`` and its key (``release`` it when done)."""
    pid = os.getpid()
    for key in [k for k in _ENVS if k[0] != pid]:
        # Inherited through fork: the parent's map must not be used here. Closing the child's copy
        # touches no lock (lock=False) and tells py-lmdb the file is no longer open in this process.
        _ENVS.pop(key)[0].close()
    key = (pid, path, *FileStamp.at(path).reader_identity())
    entry = _ENVS.get(key)
    if entry is None:
        # lock=False: the files never change after conversion, so readers need no lock table.
        env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False, meminit=False)
        entry = _ENVS[key] = [env, 0]
    entry[1] += 1
    return key, entry[0]


def release(key: tuple) -> None:
    """One user of the environment ``key`` is done with it; the last closes it."""
    entry = _ENVS.get(key)
    if entry is not None:
        entry[1] -= 1
        if entry[1] <= 0:
            _ENVS.pop(key)[0].close()


__all__ = ["acquire", "release"]
