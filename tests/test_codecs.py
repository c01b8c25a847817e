"""The field codecs shared by writers and readers."""

import io

import numpy as np
import pytest

from packer.codecs import CODECS, codec, decode_npy, encode_npy
from packer.errors import PackerError

VALUES = {
    "npy": [
        np.arange(24, dtype=np.uint8).reshape(2, 4, 3),
        np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4, 1),
        np.zeros((0, 5), dtype=np.int64),
        np.array(7, dtype=np.float16),
    ],
    "cls": [0, 3, 999, -1],
    "json": [{"key": "a/ü b.png", "label": 2}, [1, 2.5, None, "x"], "text", 0],
    "txt": ["", "hello", "ünïcödé ✓"],
}


def test_every_codec_has_test_values():
    assert set(CODECS) == set(VALUES)


@pytest.mark.parametrize("ext, value", [(e, v) for e, vs in VALUES.items() for v in vs])
def test_round_trip(ext, value):
    c = codec(ext)
    assert c is CODECS[ext]
    data = c.encode(value)
    assert isinstance(data, bytes)
    back = c.decode(data)
    if ext == "npy":
        assert back.dtype == value.dtype
        assert back.shape == value.shape
        assert np.array_equal(back, value)
    else:
        assert back == value
        assert type(back) is type(value)


def test_npy_bytes_are_a_npy_file():
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    data = encode_npy(a)
    assert data.startswith(b"\x93NUMPY")
    assert np.array_equal(np.load(io.BytesIO(data), allow_pickle=False), a)


def test_npy_encode_non_contiguous():
    a = np.arange(24, dtype=np.uint8).reshape(4, 6)[:, ::2]
    assert np.array_equal(decode_npy(encode_npy(a)), a)


def test_cls_and_json_bytes():
    assert CODECS["cls"].encode(5) == b"5"
    assert CODECS["cls"].encode(np.int64(-1)) == b"-1"
    assert CODECS["json"].encode({"label": 1, "key": "é"}) == '{"key":"é","label":1}'.encode("utf-8")


def test_npy_decode_refuses_object_array():
    buf = io.BytesIO()
    np.save(buf, np.array([{"evil": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle"):
        decode_npy(buf.getvalue())


def test_npy_encode_refuses_object_array():
    with pytest.raises(ValueError):
        encode_npy(np.array([1, "a", None], dtype=object))


def test_unknown_codec():
    with pytest.raises(PackerError, match="no codec for .png"):
        codec("png")
