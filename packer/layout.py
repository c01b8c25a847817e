"""Names inside shard files that writers and readers must agree on (see docs/FORMATS.md)."""

from __future__ import annotations

LMDB_LABELS = b"labels"
LMDB_LENGTH = b"length"
LMDB_CRC32 = b"crc32"


def lmdb_image_key(i: int) -> bytes:
    """LMDB key of a shard's ``i``-th image."""
    return b"%08d.image" % i


def lmdb_key_key(i: int) -> bytes:
    """LMDB key of a shard's ``i``-th sample key (its relative source path)."""
    return b"%08d.key" % i


def tar_member_key(index: int) -> str:
    """Tar member key (``KEY`` in ``KEY.npy``) of the source item at ``index`` in the sorted listing."""
    return f"{index:09d}"


TAR_MEMBERS = ("cls", "json", "npy")
"""Member extensions of one sample in a tar shard, in the order they are written."""
