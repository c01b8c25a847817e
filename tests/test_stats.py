"""Dataset statistics: exact per-shard counts, their merge, and the manifest's summary of them."""

import json
import logging
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from packer.config import PreprocessConfig
from packer.preprocess import finish_pixels
from packer.records import FileEntry, ShardResult, ShardStats, Skipped
from packer.stats import SIZE_BINS, auto_normalize, pixel_stats, size_summary, summarize


def histogram(images: list[np.ndarray]) -> np.ndarray:
    """Per-channel 256-bin counts, channel after channel, as Pillow's histogram gives them."""
    c = images[0].shape[2]
    return np.concatenate([np.bincount(np.concatenate([im[..., k].ravel() for im in images]), minlength=256)
                           for k in range(c)])


def random_images(n, channels, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (int(rng.integers(3, 20)), int(rng.integers(3, 20)), channels), np.uint8)
            for _ in range(n)]


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
        c, v = counts[k * 256:(k + 1) * 256].tolist(), [Fraction(x) for x in stored[k]]
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
    result = ShardResult("shard-00003", 2, [FileEntry("shard-00003.h5", 10, "ab" * 32)], [Skipped("x.png", "empty")],
                         ["a.png", "b.png"], [0, 1], ["00" * 8, "11" * 8], stats)
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
