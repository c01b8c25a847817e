"""Reader of HDF5 outputs: one h5py file per shard, opened lazily in each worker."""

from __future__ import annotations

import h5py
import numpy as np

from packer.layout import HDF5_IMAGES, HDF5_KEYS, HDF5_LABELS, HDF5_SUFFIX
from packer.manifest import ShardEntry
from readers.base import PackedDataset

CHUNK_CACHE_BYTES = 4 * 1024**2  # per open file; samples are one chunk each, so little is needed


class Hdf5Dataset(PackedDataset):
    """Map-style dataset over an hdf5 output (see PackedDataset for what items look like)."""

    format_name = "hdf5"

    def open_shard(self, shard: ShardEntry) -> h5py.File:
        return h5py.File(self.path(shard.file(HDF5_SUFFIX)), "r", rdcc_nbytes=CHUNK_CACHE_BYTES)

    def read_image(self, handle: h5py.File, local: int) -> np.ndarray:
        return handle[HDF5_IMAGES][local]

    def read_labels(self, handle: h5py.File) -> np.ndarray:
        return handle[HDF5_LABELS][:]

    def read_key(self, handle: h5py.File, local: int) -> str:
        return handle[HDF5_KEYS].asstr()[local]

    def close_shard(self, handle: h5py.File) -> None:
        handle.close()
