"""HDF5 shards: one ``NAME.h5`` file per shard with one dataset per field.

Datasets: ``images`` (N x H x W x C, chunked one sample per chunk for random access),
``labels`` (N, int64), ``keys`` (N, UTF-8 strings) and ``crc32`` (N, uint32). Encoded images (jpeg,
png) replace ``images`` with a variable-length field: ``images_bytes`` (flat uint8) and
``images_offsets`` (N + 1, int64); text fields are variable-length fields too (``text_bytes`` and
``text_offsets``, likewise ``json``), and text-only shards have no ``images``. Raw images of varying
sizes (``--resize none``) are a variable-length field of their pixels' bytes with ``images_shapes``
(N x 3, int64).
Timestamps are off so equal inputs give byte-identical files.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Iterator, Optional

import h5py
import numpy as np

from packer.formats.base import ImageLayout, check_image, encoded_bytes, raw_bytes, raw_image
from packer.formats.varlen import Hdf5VarlenWriter, iter_varlen
from packer.layout import (
    HDF5_CRC32,
    HDF5_IMAGE_SHAPES,
    HDF5_IMAGES,
    HDF5_KEYS,
    HDF5_LABELS,
    HDF5_SUFFIX,
    hdf5_varlen_names,
)
from packer.manifest import ShardEntry
from packer.records import Sample, StoredSample, TextField

BATCH = 64  # samples buffered per write: h5py's per-call overhead dominates single-sample writes


class Hdf5Writer:
    """Writes one shard as an HDF5 file."""

    name: ClassVar[str] = "hdf5"

    def __init__(self, directory: Path, shard: str, layout: ImageLayout, capacity: int) -> None:
        self.file_name = f"{shard}{HDF5_SUFFIX}"
        self.layout = layout
        self._file = h5py.File(Path(directory) / self.file_name, "w", track_order=False)
        self._pending = 0
        self._text = {f.name: Hdf5VarlenWriter(self._file, f.name) for f in layout.text}
        self._shapes: Optional[list[tuple[int, ...]]] = None  # of raw images of varying sizes
        if not layout.has_image:
            pass
        elif layout.codec.encoded or layout.shape is None:
            self._encoded = Hdf5VarlenWriter(self._file, "images")
            self._shapes = [] if not layout.codec.encoded else None
        else:
            self._images = self._file.create_dataset(
                HDF5_IMAGES, shape=(0, *layout.shape), maxshape=(None, *layout.shape), dtype=layout.dtype,
                chunks=(1, *layout.shape), track_times=False,
            )
            self._batch = np.empty((BATCH, *layout.shape), dtype=layout.dtype)
        self.labels: list[int] = []
        self.keys: list[str] = []
        self.crcs: list[int] = []
        self.digests: dict[str, str] = {}  # none: HDF5 does not write the file in order

    def add(self, sample: Sample) -> None:
        """Buffer one sample; full buffers go to the file in one write."""
        if self.layout.has_image:
            check_image(sample, self.layout)
            if self.layout.codec.encoded:
                self._encoded.add(encoded_bytes(sample, self.layout))
            elif self._shapes is not None:
                self._encoded.add(raw_bytes(sample.image, np.dtype(self.layout.dtype)))
                self._shapes.append(sample.image.shape)
            else:
                self._batch[self._pending] = sample.image
                self._pending += 1
        for name, writer in self._text.items():
            writer.add(sample.fields[name])
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
        if not self.layout.has_image:
            pass
        elif self.layout.codec.encoded or self._shapes is not None:
            self._encoded.close()
        else:
            self._flush()
        if self._shapes is not None:
            shapes = np.asarray(self._shapes, np.int64).reshape(-1, 3)
            self._file.create_dataset(HDF5_IMAGE_SHAPES, data=shapes, track_times=False)
        for writer in self._text.values():
            writer.close()
        self._file.create_dataset(HDF5_LABELS, data=np.asarray(self.labels, dtype=np.int64), track_times=False)
        self._file.create_dataset(HDF5_CRC32, data=np.asarray(self.crcs, dtype=np.uint32), track_times=False)
        self._file.create_dataset(
            HDF5_KEYS, data=np.asarray(self.keys, dtype=object), dtype=h5py.string_dtype("utf-8"), track_times=False
        )
        self._file.close()
        return [self.file_name]


def scan_shard(directory: Path, shard: ShardEntry, codec: str = "raw", text: tuple[TextField, ...] = (),
               image: bool = True, dtype: str = "uint8") -> Iterator[StoredSample]:
    """Every sample of one shard, in order, read with h5py alone (encoded images as their bytes, the
    ``text`` fields as theirs)."""
    with h5py.File(directory / shard.file(HDF5_SUFFIX), "r") as f:
        labels, keys, crcs = f[HDF5_LABELS][:], f[HDF5_KEYS].asstr()[:], f[HDF5_CRC32][:]
        if not len(labels) == len(keys) == len(crcs) == shard.samples:
            raise ValueError(f"{shard.name}: {len(labels)} labels, {len(keys)} keys, {len(crcs)} checksums; "
                             f"the manifest says {shard.samples}")
        streams = {t.name: _varlen(f, shard, t.name) for t in text}
        variable = image and codec == "raw" and HDF5_IMAGE_SHAPES in f
        if image and (codec != "raw" or variable):
            encoded = _varlen(f, shard, "images")
            shapes = f[HDF5_IMAGE_SHAPES][:] if variable else None
        elif image:
            images = f[HDF5_IMAGES]
            if len(images) != shard.samples:
                raise ValueError(f"{shard.name}: {len(images)} images; the manifest says {shard.samples}")
        for i in range(shard.samples):
            pixels = data = None
            if variable:
                pixels = raw_image(next(encoded), dtype, shapes[i], shard.name)  # type: ignore[index]
            elif image and codec == "raw":
                pixels = images[i]
            elif image:
                data = next(encoded)
            fields = {name: next(stream) for name, stream in streams.items()}
            yield StoredSample(i, str(keys[i]), int(labels[i]), pixels, int(crcs[i]), data, fields)


def _varlen(f: h5py.File, shard: ShardEntry, field: str) -> Iterator[bytes]:
    """The bytes of each sample of variable-length field ``field``, from its two datasets."""
    data, offsets = hdf5_varlen_names(field)
    return iter_varlen(f[data], f[offsets][:], shard.samples, f"{shard.name} {data}")
