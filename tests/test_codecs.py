"""The field codecs shared by writers and readers."""

import io

import numpy as np
import pytest
from PIL import Image

from packer.spec.codecs import (
    CODECS,
    IMAGE_CODECS,
    IMAGE_EXTENSIONS,
    PNG_COMPRESS_LEVEL,
    codec,
    decode_image,
    decode_npy,
    encode_image,
    encode_npy,
)
from packer.spec.errors import PackerError

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


# --------------------------------------------------------------------------- image codecs


def smooth(h=24, w=32, c=3, seed=0):
    """A smooth uint8 image (JPEG keeps it close), H x W x C."""
    base = np.random.default_rng(seed).integers(0, 256, size=(h // 16 + 1, w // 16 + 1, c), dtype=np.uint8)
    pixels = np.asarray(Image.fromarray(base[:, :, 0] if c == 1 else base).resize((w, h), Image.BILINEAR))
    return pixels[:, :, None] if c == 1 else pixels


@pytest.mark.parametrize("channels,mode", [(3, "RGB"), (1, "L")])
def test_png_round_trip_is_exact(channels, mode):
    pixels = smooth(c=channels)
    data = encode_image(pixels, "png")
    assert data.startswith(b"\x89PNG")
    back = decode_image(data, "png", mode)
    assert back.dtype == np.uint8 and back.shape == pixels.shape and np.array_equal(back, pixels)


@pytest.mark.parametrize("channels,mode", [(3, "RGB"), (1, "L")])
def test_jpeg_round_trip_is_close_and_quality_matters(channels, mode):
    pixels = smooth(48, 64, channels)
    data = encode_image(pixels, "jpeg", 90)
    assert data.startswith(b"\xff\xd8")
    back = decode_image(data, "jpeg", mode)
    assert back.dtype == np.uint8 and back.shape == pixels.shape
    assert np.abs(back.astype(int) - pixels).mean() < 3
    assert len(encode_image(pixels, "jpeg", 30)) < len(data)


@pytest.mark.parametrize("codec", ["jpeg", "png"])
def test_encoded_bytes_are_deterministic_and_plain(codec):
    pixels = smooth()
    data = encode_image(pixels, codec)
    assert data == encode_image(pixels.copy(), codec)
    with Image.open(io.BytesIO(data)) as img:
        assert not img.getexif() and "icc_profile" not in img.info and "exif" not in img.info


def test_png_uses_the_fast_compress_level():
    pixels = smooth(64, 64)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG", compress_level=PNG_COMPRESS_LEVEL)
    assert encode_image(pixels, "png") == buf.getvalue()


def test_decode_converts_to_the_requested_mode():
    gray = decode_image(encode_image(smooth(), "png"), "png", "L")
    assert gray.shape == (24, 32, 1)
    rgb = decode_image(encode_image(smooth(c=1), "png"), "png", "RGB")
    assert rgb.shape == (24, 32, 3) and np.array_equal(rgb[:, :, 0], rgb[:, :, 2])


def _pillow_pixels(data, mode):
    with Image.open(io.BytesIO(data)) as img:
        pixels = np.asarray(img.convert(mode))
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


@pytest.mark.parametrize("size", [(24, 32), (224, 224), (37, 53), (1, 1)])
@pytest.mark.parametrize("channels,mode", [(3, "RGB"), (1, "L")])
def test_stored_jpegs_decode_without_pillow_to_pillows_pixels(size, channels, mode, monkeypatch):
    data = encode_image(smooth(*size, channels, seed=sum(size)), "jpeg", 90)
    want = _pillow_pixels(data, mode)
    monkeypatch.setattr(Image, "open", lambda *a, **k: pytest.fail("Pillow opened a JPEG packer stored"))
    for buffer in (data, memoryview(data), np.frombuffer(data, np.uint8)):  # as the readers hand them over
        got = decode_image(buffer, "jpeg", mode)
        assert got.dtype == np.uint8 and got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize("save", [{"subsampling": 0}, {"progressive": True}, {"quality": 20}])
def test_other_jpegs_decode_to_pillows_pixels_too(save):
    pixels = smooth(40, 56)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", **save)
    assert np.array_equal(decode_image(buf.getvalue(), "jpeg", "RGB"), _pillow_pixels(buf.getvalue(), "RGB"))


@pytest.mark.parametrize("source,mode", [("L", "RGB"), ("RGB", "L"), ("CMYK", "RGB")])
def test_jpegs_in_another_colour_space_are_converted_by_pillow(source, mode):
    buf = io.BytesIO()
    Image.fromarray(smooth(24, 32)).convert(source).save(buf, "JPEG")
    got = decode_image(buf.getvalue(), "jpeg", mode)
    assert got.shape == (24, 32, 1 if mode == "L" else 3) and np.array_equal(got, _pillow_pixels(buf.getvalue(), mode))


def test_stored_jpegs_keep_pillows_decompression_bomb_check(monkeypatch):
    data = encode_image(smooth(24, 32), "jpeg")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300)  # 768 pixels: over twice the limit
    with pytest.raises(Image.DecompressionBombError):
        decode_image(data, "jpeg", "RGB")


def test_a_mode_libjpeg_does_not_give_is_left_to_pillow():
    data = encode_image(smooth(24, 32), "jpeg")
    got = decode_image(data, "jpeg", "RGBA")
    assert got.shape == (24, 32, 4) and np.array_equal(got, _pillow_pixels(data, "RGBA"))


def test_a_corrupt_stored_jpeg_still_raises_pillows_error():
    data = encode_image(smooth(64, 64), "jpeg")
    with pytest.raises(OSError):
        decode_image(data[: len(data) // 2], "jpeg", "RGB")


def test_raw_image_codec_is_npy():
    pixels = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 4, 3)
    assert encode_image(pixels, "raw") == encode_npy(pixels)
    assert np.array_equal(decode_image(encode_npy(pixels), "raw"), pixels)
    assert IMAGE_CODECS == ("raw", "jpeg", "png", "source") and IMAGE_EXTENSIONS["jpeg"] == "jpg"


@pytest.mark.parametrize(
    "pixels", [np.zeros((4, 4, 3), np.float32), np.zeros((4, 4, 4), np.uint8), np.zeros((4, 4), np.uint8)]
)
def test_encode_refuses_what_jpeg_and_png_cannot_hold(pixels):
    with pytest.raises(ValueError, match="uint8"):
        encode_image(pixels, "jpeg")


def test_unknown_image_codec_is_refused_by_name():
    with pytest.raises(PackerError, match="unknown image codec 'webp'.*raw, jpeg, png.*[Uu]pgrade"):
        decode_image(b"RIFF", "webp")
    with pytest.raises(PackerError, match="webp"):
        encode_image(np.zeros((2, 2, 3), np.uint8), "webp")


def test_npy_decoder_parses_a_shared_header_once_and_still_reads_others():
    from packer.spec.codecs import NpyDecoder, encode_npy

    decode = NpyDecoder()
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (4, 5, 3), dtype=np.uint8) for _ in range(3)]
    other = np.arange(6, dtype=np.float32).reshape(2, 3)
    fortran = np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3))
    for array in (*images, other, fortran, images[0]):
        got = decode(memoryview(encode_npy(array)))
        assert got.dtype == array.dtype and np.array_equal(got, array)
    assert decode._header[2] == (4, 5, 3)  # the first header is the one kept
