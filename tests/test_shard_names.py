"""packer.spec.shard_names: the file, dataset, key and member names writers and readers agree on, checked
against the files of real conversions of ``sample_data`` into every format (raw images of one size, JPEG
images of their own sizes, text alone), and the same sample found under them in every format."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ShardSize
from packer.spec import shard_names as names
from packer.spec.manifest import read_manifest
from packer.spec.sample_layout import ImageCodec
from packer.spec.tario import iter_tar_samples
from readers import open_dataset

SAMPLE_DATA = Path(__file__).resolve().parents[1] / "sample_data"
KINDS = {
    "raw": ("images", PreprocessConfig(size=(16, 16)), ImageCodec()),
    "jpeg": ("images", PreprocessConfig(size=None, resize="none"), ImageCodec("jpeg")),
    "text": ("texts", PreprocessConfig(), ImageCodec()),
}
FORMATS = ("npy", "lmdb", "hdf5", "wds")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(kind, format) -> a conversion of sample_data in shards of 16 samples."""
    root = tmp_path_factory.mktemp("names")
    out = {}
    for kind, (source, pre, codec) in KINDS.items():
        for fmt in FORMATS:
            config = ConvertConfig(fmt, pre, ShardSize(samples=16), codec=codec)
            convert(SAMPLE_DATA / source, root / f"{kind}-{fmt}", config, workers=1)
            out[kind, fmt] = root / f"{kind}-{fmt}"
    return out


def shard_files(root: Path) -> list[tuple[str, int, list[str]]]:
    return [(s.name, s.samples, sorted(f.path for f in s.files)) for s in read_manifest(root).shards]


def test_the_names_built_from_a_field_or_an_index():
    assert names.npy_varlen_suffixes("text") == (".text.bytes.npy", ".text.offsets.npy")
    assert (names.NPY_IMAGE_BYTES, names.NPY_IMAGE_OFFSETS) == (".images.bytes.npy", ".images.offsets.npy")
    assert names.hdf5_varlen_names("json") == ("json_bytes", "json_offsets")
    assert names.lmdb_image_key(12) == b"00000012.image" and names.lmdb_key_key(3) == b"00000003.key"
    assert names.lmdb_field_key(7, "json") == b"00000007.json" and names.lmdb_lengths_key("text") == b"lengths.text"
    assert names.tar_member_key(41) == "000000041" and names.wds_lengths_suffix("text") == ".text.lengths.npy"
    assert sorted([names.tar_member_key(i) for i in (10, 9, 100)]) == ["000000009", "000000010", "000000100"]


@pytest.mark.parametrize("kind", KINDS)
def test_npy_shards_are_the_files_their_suffixes_name(outputs, kind):
    image = {
        "raw": [names.NPY_IMAGES],
        "jpeg": [names.NPY_IMAGE_BYTES, names.NPY_IMAGE_OFFSETS, names.NPY_IMAGE_SHAPES],
        "text": list(names.npy_varlen_suffixes("text")),
    }[kind]
    suffixes = [*image, names.NPY_LABELS, names.NPY_KEYS, names.NPY_CRC32]
    for shard, _, files in shard_files(outputs[kind, "npy"]):
        assert files == sorted(shard + s for s in suffixes)


@pytest.mark.parametrize("kind", KINDS)
def test_hdf5_shards_hold_the_datasets_their_names_name(outputs, kind):
    image = {
        "raw": [names.HDF5_IMAGES],
        "jpeg": [names.HDF5_IMAGE_BYTES, names.HDF5_IMAGE_OFFSETS, names.HDF5_IMAGE_SHAPES],
        "text": list(names.hdf5_varlen_names("text")),
    }[kind]
    expected = {*image, names.HDF5_LABELS, names.HDF5_CRC32, names.HDF5_KEY_BYTES, names.HDF5_KEY_OFFSETS}
    root = outputs[kind, "hdf5"]
    for shard, samples, files in shard_files(root):
        assert files == [shard + names.HDF5_SUFFIX]
        with h5py.File(root / files[0], "r") as f:
            assert set(f) == expected and len(f[names.HDF5_LABELS]) == samples


@pytest.mark.parametrize("kind", KINDS)
def test_lmdb_shards_hold_the_keys_their_names_name(outputs, kind):
    root = outputs[kind, "lmdb"]
    for shard, n, files in shard_files(root):
        assert files == [shard + names.LMDB_SUFFIX]
        per_sample = {
            "raw": [names.lmdb_image_key],
            "jpeg": [names.lmdb_image_key],
            "text": [lambda i: names.lmdb_field_key(i, "text")],
        }[kind]
        expected = {key(i) for i in range(n) for key in (*per_sample, names.lmdb_key_key)}
        expected |= {names.LMDB_LABELS, names.LMDB_LENGTH, names.LMDB_CRC32}
        expected |= {"raw": set(), "jpeg": {names.LMDB_IMAGE_SHAPES}, "text": {names.lmdb_lengths_key("text")}}[kind]
        env = lmdb.open(str(root / files[0]), subdir=False, readonly=True, lock=False)
        with env.begin() as txn:
            assert {k for k, _ in txn.cursor()} == expected
            assert int(txn.get(names.LMDB_LENGTH)) == n
        env.close()


@pytest.mark.parametrize("kind", KINDS)
def test_tar_shards_name_members_by_listing_index_with_their_side_files(outputs, kind):
    root = outputs[kind, "wds"]
    last = {"raw": "npy", "jpeg": "jpg", "text": "txt"}[kind]
    side = {"raw": [], "jpeg": [names.NPY_IMAGE_SHAPES], "text": [names.wds_lengths_suffix("text")]}[kind]
    start = 0
    for shard, n, files in shard_files(root):
        assert files == sorted(shard + s for s in (names.TAR_SUFFIX, names.DALI_INDEX, *side))
        samples = list(iter_tar_samples(root / (shard + names.TAR_SUFFIX)))
        assert [s["__key__"] for s in samples] == [names.tar_member_key(start + i) for i in range(n)]
        assert all(sorted(s) == sorted(["__key__", *names.TAR_MEMBERS[:2], last]) for s in samples)
        index = (root / (shard + names.DALI_INDEX)).read_text().splitlines()
        assert index[0] == f"{names.DALI_INDEX_VERSION} {n}"
        start += n
    shardindex = json.loads((root / names.WIDS_INDEX).read_text())
    assert [s["url"] for s in shardindex["shardlist"]] == [s + names.TAR_SUFFIX for s, _, _ in shard_files(root)]


@pytest.mark.parametrize("kind", KINDS)
def test_every_format_stores_the_same_sample_under_its_names(outputs, kind):
    """The i-th key of each shard, read by the names alone, is the same in every format, and the readers
    (which read by the same names) return every sample."""
    keys = {}
    for fmt in FORMATS:
        root, found = outputs[kind, fmt], []
        for shard, n, files in shard_files(root):
            if fmt == "npy":
                found += np.load(root / (shard + names.NPY_KEYS)).tolist()
            elif fmt == "hdf5":
                with h5py.File(root / files[0], "r") as f:
                    flat, offsets = f[names.HDF5_KEY_BYTES][:].tobytes(), f[names.HDF5_KEY_OFFSETS][:]
                found += [flat[a:b].decode() for a, b in zip(offsets[:-1], offsets[1:])]
            elif fmt == "lmdb":
                env = lmdb.open(str(root / files[0]), subdir=False, readonly=True, lock=False)
                with env.begin() as txn:
                    found += [txn.get(names.lmdb_key_key(i)).decode() for i in range(n)]
                env.close()
            else:
                tar = root / (shard + names.TAR_SUFFIX)
                found += [json.loads(s["json"])["key"] for s in iter_tar_samples(tar)]
        keys[fmt] = found
        assert len(open_dataset(root)) == len(found)
    assert keys["npy"] == keys["lmdb"] == keys["hdf5"] == keys["wds"] == sorted(keys["npy"])
    assert len(keys["npy"]) == (24 if kind == "text" else 40)
