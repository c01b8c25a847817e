"""Segmentation masks that follow the pixels: class indices kept (never RGB, never blended), the same
resize, crop, pad and EXIF orientation as their image, in every format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FORMATS
from PIL import Image

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import MaskConfig, ShardSize
from packer.output.verify import verify
from packer.spec.manifest import read_manifest
from readers import make_loader, open_dataset

COLOURS = {1: (255, 0, 0), 2: (0, 255, 0), 3: (0, 0, 255)}
IMAGES = [  # stored size, EXIF orientation, rectangles (x0, y0, x1, y1) -> class on the stored grid
    ((120, 80), 1, {1: (10, 10, 50, 60), 2: (60, 20, 110, 70)}),
    ((90, 150), 6, {3: (20, 30, 70, 90), 1: (5, 100, 40, 140)}),
    ((160, 60), 1, {2: (0, 0, 30, 60), 3: (100, 10, 150, 50)}),
]


def write_data(root: Path) -> None:
    """Images (PNG, with their EXIF orientation) and palette-PNG masks of the same stored grid."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for i, ((w, h), orientation, rects) in enumerate(IMAGES):
        pixels = np.zeros((h, w, 3), np.uint8)
        mask = np.zeros((h, w), np.uint8)
        for cls, (x0, y0, x1, y1) in rects.items():
            pixels[y0:y1, x0:x1] = COLOURS[cls]
            mask[y0:y1, x0:x1] = cls
        exif = Image.Exif()
        exif[0x0112] = orientation
        Image.fromarray(pixels).save(root / "images" / f"{i}.png", exif=exif)
        palette = Image.fromarray(mask, "L").convert("P")
        palette.putpalette([0, 0, 0, 200, 0, 0, 0, 200, 0, 0, 0, 200] + [0] * 756)
        palette.save(root / "masks" / f"{i}.png")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("seg")
    write_data(root)
    return root


def check_masks(out: Path, ignore: int = 255, epoch: int = 0, **options) -> None:
    """Every mask pixel well inside a class region sits on that class's colour, and every pixel well
    inside a colour has that class; only the mask's indices (and the ignore index) appear. ``options``
    go to the reader (``crop=``, ``flip=``), read in ``epoch``."""
    ds = open_dataset(out, normalize=False, **options)
    ds.set_epoch(epoch)
    assert ds.ignore_index == ignore
    seen = 0
    for image, mask in ds:
        seen += 1
        assert mask.dtype == torch.int64 and mask.shape == image.shape[1:]
        assert set(mask.unique().tolist()) <= {0, 1, 2, 3, ignore}
        pixels = image.permute(1, 2, 0).numpy().astype(int)
        m = mask.numpy()
        for cls, colour in COLOURS.items():
            near = np.abs(pixels - np.array(colour)).max(-1) <= 40
            interior = _eroded(m == cls)
            assert near[interior].all(), f"class {cls} pixels off its colour"
            assert (m[_eroded(near)] == cls).all(), f"colour of class {cls} with another class in the mask"
    assert seen == read_manifest(out).samples > 0  # every sample checked


def _eroded(region: np.ndarray) -> np.ndarray:
    """Pixels whose 3x3 neighbourhood lies in ``region`` (away from the blended edges)."""
    padded = np.pad(region, 1)
    out = np.ones_like(region)
    for dy in range(3):
        for dx in range(3):
            out &= padded[dy : dy + region.shape[0], dx : dx + region.shape[1]]
    return out


MODES = {
    "shorter-crop": PreprocessConfig(size=(64, 64)),
    "stretch": PreprocessConfig(size=(96, 40), resize="stretch"),
    "pad": PreprocessConfig(size=(64, 64), resize="pad"),
    "max": PreprocessConfig(size=(100, 100), resize="max"),
    "shorter+crop": PreprocessConfig(size=(48, 48), resize="shorter", crop=(80, 40)),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_masks_follow_every_resize_mode(data, tmp_path, mode):
    config = ConvertConfig("npy", MODES[mode], masks=MaskConfig(str(data / "masks")))
    convert(data / "images", tmp_path / "out", config, workers=1)
    check_masks(tmp_path / "out")


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_stores_the_masks(data, tmp_path, fmt):
    config = ConvertConfig(fmt, MODES["pad"], ShardSize(samples=2), masks=MaskConfig(str(data / "masks"), 250))
    convert(data / "images", tmp_path / "out", config, workers=2)
    assert verify(tmp_path / "out") == []
    check_masks(tmp_path / "out", ignore=250)
    masks = [m for _, m in open_dataset(tmp_path / "out")]
    assert len(masks) == len(IMAGES) and all((m == 250).any() for m in masks)  # the letterbox: the ignore index
    images, batch = next(iter(make_loader(open_dataset(tmp_path / "out"), 3, shuffle=False, num_workers=0)))
    assert images.shape == (3, 3, 64, 64) and batch.shape == (3, 64, 64) and batch.dtype == torch.int64


def test_bad_masks_are_skipped_with_the_reason(data, tmp_path):
    import shutil

    shutil.copytree(data, tmp_path / "d")
    Image.new("RGB", (120, 80)).save(tmp_path / "d" / "masks" / "0.png")  # colours, not classes
    Image.new("L", (30, 30)).save(tmp_path / "d" / "masks" / "2.png")  # another size
    Image.new("RGB", (10, 10)).save(tmp_path / "d" / "images" / "3.png")  # no mask at all
    config = ConvertConfig("npy", MODES["pad"], masks=MaskConfig(str(tmp_path / "d" / "masks")))
    result = convert(tmp_path / "d" / "images", tmp_path / "out", config, workers=1)
    reasons = {s.path: s.reason for s in result.skipped}
    assert reasons["0.png"].startswith("bad mask: a RGB image holds colours")
    assert reasons["2.png"].startswith("mask size mismatch")
    assert reasons["3.png"].startswith("no mask")
    assert result.manifest.samples == 1


def test_masks_inside_the_source_are_refused(data, tmp_path):
    from packer.spec.errors import InputError

    with pytest.raises(InputError, match="inside the source folder"):
        convert(
            data, tmp_path / "out", ConvertConfig("npy", MODES["pad"], masks=MaskConfig(str(data / "masks"))), workers=1
        )


def test_masks_beside_their_images(data, tmp_path):
    """--mask-sidecar: 0.png beside 0.jpg is 0.jpg's mask, not a sample; an image without one is skipped."""
    src = tmp_path / "side"
    src.mkdir()
    for i in range(len(IMAGES)):
        Image.open(data / "images" / f"{i}.png").save(
            src / f"{i}.tif", exif=Image.open(data / "images" / f"{i}.png").getexif()
        )
        (src / f"{i}.png").write_bytes((data / "masks" / f"{i}.png").read_bytes())
    Image.new("RGB", (20, 20)).save(src / "lonely.jpg")
    config = ConvertConfig("npy", MODES["pad"], masks=MaskConfig("", sidecar=True))
    result = convert(src, tmp_path / "out", config, workers=1)
    assert result.manifest.samples == len(IMAGES)
    assert [(s.path, s.reason.split(":")[0]) for s in result.skipped] == [("lonely.jpg", "no mask")]
    check_masks(tmp_path / "out")


def test_a_forced_grid_that_the_mask_size_contradicts_is_refused(data, tmp_path):
    """Image 1 is turned by EXIF 6 and its mask is drawn on the stored grid: --box-coords displayed says
    otherwise, and the sizes prove it wrong: skipped, never turned the wrong way."""
    config = ConvertConfig("npy", MODES["pad"], masks=MaskConfig(str(data / "masks"), coords="displayed"))
    result = convert(data / "images", tmp_path / "out", config, workers=1)
    assert {s.path: s.reason.split(":")[0] for s in result.skipped} == {
        "1.png": "mask size contradicts --box-coords displayed"
    }
    check_masks(tmp_path / "out")


def test_a_lossy_mask_is_refused(data, tmp_path):
    import shutil

    shutil.copytree(data, tmp_path / "d")
    Image.open(data / "masks" / "2.png").convert("L").save(tmp_path / "d" / "masks" / "2.png", format="JPEG")
    config = ConvertConfig("npy", MODES["pad"], masks=MaskConfig(str(tmp_path / "d" / "masks")))
    result = convert(tmp_path / "d" / "images", tmp_path / "out", config, workers=1)
    assert [(s.path, "lossy compression" in s.reason) for s in result.skipped] == [("2.png", True)]


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_masks_follow_the_readers_crops_and_flips(data, tmp_path, fmt):
    from readers import CenterCrop, RandomResizedCrop

    config = ConvertConfig(fmt, MODES["max"], masks=MaskConfig(str(data / "masks")))
    convert(data / "images", tmp_path / "out", config, workers=1)
    for epoch in range(4):
        check_masks(tmp_path / "out", epoch=epoch, crop=RandomResizedCrop(40, scale=(0.3, 1.0)), flip=True)
    check_masks(tmp_path / "out", crop=CenterCrop(120))  # padded: the ignore index under the padding
    ds = open_dataset(tmp_path / "out", normalize=False, crop=CenterCrop(120))
    image, mask = next(iter(ds))
    assert mask.shape == (120, 120)
    assert (mask == 255).any()  # the padding of a 100-pixel image to 120
    images, masks = next(
        iter(make_loader(open_dataset(tmp_path / "out", crop=RandomResizedCrop(40), flip=True), 3, num_workers=0))
    )
    assert images.shape == (3, 3, 40, 40) and masks.shape == (3, 40, 40) and masks.dtype == torch.int64


def test_outputs_whose_masks_pad_with_other_values_are_not_read_as_one(data, tmp_path):
    """One loss cannot ignore two padding values: a + b refuses them, as combine does."""
    for name, ignore in (("a", 255), ("b", 77), ("c", 255)):
        convert(
            data / "images",
            tmp_path / name,
            ConvertConfig("npy", MODES["pad"], masks=MaskConfig(str(data / "masks"), ignore)),
            workers=1,
        )
    a, b, c = (open_dataset(tmp_path / name) for name in "abc")
    with pytest.raises(ValueError, match=r"pad their masks with other values \(255 and 77\)"):
        a + b
    assert (a + c).ignore_index == 255
