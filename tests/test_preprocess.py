"""load_image and decode: decoding by content, colour modes, resize modes, orientation, bad files."""

import sys

import numpy as np
import pytest
from conftest import write_image
from PIL import Image

from packer.config import PreprocessConfig
from packer.pixels.preprocess import (
    IMAGE_BLOCKS_KEPT,
    decode,
    decode_image,
    finish_pixels,
    image_pixels,
    keep_image_memory,
    load_image,
)
from packer.spec.errors import ConfigError, DecodeError


def save_array(path, array, mode=None, **save):
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(array)
    if mode and img.mode != mode:
        img = img.convert(mode)
    img.save(path, **save)
    return path


def solid(path, size, color, mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)
    return path


def thirds(tmp_path):
    """A 60x20 image: red, green, blue thirds, with one marked pixel in the middle third."""
    a = np.zeros((20, 60, 3), np.uint8)
    a[:, :20] = (255, 0, 0)
    a[:, 20:40] = (0, 255, 0)
    a[:, 40:] = (0, 0, 255)
    a[5, 25] = (7, 8, 9)
    return save_array(tmp_path / "thirds.png", a), a


# --------------------------------------------------------------------------- shapes per resize mode


@pytest.mark.parametrize("resize", ["shorter-crop", "stretch", "pad"])
@pytest.mark.parametrize("src_size", [(64, 48), (48, 64), (32, 24), (10, 10)])
def test_output_shape_and_dtype(tmp_path, resize, src_size):
    path = write_image(tmp_path / "a.png", src_size)
    out = load_image(path, PreprocessConfig(size=(32, 24), resize=resize))
    assert out.shape == (24, 32, 3)
    assert out.dtype == np.uint8
    assert out.flags["C_CONTIGUOUS"]


def test_resize_none_keeps_size(tmp_path):
    path = write_image(tmp_path / "a.png", (37, 23))
    out = load_image(path, PreprocessConfig(resize="none"))
    assert out.shape == (23, 37, 3)
    assert np.array_equal(out, np.asarray(Image.open(path).convert("RGB")))


def test_shorter_crop_takes_the_centre(tmp_path):
    path, a = thirds(tmp_path)
    for interp in ["bilinear", "nearest", "bicubic"]:
        out = load_image(path, PreprocessConfig(size=(20, 20), interpolation=interp))
        assert np.array_equal(out, a[:, 20:40]), interp


def test_shorter_crop_same_size_is_identity(tmp_path):
    path = write_image(tmp_path / "a.png", (32, 24), seed=3)
    out = load_image(path, PreprocessConfig(size=(32, 24)))
    assert np.array_equal(out, np.asarray(Image.open(path)))


def test_stretch_keeps_everything(tmp_path):
    path, _ = thirds(tmp_path)
    out = load_image(path, PreprocessConfig(size=(3, 1), resize="stretch", interpolation="box"))
    assert out.shape == (1, 3, 3)
    # box filter over each third averages that third: the colours survive in order.
    assert out[0, 0].tolist() == [255, 0, 0]
    assert out[0, 2].tolist() == [0, 0, 255]
    assert out[0, 1, 1] >= 250 and out[0, 1, 0] < 5


def test_pad_wide_image_fill_at_top_and_bottom(tmp_path):
    path = solid(tmp_path / "wide.png", (64, 32), (200, 100, 50))
    out = load_image(path, PreprocessConfig(size=(32, 32), resize="pad", fill=(10, 20, 30)))
    assert out.shape == (32, 32, 3)
    assert (out[:8] == (10, 20, 30)).all()
    assert (out[24:] == (10, 20, 30)).all()
    assert (out[8:24] == (200, 100, 50)).all()


def test_pad_tall_image_fill_at_left_and_right(tmp_path):
    path = solid(tmp_path / "tall.png", (16, 64), (200, 100, 50))
    out = load_image(path, PreprocessConfig(size=(32, 32), resize="pad", fill=(1, 2, 3)))
    # scaled to 8x32, centred at x = 12..19
    assert (out[:, :12] == (1, 2, 3)).all()
    assert (out[:, 20:] == (1, 2, 3)).all()
    assert (out[:, 12:20] == (200, 100, 50)).all()


def test_pad_grayscale_uses_fill(tmp_path):
    path = solid(tmp_path / "wide.png", (64, 32), (200, 200, 200))
    out = load_image(path, PreprocessConfig(size=(32, 32), resize="pad", mode="L", fill=(9,)))
    assert out.shape == (32, 32, 1)
    assert (out[:8] == 9).all() and (out[24:] == 9).all()
    assert (out[8:24] == 200).all()


@pytest.mark.parametrize("resize", ["shorter-crop", "stretch", "pad"])
def test_non_square_size_is_width_by_height(tmp_path, resize):
    path = write_image(tmp_path / "a.png", (100, 100))
    out = load_image(path, PreprocessConfig(size=(32, 24), resize=resize))
    assert out.shape == (24, 32, 3)


@pytest.mark.parametrize("src_size", [(1, 1), (5000, 10), (10, 5000)])
def test_shorter_crop_extreme_sizes(tmp_path, src_size):
    path = solid(tmp_path / "x.png", src_size, (12, 34, 56))
    out = load_image(path, PreprocessConfig(size=(32, 32)))
    assert out.shape == (32, 32, 3)
    assert (out == (12, 34, 56)).all()


@pytest.mark.parametrize("resize", ["stretch", "pad"])
def test_extreme_aspect_other_modes(tmp_path, resize):
    path = solid(tmp_path / "x.png", (5000, 10), (12, 34, 56))
    out = load_image(path, PreprocessConfig(size=(32, 32), resize=resize))
    assert out.shape == (32, 32, 3)


# --------------------------------------------------------------------------- colour


def test_grayscale_mode(tmp_path):
    path = write_image(tmp_path / "a.png", (32, 24), seed=5)
    out = load_image(path, PreprocessConfig(size=(32, 24), mode="L"))
    assert out.shape == (24, 32, 1)
    assert out.dtype == np.uint8
    assert np.array_equal(out[:, :, 0], np.asarray(Image.open(path).convert("L")))


def test_grayscale_source_to_rgb(tmp_path):
    path = solid(tmp_path / "g.png", (8, 8), 77, mode="L")
    out = load_image(path, PreprocessConfig(size=(8, 8)))
    assert out.shape == (8, 8, 3)
    assert (out == 77).all()


def test_rgba_composited_on_background(tmp_path):
    a = np.zeros((4, 4, 4), np.uint8)
    a[...] = (200, 100, 50, 255)
    a[0, 0] = (1, 2, 3, 0)  # fully transparent
    a[0, 1] = (200, 100, 50, 128)  # half transparent
    path = save_array(tmp_path / "rgba.png", a)
    assert Image.open(path).mode == "RGBA"
    out = load_image(path, PreprocessConfig(size=(4, 4), background=(10, 20, 30)))
    assert out.shape == (4, 4, 3)
    assert out[0, 0].tolist() == [10, 20, 30]
    assert out[1, 1].tolist() == [200, 100, 50]
    expected = [round(c * 128 / 255 + b * 127 / 255) for c, b in zip((200, 100, 50), (10, 20, 30))]
    assert np.abs(out[0, 1].astype(int) - expected).max() <= 1


def test_rgba_default_background_is_white(tmp_path):
    a = np.zeros((2, 2, 4), np.uint8)
    path = save_array(tmp_path / "clear.png", a)
    out = load_image(path, PreprocessConfig(resize="none"))
    assert (out == 255).all()


def test_la_to_grayscale_on_background(tmp_path):
    img = Image.new("LA", (2, 2), (100, 255))
    img.putpixel((0, 0), (5, 0))
    img.save(tmp_path / "la.png")
    out = load_image(tmp_path / "la.png", PreprocessConfig(resize="none", mode="L", background=(40,)))
    assert out.shape == (2, 2, 1)
    assert out[0, 0, 0] == 40
    assert out[1, 1, 0] == 100


def test_palette_transparency_composited(tmp_path):
    img = Image.new("P", (2, 2), 0)
    img.putpalette([0, 0, 0, 250, 0, 0] + [0] * 762)
    img.putpixel((1, 1), 1)
    img.save(tmp_path / "p.png", transparency=0)
    out = load_image(tmp_path / "p.png", PreprocessConfig(resize="none", background=(0, 0, 200)))
    assert out[0, 0].tolist() == [0, 0, 200]
    assert out[1, 1].tolist() == [250, 0, 0]


@pytest.mark.parametrize("mode", ["RGB", "L", "I;16"])
def test_a_transparent_colour_is_composited_like_alpha(tmp_path, mode):
    """A PNG's tRNS colour key (RGB, grayscale, 16-bit grayscale): its pixels are transparent, as
    Pillow's own RGBA conversion and every viewer show them, so they lie on --background."""
    if mode == "I;16":
        a = np.full((2, 3), 40000, np.uint16)
        a[0, 0] = 1000
        key: object = 1000
        Image.fromarray(a).save(tmp_path / "k.png", transparency=key)
        kept = [40000 * 255 // 65535] * 3
    else:
        a = np.full((2, 3, 3), (200, 100, 50), np.uint8)
        a[0, 0] = (10, 20, 30)
        if mode == "L":
            a = a[:, :, 0]
        key = (10, 20, 30) if mode == "RGB" else 10
        Image.fromarray(a).save(tmp_path / "k.png", transparency=key)
        kept = [200, 100, 50] if mode == "RGB" else [200] * 3
    assert "transparency" in Image.open(tmp_path / "k.png").info
    out = load_image(tmp_path / "k.png", PreprocessConfig(resize="none", background=(0, 0, 250)))
    assert out[0, 0].tolist() == [0, 0, 250]
    assert out[1, 2].tolist() == kept


def test_16bit_grayscale_scaled_to_8bit(tmp_path):
    a = np.array([[0, 32768, 65535, 255, 1000]], dtype=np.uint16)
    path = save_array(tmp_path / "deep.png", a)
    assert Image.open(path).mode.startswith("I;16")
    out = load_image(path, PreprocessConfig(resize="none", mode="L"))
    assert out.shape == (1, 5, 1)
    v = out[0, :, 0].tolist()
    assert v[0] == 0
    assert v[1] in (127, 128)
    assert v[2] == 255
    assert v[3] == 0  # 255 of 65535 is dark, not white
    assert v[4] == 3
    rgb = load_image(path, PreprocessConfig(resize="none"))
    assert rgb.shape == (1, 5, 3)
    assert rgb[0, 2].tolist() == [255, 255, 255]


def test_16bit_dark_image_not_treated_as_8bit(tmp_path):
    a = np.array([[0, 100, 200, 255]], dtype=np.uint16)
    path = save_array(tmp_path / "dark.png", a)
    out = load_image(path, PreprocessConfig(resize="none", mode="L"))
    assert out[0, :, 0].tolist() == [0, 0, 0, 0]


def test_cmyk_jpeg(tmp_path):
    Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(tmp_path / "cmyk.jpg")
    out = load_image(tmp_path / "cmyk.jpg", PreprocessConfig(resize="none"))
    assert out.shape == (8, 8, 3)
    assert out[4, 4, 0] > 200 and out[4, 4, 1] < 60 and out[4, 4, 2] < 60


# --------------------------------------------------------------------------- orientation and content


def test_exif_orientation_applied(tmp_path):
    a = np.zeros((20, 40, 3), np.uint8)
    a[:, :20] = (255, 0, 0)  # stored left half red
    a[:, 20:] = (0, 0, 255)  # stored right half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    path = tmp_path / "rot.jpg"
    Image.fromarray(a).save(path, exif=exif, quality=95)
    out = load_image(path, PreprocessConfig(resize="none"))
    assert out.shape == (40, 20, 3)  # width and height swapped
    # the stored left column becomes the top row after a clockwise turn
    assert out[5, 10, 0] > 200 and out[5, 10, 2] < 60
    assert out[35, 10, 2] > 200 and out[35, 10, 0] < 60


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


def test_no_orientation_keeps_shape(tmp_path):
    path = write_image(tmp_path / "plain.jpg", (40, 20))
    out = load_image(path, PreprocessConfig(resize="none"))
    assert out.shape == (20, 40, 3)


def test_png_named_jpg_decodes_by_content(tmp_path):
    src = write_image(tmp_path / "real.png", (16, 12), seed=9)
    fake = tmp_path / "fake.jpg"
    fake.write_bytes(src.read_bytes())
    out = load_image(fake, PreprocessConfig(resize="none"))
    assert np.array_equal(out, np.asarray(Image.open(src)))


# --------------------------------------------------------------------------- bad files


def test_zero_byte_file(tmp_path):
    path = tmp_path / "empty.jpg"
    path.write_bytes(b"")
    with pytest.raises(DecodeError) as exc:
        load_image(path, PreprocessConfig())
    assert exc.value.path == str(path)
    assert exc.value.reason
    assert str(path) in str(exc.value)


def test_text_file_named_jpg(tmp_path):
    path = tmp_path / "notes.jpg"
    path.write_text("this is not an image\n" * 20)
    with pytest.raises(DecodeError) as exc:
        load_image(path, PreprocessConfig())
    assert exc.value.reason.startswith("not an image")


def test_truncated_jpeg(tmp_path):
    path = write_image(tmp_path / "full.jpg", (64, 48))
    data = path.read_bytes()
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(DecodeError) as exc:
        load_image(cut, PreprocessConfig())
    assert exc.value.reason
    assert exc.value.path == str(cut)


def test_truncated_png(tmp_path):
    path = write_image(tmp_path / "full.png", (64, 48))
    data = path.read_bytes()
    cut = tmp_path / "cut.png"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(DecodeError):
        load_image(cut, PreprocessConfig())


def test_missing_file(tmp_path):
    with pytest.raises(DecodeError) as exc:
        load_image(tmp_path / "gone.png", PreprocessConfig())
    assert exc.value.reason


# --------------------------------------------------------------------------- dtype


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


# ------------------------------------------------------------------------- reduced JPEG decoding


def _photo_jpeg(tmp_path, size=(1600, 1200), orientation=None) -> bytes:
    """A smooth, photograph-like JPEG (gradients plus mild noise), optionally with an EXIF orientation."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h)], axis=-1)
    rgb = np.clip(rgb + np.random.default_rng(0).integers(-5, 5, rgb.shape), 0, 255).astype(np.uint8)
    path = tmp_path / "photo.jpg"
    extra = {}
    if orientation:
        exif = Image.Exif()
        exif[0x0112] = orientation
        extra["exif"] = exif.tobytes()
    Image.fromarray(rgb).save(path, quality=92, **extra)
    return path.read_bytes()


def test_draft_size_keeps_at_least_the_target():
    from packer.pixels.preprocess import draft_size

    cfg = PreprocessConfig(size=(224, 224))
    assert draft_size((2000, 1500), cfg) == (299, 224)
    assert draft_size((2000, 1500), cfg, swap=True) == (224, 299)
    assert draft_size((2000, 1500), PreprocessConfig(size=(224, 224), resize="pad")) == (224, 168)
    assert draft_size((2000, 1500), PreprocessConfig(size=(100, 50), resize="stretch")) == (100, 50)


@pytest.mark.parametrize("orientation", [None, 6])
def test_reduced_decode_is_close_to_a_full_decode(tmp_path, orientation):
    data = _photo_jpeg(tmp_path, orientation=orientation)
    full = decode(data, PreprocessConfig(size=(200, 150), reduced_decode=False))
    reduced = decode(data, PreprocessConfig(size=(200, 150)))
    assert reduced.original_size == full.original_size == ((1200, 1600) if orientation else (1600, 1200))
    assert reduced.pixels.shape == full.pixels.shape == (150, 200, 3)
    diff = np.abs(reduced.pixels.astype(int) - full.pixels.astype(int))
    assert diff.mean() < 1.0 and diff.max() <= 12


def test_reduced_decode_really_decodes_less(tmp_path, monkeypatch):
    data = _photo_jpeg(tmp_path)
    sizes = []
    real = Image.Image.resize

    def spy(self, size, *args, **kwargs):
        sizes.append(self.size)
        return real(self, size, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "resize", spy)
    decode(data, PreprocessConfig(size=(190, 140)))
    decode(data, PreprocessConfig(size=(190, 140), reduced_decode=False))
    assert sizes == [(200, 150), (1600, 1200)]  # scaled by 1/8 while decoding, then resized


def test_manifests_without_the_option_mean_full_decoding():
    d = PreprocessConfig().to_dict()
    assert d["reduced_decode"] is True
    del d["reduced_decode"]
    assert PreprocessConfig.from_dict(d).reduced_decode is False


# --------------------------------------------------------------------------- Pillow's memory in workers


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


class _PiecewiseEncoder:
    """Pillow's raw encoder one byte short of what it is asked for: a call for the whole image ends a
    line early (tobytes calls again; image_pixels must not take the part)."""

    def __init__(self, real):
        self.real = real

    def setimage(self, *args):
        return self.real.setimage(*args)

    def encode(self, size):
        return self.real.encode(size - 1)

    def cleanup(self):
        return self.real.cleanup()


@pytest.mark.parametrize("encoder", ["pillow", "piecewise", "failing"])
def test_image_pixels_are_what_numpy_gives(monkeypatch, tmp_path, encoder):
    real = Image.core.raw_encoder
    if encoder == "piecewise":
        monkeypatch.setattr(Image.core, "raw_encoder", lambda *a: _PiecewiseEncoder(real(*a)))
    elif encoder == "failing":  # fails when image_pixels calls it; tobytes (np.asarray) still works

        def failing(*args):
            if sys._getframe(1).f_code.co_name == "image_pixels":
                raise TypeError("changed signature")
            return real(*args)

        monkeypatch.setattr(Image.core, "raw_encoder", failing)
    rng = np.random.default_rng(3)
    for shape in [(224, 224, 3), (5, 7, 3), (1, 1, 3), (2, 40_000, 3), (300, 2, 3)]:
        img = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8))
        for im in (img, img.convert("L")):
            got = image_pixels(im)
            assert got.dtype == np.uint8 and got.shape == (shape[0], shape[1], len(im.getbands()))
            assert np.array_equal(got.reshape(np.asarray(im).shape), np.asarray(im))
    # an image Pillow has not decoded yet (no resize: decode hands over the opened file)
    write_image(tmp_path / "a.png", (33, 21), seed=4)
    with Image.open(tmp_path / "a.png") as opened:
        want = np.asarray(opened.convert("RGB"))
    assert np.array_equal(
        decode((tmp_path / "a.png").read_bytes(), PreprocessConfig(size=None, resize="none")).pixels, want
    )


# --------------------------------------------------------------------------- torchvision's geometry


def torchvision_resize(img: Image.Image, size) -> Image.Image:
    """torchvision's ``Resize(size)`` on a PIL image, as its documentation and code define it: an int
    resizes the shorter side to ``size`` and the longer one to ``int(size * long / short)``; a pair is
    ``(height, width)``; PIL's bilinear resize, nothing done when the size does not change."""
    w, h = img.size
    if isinstance(size, int):
        short, long = (w, h) if w <= h else (h, w)
        new_short, new_long = size, int(size * long / short)
        new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    else:
        new_h, new_w = size
    return img if (new_w, new_h) == (w, h) else img.resize((new_w, new_h), Image.BILINEAR)


def torchvision_center_crop(img: Image.Image, size: int) -> Image.Image:
    """torchvision's ``CenterCrop(size)`` on a PIL image: offsets ``int(round((side - size) / 2.0))``."""
    w, h = img.size
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


ODD_SIZES = [(333, 500), (500, 375), (225, 1000), (1000, 225), (301, 300), (224, 224), (225, 225), (227, 301)]


def photo(path, size, seed=0, **save):
    """A smooth-plus-noise picture of ``size`` (a crop in the wrong place shows in every pixel)."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) % 256)], -1)
    noise = rng.integers(0, 40, (h, w, 3))
    return save_array(path, np.clip(base + noise, 0, 255).astype(np.uint8), **save)


@pytest.mark.parametrize("size", ODD_SIZES)
def test_shorter_crop_is_torchvisions_resize_and_center_crop_byte_for_byte(tmp_path, size):
    path = photo(tmp_path / "a.png", size)
    got = load_image(path, PreprocessConfig(size=(224, 224), reduced_decode=False, mean=None, std=None))
    want = np.asarray(torchvision_center_crop(torchvision_resize(Image.open(path).convert("RGB"), 224), 224))
    assert got.shape == (224, 224, 3) and np.array_equal(got, want)


@pytest.mark.parametrize("size", [(333, 500), (500, 375), (225, 1000)])
def test_shorter_crop_of_a_jpeg_with_full_decode_is_torchvisions(tmp_path, size):
    path = photo(tmp_path / "a.jpg", size, quality=90)
    got = load_image(path, PreprocessConfig(size=(224, 224), reduced_decode=False))
    want = np.asarray(torchvision_center_crop(torchvision_resize(Image.open(path).convert("RGB"), 224), 224))
    assert np.array_equal(got, want)


@pytest.mark.parametrize("size", [(333, 500), (500, 375), (1000, 225)])
def test_stretch_is_torchvisions_resize_to_height_width(tmp_path, size):
    path = photo(tmp_path / "a.jpg", size, quality=90)
    got = load_image(path, PreprocessConfig(size=(200, 150), resize="stretch", reduced_decode=False))
    want = np.asarray(torchvision_resize(Image.open(path).convert("RGB"), (150, 200)))  # torchvision: (h, w)
    assert got.shape == (150, 200, 3) and np.array_equal(got, want)


@pytest.mark.parametrize("size", [(1000, 750), (750, 1000), (1333, 2000)])
def test_shorter_crop_with_the_reduced_jpeg_decode_stays_close_to_torchvision(tmp_path, size):
    """The decoder scales these by 1/2 to 5/8 before the resize; the crop is torchvision's, so only
    the decode's own difference remains (a few levels on average, never a shifted picture)."""
    path = photo(tmp_path / "a.jpg", size, quality=90)
    got = load_image(path, PreprocessConfig(size=(224, 224))).astype(int)
    want = np.asarray(torchvision_center_crop(torchvision_resize(Image.open(path).convert("RGB"), 224), 224))
    assert np.abs(got - want).mean() < 3


def test_the_fractional_geometry_is_kept_as_an_option(tmp_path):
    """packer before 0.3.0: the largest centred box of the target's shape, resized in one step."""
    path = photo(tmp_path / "a.png", (333, 500))
    got = load_image(path, PreprocessConfig(size=(224, 224), reduced_decode=False, geometry="fractional"))
    box = (0.0, (500 - 333) / 2, 333.0, (500 - 333) / 2 + 333)
    want = np.asarray(Image.open(path).convert("RGB").resize((224, 224), Image.BILINEAR, box=box))
    assert np.array_equal(got, want)
    torchvision = load_image(path, PreprocessConfig(size=(224, 224), reduced_decode=False))
    assert not np.array_equal(got, torchvision)


@pytest.mark.parametrize("size", ODD_SIZES)
def test_the_evaluation_recipe_is_torchvisions_resize_256_and_center_crop_224(tmp_path, size):
    """``--resize shorter --size 256 --crop 224`` is ``Resize(256)`` + ``CenterCrop(224)``."""
    path = photo(tmp_path / "a.png", size)
    cfg = PreprocessConfig(size=(256, 256), resize="shorter", crop=(224, 224), reduced_decode=False)
    got = load_image(path, cfg)
    want = np.asarray(torchvision_center_crop(torchvision_resize(Image.open(path).convert("RGB"), 256), 224))
    assert got.shape == (224, 224, 3) and np.array_equal(got, want)


@pytest.mark.parametrize("size", [(333, 500), (500, 375), (1000, 225)])
def test_resize_shorter_keeps_the_aspect_ratio_as_torchvisions_resize(tmp_path, size):
    path = photo(tmp_path / "a.jpg", size, quality=90)
    got = load_image(path, PreprocessConfig(size=(160, 160), resize="shorter", reduced_decode=False))
    want = np.asarray(torchvision_resize(Image.open(path).convert("RGB"), 160))
    assert got.shape == want.shape and min(got.shape[:2]) == 160 and np.array_equal(got, want)
    reduced = load_image(path, PreprocessConfig(size=(160, 160), resize="shorter")).astype(int)
    assert reduced.shape == want.shape and np.abs(reduced - want).mean() < 3


def test_a_crop_larger_than_the_image_is_padded_as_torchvision_pads_it(tmp_path):
    path = photo(tmp_path / "a.png", (30, 20))
    got = load_image(path, PreprocessConfig(resize="none", crop=(35, 24), fill=(0, 0, 0)))
    src = np.asarray(Image.open(path).convert("RGB"))
    want = np.zeros((24, 35, 3), np.uint8)  # torchvision: (35 - 30) // 2 = 2 left, (24 - 20) // 2 = 2 on top
    want[2:22, 2:32] = src
    assert np.array_equal(got, want)


def test_resize_shorter_takes_one_number():
    with pytest.raises(ConfigError, match="--resize shorter takes one number"):
        PreprocessConfig(size=(256, 192), resize="shorter")
    assert PreprocessConfig(size=(256, 256), resize="shorter").image_shape is None  # images keep their shapes
    assert PreprocessConfig(size=(256, 256), resize="shorter", crop=(224, 200)).image_shape == (200, 224, 3)


def test_a_long_thin_image_is_cropped_without_resizing_all_of_it(tmp_path, monkeypatch):
    """A 10 x 2000 strip resized whole to torchvision's 224 x 44800 first would take 30 MB for a
    224 x 224 crop (a 10 x 50000 one, gigabytes): beyond TWO_STEP_LIMIT the kept box is resized in
    one step, within a level or so of the two steps."""
    import packer.pixels.preprocess as preprocess

    path = photo(tmp_path / "strip.png", (10, 2000))
    reference = torchvision_center_crop(torchvision_resize(Image.open(path).convert("RGB"), 224), 224)
    want = np.asarray(reference).astype(int)
    sizes = []
    real = Image.Image.resize

    def resize(self, size, *args, **kwargs):
        sizes.append(size)
        return real(self, size, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "resize", resize)
    for cfg in (
        PreprocessConfig(size=(224, 224), reduced_decode=False),
        PreprocessConfig(size=(224, 224), resize="shorter", crop=(224, 224), reduced_decode=False),
    ):
        sizes.clear()
        got = load_image(path, cfg).astype(int)
        assert sizes == [(224, 224)] and got.shape == (224, 224, 3) and np.abs(got - want).mean() < 2
    assert preprocess.TWO_STEP_LIMIT * 224 * 224 < 224 * 44800


def test_resize_shorter_refuses_a_result_over_max_pixels(tmp_path):
    path = photo(tmp_path / "strip.png", (10, 2000))
    with pytest.raises(DecodeError, match="too many pixels after the resize: 224x44800"):
        load_image(path, PreprocessConfig(size=(224, 224), resize="shorter", max_pixels=1_000_000))


@pytest.mark.parametrize(
    "size, expected",
    [
        ((500, 375), (224, 168)),
        ((375, 500), (168, 224)),
        ((100, 50), (100, 50)),
        ((10, 2000), (1, 224)),
        ((224, 300), (167, 224)),
    ],
)
def test_resize_max_bounds_the_longer_side_and_never_enlarges(tmp_path, size, expected):
    """FFCV's max_resolution: the longer side at most N, the aspect kept; smaller images as they are."""
    path = photo(tmp_path / "a.png", size)
    got = load_image(path, PreprocessConfig(size=(224, 224), resize="max", reduced_decode=False))
    source = Image.open(path).convert("RGB")
    want = np.asarray(source if expected == size else source.resize(expected, Image.BILINEAR))
    assert got.shape == (expected[1], expected[0], 3) and np.array_equal(got, want)


def test_resize_max_with_the_reduced_decode_gives_the_same_size(tmp_path):
    path = photo(tmp_path / "a.jpg", (1600, 1200), quality=90)
    full = load_image(path, PreprocessConfig(size=(300, 300), resize="max", reduced_decode=False)).astype(int)
    reduced = load_image(path, PreprocessConfig(size=(300, 300), resize="max")).astype(int)
    assert full.shape == reduced.shape == (225, 300, 3) and np.abs(full - reduced).mean() < 3
    with pytest.raises(ConfigError, match="--resize max takes one number, the longer side's size"):
        PreprocessConfig(size=(300, 200), resize="max")
