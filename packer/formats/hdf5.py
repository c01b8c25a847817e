"""HDF5 shards: one ``NAME.h5`` file per shard with one dataset per field.

Datasets: ``images`` (N x H x W x C, chunked one sample per chunk for random access),
``labels`` (N, int64), ``keys`` (N, UTF-8 strings) and ``crc32`` (N, uint32). Encoded images (jpeg,
png) replace ``images`` with a variable-length field: ``images_bytes`` (flat uint8) and
``images_offsets`` (N + 1, int64). Timestamps are off so equal inputs give byte-identical files.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Iterator

import h5py
import numpy as np

from packer.errors import ConfigError
from packer.formats.base import ImageLayout, encoded_bytes
from packer.formats.varlen import Hdf5VarlenWriter, iter_varlen
from packer.layout import (
    HDF5_CRC32,
    HDF5_IMAGE_BYTES,
    HDF5_IMAGE_OFFSETS,
    HDF5_IMAGES,
    HDF5_KEYS,
    HDF5_LABELS,
    HDF5_SUFFIX,
)
from packer.manifest import ShardEntry
from packer.records import Sample, StoredSample

BATCH = 64  # samples buffered per write: h5py's per-call overhead dominates single-sample writes


class Hdf5Writer:
    """Writes one shard as an HDF5 file."""

    name: ClassVar[str] = "hdf5"
    variable_shape: ClassVar[bool] = False

    def __init__(self, directory: Path, shard: str, layout: ImageLayout, capacity: int) -> None:
        if layout.shape is None:
            raise ConfigError("the hdf5 format stores one N x H x W x C dataset and needs a fixed image size")
        self.file_name = f"{shard}{HDF5_SUFFIX}"
        self.layout = layout
        self._file = h5py.File(Path(directory) / self.file_name, "w", track_order=False)
        self._pending = 0
        if layout.codec.encoded:
            self._encoded = Hdf5VarlenWriter(self._file, "images")
        else:
            self._images = self._file.create_dataset(
                HDF5_IMAGES, shape=(0, *layout.shape), maxshape=(None, *layout.shape), dtype=layout.dtype,
                chunks=(1, *layout.shape), track_times=False,
            )
            self._batch = np.empty((BATCH, *layout.shape), dtype=layout.dtype)
        self.labels: list[int] = []
        self.keys: list[str] = []
        self.crcs: list[int] = []

    def add(self, sample: Sample) -> None:
        """Buffer one sample; full buffers go to the file in one write."""
        if sample.image.shape != self.layout.shape:
            raise ValueError(f"image of shape {sample.image.shape} in a shard of shape {self.layout.shape}")
        if self.layout.codec.encoded:
            self._encoded.add(encoded_bytes(sample, self.layout))
        else:
            self._batch[self._pending] = sample.image
            self._pending += 1
        self.labels.append(sample.label)
        self.keys.append(sample.key)
        self.crcs.append(sample.crc32)
        if self._pending == BATCH:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        start = self._images.shape[0]
        self._images.resize(start + self._pending, axis=0)
        self._images[start:] = self._batch[: self._pending]
        self._pending = 0

    def close(self) -> list[str]:
        """Write labels, keys and checksums and close the file."""
        if self.layout.codec.encoded:
            self._encoded.close()
        else:
            self._flush()
        self._file.create_dataset(HDF5_LABELS, data=np.asarray(self.labels, dtype=np.int64), track_times=False)
        self._file.create_dataset(HDF5_CRC32, data=np.asarray(self.crcs, dtype=np.uint32), track_times=False)
        self._file.create_dataset(
            HDF5_KEYS, data=np.asarray(self.keys, dtype=object), dtype=h5py.string_dtype("utf-8"), track_times=False
        )
        self._file.close()
        return [self.file_name]


def scan_shard(directory: Path, shard: ShardEntry, codec: str = "raw") -> Iterator[StoredSample]:
    """Every sample of one shard, in order, read with h5py alone (encoded images as their bytes)."""
    with h5py.File(directory / shard.file(HDF5_SUFFIX), "r") as f:
        labels, keys, crcs = f[HDF5_LABELS][:], f[HDF5_KEYS].asstr()[:], f[HDF5_CRC32][:]
        images = f[HDF5_IMAGES] if codec == "raw" else f[HDF5_IMAGE_OFFSETS][:]
        count = len(images) - (codec != "raw")  # N + 1 offsets
        if not count == len(labels) == len(keys) == len(crcs) == shard.samples:
            raise ValueError(
                f"{shard.name}: {count} images, {len(labels)} labels, {len(keys)} keys, "
                f"{len(crcs)} checksums; the manifest says {shard.samples}"
            )
        if codec != "raw":
            encoded = iter_varlen(f[HDF5_IMAGE_BYTES], images, shard.samples, f"{shard.name} {HDF5_IMAGE_BYTES}")
            for i, data in enumerate(encoded):
                yield StoredSample(i, str(keys[i]), int(labels[i]), None, int(crcs[i]), data)
            return
        for i in range(shard.samples):
            yield StoredSample(i, str(keys[i]), int(labels[i]), images[i], int(crcs[i]))
