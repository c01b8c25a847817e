"""One image's preprocessing as a whole: decode's report (original size, histogram), the stored dtype,
and Pillow's memory in workers. Decoding is tested in test_decoding.py, the resize in test_resize.py."""

import numpy as np
import pytest
from conftest import solid, write_image
from PIL import Image

from packer.config import PreprocessConfig
from packer.pixels.preprocess import (
    IMAGE_BLOCKS_KEPT,
    decode,
    decode_image,
    finish_pixels,
    keep_image_memory,
    load_image,
)

# --------------------------------------------------------------------- decode


def test_decode_reports_the_displayed_original_size(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "rot.jpg"
    Image.fromarray(np.zeros((20, 40, 3), np.uint8)).save(path, exif=exif)  # stored 40 wide, shown 20 wide
    d = decode(path.read_bytes(), PreprocessConfig(size=(8, 8)))
    assert d.original_size == (20, 40) and d.pixels.shape == (8, 8, 3) and d.histogram is None


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("dtype", ["uint8", "float16"])
def test_decode_histogram_counts_the_8bit_pixels(tmp_path, mode, dtype):
    path = write_image(tmp_path / "a.png", (45, 30), seed=4)
    cfg = PreprocessConfig(size=(24, 16), mode=mode, dtype=dtype)
    d = decode(path.read_bytes(), cfg, histogram=True)
    assert d.pixels.dtype == np.uint8 and d.pixels.shape == (16, 24, cfg.channels) and d.original_size == (45, 30)
    want = np.concatenate([np.bincount(d.pixels[..., c].ravel(), minlength=256) for c in range(cfg.channels)])
    assert d.histogram == want.tolist()
    assert np.array_equal(finish_pixels(d.pixels, cfg), decode_image(path.read_bytes(), cfg))


# ---------------------------------------------------------------------- dtype


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_float_dtype_normalized(tmp_path, dtype):
    path = write_image(tmp_path / "a.png", (40, 30), seed=4)
    base = PreprocessConfig(size=(32, 24))
    norm = PreprocessConfig(size=(32, 24), dtype=dtype)
    u8 = load_image(path, base)
    out = load_image(path, norm)
    assert out.dtype == np.dtype(dtype)
    assert out.shape == (24, 32, 3)
    mean = np.array([0.485, 0.456, 0.406])
    std = np.array([0.229, 0.224, 0.225])
    expected = (u8 / 255.0 - mean) / std
    tol = 1e-5 if dtype == "float32" else 2e-3
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=tol, atol=tol)


def test_float_without_normalization_scales_to_unit(tmp_path):
    path = solid(tmp_path / "a.png", (4, 4), (0, 51, 255))
    out = load_image(path, PreprocessConfig(size=(4, 4), dtype="float32", mean=None, std=None))
    np.testing.assert_allclose(out[0, 0], [0.0, 0.2, 1.0], rtol=1e-6)


def test_float_grayscale_uses_averaged_stats():
    cfg = PreprocessConfig(size=(1, 1), mode="L", dtype="float32")
    out = finish_pixels(np.array([[[255]]], np.uint8), cfg)
    np.testing.assert_allclose(out, [[[(1.0 - 0.449) / 0.226]]], rtol=1e-5)


def test_finish_pixels_uint8_passthrough():
    px = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    out = finish_pixels(px, PreprocessConfig(size=(2, 2)))
    assert out.dtype == np.uint8 and np.array_equal(out, px)


# ------------------------------------------------- Pillow's memory in workers


@pytest.fixture
def pillow_blocks():
    """Restore Pillow's block cache (a process-wide setting) after the test."""
    before = Image.core.get_blocks_max()
    yield
    Image.core.set_blocks_max(before)
    Image.core.clear_cache()


def test_keep_image_memory_reuses_freed_images(tmp_path, monkeypatch, pillow_blocks):
    monkeypatch.delenv("PILLOW_BLOCKS_MAX", raising=False)
    path = write_image(tmp_path / "a.jpg", (500, 375))
    keep_image_memory()
    assert Image.core.get_blocks_max() == IMAGE_BLOCKS_KEPT
    load_image(path, PreprocessConfig())
    Image.core.reset_stats()
    for _ in range(5):
        load_image(path, PreprocessConfig())
    stats = Image.core.get_stats()
    # every image of the later decodes (decoded, half-resized, resized) lives in a block kept from the first
    assert stats["new_count"] >= 15 and stats["allocated_blocks"] == 0 and stats["freed_blocks"] == 0


def test_keep_image_memory_leaves_a_users_setting(monkeypatch, pillow_blocks):
    monkeypatch.setenv("PILLOW_BLOCKS_MAX", "3")
    Image.core.set_blocks_max(3)  # what Pillow's import made of the variable
    keep_image_memory()
    assert Image.core.get_blocks_max() == 3
