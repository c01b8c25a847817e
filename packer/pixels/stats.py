"""Dataset statistics gathered while converting: pixel mean and std, original image sizes.

Each worker keeps exact integer counts for its shard (``packer.records.ShardStats``): per channel,
how many pixels hold each 8-bit value, and how many images have each original width and height.
Merging shards is adding counts, so the result does not depend on the shard layout or on
``--resume``, and the summary computed from the merged counts (``summarize``) is exact up to the
final rounding to float64. Float64 sums would do too (summing squares of 1e9 values of at most 1
loses at worst ~1e-7 relatively, far below what normalization needs), but a Pillow histogram is
faster to take per image than the sums, and exact.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import Counter
from fractions import Fraction
from typing import Optional

import numpy as np

from packer.config import PreprocessConfig
from packer.pixels.preprocess import finish_pixels
from packer.records import ShardStats

log = logging.getLogger(__name__)

SIZE_BINS = (0, 32, 64, 128, 256, 512, 1024, 2048, 4096)
"""Lower edges of the original-size histogram bins: [0, 32), [32, 64), ..., [4096, inf)."""


def summarize(stats: ShardStats, cfg: PreprocessConfig) -> dict:
    """The manifest's ``stats`` entry: ``pixels`` (per-channel mean and std, None without images)
    and ``original_sizes`` (histograms and min/median/max of widths and heights)."""
    sizes = {"bins": list(SIZE_BINS), "width": size_summary(stats.widths), "height": size_summary(stats.heights)}
    return {"pixels": pixel_stats(stats.histogram, cfg), "original_sizes": sizes}


def pixel_stats(histogram: np.ndarray, cfg: PreprocessConfig) -> Optional[dict]:
    """Mean and (population) std per channel of the stored pixels, from their 8-bit histogram.

    uint8 storage: of pixel / 255 (``scale`` ``0..1``, the scale of ``--normalize``). Float
    storage: of the stored values (``scale`` ``stored``), which are a function of channel and
    8-bit value, so a table of the 256 stored values per channel makes the sums exact too.
    """
    if not len(histogram):
        return None
    counts = histogram.reshape(cfg.channels, 256).tolist()
    if cfg.dtype == "uint8":
        scale = "0..1"
        values = [(list(range(256)), 255)] * cfg.channels
    else:
        scale = "stored"
        levels = np.repeat(np.arange(256, dtype=np.uint8)[:, None, None], cfg.channels, axis=2)
        table = finish_pixels(levels, cfg)[:, 0, :].astype(np.float64).T.tolist()  # exactly what is stored
        values = [_integer_scale(row) for row in table]
    n = sum(counts[0])
    means, stds = [], []
    for count, (numerators, denominator) in zip(counts, values):
        # Sums of integers, the stored values being numerators / denominator: exact, and one
        # Fraction per channel instead of 512: this runs at the end of every conversion, in the
        # parent, while the cores wait.
        s1 = sum(c * v for c, v in zip(count, numerators))
        s2 = sum(c * v * v for c, v in zip(count, numerators))
        means.append(float(Fraction(s1, denominator * n)))
        stds.append(math.sqrt(Fraction(n * s2 - s1 * s1, (denominator * n) ** 2)))
    return {"scale": scale, "count": n, "mean": means, "std": stds}


def _integer_scale(values: list[float]) -> tuple[list[int], int]:
    """Integers and one denominator (a power of two) whose quotients are exactly ``values``."""
    ratios = [v.as_integer_ratio() for v in values]
    denominator = max(q for _, q in ratios)
    return [p * (denominator // q) for p, q in ratios], denominator


def size_summary(counts: Counter) -> dict:
    """Histogram over ``SIZE_BINS`` and min, median (the lower middle value) and max of one side."""
    hist = [0] * len(SIZE_BINS)
    for size, n in counts.items():
        hist[bisect.bisect_right(SIZE_BINS, size) - 1] += n
    total = sum(counts.values())
    if not total:
        return {"counts": hist, "min": None, "median": None, "max": None}
    seen, median = 0, None
    for size in sorted(counts):
        seen += counts[size]
        if seen >= (total + 1) // 2:
            median = size
            break
    return {"counts": hist, "min": min(counts), "median": median, "max": max(counts)}


def auto_normalize(pixels: dict) -> dict:
    """``preprocess.normalize`` for ``--normalize auto``: the computed mean and std (0..1 scale).

    A channel with one value everywhere has std 0; it gets std 1 (the values become 0) with a
    warning, rather than a division by zero in every reader.
    """
    stds = pixels["std"]
    if any(s <= 0 for s in stds):
        log.warning("--normalize auto: a channel has the same value in every pixel; its std is set to 1")
    return {"mean": pixels["mean"], "std": [s if s > 0 else 1.0 for s in stds], "auto": True}
