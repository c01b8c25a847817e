"""--codec source: the source files' own bytes where the preprocessing keeps their pixels, the rest re-encoded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FORMATS, write_image
from PIL import Image

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli.option_values import parse_normalize
from packer.config import ImageCodec, ShardSize
from packer.pixels.source_codec import SOURCE_STATS, keep
from packer.spec.errors import ConfigError
from packer.spec.manifest import read_manifest
from packer.spec.registry import FORMATS as SPECS
from packer.spec.sample_layout import SampleLayout
from readers import RandomResizedCrop, open_dataset

MAX = PreprocessConfig(resize="max", size=(256, 256))
KEPT = {"a/plain.jpg", "a/turned.jpg", "a/gray.jpg", "b/rgb.png", "b/turned.png"}
"""What ``--resize max --size 256 --codec source --mode RGB`` keeps of ``sources``; gray.jpg is kept only
in mode L, so it is re-encoded in RGB (see KEPT_RGB)."""
KEPT_RGB = KEPT - {"a/gray.jpg"}


def turned(path: Path, orientation: int, **save) -> Path:
    """Give the image at ``path`` an EXIF orientation (saved again: a PNG keeps its pixels)."""
    img = Image.open(path)
    exif = img.getexif()
    exif[0x0112] = orientation
    img.save(path, exif=exif, **save)
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src") / "images"
    write_image(src / "a" / "plain.jpg", (120, 80), seed=1, quality=90)
    turned(write_image(src / "a" / "turned.jpg", (100, 70), seed=2, quality=90), 6, quality=90)
    write_image(src / "a" / "big.jpg", (400, 300), seed=3, quality=90)  # over 256: resized, re-encoded as JPEG
    write_image(src / "a" / "gray.jpg", (64, 48), mode="L", seed=4, quality=90)  # gray: kept only in mode L
    write_image(src / "b" / "rgb.png", (90, 60), seed=5)
    turned(write_image(src / "b" / "turned.png", (50, 80), seed=6), 8)
    write_image(src / "b" / "alpha.png", (90, 60), mode="RGBA", seed=7)  # another mode: re-encoded as PNG
    write_image(src / "b" / "pic.bmp", (50, 40), seed=8)  # not JPEG or PNG: PNG
    return src


@pytest.fixture(scope="module")
def outputs(sources, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("out")
    found = {}
    for fmt in FORMATS:
        convert(
            sources, out / fmt, ConvertConfig(fmt, MAX, ShardSize(samples=3), codec=ImageCodec("source")), workers=1
        )
        found[fmt] = out / fmt
    convert(sources, out / "png", ConvertConfig("npy", MAX, codec=ImageCodec("png")), workers=1)
    found["png"] = out / "png"  # lossless: the pixels the conversion makes
    return found


def by_key(ds) -> dict:
    items = list(ds) if type(ds).__name__ == "WdsDataset" else [ds[i] for i in range(len(ds))]
    return {meta["key"]: image for image, _, meta in items}


@pytest.mark.parametrize("fmt", FORMATS)
def test_kept_files_are_stored_byte_for_byte_and_the_manifest_says_which(sources, outputs, fmt):
    m = read_manifest(outputs[fmt])
    layout = SampleLayout.from_manifest(m)
    assert m.format_version == (7 if fmt == "wds" else 6) and m.fields["image"]["codec"] == "source"
    kept, reencoded = set(), {}
    for shard in m.shards:
        flags = shard.kept_sources()
        for s in SPECS[fmt].scan(outputs[fmt], shard, layout):  # the stock library's reading of the shard
            original = (sources / s.key).read_bytes()
            assert (bytes(s.encoded) == original) == flags[s.local], s.key
            if flags[s.local]:
                kept.add(s.key)
            else:
                reencoded[s.key] = "jpeg" if bytes(s.encoded[:3]) == b"\xff\xd8\xff" else "png"
    assert kept == KEPT_RGB
    assert reencoded == {"a/big.jpg": "jpeg", "a/gray.jpg": "jpeg", "b/alpha.png": "png", "b/pic.bmp": "png"}
    totals = {k: sum(s.image_sources[k] for s in m.shards) for k in ("jpeg", "png")}
    assert totals == {"jpeg": 2, "png": 2}
    report = (outputs[fmt] / "report.txt").read_text()
    assert "4 kept; re-encoded: 2 as JPEG quality 90, 2 as PNG" in report


@pytest.mark.parametrize("fmt", FORMATS)
def test_readers_give_the_conversions_pixels_with_the_exif_orientation_applied(outputs, fmt):
    want = by_key(open_dataset(outputs["png"], normalize=False, return_meta=True))
    got = by_key(open_dataset(outputs[fmt], normalize=False, return_meta=True))
    assert set(got) == set(want)
    for key, image in got.items():
        diff = (image.int() - want[key].int()).abs().max().item()
        if key in KEPT_RGB or key.endswith((".png", ".bmp")):
            assert diff == 0, key  # kept, or re-encoded losslessly
        else:
            assert image.shape == want[key].shape and diff < 60, key  # re-encoded as JPEG q90
    assert tuple(got["a/turned.jpg"].shape) == (3, 100, 70)  # 100x70 turned by 90 degrees
    assert tuple(got["b/turned.png"].shape) == (3, 50, 80)


def test_random_crops_of_turned_kept_files_are_cut_from_the_upright_image(outputs):
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_crops import reference

    plain = by_key(open_dataset(outputs["lmdb"], normalize=False, return_meta=True))
    ds = open_dataset(outputs["lmdb"], normalize=False, return_meta=True, flip=True, crop=RandomResizedCrop(32))
    for epoch in range(3):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            image, _, meta = ds[i]
            want = reference(plain[meta["key"]].permute(1, 2, 0).numpy(), meta, (32, 32))
            assert np.abs(image.permute(1, 2, 0).numpy().astype(int) - want.astype(int)).max() <= 2, meta


def test_statistics_of_kept_jpegs_are_counted_at_one_eighth_unless_normalizing_by_them(sources, outputs, tmp_path):
    m, ref = read_manifest(outputs["npy"]), read_manifest(outputs["png"])
    assert m.stats["pixels"]["counted"] == SOURCE_STATS
    assert np.allclose(m.stats["pixels"]["mean"], ref.stats["pixels"]["mean"], atol=0.01)
    auto = PreprocessConfig(resize="max", size=(256, 256), **parse_normalize("auto"))
    convert(sources, tmp_path / "auto", ConvertConfig("npy", auto, codec=ImageCodec("source")), workers=1)
    convert(sources, tmp_path / "auto-png", ConvertConfig("npy", auto, codec=ImageCodec("png")), workers=1)
    a, b = read_manifest(tmp_path / "auto"), read_manifest(tmp_path / "auto-png")
    assert "counted" not in a.stats["pixels"]
    assert a.preprocess["normalize"] == b.preprocess["normalize"]  # full decodes: the same statistics exactly


def test_kept_jpegs_are_checked_at_one_eighth_whatever_their_size(tmp_path, monkeypatch):
    from packer.pixels import jpeg

    scales = []
    decode_scaled = jpeg.decode_scaled

    def spy(*args, **kwargs):
        out = decode_scaled(*args, **kwargs)
        scales.append(out.eighths if out is not None else None)
        return out

    monkeypatch.setattr(jpeg, "decode_scaled", spy)
    pre = PreprocessConfig(resize="none", size=None)
    for size in ((500, 375), (80, 60), (64, 48), (9, 8)):  # sides that are not multiples of 8 and ones that are
        data = write_image(tmp_path / f"{size[0]}x{size[1]}.jpg", size, quality=90).read_bytes()
        kept = keep(data, pre)
        assert kept is not None and kept.scaled and kept.original_size == size
    assert scales == [1, 1, 1, 1]  # libjpeg-turbo's 1/8: its smallest scale, the least inverse DCT work


@pytest.mark.parametrize("size", [(9, 8), (17, 33), (80, 60), (500, 375)])
def test_a_kept_jpegs_statistics_count_each_block_for_the_pixels_it_covers(tmp_path, size):
    """Partial 8x8 blocks at the right and bottom edges stand for fewer pixels: counted as whole
    blocks, a 9x8 JPEG's mean was 13 levels off its pixels' (a differential review's finding)."""
    w, h = size
    ramp = np.zeros((h, w, 3), np.uint8)  # dark to light towards the partial blocks: their weight shows
    ramp[:, :, 0] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
    ramp[:, :, 1] = np.linspace(0, 255, h, dtype=np.uint8)[:, None]
    ramp[:, :, 2] = 128
    path = tmp_path / "ramp.jpg"
    Image.fromarray(ramp).save(path, quality=90)
    kept = keep(path.read_bytes(), PreprocessConfig(resize="none", size=None))
    assert kept is not None and kept.scaled
    hist = np.asarray(kept.histogram, np.int64).reshape(3, 256)
    assert (hist.sum(axis=1) == w * h).all()  # every channel counts every pixel once
    mean = (hist * np.arange(256)).sum(axis=1) / (w * h)
    with Image.open(path) as img:
        full = np.asarray(img.convert("RGB"), np.float64).reshape(-1, 3).mean(axis=0)
    assert np.abs(mean - full).max() < 2, (mean, full)


def test_what_is_kept_follows_the_preprocessing(sources, tmp_path):
    def kept(pre: PreprocessConfig) -> set:
        out = tmp_path / f"o{len(list(tmp_path.iterdir()))}"
        convert(sources, out, ConvertConfig("npy", pre, codec=ImageCodec("source")), workers=1)
        flags = [f for s in read_manifest(out).shards for f in s.kept_sources()]
        return {key for (key, _), f in zip(open_dataset(out).samples, flags) if f}

    assert kept(PreprocessConfig(resize="none", size=None)) == KEPT_RGB | {"a/big.jpg"}
    # within 100 as displayed: turned.jpg (70x100), rgb.png (90x60), turned.png (80x50); not plain.jpg (120x80)
    assert kept(PreprocessConfig(resize="max", size=(100, 100))) == {"a/turned.jpg", "b/rgb.png", "b/turned.png"}
    assert kept(PreprocessConfig(resize="none", size=None, mode="L")) == {"a/gray.jpg"}
    for pre in (PreprocessConfig(resize="none", size=None, crop=(32, 32)), PreprocessConfig(size=(64, 64))):
        with pytest.raises(ConfigError, match="every image changes"):  # nothing could be kept: refused
            ConvertConfig("npy", pre, codec=ImageCodec("source"))


def test_a_damaged_jpeg_is_reported_not_stored(tmp_path):
    src = tmp_path / "src"
    good = write_image(src / "a" / "good.jpg", (80, 60), quality=90)
    (src / "a" / "cut.jpg").write_bytes(good.read_bytes()[:300])
    convert(
        src,
        tmp_path / "out",
        ConvertConfig("wds", PreprocessConfig(resize="none", size=None), codec=ImageCodec("source")),
        workers=1,
    )
    m = read_manifest(tmp_path / "out")
    assert m.samples == 1 and [s["path"] for s in m.skipped] == ["a/cut.jpg"]
    assert "corrupt or truncated" in m.skipped[0]["reason"]


def test_every_output_verifies_and_info_says_how_images_are_stored(outputs):
    import subprocess
    import sys

    for fmt in FORMATS:  # in a process of its own: this one holds the LMDB shards open in its readers
        result = subprocess.run(
            [sys.executable, "-m", "packer", "verify", str(outputs[fmt])], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr
    info = subprocess.run(
        [sys.executable, "-m", "packer", "info", str(outputs["hdf5"])], capture_output=True, text=True
    )
    assert "the source files' bytes (4 kept" in info.stdout
    assert "kept JPEGs counted at 1/8 scale" in info.stdout
    assert json.loads((outputs["wds"] / "manifest.json").read_text())["shards"][0]["image_sources"]["kept"]
    assert torch.is_tensor(open_dataset(outputs["npy"])[0][0])


def png16(pixels: np.ndarray) -> bytes:
    """A 16-bit RGB PNG (Pillow writes none), chunk by chunk as the PNG specification lays it out."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    h, w, _ = pixels.shape
    rows = b"".join(b"\x00" + pixels[y].astype(">u2").tobytes() for y in range(h))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def test_camera_style_jpegs_tiny_ones_and_16_bit_pngs(tmp_path):
    src = tmp_path / "src"
    xmp = write_image(src / "a" / "xmp.jpg", (80, 60), seed=1, quality=90)
    Image.open(xmp).save(xmp, quality=90, xmp=b"<x:xmpmeta xmlns:x='adobe:ns:meta/'></x:xmpmeta>")  # an APP1 of XMP
    write_image(src / "a" / "tiny.jpg", (5, 5), seed=2, quality=90)  # under 8 pixels: no 1/8 decode
    deep = src / "a" / "deep.png"
    deep.write_bytes(png16(np.random.default_rng(0).integers(0, 65536, (20, 30, 3), dtype=np.uint16)))
    rgb16 = deep.read_bytes()
    write_image(src / "a" / "rgb.png", (30, 20), seed=3)
    pre = PreprocessConfig(resize="none", size=None)
    convert(src, tmp_path / "out", ConvertConfig("npy", pre, codec=ImageCodec("source")), workers=1)
    convert(src, tmp_path / "ref", ConvertConfig("npy", pre, codec=ImageCodec("png")), workers=1)
    flags = [f for s in read_manifest(tmp_path / "out").shards for f in s.kept_sources()]
    kept = {key for (key, _), f in zip(open_dataset(tmp_path / "out").samples, flags) if f}
    assert kept == {"a/xmp.jpg", "a/tiny.jpg", "a/rgb.png"}  # the 16-bit PNG is re-encoded in 8 bits
    assert rgb16[24] == 16
    got = by_key(open_dataset(tmp_path / "out", normalize=False, return_meta=True))
    want = by_key(open_dataset(tmp_path / "ref", normalize=False, return_meta=True))
    assert all(torch.equal(got[k], want[k]) for k in kept)


def test_readers_leave_pillows_pixel_limit_as_they_found_it(outputs):
    before = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = 1000  # far below these images: the conversion's own limit applied already
    try:
        ds = open_dataset(outputs["lmdb"], normalize=False, return_meta=True)
        # Decoded whole, though Pillow refuses over twice its limit: two JPEGs re-encoded, one kept as it was
        got = [(ds[i][2]["key"], tuple(ds[i][0].shape[1:])) for i in range(3)]
        assert got == [("a/big.jpg", (192, 256)), ("a/gray.jpg", (48, 64)), ("a/plain.jpg", (80, 120))]
        assert Image.MAX_IMAGE_PIXELS == 1000
    finally:
        Image.MAX_IMAGE_PIXELS = before


def test_counts_of_kept_jpegs_add_up_exactly_and_a_png_only_output_is_not_flagged(sources, outputs, tmp_path):
    m = read_manifest(outputs["npy"])
    ref = read_manifest(outputs["png"])
    assert m.stats["pixels"]["count"] == ref.stats["pixels"]["count"]  # weighted to whole pixels, per channel
    src = tmp_path / "src"
    for name in ("rgb.png", "turned.png"):
        (src / "b").mkdir(parents=True, exist_ok=True)
        (src / "b" / name).write_bytes((sources / "b" / name).read_bytes())
    convert(src, tmp_path / "png-only", ConvertConfig("npy", MAX, codec=ImageCodec("source")), workers=1)
    assert "counted" not in read_manifest(tmp_path / "png-only").stats["pixels"]
