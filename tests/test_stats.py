"""Dataset statistics: exact per-shard counts, their merge, the manifest's summary of them, and what a
conversion records (equal to numpy over the stored pixels; --normalize auto)."""

import json
import logging
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from compare import stored
from conftest import FORMATS, add_varied_files
from PIL import Image

from packer import ConvertConfig, convert
from packer.config import ImageCodec, PreprocessConfig, ShardSize
from packer.pixels.preprocess import finish_pixels
from packer.pixels.stats import SIZE_BINS, auto_normalize, pixel_stats, size_summary, summarize
from packer.records import ShardResult, ShardStats, Skipped
from packer.sources.discover import discover
from packer.spec.entries import FileEntry
from packer.spec.errors import ConfigError
from packer.spec.manifest import read_manifest

PRE = PreprocessConfig(size=(16, 12))


def histogram(images: list[np.ndarray]) -> np.ndarray:
    """Per-channel 256-bin counts, channel after channel, as Pillow's histogram gives them."""
    c = images[0].shape[2]
    return np.concatenate(
        [np.bincount(np.concatenate([im[..., k].ravel() for im in images]), minlength=256) for k in range(c)]
    )


def random_images(n, channels, seed=0):
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, 256, (int(rng.integers(3, 20)), int(rng.integers(3, 20)), channels), np.uint8) for _ in range(n)
    ]


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_uint8_pixel_stats_equal_numpy_of_pixel_over_255(mode):
    cfg = PreprocessConfig(size=(8, 8), mode=mode)
    images = random_images(12, cfg.channels)
    px = pixel_stats(histogram(images), cfg)
    values = np.concatenate([im.reshape(-1, cfg.channels) for im in images]).astype(np.float64) / 255
    assert px["scale"] == "0..1" and px["count"] == len(values)
    np.testing.assert_allclose(px["mean"], values.mean(0), rtol=1e-12)
    np.testing.assert_allclose(px["std"], values.std(0), rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("mean,std", [((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), (None, None)])
def test_float_pixel_stats_are_of_the_stored_values(dtype, mean, std):
    cfg = PreprocessConfig(size=(8, 8), dtype=dtype, mean=mean, std=std)
    images = random_images(9, 3, seed=1)
    stored = np.concatenate([finish_pixels(im, cfg).reshape(-1, 3) for im in images]).astype(np.float64)
    px = pixel_stats(histogram(images), cfg)
    assert px["scale"] == "stored" and px["count"] == len(stored)
    np.testing.assert_allclose(px["mean"], stored.mean(0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(px["std"], stored.std(0), rtol=1e-10)


def test_pixel_stats_are_exact_where_float_sums_drift():
    """A billion-pixel-scale histogram: counts make the result exact, whatever their size."""
    cfg = PreprocessConfig(size=(8, 8), mode="L")
    counts = np.zeros(256, np.int64)
    counts[254], counts[255] = 3 * 10**12 + 1, 10**12
    px = pixel_stats(counts, cfg)
    n = 4 * 10**12 + 1
    mean = (254 * (3 * 10**12 + 1) + 255 * 10**12) / n
    var = ((3 * 10**12 + 1) * 10**12) / n**2  # two values one apart: p(1-p)
    assert px["mean"] == [pytest.approx(mean / 255, rel=1e-15)]
    assert px["std"] == [pytest.approx(var**0.5 / 255, rel=1e-14)]
    assert px["count"] == n


@pytest.mark.parametrize("dtype", ["uint8", "float16", "float32"])
def test_pixel_stats_are_the_exact_rational_mean_and_variance_rounded_once(dtype):
    """Huge counts over every level: the result is the float nearest to the exact mean (and the
    square root of the float nearest to the exact variance) of the stored values."""
    cfg = PreprocessConfig(size=(8, 8), dtype=dtype, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    rng = np.random.default_rng(7)
    base = rng.integers(0, 10**15, 256)
    counts = np.concatenate([rng.permutation(base) for _ in range(3)])  # every channel counts every pixel
    levels = np.repeat(np.arange(256, dtype=np.uint8)[:, None, None], 3, axis=2)
    stored = finish_pixels(levels, cfg)[:, 0, :].astype(np.float64).T
    if dtype == "uint8":
        stored = [[Fraction(v, 255) for v in range(256)]] * 3
    px = pixel_stats(counts, cfg)
    for k in range(3):
        c, v = counts[k * 256 : (k + 1) * 256].tolist(), [Fraction(x) for x in stored[k]]
        n = sum(c)
        mean = sum(a * b for a, b in zip(c, v)) / n
        var = sum(a * b * b for a, b in zip(c, v)) / n - mean * mean
        assert px["mean"][k] == float(mean) and px["std"][k] == math.sqrt(float(var))


def test_no_pixels_no_pixel_stats():
    assert pixel_stats(np.zeros(0, np.int64), PreprocessConfig()) is None


def test_size_summary_bins_and_median():
    sizes = [10, 31, 32, 63, 64, 224, 500, 500, 1024, 4095, 4096, 9000]
    got = size_summary(Counter(sizes))
    want = [sum(1 for s in sizes if lo <= s < hi) for lo, hi in zip(SIZE_BINS, SIZE_BINS[1:] + (float("inf"),))]
    assert got["counts"] == want == [2, 2, 1, 1, 2, 0, 1, 1, 2]
    assert (got["min"], got["median"], got["max"]) == (10, 224, 9000)  # lower middle of 12 values
    assert size_summary(Counter([7]))["median"] == 7
    assert size_summary(Counter([5, 5, 9]))["median"] == 5
    assert size_summary(Counter()) == {"counts": [0] * len(SIZE_BINS), "min": None, "median": None, "max": None}


def test_shard_stats_merge_equals_one_pass():
    images = random_images(10, 3, seed=2)
    sizes = [(40 + i, 30 + 2 * i) for i in range(10)]
    whole, parts = ShardStats(), [ShardStats(), ShardStats(), ShardStats()]  # the last one stays empty
    for i, (im, size) in enumerate(zip(images, sizes)):
        whole.add(histogram([im]).tolist(), size)
        parts[i % 2].add(histogram([im]).tolist(), size)
    merged = ShardStats.merged(parts)
    assert np.array_equal(merged.histogram, whole.histogram) and np.array_equal(merged.histogram, histogram(images))
    assert merged.widths == Counter(w for w, _ in sizes) and merged.heights == Counter(h for _, h in sizes)
    assert summarize(merged, PreprocessConfig()) == summarize(whole, PreprocessConfig())
    assert len(parts[0].histogram) == 768  # merging did not change the parts


def test_shard_result_keeps_its_stats_through_json():
    """What --resume reloads from a finished shard's record."""
    stats = ShardStats()
    stats.add(list(range(768)), (640, 480))
    stats.add([1] * 768, (33, 4097))
    result = ShardResult(
        "shard-00003",
        2,
        [FileEntry("shard-00003.h5", 10, "ab" * 32)],
        [Skipped("x.png", "empty")],
        ["a.png", "b.png"],
        [0, 1],
        ["00" * 8, "11" * 8],
        stats,
    )
    back = ShardResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert np.array_equal(back.stats.histogram, stats.histogram) and back.stats.histogram.dtype == np.int64
    assert back.stats.widths == Counter({640: 1, 33: 1}) and back.stats.heights == Counter({480: 1, 4097: 1})
    assert back.to_dict() == result.to_dict()


def test_record_of_an_older_packer_is_not_a_finished_shard():
    """Without stats the shard cannot count toward the manifest; --resume writes it again."""
    d = ShardResult("shard-00000", 0, []).to_dict()
    del d["stats"]
    with pytest.raises(KeyError):
        ShardResult.from_dict(d)


def test_auto_normalize_uses_the_statistics_and_guards_a_constant_channel(caplog):
    norm = auto_normalize({"scale": "0..1", "count": 9, "mean": [0.25, 0.5], "std": [0.125, 0.0]})
    assert norm == {"mean": [0.25, 0.5], "std": [0.125, 1.0], "auto": True}
    assert any("same value in every pixel" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


# --------------------------------------------------------------------------- what a conversion records


def pixel_values(out, m):
    """Every stored pixel value as read back with the stock libraries: (pixels, channels) float64."""
    images = [im for _, _, im in stored(out, m)]
    return np.concatenate([im.reshape(-1, im.shape[2]) for im in images]).astype(np.float64)


def expected_sizes(src, skip=("bee/bad.png",)):
    """The manifest's original_sizes computed directly from the source files' headers."""
    sizes = []
    for item in discover(src).items:
        if item.relpath not in skip:
            with Image.open(item.path) as img:
                sizes.append(img.size)
    edges = list(SIZE_BINS) + [float("inf")]

    def side(values):
        values = sorted(values)
        return {
            "counts": [sum(lo <= v < hi for v in values) for lo, hi in zip(edges, edges[1:])],
            "min": values[0],
            "median": values[(len(values) - 1) // 2],
            "max": values[-1],
        }

    return {"bins": list(SIZE_BINS), "width": side(w for w, _ in sizes), "height": side(h for _, h in sizes)}


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_stats_equal_numpy_over_the_stored_pixels(image_tree, tmp_path, fmt, mode):
    add_varied_files(image_tree)
    out = tmp_path / "out"
    pre = PreprocessConfig(size=(16, 12), mode=mode)
    result = convert(image_tree, out, ConvertConfig(fmt, pre, ShardSize(samples=7)), workers=2)
    m = read_manifest(out)
    assert [s.samples for s in m.shards] == [6, 7, 4] and [s["path"] for s in m.skipped] == ["bee/bad.png"]
    assert m.stats == json.loads(json.dumps(result.manifest.stats))
    values = pixel_values(out, m) / 255
    px = m.stats["pixels"]
    assert px["scale"] == "0..1" and px["count"] == len(values) == 17 * 16 * 12
    np.testing.assert_allclose(px["mean"], values.mean(0), rtol=1e-12)
    np.testing.assert_allclose(px["std"], values.std(0), rtol=1e-12)
    assert m.stats["original_sizes"] == expected_sizes(image_tree)
    assert m.stats["original_sizes"]["width"]["counts"][SIZE_BINS.index(256)] == 1  # the wide one


@pytest.mark.parametrize("dtype,mode", [("float16", "RGB"), ("float32", "L")])
def test_stats_of_float_storage_are_of_the_stored_normalized_values(image_tree, tmp_path, dtype, mode):
    add_varied_files(image_tree)
    out = tmp_path / "out"
    pre = PreprocessConfig(size=(16, 12), mode=mode, dtype=dtype)
    convert(image_tree, out, ConvertConfig("npy", pre, ShardSize(samples=7)), workers=2)
    m = read_manifest(out)
    values = pixel_values(out, m)
    px = m.stats["pixels"]
    assert px["scale"] == "stored" and px["count"] == len(values)
    np.testing.assert_allclose(px["mean"], values.mean(0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(px["std"], values.std(0), rtol=1e-9)
    assert m.stats["original_sizes"] == expected_sizes(image_tree)


@pytest.mark.parametrize("codec", ["png", "jpeg"])
def test_stats_of_encoded_images_are_of_the_pixels_encoded(image_tree, tmp_path, codec):
    """As with raw images: exact for png; for jpeg, of the pixels before encoding (what decodes
    is close on average, smoother in detail)."""
    out = tmp_path / "out"
    convert(image_tree, out, ConvertConfig("hdf5", PRE, ShardSize(samples=7), codec=ImageCodec(codec)), workers=1)
    raw = convert(image_tree, tmp_path / "raw", ConvertConfig("hdf5", PRE, ShardSize(samples=7)), workers=1)
    m = read_manifest(out)
    assert m.stats == raw.manifest.stats
    values = pixel_values(out, m) / 255
    tol = {"rtol": 1e-12} if codec == "png" else {"atol": 0.02}
    np.testing.assert_allclose(m.stats["pixels"]["mean"], values.mean(0), **tol)
    if codec == "png":
        np.testing.assert_allclose(m.stats["pixels"]["std"], values.std(0), **tol)


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_normalize_auto_makes_readers_give_zero_mean_unit_std(image_tree, tmp_path, mode):
    import torch

    from readers import open_dataset

    add_varied_files(image_tree)
    out = tmp_path / "out"
    pre = PreprocessConfig(size=(16, 12), mode=mode, auto_normalize=True)
    m = convert(image_tree, out, ConvertConfig("wds", pre, ShardSize(samples=5)), workers=2).manifest
    px = m.stats["pixels"]
    assert m.preprocess["normalize"] == {"mean": px["mean"], "std": px["std"], "auto": True}
    assert len(px["mean"]) == pre.channels
    x = torch.stack([image for image, _ in open_dataset(out)]).double()
    assert x.shape == (17, pre.channels, 12, 16)
    assert torch.allclose(x.mean(dim=(0, 2, 3)), torch.zeros(pre.channels, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(
        x.std(dim=(0, 2, 3), unbiased=False), torch.ones(pre.channels, dtype=torch.float64), atol=1e-5
    )


def test_normalize_auto_refused_with_float_storage(image_tree, tmp_path):
    with pytest.raises(ConfigError, match="--normalize auto needs --dtype uint8"):
        convert(
            image_tree, tmp_path / "out", ConvertConfig("npy", PreprocessConfig(auto_normalize=True, dtype="float32"))
        )
    assert not (tmp_path / "out").exists()
