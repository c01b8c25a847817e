"""The geometry of one image's preprocessing: boxes turned as EXIF turns the pixels, scaled and offset
as every resize mode places them, and the part of the output that holds the picture."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from packer.config import PreprocessConfig
from packer.pixels import preprocess
from packer.pixels.geometry import image_geometry, map_boxes, orient_box
from packer.pixels.jpeg import upright

RECT = (20, 10, 60, 40)  # x0, y0, x1, y1 on a 200 x 150 stored grid


def picture(fmt: str = "PNG", orientation: int = 1) -> bytes:
    pixels = np.zeros((150, 200, 3), np.uint8)
    pixels[RECT[1] : RECT[3], RECT[0] : RECT[2]] = (255, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt, exif=exif)
    return buf.getvalue()


def red(pixels: np.ndarray) -> tuple[int, ...]:
    ys, xs = np.nonzero((pixels[..., 0] > 127) & (pixels[..., 1] < 100))
    return (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_a_box_turns_as_pillow_turns_the_pixels(orientation):
    pixels = np.zeros((150, 200, 3), np.uint8)
    pixels[RECT[1] : RECT[3], RECT[0] : RECT[2]] = (255, 0, 0)
    turned = np.asarray(upright(Image.fromarray(pixels), orientation))
    assert orient_box(RECT, (200, 150), orientation) == red(turned)


CONFIGS = [
    PreprocessConfig(size=(64, 64)),
    PreprocessConfig(size=(64, 48), geometry="fractional"),
    PreprocessConfig(size=(50, 50), resize="shorter"),
    PreprocessConfig(size=(90, 90), resize="max"),
    PreprocessConfig(size=(96, 40), resize="stretch"),
    PreprocessConfig(size=(64, 64), resize="pad"),
    PreprocessConfig(size=None, resize="none"),
    PreprocessConfig(size=(72, 72), resize="shorter", crop=(56, 90)),
    PreprocessConfig(size=(100, 100), crop=(160, 160)),
]


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])  # Pillow turns a TIFF by itself as it loads: never twice
@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.resize}-{c.geometry}-{c.crop}")
def test_a_mapped_box_lands_on_its_pixels(fmt, orientation, cfg):
    data = picture(fmt, orientation)
    decoded = preprocess.decode(data, cfg)
    upright_reference = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).size
    assert decoded.original_size == upright_reference
    geometry = image_geometry(decoded.stored_size, decoded.orientation, cfg)
    assert geometry.size == decoded.pixels.shape[1::-1]
    box = map_boxes(np.array([RECT]), geometry, False, 0.0).boxes[0]
    assert max(abs(a - b) for a, b in zip(box.tolist(), red(decoded.pixels))) <= 1.5


def test_the_picture_part_of_a_crop_larger_than_shorter_crop_window():
    """shorter-crop keeps a 100 x 100 window; a 160 crop around it is padding outside that window, so
    a box beyond the window is dropped, not drawn on the padding."""
    cfg = PreprocessConfig(size=(100, 100), crop=(160, 160))
    geometry = image_geometry((200, 100), 1, cfg)
    assert geometry.content == (30.0, 30.0, 130.0, 130.0)
    assert len(map_boxes(np.array([[160, 40, 190, 60]]), geometry, False, 0.1).boxes) == 0
    pad = image_geometry((200, 100), 1, PreprocessConfig(size=(64, 64), resize="pad"))
    assert pad.content == (0.0, 16.0, 64.0, 48.0)  # the letterbox is not picture
