"""Reader of HDF5 outputs: one h5py file per shard, opened lazily in each worker.

Raw images are read through a memory map of the file where HDF5's own chunk index says that every
sample is one unfiltered chunk of exactly one image (how packer writes them): the same zero-copy
path as npy, with the byte offsets taken from h5py, not assumed. Any other layout (a file
rewritten with compression, say) is read through h5py. Encoded images (jpeg, png) are sliced out
of the flat bytes dataset and decoded.

From a URL, h5py reads the file through a ``RangeFile`` (``readers.remote.range_file``), the images
by the same chunk offsets; a batch's chunks (of raw images, and of the flat bytes of encoded
images and text fields) are fetched at once, and each sample is checked against its CRC-32.
"""

from __future__ import annotations

import mmap
from typing import Any, NamedTuple, Optional

import h5py
import numpy as np

from packer.spec.codecs import raw_image
from packer.spec.entries import TextField
from packer.spec.errors import ManifestError
from packer.spec.hdf5_index import index_crc32
from packer.spec.manifest import ShardEntry
from packer.spec.sample_layout import ImageStorage
from packer.spec.shard_names import (
    HDF5_CRC32,
    HDF5_FLAT_KEYS_SINCE,
    HDF5_IMAGE_SHAPES,
    HDF5_IMAGES,
    HDF5_KEY_BYTES,
    HDF5_KEY_OFFSETS,
    HDF5_KEYS,
    HDF5_LABELS,
    HDF5_SUFFIX,
    hdf5_varlen_names,
)
from readers.datasets.mapstyle import PackedDataset
from readers.remote.npy_ranges import RemoteArray
from readers.remote.range_file import RangeFile
from readers.remote.sample_checks import SampleChecks

CHUNK_CACHE_BYTES = 4 * 1024**2  # per open file; raw samples are one chunk each, encoded ones 64 KiB chunks


class _Hdf5Shard(NamedTuple):
    file: h5py.File
    images: Optional[h5py.Dataset]  # N x H x W x C, or the flat bytes of encoded images; None without images
    offsets: Optional[np.ndarray]  # N + 1 offsets into ``images`` when encoded
    mapped: Optional[np.ndarray] = None  # raw images: the file as uint8, when every image is one plain chunk
    chunks: Optional[np.ndarray] = None  # raw images: byte offset of each image's chunk in the file
    dtype: Optional[np.dtype] = None
    shape: tuple[int, ...] = ()  # of one image
    nbytes: int = 0  # of one image
    text: dict = {}  # field: (flat bytes dataset, N + 1 offsets)
    shapes: Optional[np.ndarray] = None  # N x 3, raw images of varying sizes (stored like encoded ones)
    flat_keys: bool = True  # keys as UTF-8 bytes (format version 4 on), else HDF5 strings
    checks: Optional[SampleChecks] = None  # read by ranges from a URL: each sample checked as it is read
    source: Any = None  # read by ranges: the file's RangeSource
    flat_chunks: dict = {}  # read by ranges: dataset name: (file offset of each chunk, chunk length) where unfiltered


def chunk_offsets(images: h5py.Dataset) -> Optional[np.ndarray]:
    """File offset of each image when each is stored as one unfiltered chunk of its exact size, else None."""
    shape, dtype = images.shape, images.dtype
    if (
        not hasattr(images.id, "chunk_iter")
        or not shape[0]
        or images.chunks != (1, *shape[1:])
        or images.id.get_create_plist().get_nfilters()
        or dtype.hasobject
    ):
        return None
    nbytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    offsets = np.full(shape[0], -1, dtype=np.int64)
    ok = [True]

    def visit(info) -> None:
        if info.filter_mask or info.size != nbytes or info.byte_offset is None:
            ok[0] = False
        else:
            offsets[info.chunk_offset[0]] = info.byte_offset

    images.id.chunk_iter(visit)
    return offsets if ok[0] and (offsets >= 0).all() else None


def flat_chunks(data: h5py.Dataset) -> Optional[tuple[np.ndarray, int]]:
    """``(file offset of each chunk, chunk length)`` of a flat, chunked, unfiltered bytes dataset (the
    chunks a range read of its elements needs), else None."""
    if not hasattr(data.id, "chunk_iter") or data.chunks is None or data.id.get_create_plist().get_nfilters():
        return None
    length = data.chunks[0]
    starts = np.full(-(-data.shape[0] // length), -1, dtype=np.int64)

    def visit(info) -> None:
        starts[info.chunk_offset[0] // length] = -1 if info.byte_offset is None else info.byte_offset

    data.id.chunk_iter(visit)
    return (starts, length) if (starts >= 0).all() else None


class Hdf5Dataset(PackedDataset):
    """Map-style dataset over an hdf5 output (see PackedDataset for what items look like)."""

    format_name = "hdf5"
    reads_ranges = True

    def open_shard(self, shard: ShardEntry) -> _Hdf5Shard:
        name = shard.file(HDF5_SUFFIX)
        ranged = self.files.ranged
        source = self.files.source(name) if ranged else None
        path = self.files.path(name) if not ranged else None
        # By ranges, the blocks are cached already, and a chunk h5py kept would outlive a failed check.
        f = h5py.File(RangeFile(source) if ranged else path, "r", rdcc_nbytes=0 if ranged else CHUNK_CACHE_BYTES)
        recorded = self.files.entries[name].structure_crc32
        if ranged and recorded is not None and index_crc32(f) != recorded:
            f.close()  # labels, keys or offsets of another version than the manifest's: never mixed in
            raise ManifestError(
                f"{self.files.where(name)}: its labels, keys or offsets are not the ones the manifest records "
                "(the object was replaced or damaged since the output was opened); open the dataset again, or "
                f"run packer verify {self.root}"
            )

        def varlen(field: str) -> tuple[h5py.Dataset, np.ndarray]:
            data, offsets = hdf5_varlen_names(field)
            return f[data], f[offsets][:]

        text = {t.name: varlen(t.name) for t in self.text_fields}
        keys = self.manifest.format_version >= HDF5_FLAT_KEYS_SINCE  # by the manifest, never guessed from the file
        remote: dict = {}
        if ranged:
            flat = [data for data, _ in text.values()]
            if self.layout.image in (ImageStorage.ENCODED, ImageStorage.VARIABLE):
                flat.append(f[hdf5_varlen_names("images")[0]])
            chunks_of = {d.name: flat_chunks(d) for d in flat}
            checks = SampleChecks(f[HDF5_CRC32][:], self.files.where(name))
            remote = {"checks": checks, "source": source, "flat_chunks": chunks_of}
        kind = self.layout.image
        if kind is ImageStorage.NONE:
            return _Hdf5Shard(f, None, None, text=text, flat_keys=keys, **remote)
        if kind is ImageStorage.ENCODED:
            return _Hdf5Shard(f, *varlen("images"), text=text, flat_keys=keys, **remote)
        if kind is ImageStorage.VARIABLE:
            shapes = f[HDF5_IMAGE_SHAPES][:]
            return _Hdf5Shard(f, *varlen("images"), text=text, shapes=shapes, flat_keys=keys, **remote)
        images = f[HDF5_IMAGES]
        chunks = chunk_offsets(images)
        if chunks is None:
            return _Hdf5Shard(f, images, None, text=text, flat_keys=keys, **remote)
        shape = images.shape[1:]
        # A plain ndarray over the map: cheaper to index than a np.memmap. From a URL, by ranges.
        mapped = RemoteArray(source, flat=True) if ranged else np.asarray(np.memmap(path, dtype=np.uint8, mode="r"))
        nbytes = images.dtype.itemsize * int(np.prod(shape))
        return _Hdf5Shard(f, images, None, mapped, chunks, images.dtype, shape, nbytes, text, flat_keys=keys, **remote)

    def image_bytes(self, handle: _Hdf5Shard, local: int) -> np.ndarray:
        """The image of sample ``local`` as the file holds it: a chunk's bytes, a row, or its slice of
        the flat bytes."""
        if handle.mapped is not None:
            start = handle.chunks[local]  # local is always < the shard's samples: checked by locate()
            return handle.mapped[start : start + handle.nbytes].view(handle.dtype).reshape(handle.shape)
        if handle.offsets is None:
            return handle.images[local]
        return handle.images[handle.offsets[local] : handle.offsets[local + 1]]

    def ranges_of(self, handle: _Hdf5Shard, local: np.ndarray) -> list:
        if handle.checks is None:
            return []
        spans: list[tuple[int, int]] = []
        if handle.mapped is not None:
            spans += [(int(handle.chunks[i]), int(handle.chunks[i]) + handle.nbytes) for i in local.tolist()]
        flat = list(handle.text.values())
        if handle.offsets is not None:
            flat.append((handle.images, handle.offsets))
        for data, offsets in flat:
            table = handle.flat_chunks.get(data.name)
            if table is None:  # a filtered dataset: h5py reads it chunk by chunk
                continue
            starts, length = table
            for i in local.tolist():
                a, b = int(offsets[i]), int(offsets[i + 1])
                if b > a:
                    chunks = range(a // length, (b - 1) // length + 1)
                    spans += [(int(starts[c]), int(starts[c]) + length) for c in chunks]
        size = handle.source.size  # a flat dataset's last chunk may end at the file's end
        return [(handle.source, [(a, min(b, size)) for a, b in spans])]

    def read_stored(self, handle: _Hdf5Shard, local: int) -> np.ndarray:
        data = self.checked_sample(handle, local)[0] if handle.checks is not None else self.image_bytes(handle, local)
        if handle.shapes is not None:
            return raw_image(data, self.layout.np_dtype, handle.shapes[local], handle.file.filename)
        return data

    def read_labels(self, handle: _Hdf5Shard) -> np.ndarray:
        labels = handle.file[HDF5_LABELS]
        offset = labels.id.get_offset()
        if offset is None or labels.chunks is not None or labels.compression is not None or not labels.size:
            return labels[:]
        if handle.source is not None:  # read by ranges: no file descriptor to map
            return labels[:]
        # Contiguous and unfiltered (as packer writes it): a view of the file at the data's offset,
        # shared by every worker through the page cache instead of a copy in each. Mapped from the
        # open file, not its path: an output replaced since the open must not be read.
        try:
            fd = handle.file.id.get_vfd_handle()
        except (OSError, ValueError, TypeError):
            return labels[:]  # a driver without a file descriptor
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        nbytes = labels.dtype.itemsize * labels.size
        try:
            mapped = mmap.mmap(fd, offset + nbytes - start, access=mmap.ACCESS_READ, offset=start)
        except (OSError, ValueError):  # a filesystem that cannot map files, or a file shorter than its dataset
            return labels[:]
        return np.frombuffer(mapped, dtype=labels.dtype, count=labels.size, offset=offset - start).reshape(labels.shape)

    def read_field(self, handle: _Hdf5Shard, local: int, field: str) -> np.ndarray:
        if handle.checks is not None:
            return self.checked_sample(handle, local)[1][list(handle.text).index(field)]
        flat, offsets = handle.text[field]
        return flat[offsets[local] : offsets[local + 1]]

    def read_lengths(self, handle: _Hdf5Shard, field: TextField) -> np.ndarray:
        return np.diff(handle.text[field.name][1]) // field.itemsize

    def read_shapes(self, handle: _Hdf5Shard, shard: ShardEntry) -> Optional[np.ndarray]:
        if handle.shapes is not None:
            return handle.shapes
        return handle.file[HDF5_IMAGE_SHAPES][:] if HDF5_IMAGE_SHAPES in handle.file else None

    def read_key(self, handle: _Hdf5Shard, local: int) -> str:
        if not handle.flat_keys:  # format versions 1 to 3: strings in HDF5's global heap
            return handle.file[HDF5_KEYS].asstr()[local]
        start, end = handle.file[HDF5_KEY_OFFSETS][local : local + 2]  # read when asked: return_meta only
        return bytes(handle.file[HDF5_KEY_BYTES][start:end]).decode("utf-8")

    def read_keys(self, handle: _Hdf5Shard, count: int) -> list[str]:
        """Every key of a shard in two reads (``samples``): each h5py read has a large fixed cost,
        so one read per key would make ``samples`` slow on big outputs."""
        if not handle.flat_keys:
            return list(handle.file[HDF5_KEYS].asstr()[:count])
        offsets = handle.file[HDF5_KEY_OFFSETS][: count + 1].tolist()  # two reads for the whole shard
        flat = handle.file[HDF5_KEY_BYTES][:].tobytes()
        return [flat[a:b].decode("utf-8") for a, b in zip(offsets, offsets[1:])]

    def close_shard(self, handle: _Hdf5Shard) -> None:
        handle.file.close()
