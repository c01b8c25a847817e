"""LMDB shards: one single-file LMDB environment ``NAME.lmdb`` per shard.

Keys (ASCII) and values:
  ``length``          the sample count, ASCII decimal
  ``labels``          ``.npy`` bytes of an int64 array of every label in the shard
  ``crc32``           ``.npy`` bytes of a uint32 array: CRC-32 of each image's stored bytes
                      (raw pixels, or the JPEG/PNG bytes)
  ``00000042.image``  ``.npy`` bytes of sample 42's HxWxC image (index local to the shard), or
                      its JPEG/PNG file bytes with an encoding codec
  ``00000042.key``    UTF-8 relative source path of sample 42
  ``00000042.text``   the bytes of sample 42's text field (UTF-8, or int32 token ids); likewise ``.json``
  ``lengths.text``    ``.npy`` bytes of an int64 array of every sample's text length (bytes or tokens)
Text-only shards have no ``.image`` records.
Values decode with numpy alone (``np.load(io.BytesIO(value))``), never with pickle, or with
Pillow for encoded images.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import ClassVar, Iterator, Optional

import lmdb
import numpy as np

from packer.formats.base import TokenBuffer, encoded_bytes
from packer.records import Sample, StoredSample
from packer.spec.codecs import NpyDecoder, decode_npy, encode_npy, npy_header
from packer.spec.manifest import ShardEntry
from packer.spec.sample_layout import ImageStorage, SampleLayout, choose
from packer.spec.shard_names import (
    LMDB_BLOCKS,
    LMDB_CRC32,
    LMDB_DOCUMENTS,
    LMDB_IMAGE_SHAPES,
    LMDB_LABELS,
    LMDB_LENGTH,
    LMDB_SUFFIX,
    LMDB_TOKENS,
    lmdb_field_key,
    lmdb_image_key,
    lmdb_key_key,
    lmdb_lengths_key,
)
from packer.spec.token_blocks import POSITION_DTYPE

COMMIT_BYTES = 1024**2
"""A write transaction is committed once it holds this many bytes of values. LMDB keeps a
transaction's dirty pages in malloc'd memory until the commit: with ~1 MB the same heap pages serve
every transaction, still in the CPU cache when the commit writes them. With 64 MB the heap grew
through fresh pages for each transaction, and libjpeg's buffers for the next images landed in
fresh pages too: more page faults and more CPU time per image, for files of the same size.
Smaller values may take a few more pages for the extra commits."""
VARIABLE_SIZE_GUESS = 1024**2  # map-size estimate per sample when image sizes are not fixed
_PAGES_PER_PUT = 6
"""Pages a put may take beyond its data's own: its leaf node and the splits of a B-tree of depth 4
or less (an upper bound: a put that exceeded it could fill the map)."""
_PAGES_PER_COMMIT = 64  # a transaction's copies of the pages it changes and the free-page records


class LmdbWriter:
    """Writes one shard as an LMDB environment; the map grows before it could fill, so it never does.

    Records go straight into an open write transaction (LMDB copies them into its pages at once),
    committed every ~1 MB (``COMMIT_BYTES``): no queue of values, and one reused buffer for the
    ``.npy`` bytes of raw images, a large part of what LMDB cost over the other formats.
    """

    name: ClassVar[str] = "lmdb"

    def __init__(self, directory: Path, shard: str, layout: SampleLayout, capacity: int) -> None:
        self.file_name = f"{shard}{LMDB_SUFFIX}"
        self.layout = layout
        # The value of a sample's .image record: .npy bytes of raw pixels, or the encoded file bytes.
        self._image = choose(
            layout,
            {
                ImageStorage.FIXED: self._npy_image,
                ImageStorage.VARIABLE: self._npy_image,
                ImageStorage.ENCODED: lambda sample: encoded_bytes(sample, layout),
                ImageStorage.NONE: None,
            },
            self.name,
        )
        per_sample = (layout.sample_bytes or VARIABLE_SIZE_GUESS) + 4096
        self._map_size = max(16 * 1024**2, int(capacity * per_sample * 1.25))
        # lock=False: this process is the only writer of this shard, so no lock file is needed.
        self._env = lmdb.open(
            str(Path(directory) / self.file_name),
            subdir=False,
            map_size=self._map_size,
            lock=False,
            sync=False,
            metasync=False,
            readahead=False,
            max_dbs=0,
        )
        self._page = self._env.stat()["psize"]
        self._txn: Optional[lmdb.Transaction] = None
        self._txn_bytes = 0
        self._pages = self._used_pages()  # an upper bound of the pages in use, the open transaction's too
        self._value = bytearray()
        self.labels: list[int] = []
        self.crcs: list[int] = []
        self.shapes: Optional[list[tuple[int, ...]]] = [] if layout.sizes_indexed else None
        self.lengths: dict[str, list[int]] = {f.name: [] for f in layout.text}
        self.digests: dict[str, str] = {}  # none: the file is not written in order

    def add(self, sample: Sample) -> None:
        """Put one sample's records; transactions are committed every ~1 MB."""
        i = len(self.labels)
        records = [(lmdb_key_key(i), sample.key.encode("utf-8"))]
        if self._image is not None:
            records.append((lmdb_image_key(i), self._image(sample)))
        for f in self.layout.text:
            value = sample.fields[f.name]
            records.append((lmdb_field_key(i, f.name), value))
            self.lengths[f.name].append(len(value) // f.itemsize)
        for key, value in sorted(records):  # put in key order (see _put)
            self._put(key, value)
        self.labels.append(sample.label)
        self.crcs.append(sample.crc32)
        if self.shapes is not None:
            self.shapes.append(sample.image.shape)
        if self._txn_bytes >= COMMIT_BYTES:
            self._commit()

    def _npy_image(self, sample: Sample) -> bytearray:
        """``.npy`` bytes of a sample's image, in a buffer reused for every image (LMDB copies it at once)."""
        image = np.ascontiguousarray(sample.image)
        header = npy_header(image.dtype.str, image.shape)
        if len(self._value) != len(header) + image.nbytes:
            self._value = bytearray(len(header) + image.nbytes)
        self._value[: len(header)] = header
        self._value[len(header) :] = memoryview(image).cast("B")
        return self._value

    def _put(self, key: bytes, value: bytes | bytearray) -> None:
        """Put one record into the open transaction, first growing the map if the record's worst
        case would not fit (LMDB cannot grow the map of a transaction in progress)."""
        pages = -(-(len(key) + len(value) + 64) // self._page) + _PAGES_PER_PUT
        if (self._pages + pages) * self._page > self._map_size:
            self._commit()
            self._map_size = max(2 * self._map_size, 2 * (self._pages + pages) * self._page)
            self._env.set_mapsize(self._map_size)
        if self._txn is None:
            self._txn = self._env.begin(write=True)
        # Keys come in sorted order: appending skips the B-tree search and fills pages.
        if not self._txn.put(key, value, append=True):
            raise RuntimeError(f"LMDB refused key {key!r} out of order")  # a bug, never data
        self._pages += pages
        self._txn_bytes += len(value)

    def _commit(self) -> None:
        if self._txn is not None:
            self._txn.commit()
            self._txn = None
        self._txn_bytes = 0
        self._pages = self._used_pages()

    def _used_pages(self) -> int:
        """Pages in use after the last commit, with room for the next transaction's bookkeeping."""
        return self._env.info()["last_pgno"] + 1 + _PAGES_PER_COMMIT

    def close(self) -> list[str]:
        """Put the labels, checksums and length, commit, and close."""
        for key, value in sorted(
            [  # after the samples' keys (digits sort before letters), in order
                (LMDB_LABELS, encode_npy(np.asarray(self.labels, dtype=np.int64))),
                (LMDB_CRC32, encode_npy(np.asarray(self.crcs, dtype=np.uint32))),
                (LMDB_LENGTH, str(len(self.labels)).encode("ascii")),
                *(
                    (lmdb_lengths_key(name), encode_npy(np.asarray(v, dtype=np.int64)))
                    for name, v in self.lengths.items()
                ),
                *(
                    [(LMDB_IMAGE_SHAPES, encode_npy(np.asarray(self.shapes, np.int64).reshape(-1, 3)))]
                    if self.shapes is not None
                    else []
                ),
            ]
        ):
            self._put(key, value)
        self._commit()
        # No fsync here, as for the other formats: the manifest, written last, is what makes an
        # output complete, and the data is in the page cache for any process that reads it.
        self._env.close()
        return [self.file_name]


class LmdbTokenWriter(TokenBuffer):
    """One LMDB token shard ``NAME.lmdb``: keys ``tokens`` (its stream), ``blocks`` (N x 2 uint32: each
    block's start and length in it) and ``documents`` (uint32: where each document, or the piece of
    one, starts), each the ``.npy`` bytes of its array (``np.load(io.BytesIO(value))``)."""

    def __init__(self, directory: Path, shard: str, dtype: np.dtype, tokens: int) -> None:
        super().__init__(dtype, tokens)
        self.path = Path(directory) / f"{shard}{LMDB_SUFFIX}"

    def close(self, spans: np.ndarray, documents: np.ndarray) -> list[str]:
        """Write the shard's file in one transaction; its name."""
        values = {
            LMDB_BLOCKS: encode_npy(np.asarray(spans).astype(POSITION_DTYPE)),
            LMDB_DOCUMENTS: encode_npy(np.asarray(documents).astype(POSITION_DTYPE)),
            LMDB_TOKENS: npy_header(self.ids.dtype.str, (self.count,)) + self.stream.tobytes(),
        }
        size = sum(len(v) for v in values.values())
        env = lmdb.open(
            str(self.path),
            subdir=False,
            map_size=max(16 * 1024**2, 2 * size),  # values on overflow pages: a few pages over their bytes
            lock=False,
            sync=False,
            metasync=False,
            readahead=False,
            max_dbs=0,
        )
        try:
            with env.begin(write=True) as txn:
                for key in sorted(values):
                    txn.put(key, values[key], append=True)
            env.sync(True)
        finally:
            env.close()
        return [self.path.name]


def scan_shard(directory: Path, shard: ShardEntry, layout: SampleLayout, start: int = 0) -> Iterator[StoredSample]:
    """Every sample of one shard from sample ``start`` on, in order, read with lmdb and numpy alone
    (encoded images as their bytes, the text fields as theirs)."""
    image, encoded = layout.has_image, layout.image is ImageStorage.ENCODED
    with contextlib.ExitStack() as stack:
        env = _open_readonly(directory / shard.file(LMDB_SUFFIX), stack)
        yield from _scan_env(env, shard, layout, image, encoded, start)


def scan_index(directory: Path, shard: ShardEntry, layout: SampleLayout) -> tuple[list[str], np.ndarray]:
    """The keys and stored CRC-32s of a shard's samples, read without any image."""
    with contextlib.ExitStack() as stack:
        env = _open_readonly(directory / shard.file(LMDB_SUFFIX), stack)
        stack.callback(env.close)
        with env.begin() as txn:
            found = txn.get(LMDB_CRC32)
            if found is None:
                raise KeyError(f"{shard.name}: key {LMDB_CRC32.decode()} is missing")
            crcs = decode_npy(found)
            keys = []
            for i in range(len(crcs)):
                value = txn.get(lmdb_key_key(i))
                if value is None:
                    raise KeyError(f"{shard.name}: key {lmdb_key_key(i).decode()} is missing")
                keys.append(bytes(value).decode("utf-8"))
        return keys, crcs.astype(np.int64)


def _open_readonly(path: Path, stack: contextlib.ExitStack) -> "lmdb.Environment":
    """A shard's environment opened read-only without locks."""
    try:
        return lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    except lmdb.Error as e:
        if "already open in this process" not in str(e):
            raise
    # py-lmdb refuses a second open of a file this process has open, and a forked child (verify's
    # scan, a repack worker) inherits that record from a parent holding a reader of this output,
    # without the open environment itself. A private copy is another file.
    copy = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="packer-scan-"))) / path.name
    shutil.copyfile(path, copy)
    return lmdb.open(str(copy), subdir=False, readonly=True, lock=False)


def _scan_env(
    env: "lmdb.Environment", shard: ShardEntry, layout: SampleLayout, image: bool, encoded: bool, start: int = 0
) -> Iterator[StoredSample]:
    """``scan_shard`` of an open environment, which it closes."""
    try:
        with env.begin() as txn:

            def get(key: bytes) -> bytes:
                value = txn.get(key)
                if value is None:
                    raise KeyError(f"{shard.name}: key {key.decode()} is missing")
                return value

            length = int(get(LMDB_LENGTH))
            labels, crcs = decode_npy(get(LMDB_LABELS)), decode_npy(get(LMDB_CRC32))
            shapes = txn.get(LMDB_IMAGE_SHAPES) if layout.sizes_indexed else None  # none before format version 6
            shapes = decode_npy(shapes) if shapes is not None else None
            if not length == len(labels) == len(crcs) == shard.samples:
                raise ValueError(
                    f"{shard.name}: length {length}, {len(labels)} labels, {len(crcs)} checksums; "
                    f"the manifest says {shard.samples}"
                )
            npy = NpyDecoder()  # the images of a shard share one .npy header: parsed once, not per image
            for i in range(start, length):
                key = get(lmdb_key_key(i)).decode("utf-8")
                value = get(lmdb_image_key(i)) if image else None
                pixels = npy(value) if image and not encoded else None
                fields = {f.name: get(lmdb_field_key(i, f.name)) for f in layout.text}
                shape = tuple(int(v) for v in shapes[i]) if shapes is not None and i < len(shapes) else None
                yield StoredSample(
                    i, key, int(labels[i]), pixels, int(crcs[i]), value if encoded else None, fields, shape
                )
    finally:
        env.close()
