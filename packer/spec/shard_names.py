"""Names inside shard files that writers and readers must agree on (see docs/FORMATS.md)."""

from __future__ import annotations

NPY_IMAGES, NPY_LABELS, NPY_KEYS, NPY_CRC32 = ".images.npy", ".labels.npy", ".keys.npy", ".crc32.npy"
"""Suffixes of an npy shard's four files (after the shard name)."""


def npy_varlen_suffixes(field: str) -> tuple[str, str]:
    """Suffixes of the two files of a variable-length field ``field`` in an npy shard: its flat
    uint8 bytes and its N + 1 int64 offsets."""
    return f".{field}.bytes.npy", f".{field}.offsets.npy"


NPY_IMAGE_BYTES, NPY_IMAGE_OFFSETS = npy_varlen_suffixes("images")
"""Where encoded (jpeg, png) images, or raw images of varying sizes, go in an npy shard, instead of
``.images.npy``."""

NPY_IMAGE_SHAPES = ".images.shapes.npy"
"""N x 3 int64 (H, W, C) of each image of an npy shard whose images vary in size: raw ones (format
version 3), encoded ones (version 6); also the side file of a tar shard's images (version 6)."""

HDF5_SUFFIX = ".h5"
HDF5_IMAGES, HDF5_LABELS, HDF5_KEYS, HDF5_CRC32 = "images", "labels", "keys", "crc32"
"""Dataset names inside an HDF5 shard (``keys``: format versions 1 to 3 only)."""


def hdf5_varlen_names(field: str) -> tuple[str, str]:
    """Names of the two datasets of a variable-length field ``field`` in an HDF5 shard: its flat
    uint8 bytes and its N + 1 int64 offsets."""
    return f"{field}_bytes", f"{field}_offsets"


HDF5_IMAGE_BYTES, HDF5_IMAGE_OFFSETS = hdf5_varlen_names("images")
"""Where encoded (jpeg, png) images, or raw images of varying sizes, go in an HDF5 shard, instead of
``images``."""

HDF5_KEY_BYTES, HDF5_KEY_OFFSETS = hdf5_varlen_names("keys")
"""Where an HDF5 shard of format version 4 or later keeps its keys: a variable-length field of
their UTF-8 bytes. Earlier versions hold ``keys``, variable-length strings, which live in HDF5's
global heap, where one damaged length sends libhdf5 into an endless loop."""

HDF5_FLAT_KEYS_SINCE = 4
"""The hdf5 format version that moved keys off the global heap (``HDF5_KEY_BYTES``)."""

HDF5_IMAGE_SHAPES = "images_shapes"
"""N x 3 int64 (H, W, C) of each image of an HDF5 shard whose images vary in size (encoded ones from
format version 6)."""

LMDB_SUFFIX = ".lmdb"
TAR_SUFFIX = ".tar"

DALI_INDEX = ".idx"
"""Suffix of a tar shard's index for NVIDIA DALI's ``readers.webdataset`` (``index_paths``): the text
file DALI's ``wds2idx`` makes, written by the writer from the offsets it knows (format version 7)."""

DALI_INDEX_VERSION = "v1.2"
"""The ``wds2idx`` index version written on the first line of every ``DALI_INDEX`` file."""

WIDS_INDEX = "shardindex.json"
"""The shard list of a tar-shard output for ``wids.ShardListDataset`` (its ``widsindex`` tool's name
and layout: each shard's URL, relative to the file, and sample count; format version 7)."""

LMDB_LABELS = b"labels"
LMDB_LENGTH = b"length"
LMDB_CRC32 = b"crc32"
LMDB_IMAGE_SHAPES = b"image_shapes"
"""N x 3 int64 (H, W, C), as ``.npy`` bytes, of each image of an LMDB shard whose images vary in size
(format version 6)."""


def lmdb_image_key(i: int) -> bytes:
    """LMDB key of a shard's ``i``-th image."""
    return b"%08d.image" % i


def lmdb_field_key(i: int, field: str) -> bytes:
    """LMDB key of the bytes of a shard's ``i``-th sample's variable-length field ``field`` (``text``, ``json``)."""
    return b"%08d.%s" % (i, field.encode("ascii"))


def lmdb_lengths_key(field: str) -> bytes:
    """LMDB key of a shard's per-sample lengths of field ``field`` (``.npy`` bytes of int64)."""
    return b"lengths." + field.encode("ascii")


def lmdb_key_key(i: int) -> bytes:
    """LMDB key of a shard's ``i``-th sample key (its relative source path)."""
    return b"%08d.key" % i


def tar_member_key(index: int) -> str:
    """Tar member key (``KEY`` in ``KEY.npy``) of the source item at ``index`` in the sorted listing."""
    return f"{index:09d}"


def wds_lengths_suffix(field: str) -> str:
    """Suffix of a tar shard's side file of per-sample lengths of field ``field`` (int64 ``.npy``)."""
    return f".{field}.lengths.npy"


TAR_MEMBERS = ("cls", "json", "npy")
"""Member extensions of one sample in a tar shard, in the order they are written; with jpeg or png
images the last is ``jpg`` or ``png`` (``packer.spec.codecs.IMAGE_EXTENSIONS``)."""

NPY_TOKENS, NPY_BLOCKS, NPY_DOCUMENTS = ".tokens.npy", ".blocks.npy", ".documents.npy"
"""Suffixes of an npy token shard's three files (format version 8): its token stream (uint16 or
uint32), its blocks' (start, length) in that stream (N x 2 uint32) and the positions where documents
start in it (uint32, ascending)."""

HDF5_TOKENS, HDF5_BLOCKS, HDF5_DOCUMENTS = "tokens", "blocks", "documents"
"""Datasets of an HDF5 token shard (format version 8), as the npy token shard's three files."""

TAR_TOKEN_MEMBERS = ("shard.blocks.npy", "shard.documents.npy", "shard.tokens.npy")
"""Members of a tar token shard ``NAME.tar`` (format version 8), in the order they are written: the
npy token shard's three files under one key (``shard``), so that ``webdataset.WebDataset`` gives a
shard as one sample of three arrays."""

LMDB_TOKENS, LMDB_BLOCKS, LMDB_DOCUMENTS = b"tokens", b"blocks", b"documents"
"""Keys of an LMDB token shard (format version 8), each the ``.npy`` bytes of the npy token shard's
array of that name."""
