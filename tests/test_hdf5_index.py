"""packer.spec.hdf5_index: the checksum of an HDF5 shard's index covers its labels, keys and offsets,
not its images or a field's bytes, and is the same each time the file is read."""

from __future__ import annotations

import h5py
import numpy as np

from packer.spec.hdf5_index import index_crc32, is_index, structure_crc32


def _shard(path, labels=(0, 1, 1), image_value=7, keys=("a", "bb", "ccc")) -> None:
    with h5py.File(path, "w") as f:
        f["images"] = np.full((3, 4, 4, 3), image_value, np.uint8)
        f["labels"] = np.asarray(labels, np.int64)
        f["crc32"] = np.arange(3, dtype=np.uint32)
        f["text_bytes"] = np.frombuffer(b"abcdef", np.uint8) + image_value
        f["text_offsets"] = np.asarray([0, 2, 4, 6], np.int64)
        f["keys"] = np.asarray(keys, dtype=object)  # before format version 4: variable-length strings


def test_labels_and_keys_change_it_images_and_field_bytes_do_not(tmp_path):
    _shard(tmp_path / "a.h5")
    first = structure_crc32(tmp_path / "a.h5")
    assert structure_crc32(tmp_path / "a.h5") == first  # the same file, read again: the same (no pointers)
    _shard(tmp_path / "b.h5", image_value=9)
    assert structure_crc32(tmp_path / "b.h5") == first  # bulk bytes are each sample's CRC-32's
    _shard(tmp_path / "c.h5", labels=(0, 1, 0))
    _shard(tmp_path / "d.h5", keys=("a", "bb", "ccd"))
    assert len({first, structure_crc32(tmp_path / "c.h5"), structure_crc32(tmp_path / "d.h5")}) == 3
    with h5py.File(tmp_path / "a.h5", "r") as f:
        assert index_crc32(f) == first


def test_which_datasets_are_the_index():
    assert [n for n in ("images", "tokens", "labels", "keys_bytes", "keys_offsets", "text_bytes") if is_index(n)] == [
        "labels",
        "keys_bytes",
        "keys_offsets",
    ]
