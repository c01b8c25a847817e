"""Decoding: by content, colour modes, transparency, EXIF orientation, bad files, the reduced JPEG
decode, and the pixels taken out of Pillow."""

import sys

import numpy as np
import pytest
from conftest import save_array, solid, write_image
from PIL import Image

from packer.config import PreprocessConfig
from packer.pixels.decoding import image_pixels
from packer.pixels.preprocess import decode, load_image
from packer.spec.errors import DecodeError

# --------------------------------------------------------------------- colour


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


# ---------------------------------------------------- orientation and content


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


# ------------------------------------------------------------------ bad files


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


# ------------------------------------------------------ reduced JPEG decoding


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


# --------------------------------------------------- the pixels out of Pillow


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
