"""Reader of HDF5 outputs: one h5py file per shard, opened lazily in each worker."""

from __future__ import annotations

from typing import NamedTuple, Optional

import h5py
import numpy as np

from packer.codecs import decode_image
from packer.layout import HDF5_IMAGE_BYTES, HDF5_IMAGE_OFFSETS, HDF5_IMAGES, HDF5_KEYS, HDF5_LABELS, HDF5_SUFFIX
from packer.manifest import ShardEntry
from readers.base import PackedDataset

CHUNK_CACHE_BYTES = 4 * 1024**2  # per open file; raw samples are one chunk each, encoded ones 64 KiB chunks


class _Hdf5Shard(NamedTuple):
    file: h5py.File
    images: h5py.Dataset  # N x H x W x C, or the flat bytes of encoded images
    offsets: Optional[np.ndarray]  # N + 1 offsets into ``images`` when encoded


class Hdf5Dataset(PackedDataset):
    """Map-style dataset over an hdf5 output (see PackedDataset for what items look like)."""

    format_name = "hdf5"

    def open_shard(self, shard: ShardEntry) -> _Hdf5Shard:
        f = h5py.File(self.path(shard.file(HDF5_SUFFIX)), "r", rdcc_nbytes=CHUNK_CACHE_BYTES)
        if self.manifest.image_codec == "raw":
            return _Hdf5Shard(f, f[HDF5_IMAGES], None)
        return _Hdf5Shard(f, f[HDF5_IMAGE_BYTES], f[HDF5_IMAGE_OFFSETS][:])

    def read_image(self, handle: _Hdf5Shard, local: int) -> np.ndarray:
        if handle.offsets is None:
            return handle.images[local]
        data = handle.images[handle.offsets[local]:handle.offsets[local + 1]]
        return decode_image(data, self.manifest.image_codec, self.manifest.preprocess["mode"])

    def read_labels(self, handle: _Hdf5Shard) -> np.ndarray:
        return handle.file[HDF5_LABELS][:]

    def read_key(self, handle: _Hdf5Shard, local: int) -> str:
        return handle.file[HDF5_KEYS].asstr()[local]

    def close_shard(self, handle: _Hdf5Shard) -> None:
        handle.file.close()
