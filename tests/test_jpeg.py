"""JPEG decoding at reduced scale (packer.jpeg) and how decode uses it."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from packer import jpeg
from packer.config import PreprocessConfig
from packer.errors import DecodeError
from packer.preprocess import decode


def _jpeg(size=(505, 379), orientation=None, mode="RGB", quality=95, stripes=False) -> bytes:
    """A JPEG of gradients, photograph-like, or with sharp ``stripes`` (a resize box misplaced by a
    fraction of a pixel shows at every edge), in ``size`` as stored (not a multiple of 8 / M:
    partial last blocks), with an EXIF orientation."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    stripes = ((x // 13 + y // 17) % 2) * 120 if stripes else (np.sin(x / 9.0) + np.cos(y / 11.0)) * 30 + 60
    rgb = np.stack([x * 120 // w + stripes, y * 120 // h + stripes, (x + y) * 120 // (w + h) + stripes], axis=-1)
    img = Image.fromarray(rgb.astype(np.uint8))
    if mode != "RGB":
        img = img.convert(mode)
    extra = {}
    if orientation:
        exif = Image.Exif()
        exif[0x0112] = orientation
        extra["exif"] = exif.tobytes()
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality, **extra)
    return buf.getvalue()


def _diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    assert a.shape == b.shape
    return np.abs(a.astype(int) - b.astype(int))


def test_eighths_is_the_smallest_scale_that_keeps_the_target():
    assert jpeg.eighths_for((500, 375), (299, 224)) == 5  # 312.5 x 234.4 >= 299 x 224; 4/8 gives 188 rows
    assert jpeg.eighths_for((2000, 1500), (299, 224)) == 2
    assert jpeg.eighths_for((1600, 1200), (200, 150)) == 1
    assert jpeg.eighths_for((224, 224), (224, 224)) == 8
    assert jpeg.eighths_for((100, 80), (224, 224)) == 8  # enlarging: never more than full size
    assert jpeg.eighths_for((800, 600), (100, 150)) == 2  # the tighter side decides


@pytest.mark.parametrize("orientation", [1, 3, 6])
@pytest.mark.parametrize("resize", ["shorter-crop", "stretch", "pad"])
def test_scaled_decode_is_close_to_a_full_decode(resize, orientation):
    data = _jpeg(orientation=orientation)
    full = decode(data, PreprocessConfig(size=(160, 120), resize=resize, reduced_decode=False))
    scaled = decode(data, PreprocessConfig(size=(160, 120), resize=resize))
    assert scaled.original_size == full.original_size == ((379, 505) if orientation >= 5 else (505, 379))
    diff = _diff(scaled.pixels, full.pixels)
    assert diff.mean() < 1.0 and np.percentile(diff, 99) <= 4


_UPRIGHT = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
            5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
            8: Image.Transpose.ROTATE_90}


@pytest.mark.parametrize("orientation", range(2, 9))
@pytest.mark.parametrize("resize", ["shorter-crop", "stretch"])
def test_every_orientation_resizes_the_same_source_pixels(orientation, resize):
    """An image stored turned gives the upright image turned: the resize box sits on the same pixels
    whichever side the partial last block ends up on (505 * 3 / 8 = 189.375: 0.6 of a pixel). (Not
    for pad, whose letterbox is placed by rounding down, so a flip moves it by a pixel.)"""
    cfg = PreprocessConfig(size=(140, 140), resize=resize)
    upright = decode(_jpeg(stripes=True), cfg).pixels
    turned = decode(_jpeg(orientation=orientation, stripes=True), cfg)
    assert turned.original_size == ((379, 505) if orientation >= 5 else (505, 379))
    expected = np.asarray(Image.fromarray(upright).transpose(_UPRIGHT[orientation]))
    assert _diff(turned.pixels, expected).max() <= 2  # rounding only; a box 0.6 pixel off: 30+ at the edges


def test_the_partial_last_block_is_placed_by_the_orientation():
    data = _jpeg(orientation=3)  # turned 180 degrees: the partial column and row come first
    scaled = jpeg.decode_scaled(data, (505, 379), (150, 113), gray=False, orientation=3)
    assert scaled is not None and scaled.eighths == 3
    assert scaled.image.size == (190, 143)  # ceil(505 * 3 / 8), ceil(379 * 3 / 8)
    assert scaled.area == pytest.approx((190 - 189.375, 143 - 142.125, 190, 143))
    scaled = jpeg.decode_scaled(data, (505, 379), (150, 113), gray=False, orientation=6)  # turned 90 degrees
    assert scaled is not None and scaled.image.size == (143, 190)
    assert scaled.area == pytest.approx((143 - 142.125, 0, 143, 189.375))


def test_no_scaling_when_it_would_not_pay_or_the_file_is_damaged():
    data = _jpeg()
    assert jpeg.decode_scaled(data, (505, 379), (400, 300), gray=False) is None  # M = 7: slower than in full
    assert jpeg.decode_scaled(data[: len(data) // 2], (505, 379), (150, 113), gray=False) is None


def test_a_truncated_large_jpeg_is_still_explained():
    data = _jpeg(size=(1200, 900))
    with pytest.raises(DecodeError, match="corrupt or truncated"):
        decode(data[: len(data) // 2], PreprocessConfig(size=(100, 100)), "cut.jpg")


@pytest.mark.parametrize("source,target", [("L", "RGB"), ("L", "L"), ("RGB", "L")])
def test_gray_and_colour_sources(source, target):
    data = _jpeg(mode=source)
    full = decode(data, PreprocessConfig(size=(160, 120), mode=target, reduced_decode=False))
    scaled = decode(data, PreprocessConfig(size=(160, 120), mode=target))
    assert scaled.pixels.shape == full.pixels.shape == (120, 160, 3 if target == "RGB" else 1)
    assert _diff(scaled.pixels, full.pixels).mean() < 1.0


def test_cmyk_jpegs_are_decoded_in_full_by_pillow():
    data = _jpeg(mode="CMYK")
    full = decode(data, PreprocessConfig(size=(160, 120), reduced_decode=False))
    assert np.array_equal(decode(data, PreprocessConfig(size=(160, 120))).pixels, full.pixels)


def test_no_scaling_gives_exactly_the_full_decode():
    data = _jpeg(size=(260, 200))  # to 224: M = 7 is not used
    full = decode(data, PreprocessConfig(reduced_decode=False))
    assert np.array_equal(decode(data, PreprocessConfig()).pixels, full.pixels)
