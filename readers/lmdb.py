"""Reader of LMDB outputs: one read-only environment per shard, opened lazily in each worker."""

from __future__ import annotations

from typing import NamedTuple

import lmdb
import numpy as np

from packer.codecs import decode_npy
from packer.errors import ManifestError
from packer.layout import LMDB_LABELS, lmdb_image_key, lmdb_key_key
from packer.manifest import ShardEntry
from readers.base import PackedDataset


class _LmdbShard(NamedTuple):
    env: lmdb.Environment
    txn: lmdb.Transaction
    name: str


class LmdbDataset(PackedDataset):
    """Map-style dataset over an lmdb output (see PackedDataset for what items look like)."""

    format_name = "lmdb"

    def open_shard(self, shard: ShardEntry) -> _LmdbShard:
        path = self.path(shard.file(".lmdb"))
        # lock=False: the files never change after conversion, so readers need no lock table.
        env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=False, meminit=False)
        return _LmdbShard(env, env.begin(buffers=False), str(path))

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
        handle.txn.abort()
        handle.env.close()
