"""Reader of LMDB outputs: one read-only environment per shard, opened lazily in each worker."""

from __future__ import annotations

from typing import NamedTuple, Optional

import lmdb
import numpy as np

from packer.spec.codecs import NpyDecoder, decode_npy, npy_view
from packer.spec.entries import TextField
from packer.spec.errors import ManifestError
from packer.spec.lmdb_envs import acquire, release
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
        key, env = acquire(path)
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
        release(handle.key)  # closed when no other dataset of this process uses it
