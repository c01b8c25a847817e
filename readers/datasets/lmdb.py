"""Reader of LMDB outputs: one read-only environment per shard, opened lazily in each worker."""

from __future__ import annotations

import os
from typing import NamedTuple, Optional

import lmdb
import numpy as np

from packer.spec.codecs import NpyDecoder, decode_npy, npy_view
from packer.spec.entries import TextField
from packer.spec.errors import ManifestError
from packer.spec.file_stamp import FileStamp
from packer.spec.manifest import ShardEntry
from packer.spec.shard_names import (
    LMDB_IMAGE_SHAPES,
    LMDB_LABELS,
    LMDB_SUFFIX,
    lmdb_field_key,
    lmdb_image_key,
    lmdb_key_key,
    lmdb_lengths_key,
)
from readers.datasets.mapstyle import PackedDataset

_ENVS: dict[tuple, list] = {}
"""Open environments of this process, by file identity, with a count of their users.

py-lmdb refuses to open one file twice in a process, and two datasets over the same output (train
and eval views, a copy) are common, so they share one environment. The key includes the inode
and modification time (``FileStamp.reader_identity``): an output converted again at the same path
is a new file, never served from a stale map, while a dataset that opened the old file keeps reading
it (py-lmdb opens the new file beside it: another inode)."""


def _identity(path: str) -> tuple:
    return (os.getpid(), path, *FileStamp.at(path).reader_identity())


def _acquire(path: str) -> tuple[tuple, lmdb.Environment]:
    pid = os.getpid()
    for key in [k for k in _ENVS if k[0] != pid]:
        # Inherited through fork: the parent's map must not be used here. Closing the child's copy
        # touches no lock (lock=False) and tells py-lmdb the file is no longer open in this process.
        _ENVS.pop(key)[0].close()
    key = _identity(path)
    entry = _ENVS.get(key)
    if entry is None:
        # lock=False: the files never change after conversion, so readers need no lock table.
        env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False, meminit=False)
        entry = _ENVS[key] = [env, 0]
    entry[1] += 1
    return key, entry[0]


def _release(key: tuple) -> None:
    entry = _ENVS.get(key)
    if entry is not None:
        entry[1] -= 1
        if entry[1] <= 0:
            _ENVS.pop(key)[0].close()


class _LmdbShard(NamedTuple):
    key: tuple
    txn: lmdb.Transaction
    name: str
    npy: NpyDecoder  # the shard's images share one npy header: parsed once


class LmdbDataset(PackedDataset):
    """Map-style dataset over an lmdb output (see PackedDataset for what items look like)."""

    format_name = "lmdb"

    def open_shard(self, shard: ShardEntry) -> _LmdbShard:
        path = str(self.files.path(shard.file(LMDB_SUFFIX)).resolve())
        key, env = _acquire(path)
        # buffers=True: values are views of the map, valid while the transaction lives (until
        # close_shard), so an image is copied once, into its batch slot, and no sooner.
        return _LmdbShard(key, env.begin(buffers=True), path, NpyDecoder())

    def _get(self, handle: _LmdbShard, key: bytes) -> memoryview:
        value = handle.txn.get(key)
        if value is None:
            raise ManifestError(f"{handle.name} has no key {key.decode()}; the shard is damaged")
        return value

    def read_stored(self, handle: _LmdbShard, local: int) -> np.ndarray | memoryview:
        value = self._get(handle, lmdb_image_key(local))
        return value if self.layout.codec.encoded else handle.npy(value)

    def read_labels(self, handle: _LmdbShard) -> np.ndarray:
        return npy_view(self._get(handle, LMDB_LABELS))

    def read_field(self, handle: _LmdbShard, local: int, field: str) -> memoryview:
        return self._get(handle, lmdb_field_key(local, field))

    def read_lengths(self, handle: _LmdbShard, field: TextField) -> np.ndarray:
        return decode_npy(bytes(self._get(handle, lmdb_lengths_key(field.name))))

    def read_shapes(self, handle: _LmdbShard, shard: ShardEntry) -> Optional[np.ndarray]:
        value = handle.txn.get(LMDB_IMAGE_SHAPES)
        return decode_npy(bytes(value)) if value is not None else None

    def read_key(self, handle: _LmdbShard, local: int) -> str:
        return bytes(self._get(handle, lmdb_key_key(local))).decode("utf-8")

    def close_shard(self, handle: _LmdbShard) -> None:
        handle.txn.abort()
        _release(handle.key)  # closed when no other dataset of this process uses it
