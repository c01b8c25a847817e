"""Variable-length fields (flat bytes + N + 1 offsets) in npy and hdf5, read back with the stock libraries."""

import hashlib

import h5py
import numpy as np
import pytest

import packer.formats.varlen as varlen
from packer.formats.base import HashedFile
from packer.formats.varlen import CHUNK_BYTES, Hdf5VarlenWriter, NpyStream, NpyVarlenWriter, iter_varlen
from packer.spec.shard_names import hdf5_varlen_names, npy_varlen_suffixes

ITEMS = [b"first", b"", "ünïcode text".encode("utf-8"), bytes(range(256)) * 3, b"\x00"]


def expected_offsets(items):
    return np.cumsum([0] + [len(b) for b in items]).tolist()


def test_names_are_per_field():
    assert npy_varlen_suffixes("images") == (".images.bytes.npy", ".images.offsets.npy")
    assert npy_varlen_suffixes("text") == (".text.bytes.npy", ".text.offsets.npy")
    assert hdf5_varlen_names("text") == ("text_bytes", "text_offsets")


@pytest.mark.parametrize("items", [ITEMS, []])
def test_npy_field_is_two_standard_npy_files(tmp_path, items):
    writer = NpyVarlenWriter(tmp_path, "shard-00002", "text")
    for b in items:
        writer.add(b)
    names = writer.close()
    assert names == ["shard-00002.text.bytes.npy", "shard-00002.text.offsets.npy"]
    flat = np.load(tmp_path / names[0], mmap_mode="r", allow_pickle=False)
    offsets = np.load(tmp_path / names[1], allow_pickle=False)
    assert flat.dtype == np.uint8 and flat.shape == (sum(len(b) for b in items),)
    assert offsets.dtype == np.int64 and offsets.tolist() == expected_offsets(items)
    assert [flat[offsets[i] : offsets[i + 1]].tobytes() for i in range(len(items))] == items
    assert list(iter_varlen(flat, offsets, len(items), "x")) == items


def test_npy_field_streams_to_disk(tmp_path):
    """Bytes go to the file as they are added (memory stays bounded); only the offsets are kept."""
    writer = NpyVarlenWriter(tmp_path, "s", "images")
    path = tmp_path / "s.images.bytes.npy"
    for _ in range(40):
        writer.add(b"x" * 100_000)
    assert path.stat().st_size >= 4_000_000 and len(writer.offsets) == 41
    writer.close()
    assert np.load(path, mmap_mode="r").shape == (4_000_000,)


@pytest.mark.parametrize("items", [ITEMS, []])
def test_hdf5_field_is_two_datasets(tmp_path, items):
    with h5py.File(tmp_path / "s.h5", "w") as f:
        writer = Hdf5VarlenWriter(f, "text")
        for b in items:
            writer.add(b)
        writer.close()
    with h5py.File(tmp_path / "s.h5", "r") as f:
        flat, offsets = f["text_bytes"], f["text_offsets"][:]
        assert flat.dtype == np.uint8 and flat.shape == (sum(len(b) for b in items),)
        assert flat.chunks == (CHUNK_BYTES,) and flat.maxshape == (None,)
        assert offsets.dtype == np.int64 and offsets.tolist() == expected_offsets(items)
        assert [flat[offsets[i] : offsets[i + 1]].tobytes() for i in range(len(items))] == items
        assert list(iter_varlen(flat, offsets, len(items), "x")) == items


def test_hdf5_field_writes_in_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(varlen, "BUFFER_BYTES", 1000)
    items = [bytes([i]) * (300 + i) for i in range(20)]
    with h5py.File(tmp_path / "s.h5", "w") as f:
        writer = Hdf5VarlenWriter(f, "images")
        for b in items[:10]:
            writer.add(b)
        assert f["images_bytes"].shape[0] > 0 and len(writer._pending) < 1000
        for b in items[10:]:
            writer.add(b)
        writer.close()
    with h5py.File(tmp_path / "s.h5", "r") as f:
        assert list(iter_varlen(f["images_bytes"], f["images_offsets"][:], 20, "x")) == items


def test_iter_varlen_names_the_first_missing_item_of_a_cut_array():
    flat = np.frombuffer(b"".join(ITEMS), np.uint8)
    offsets = np.asarray(expected_offsets(ITEMS))
    got = []
    with pytest.raises(ValueError, match="x.bin is truncated: it ends before sample 3"):
        for b in iter_varlen(flat[:20], offsets, len(ITEMS), "x.bin"):
            got.append(b)
    assert got == ITEMS[:3]


@pytest.mark.parametrize(
    "offsets,match",
    [
        ([0, 5], "expected 3"),
        ([1, 2, 3], "start at 0"),
        ([0, 5, 4], "start at 0 and grow"),
        ([0.0, 1.0, 2.0], "integers"),
    ],
)
def test_iter_varlen_refuses_bad_offsets(offsets, match):
    with pytest.raises(ValueError, match=match):
        list(iter_varlen(np.zeros(10, np.uint8), np.asarray(offsets), 2, "x"))


def test_iter_varlen_refuses_a_flat_array_that_is_not_bytes():
    with pytest.raises(ValueError, match="uint8"):
        list(iter_varlen(np.zeros(10, np.float32), np.asarray([0, 1]), 1, "x"))


def test_npy_stream_header_grows_from_the_capacity(tmp_path):
    stream = NpyStream(tmp_path / "a.npy", np.uint16, (2, 3), capacity=1)
    rows = np.arange(12 * 6, dtype=np.uint16).reshape(12, 2, 3)
    for row in rows:
        stream.write(row.data)
    stream.close(len(rows))
    back = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert back.shape == (12, 2, 3) and np.array_equal(back, rows)


def test_npy_stream_hashes_what_it_writes(tmp_path):
    stream = NpyStream(tmp_path / "a.npy", np.uint8, (4, 3), capacity=5)
    for i in range(5):
        stream.write(np.full((4, 3), i, np.uint8).data)
    stream.close(5)
    assert stream.sha256 == hashlib.sha256((tmp_path / "a.npy").read_bytes()).hexdigest()


@pytest.mark.parametrize("capacity,rows", [(5, 3), (0, 36)])  # samples skipped; a byte stream sized at the end
def test_npy_stream_gives_no_hash_once_its_header_changed(tmp_path, capacity, rows):
    shape = (4, 3) if capacity else ()
    stream = NpyStream(tmp_path / "a.npy", np.uint8, shape, capacity=capacity)
    stream.write(np.arange(36, dtype=np.uint8).data)
    stream.close(rows)
    assert stream.sha256 is None  # the manifest reads the file back instead
    assert np.load(tmp_path / "a.npy").shape == (rows, *shape)


def test_a_byte_stream_sized_at_the_end_is_not_hashed_while_written(tmp_path):
    """Its header is rewritten at close, so hashing the bytes as written would be wasted work."""
    stream = NpyStream(tmp_path / "a.npy", np.uint8)
    assert not stream._f.hashing
    stream.write(b"abc")
    stream.close(3)
    assert stream.sha256 is None and np.load(tmp_path / "a.npy").tobytes() == b"abc"


def test_hashed_file_without_hashing_only_writes(tmp_path):
    f = HashedFile(tmp_path / "a.bin", hashing=False)
    f.write(b"abc")
    f.file.close()
    assert (tmp_path / "a.bin").read_bytes() == b"abc"
    with pytest.raises(ValueError, match="without hashing"):
        f.hexdigest()
