"""The structure checksum of an HDF5 shard: a CRC-32 over its index datasets, recorded in the manifest
(``FileEntry.structure_crc32``) when the shard is written.

A sample's bytes (its image, its fields) are checked by the CRC-32 stored beside it; its label, key,
offsets and shape are not, and a reader of a shard in a bucket reads them through byte ranges, at
another moment than the samples: an object replaced under it could give one version's samples with
another's labels. Readers compare this checksum once they have read the index (by ranges) or before
they open the file (on a disk), so the index they use is the one the manifest describes. The bulk
datasets (the images, a field's flat bytes, a token stream) are left out: each sample, or the file's
SHA-256, checks them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from zlib_ng.zlib_ng import crc32

from packer.spec.shard_names import HDF5_IMAGES, HDF5_KEY_BYTES, HDF5_TOKENS

BULK = frozenset({HDF5_IMAGES, HDF5_TOKENS})
"""Datasets left out besides the flat bytes of variable-length fields (the keys' are in)."""


def is_index(name: str) -> bool:
    """Whether the dataset ``name`` (its path in the file) is part of a shard's index."""
    base = name.rsplit("/", 1)[-1]
    return base not in BULK and (not base.endswith("_bytes") or base == HDF5_KEY_BYTES)


def index_crc32(f: Any) -> int:
    """CRC-32 over every index dataset of the open h5py file ``f``, in name order: each one's name,
    dtype, shape and values (C order, as stored)."""
    names: list[str] = []
    f.visititems(lambda name, obj: names.append(name) if hasattr(obj, "dtype") and is_index(name) else None)
    crc = 0
    for name in sorted(names):
        values = np.ascontiguousarray(f[name][()])
        crc = crc32(f"{name}|{values.dtype.str}|{values.shape}".encode(), crc)
        if values.dtype.hasobject:  # variable-length strings (keys before format version 4): each one's bytes
            for item in values.ravel().tolist():
                raw = item if isinstance(item, bytes) else str(item).encode("utf-8")
                crc = crc32(len(raw).to_bytes(8, "little") + raw, crc)
        else:
            crc = crc32(values.tobytes(), crc)
    return crc


def structure_crc32(path: Path) -> int:
    """``index_crc32`` of the HDF5 file at ``path`` (the registry's ``structure`` of hdf5)."""
    import h5py

    with h5py.File(path, "r") as f:
        return index_crc32(f)


__all__ = ["index_crc32", "structure_crc32", "is_index"]
