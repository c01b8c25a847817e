"""Reader of LMDB outputs: one read-only environment per shard, opened lazily in each worker."""

from __future__ import annotations

import os
from typing import NamedTuple

import lmdb
import numpy as np

from packer.codecs import decode_npy
from packer.errors import ManifestError
from packer.layout import LMDB_LABELS, lmdb_image_key, lmdb_key_key
from packer.manifest import ShardEntry
from readers.base import PackedDataset

_ENVS: dict[str, tuple[int, lmdb.Environment]] = {}
"""Open environments of this process by path: py-lmdb refuses to open one file twice in a process,
and two datasets over the same output (train and eval views, a copy) are common."""


def _environment(path: str) -> lmdb.Environment:
    pid = os.getpid()
    cached = _ENVS.get(path)
    if cached is not None and cached[0] != pid:
        # Inherited through fork: the parent's map must not be used here. Closing the child's copy
        # touches no lock (lock=False) and tells py-lmdb the file is no longer open in this process.
        cached[1].close()
        cached = None
    if cached is None:
        # lock=False: the files never change after conversion, so readers need no lock table.
        env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False, meminit=False)
        _ENVS[path] = cached = (pid, env)
    return cached[1]


class _LmdbShard(NamedTuple):
    env: lmdb.Environment
    txn: lmdb.Transaction
    name: str


class LmdbDataset(PackedDataset):
    """Map-style dataset over an lmdb output (see PackedDataset for what items look like)."""

    format_name = "lmdb"

    def open_shard(self, shard: ShardEntry) -> _LmdbShard:
        path = str(self.path(shard.file(".lmdb")).resolve())
        env = _environment(path)
        return _LmdbShard(env, env.begin(buffers=False), path)

    def _get(self, handle: _LmdbShard, key: bytes) -> bytes:
        value = handle.txn.get(key)
        if value is None:
            raise ManifestError(f"{handle.name} has no key {key.decode()}; the shard is damaged")
        return value

    def read_image(self, handle: _LmdbShard, local: int) -> np.ndarray:
        return decode_npy(self._get(handle, lmdb_image_key(local)))

    def read_labels(self, handle: _LmdbShard) -> np.ndarray:
        return decode_npy(self._get(handle, LMDB_LABELS))

    def read_key(self, handle: _LmdbShard, local: int) -> str:
        return self._get(handle, lmdb_key_key(local)).decode("utf-8")

    def close_shard(self, handle: _LmdbShard) -> None:
        handle.txn.abort()  # the environment stays open for other datasets of this process
