"""readers.augment.jpeg_region: the part of a stored JPEG a crop needs, decoded alone, gives the
whole decode's pixels; any file it cannot cut is left to the whole decode."""

from __future__ import annotations

import io

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from packer.spec.codecs import encode_image
from readers.augment import jpeg_region
from readers.augment.crops import Augment, Placement, RandomResizedCrop
from readers.augment.image_crops import ImageCrops
from readers.augment.jpeg_region import decode_region, splice
from readers.augment.render import render


def photo(height: int, width: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    """A smooth picture with noise: colour that changes inside every MCU, so a wrong block shows."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    planes = [(np.sin(x / (5 + 3 * c)) + np.cos(y / (7 + 2 * c))) * 60 + 128 for c in range(channels)]
    noisy = np.stack(planes, axis=2) + rng.normal(0, 12, (height, width, channels))
    return np.clip(noisy, 0, 255).astype(np.uint8)


def pillow_jpeg(pixels: np.ndarray, **options) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels).save(buf, "JPEG", quality=90, **options)
    return buf.getvalue()


def whole(data: bytes, mode: str) -> np.ndarray:
    return simplejpeg.decode_jpeg(data, colorspace="GRAY" if mode == "L" else "RGB")


def assert_region_equal(data: bytes, mode: str, box: tuple[int, int, int, int]) -> bool:
    """The region's pixels under ``box`` equal the whole decode's; False where it was left whole."""
    region = decode_region(data, mode, box)
    if region is None:
        return False
    pixels, top, left = region
    x0, y0, x1, y1 = box
    full = whole(data, mode)
    assert top <= y0 and left <= x0 and top + pixels.shape[0] >= y1 and left + pixels.shape[1] >= x1
    np.testing.assert_array_equal(pixels[y0 - top : y1 - top, x0 - left : x1 - left], full[y0:y1, x0:x1])
    return True


def random_boxes(rng: np.random.Generator, height: int, width: int, count: int) -> list[tuple[int, int, int, int]]:
    boxes = []
    for _ in range(count):
        x0, x1 = sorted(rng.choice(width + 1, 2, replace=False)) if width > 1 else (0, 1)
        y0, y1 = sorted(rng.choice(height + 1, 2, replace=False)) if height > 1 else (0, 1)
        boxes.append((int(x0), int(y0), int(x1), int(y1)))
    return boxes


@pytest.mark.parametrize(
    "size", [(192, 256), (256, 171), (37, 53), (16, 16), (17, 33), (18, 34), (8, 200), (1, 40), (9, 1)]
)
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_region_equals_whole_decode_on_packers_jpegs(size, mode):
    channels = 1 if mode == "L" else 3
    data = encode_image(photo(*size, channels), "jpeg", 90)
    rng = np.random.default_rng(size[0] * 1000 + size[1])
    cut = sum(assert_region_equal(data, mode, box) for box in random_boxes(rng, *size, 60))
    if size[0] >= 32 and size[1] >= 32:
        assert cut >= 30  # most random boxes leave MCUs out (the rest are decoded whole)
    # every one-pixel box at the MCU edges, where the upsampling reads the neighbours
    for y in sorted({0, 1, 7, 8, 15, 16, 17, size[0] - 1} & set(range(size[0]))):
        for x in sorted({0, 1, 15, 16, 31, 32, size[1] - 1} & set(range(size[1]))):
            assert_region_equal(data, mode, (x, y, x + 1, y + 1))


@pytest.mark.parametrize("subsampling", [0, 1, 2])  # 4:4:4, 4:2:2, 4:2:0
def test_region_equals_whole_decode_for_each_subsampling(subsampling):
    data = pillow_jpeg(photo(131, 203, seed=subsampling), subsampling=subsampling, restart_marker_blocks=1)
    rng = np.random.default_rng(subsampling)
    assert sum(assert_region_equal(data, "RGB", box) for box in random_boxes(rng, 131, 203, 80)) >= 40


def test_stored_jpegs_carry_a_restart_marker_after_every_mcu():
    data = encode_image(photo(64, 64), "jpeg", 90)
    at = data.index(b"\xff\xdd")
    assert data[at + 2 : at + 6] == b"\x00\x04\x00\x01"  # DRI: length 4, interval 1 MCU
    assert sum(data.count(bytes([0xFF, 0xD0 + k])) for k in range(8)) == 4 * 4 - 1


def test_a_small_box_decodes_only_its_mcus():
    data = encode_image(photo(256, 256), "jpeg", 90)
    pixels, top, left = decode_region(data, "RGB", (100, 120, 140, 150))
    # MCUs of 16 pixels: columns 96-143 and rows 112-159 with 2 pixels of context, no more
    assert (top, left, pixels.shape) == (112, 96, (48, 48, 3))
    # with a context asked for (the device's decode: a whole MCU), the MCUs reaching 16 pixels further
    jpeg, top, left = splice(data, 3, (100, 120, 140, 150), context=16)
    assert (top, left, whole(jpeg.tobytes(), "RGB").shape) == (96, 80, (80, 80, 3))


@pytest.mark.parametrize(
    "make",
    [
        lambda p: pillow_jpeg(p),  # no restart markers
        lambda p: pillow_jpeg(p, restart_marker_blocks=2),  # a marker every 2 MCUs
        lambda p: pillow_jpeg(p, restart_marker_rows=1),
        lambda p: pillow_jpeg(p, progressive=True, restart_marker_blocks=1),
        lambda p: encode_image(p, "png"),
    ],
    ids=["plain", "every-2", "rows", "progressive", "png"],
)
def test_files_it_cannot_cut_are_left_to_the_whole_decode(make):
    assert decode_region(make(photo(64, 80)), "RGB", (10, 10, 30, 30)) is None


def test_a_box_outside_or_the_wrong_mode_is_left_to_the_whole_decode():
    data = encode_image(photo(64, 80), "jpeg", 90)
    assert decode_region(data, "RGB", (60, 10, 81, 30)) is None  # past the right edge
    assert decode_region(data, "RGB", (0, 0, 80, 64)) is None  # every MCU: decoded whole
    assert decode_region(data, "L", (10, 10, 30, 30)) is None  # a colour file read as gray
    assert decode_region(encode_image(photo(64, 80, 1), "jpeg", 90), "RGB", (10, 10, 30, 30)) is None


def test_damaged_files_are_left_to_the_whole_decode():
    data = bytearray(encode_image(photo(64, 80), "jpeg", 90))
    markers = [i for i in range(len(data) - 1) if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]
    swapped = bytearray(data)
    swapped[markers[3] + 1] = 0xD0 + (swapped[markers[3] + 1] + 1 - 0xD0) % 8  # out of sequence
    assert decode_region(bytes(swapped), "RGB", (40, 40, 60, 60)) is None
    assert decode_region(bytes(data[: markers[5]]), "RGB", (40, 40, 60, 60)) is None  # truncated
    assert decode_region(bytes(data[:40]), "RGB", (40, 40, 60, 60)) is None  # inside the headers
    assert decode_region(b"not a jpeg at all", "RGB", (0, 0, 1, 1)) is None


def test_random_crops_give_the_pixels_of_the_whole_decode(monkeypatch):
    """render() of a RandomResizedCrop over a stored JPEG equals the same crop of its decoded pixels,
    and the crops were made from their regions."""
    parts = []
    monkeypatch.setattr(jpeg_region, "decode_region", lambda *a: parts.append(decode_region(*a)) or parts[-1])
    crops = ImageCrops(Augment(RandomResizedCrop(224), True), "RGB", "jpeg")
    for seed in range(3):
        data = encode_image(photo(192, 256, seed=seed), "jpeg", 90)
        decoded = whole(data, "RGB")
        for index in range(20):
            image, placement = crops.image(data, seed, index, epoch=1)
            expected = render(decoded, "raw", "RGB", placement)
            np.testing.assert_array_equal(image, expected)
    assert len(parts) == 60 and sum(part is not None for part in parts) >= 50


def test_a_file_damaged_outside_the_box_is_refused_as_the_whole_decode_refuses_it():
    data = bytearray(encode_image(photo(64, 64), "jpeg", 90))
    last = max(i for i in range(len(data) - 1) if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7)
    data[last + 1] = 0xC1  # the last restart marker, far from a box in the top-left corner
    assert decode_region(bytes(data), "RGB", (0, 0, 20, 20)) is None
    with pytest.raises(OSError, match="broken data stream"):
        render(bytes(data), "jpeg", "RGB", Placement((0.0, 0.0, 20.0, 20.0), (8, 8), False, True))


def sos_at_the_end() -> bytes:
    """Headers whose scan header ends the file: its last two bytes, FF D9, look like the EOI."""
    data = pillow_jpeg(np.full((16, 24, 1), 128, np.uint8), restart_marker_blocks=1)
    return data[: data.index(b"\xff\xda")] + b"\xff\xda\x00\x08\x01\x01\x00\x00\xff\xd9"


def fewer_mcus_than_its_frame() -> bytes:
    """A file whose frame header says twice its height: its EOI comes after half the MCUs."""
    data = bytearray(encode_image(photo(32, 32), "jpeg", 90))
    at = data.index(b"\xff\xc0") + 5
    data[at : at + 2] = (64).to_bytes(2, "big")
    return bytes(data)


@pytest.mark.parametrize(
    "data",
    [
        sos_at_the_end(),
        fewer_mcus_than_its_frame(),
        pillow_jpeg(photo(16, 16))[:20] + b"\xff\xc0\x00\x02\xff\xd9",  # a frame header of length 2
    ],
    ids=["sos-at-the-end", "fewer-mcus", "short-frame"],
)
def test_crafted_headers_are_refused_without_reading_past_the_file(data):
    """The kernel as plain Python (``py_func``): any index past the arrays raises IndexError."""
    source, out, corner = np.frombuffer(data, np.uint8), np.zeros(len(data) + 2, np.uint8), np.zeros(2, np.int64)
    assert jpeg_region._splice.py_func(source, np.array([0, 0, 1, 8]), 1, 0, -1, out, corner) == -1
    assert jpeg_region._splice.py_func(source, np.array([0, 0, 1, 8]), 3, 0, -1, out, corner) == -1
    assert decode_region(data, "RGB", (0, 0, 1, 8)) is None
