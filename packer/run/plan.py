"""Planning a conversion: the stored order of the samples and their cut into shards.

Shards are planned up front from the sorted source list, so each is written by one worker without
talking to any other.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from PIL import Image

from packer.config import DEFAULT_SHARD_BYTES, ConvertConfig, ShardSize
from packer.records import ShardTask, SourceItem
from packer.sources.discover import Discovery
from packer.sources.item_table import ItemTable
from packer.spec.sample_layout import SampleLayout

AUTO_SHARDS_PER_WORKER = 4
"""``auto`` gives each worker at least this many shards: an interrupted run keeps its finished shards
for --resume, so with one shard per worker a Ctrl-C at 70% kept nothing."""

AUTO_MIN_SAMPLES = 1000
"""...unless that makes shards smaller than this: a few seconds of work each, below which more
shards only mean more files for the readers to open."""

AUTO_MAX_EXTRA_SHARDS = 64
"""...and never more shards than this for resumability alone (the readers' default
``max_open_shards``: random batches over more shards than a reader keeps open reopen a shard on
almost every read). Shards the 256 MiB cap asks for are not limited."""

AUTO_FIXED_MAX_SAMPLES = 20_000
"""``auto`` on a large source (see ``auto_cut``) cuts shards of at most this many samples: what an
interrupted run loses per worker stays a shard of this size, however large the source."""

ESTIMATE_PREFIX = 4096
"""``auto_cut`` estimates the stored bytes per sample from the first this many samples only, so that the
cut of a large source is known from the start of its sorted list (``packer.run.early_start``)."""


@dataclass(frozen=True)
class ShardPlan:
    """The shards of a conversion, and how ``auto`` cut them."""

    tasks: list[ShardTask]
    fixed_samples: Optional[int] = None
    """With ``--shard-size auto`` on a large source (``auto_cut``): the sample count the shards were
    cut at; None where the cut was balanced for the workers (or a size was given)."""


def shard_name(i: int) -> str:
    """Name of the ``i``-th shard; every file of the shard starts with it."""
    return f"shard-{i:05d}"


def plan_shards(
    items: Sequence[SourceItem],
    size: ShardSize,
    sample_bytes: float,
    workers: int = 1,
    fixed: Optional[int] = None,
) -> list[ShardTask]:
    """Cut the sorted items into contiguous shards.

    A sample count or byte size gives shards of that size (the last one smaller). ``auto`` gives
    shards of at most 256 MiB and at least ``AUTO_SHARDS_PER_WORKER`` per worker (while they keep
    ``AUTO_MIN_SAMPLES`` each, and up to ``AUTO_MAX_EXTRA_SHARDS``), as many as a multiple of
    ``workers`` and of equal size, so that no worker waits for another at the end; or, given
    ``fixed`` (``auto_cut`` of a large source), shards of ``fixed`` samples.
    """
    n = len(items)
    if n == 0:
        return []
    if size.samples is not None or (size.is_auto and fixed is not None):
        per = size.samples or fixed
    elif size.bytes is not None:
        per = max(1, int(size.bytes // max(sample_bytes, 1)))
    else:
        most = max(1, int(DEFAULT_SHARD_BYTES // max(sample_bytes, 1)))  # samples in 256 MiB
        by_bytes = math.ceil(math.ceil(n / most) / workers) * workers  # rounded up: each under 256 MiB
        extra = min(AUTO_SHARDS_PER_WORKER * workers, AUTO_MAX_EXTRA_SHARDS, n // AUTO_MIN_SAMPLES)
        shards = min(n, max(by_bytes, extra // workers * workers))  # rounded down: each of 1000 samples or more
        base, extra = divmod(n, shards)
        bounds, start = [], 0
        for i in range(shards):
            end = start + base + (1 if i < extra else 0)
            bounds.append((start, end))
            start = end
        return [ShardTask(shard_name(i), _part(items, a, b)) for i, (a, b) in enumerate(bounds)]
    return [ShardTask(shard_name(i), _part(items, a, a + per)) for i, a in enumerate(range(0, n, per))]


def _part(items: Sequence[SourceItem], start: int, stop: int) -> Sequence[SourceItem]:
    """A shard's items: a view of an ``ItemTable`` (no object per item), else a tuple."""
    return items[start:stop] if isinstance(items, ItemTable) else tuple(items[start:stop])


def stored_order(items: Sequence[SourceItem], seed: Optional[int]) -> Sequence[SourceItem]:
    """The order samples are stored in: sorted source order, or with a seed the permutation
    ``numpy.random.default_rng(seed).permutation(len(items))`` of it (a view of an ``ItemTable``)."""
    if seed is None:
        return items if isinstance(items, ItemTable) else list(items)
    order = np.random.default_rng(seed).permutation(len(items))
    if isinstance(items, ItemTable):
        return items.take(order)
    return [items[i] for i in order]


def estimate_sample_bytes(layout: SampleLayout, items: Sequence[SourceItem]) -> float:
    """Stored bytes per sample: exact for fixed image shapes; for images kept at their own size, the
    mean of up to 64 evenly spread files' sizes, read from their headers (no decoding); text fields
    add the mean size of their files (stored text is about its file's size)."""
    sample = items[:: max(1, len(items) // 64)]
    text = 0.0
    if layout.text:
        sizes = [_file_size(p) for item in sample for f, p in item.parts if f != "image"]
        text = float(sum(sizes) / len(sample)) if sample else 0.0
    if layout.sample_bytes is not None:
        return float(layout.sample_bytes) + text
    per_pixel = layout.channels * np.dtype(layout.dtype).itemsize
    sizes = []
    for item in sample:
        path = dict(item.parts).get("image", item.path)
        if not _file_size(path):
            continue  # a FIFO would block here; workers report such files
        try:
            with Image.open(path) as img:
                sizes.append(img.size[0] * img.size[1] * per_pixel)
        except Exception:  # noqa: BLE001 - a bad file is reported later by its worker; here it only has no size
            continue
    return (float(sum(sizes) / len(sizes)) if sizes else float(1024**2)) + text


def _file_size(path: str) -> int:
    """Size of a regular file, 0 for anything else or an unreadable path."""
    try:
        st = os.stat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def auto_samples(layout: SampleLayout, items: Sequence[SourceItem]) -> int:
    """The samples per shard of ``auto``'s cut of a large source: as many as fit 256 MiB by the
    stored bytes of the first ``ESTIMATE_PREFIX`` of ``items`` (exact for fixed image shapes), at most
    ``AUTO_FIXED_MAX_SAMPLES``."""
    estimate = estimate_sample_bytes(layout, items[:ESTIMATE_PREFIX])
    return max(1, min(AUTO_FIXED_MAX_SAMPLES, int(DEFAULT_SHARD_BYTES // max(estimate, 1))))


def fixed_size(layout: SampleLayout) -> bool:
    """Whether every sample of ``layout`` stores at most the same bytes (one image shape, no text): the
    samples ``auto`` may cut a large source of at one count (``auto_cut``)."""
    return layout.sample_bytes is not None and not layout.text


def fixed_cut_from(per: int) -> int:
    """The sample count from which ``auto`` cuts shards of ``per`` samples (``auto_samples``): enough for
    ``AUTO_MAX_EXTRA_SHARDS`` of them, where the balanced cut would give about as many anyway."""
    return max(AUTO_MAX_EXTRA_SHARDS * per, ESTIMATE_PREFIX)


def auto_cut(items: Sequence[SourceItem], size: ShardSize, layout: SampleLayout) -> Optional[int]:
    """The fixed sample count of ``auto``'s shards of ``items`` (in stored order), or None for the
    balanced cut.

    A large source (``fixed_cut_from``) of samples whose images have one shape (at most those bytes
    each, encoded or not) and no text is cut into shards of one sample count, decided before the end
    of the walk: the cut of every shard is known as soon as discovery has listed it, and its shards
    can start while the rest of the tree is walked (``packer.run.early_start``). The balanced cut depends
    on the sample count, which only the end of the walk knows; an estimate of sizes that vary by
    sample, from the first samples alone, could make shards far over 256 MiB."""
    if not size.is_auto or len(items) < ESTIMATE_PREFIX or not fixed_size(layout):
        return None
    per = auto_samples(layout, items)
    return per if len(items) >= fixed_cut_from(per) else None


def plan_tasks(found: Discovery, config: ConvertConfig, layout: SampleLayout, workers: int) -> ShardPlan:
    """The shards of a conversion of ``found``: its samples in stored order, cut by ``plan_shards``."""
    items = stored_order(found.items, config.shuffle)
    fixed = auto_cut(items, config.shard_size, layout)
    sample_bytes = estimate_sample_bytes(layout, items) if fixed is None else 0.0
    return ShardPlan(plan_shards(items, config.shard_size, sample_bytes, workers, fixed), fixed)
