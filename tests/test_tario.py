"""packer.spec.tario: tar shards read as samples in memory. Tars written with Python's ``tarfile`` are
grouped by key (from a file, a stream, or a sample's offset) and decoded; unsafe, cut and lying tars are
ManifestErrors naming the shard."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest

from packer.spec.codecs import encode_npy
from packer.spec.entries import TextField
from packer.spec.errors import ManifestError
from packer.spec.tario import decode_tar_sample, iter_tar_samples, tar_fields

JPEG = b"\xff\xd8\xff\xe0 not really a jpeg"
PIXELS = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
MEMBERS = [
    ("0001.jpg", JPEG),
    ("0001.cls", b"3"),
    ("0001.txt", "un chat ü".encode()),
    ("0002.npy", encode_npy(PIXELS)),
    ("0002.cls", b"0"),
    ("0002.json", b'{"key": "dogs/a.png"}'),
    ("sub/0003.cls", b"7"),
]
SAMPLES = [
    {"__key__": "0001", "jpg": JPEG, "cls": b"3", "txt": "un chat ü".encode()},
    {"__key__": "0002", "npy": encode_npy(PIXELS), "cls": b"0", "json": b'{"key": "dogs/a.png"}'},
    {"__key__": "sub/0003", "cls": b"7"},
]


def write_tar(path: Path, members, directory: str | None = None) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        if directory is not None:
            tar.addfile(_directory(directory))
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _directory(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info


@pytest.fixture
def tar(tmp_path) -> Path:
    return write_tar(tmp_path / "shard.tar", MEMBERS, directory="sub")


def test_members_are_grouped_into_samples_by_key_in_stored_order(tar):
    assert list(iter_tar_samples(tar)) == SAMPLES  # the directory member is no sample


def test_a_stream_gives_the_same_samples(tar):
    with open(tar, "rb") as stream:
        assert list(iter_tar_samples(stream, name="remote.tar")) == SAMPLES


def test_reading_starts_at_a_samples_first_header(tar):
    with tarfile.open(tar) as t:
        second = t.getmember("0002.npy").offset
    assert list(iter_tar_samples(tar, offset=second)) == SAMPLES[1:]


def test_an_empty_tar_has_no_samples(tmp_path):
    assert list(iter_tar_samples(write_tar(tmp_path / "empty.tar", []))) == []


@pytest.mark.parametrize("name", ["../0001.cls", "/etc/0001.cls", "a/../../0001.cls"])
def test_a_member_with_an_unsafe_path_is_refused(tmp_path, name):
    tar = write_tar(tmp_path / "unsafe.tar", [("0000.cls", b"1"), (name, b"1")])
    with pytest.raises(ManifestError, match=re.escape(f"{tar}: member '{name}' has an unsafe path")):
        list(iter_tar_samples(tar))


def test_a_tar_cut_inside_a_member_is_an_error_naming_the_shard(tar, tmp_path):
    with tarfile.open(tar) as t:
        cut_at = t.getmember("0002.npy").offset_data + 20
    cut = tmp_path / "cut.tar"
    cut.write_bytes(tar.read_bytes()[:cut_at])
    with pytest.raises(
        ManifestError, match="^" + re.escape(f"{cut}: member '0002.npy' claims 140 bytes, more than the 20 left")
    ):
        list(iter_tar_samples(cut))
    with (
        open(cut, "rb") as stream,
        pytest.raises(ManifestError, match=r"^cut is not a complete tar file \(unexpected end of data\)"),
    ):
        list(iter_tar_samples(stream, name="cut"))


def test_a_member_claiming_more_bytes_than_are_left_is_refused_before_it_is_read(tmp_path):
    info = tarfile.TarInfo("0001.npy")
    info.size = 1 << 30
    lying = tmp_path / "lying.tar"
    lying.write_bytes(info.tobuf(format=tarfile.USTAR_FORMAT) + b"x" * 4096)
    with pytest.raises(ManifestError, match="claims 1073741824 bytes, more than the 4096 left in the shard's 4608"):
        list(iter_tar_samples(lying))
    # the manifest's size, when given, is the budget: a file grown since is not trusted past it
    shard = write_tar(tmp_path / "shard.tar", MEMBERS)
    with pytest.raises(
        ManifestError,
        match="^"
        + re.escape(f"{shard}: member '0001.cls' claims 1 bytes, more than the 0 left in the shard's 600 bytes"),
    ):
        list(iter_tar_samples(shard, size=600))


def test_a_file_that_is_no_tar_is_an_error(tmp_path):
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"\x01" * 2048)
    with pytest.raises(ManifestError, match="^" + re.escape(f"{junk} is not a complete tar file")):
        list(iter_tar_samples(junk))


def test_decoding_a_sample_gives_image_label_and_metadata():
    raw, jpeg = SAMPLES[1], SAMPLES[0]
    image, label, meta = decode_tar_sample(raw, codec="raw")
    np.testing.assert_array_equal(image, PIXELS)
    assert (label, meta) == (0, {"key": "dogs/a.png"})
    assert decode_tar_sample(jpeg, codec="jpeg") == (JPEG, 3, {})  # encoded bytes as stored
    assert decode_tar_sample(jpeg, codec="source") == (JPEG, 3, {})
    assert decode_tar_sample(SAMPLES[2], codec=None) == (None, 7, {})  # an output without images
    assert decode_tar_sample(raw, npy=lambda b: "parsed once")[0] == "parsed once"


@pytest.mark.parametrize(
    ("fields", "codec", "reason"),
    [
        ({"npy": encode_npy(PIXELS)}, "raw", "KeyError: 'cls'"),  # no label
        (
            {"cls": b"two", "npy": encode_npy(PIXELS)},
            "raw",
            "ValueError: invalid literal for int() with base 10: b'two'",
        ),
        ({"cls": b"1", "jpg": JPEG}, "png", "KeyError: 'png'"),
        ({"cls": b"1", "json": b"[1, 2]"}, None, "ValueError: KEY.json holds list, not an object"),
    ],
)
def test_a_damaged_sample_is_an_error_naming_the_shard_the_key_and_the_reason(fields, codec, reason):
    with pytest.raises(ManifestError) as error:
        decode_tar_sample({"__key__": "k", **fields}, "s.tar", codec)
    assert str(error.value) == f"s.tar: sample k is damaged ({reason})"


def test_damaged_npy_bytes_are_an_error_too():
    with pytest.raises(ManifestError, match=r"^s\.tar: sample k is damaged \(ValueError: "):
        decode_tar_sample({"__key__": "k", "cls": b"1", "npy": b"\x93NUMPY broken"}, "s.tar", "raw")


def test_text_fields_are_read_as_the_other_formats_store_them():
    tokens = np.array([5, 1, 9], dtype=np.int32)
    sample = {"__key__": "k", "txt": b"hello", "tokens.npy": encode_npy(tokens)}
    text = [TextField("text", "text"), TextField("ids", "tokens"), TextField("json", "json", allow_missing=True)]
    assert tar_fields(sample, text) == {"text": b"hello", "ids": tokens.tobytes(), "json": b""}
    with pytest.raises(ManifestError, match="^s.tar: sample k is damaged"):
        tar_fields({"__key__": "k"}, text[:1], "s.tar")
