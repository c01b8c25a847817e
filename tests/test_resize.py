"""The resize rule: the plan of each --resize mode, the pixels it gives (torchvision's byte for byte),
and the size a scaled JPEG decode may stop at."""

import numpy as np
import pytest
from conftest import save_array, solid, write_image
from PIL import Image

from packer.config import PreprocessConfig
from packer.pixels.preprocess import load_image
from packer.pixels.resize import TWO_STEP_LIMIT, ResizePlan, draft_size, resize_plan
from packer.spec.errors import ConfigError, DecodeError


def thirds(tmp_path):
    """A 60x20 image: red, green, blue thirds, with one marked pixel in the middle third."""
    a = np.zeros((20, 60, 3), np.uint8)
    a[:, :20] = (255, 0, 0)
    a[:, 20:40] = (0, 255, 0)
    a[:, 40:] = (0, 0, 255)
    a[5, 25] = (7, 8, 9)
    return save_array(tmp_path / "thirds.png", a), a


# ----------------------------------------------------- shapes per resize mode


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


# --------------------------------------- the size a scaled decode may stop at


def test_the_plan_of_each_mode():
    """resize_plan, which the pixels and the geometry of boxes and masks both follow."""

    def plan(mode, **options):
        return resize_plan((400, 300), PreprocessConfig(size=(100, 100), resize=mode, **options))

    assert resize_plan((400, 300), PreprocessConfig(resize="none")) == ResizePlan((400, 300), (400, 300))
    stretch = PreprocessConfig(size=(100, 50), resize="stretch")
    assert resize_plan((400, 300), stretch) == ResizePlan((100, 50), (100, 50))
    assert plan("max") == ResizePlan((100, 75), (100, 75))
    assert plan("shorter") == ResizePlan((133, 100), (133, 100))  # torchvision's truncated longer side
    assert plan("shorter-crop") == ResizePlan((100, 100), (133, 100), crop=(16, 0))  # round(16.5): half to even
    window = (50.0, 0.0, 300, 300)  # the largest centred square, resized in one step
    assert plan("shorter-crop", geometry="fractional") == ResizePlan((100, 100), (100, 100), window=window)
    assert plan("pad") == ResizePlan((100, 100), (100, 75), at=(0, 12))


def test_a_scaled_decode_is_planned_in_its_own_pixels_but_torchvisions_sizes_in_the_original():
    """A decode at 4/8: the fractional window in the decoded pixels; torchvision's integer sizes and
    offsets from the original size, as a full decode has them."""
    fractional = PreprocessConfig(size=(100, 100), geometry="fractional")
    assert resize_plan((400, 300), fractional, (200.0, 150.0)).window == (25.0, 0.0, 150.0, 150.0)
    torchvision = PreprocessConfig(size=(100, 100))
    assert resize_plan((400, 300), torchvision, (200.0, 150.0)) == resize_plan((400, 300), torchvision)


def test_draft_size_keeps_at_least_the_target():
    cfg = PreprocessConfig(size=(224, 224))
    assert draft_size((2000, 1500), cfg) == (299, 224)
    assert draft_size((2000, 1500), cfg, swap=True) == (224, 299)
    assert draft_size((2000, 1500), PreprocessConfig(size=(224, 224), resize="pad")) == (224, 168)
    assert draft_size((2000, 1500), PreprocessConfig(size=(100, 50), resize="stretch")) == (100, 50)


# ----------------------------------------------------- torchvision's geometry


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
    assert TWO_STEP_LIMIT * 224 * 224 < 224 * 44800


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
