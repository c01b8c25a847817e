"""What a map-style output's index tells of every sample, read from the shards' index arrays alone
(no image or text is read): labels, ``(key, label)`` pairs, image sizes, text lengths and class-balance
weights. ``PackedDataset`` gives them under torchvision's names (``targets``, ``samples``, ``imgs``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np
import torch

from packer.spec.errors import ManifestError

if TYPE_CHECKING:
    from readers.datasets.mapstyle import PackedDataset


def labels(ds: PackedDataset) -> np.ndarray:
    """Every sample's label in dataset order, int64, read from the shards' label arrays alone
    (no image is read)."""
    offsets = ds.manifest.shard_offsets
    out = np.empty(len(ds), dtype=np.int64)
    for i, start in enumerate(offsets[:-1]):
        with ds.reading(i):
            found = ds.handles.labels_of(i, ds)  # copied shard by shard (see ShardHandles.labels_of)
            if len(found) != offsets[i + 1] - start:
                raise ManifestError(
                    f"{ds.root / ds.manifest.shards[i].name}: {len(found)} labels where "
                    f"the manifest says {offsets[i + 1] - start} samples; the output is "
                    f"damaged, run packer verify {ds.root}"
                )
            out[start : offsets[i + 1]] = found
    return out


def targets(ds: PackedDataset) -> list[int]:
    """Every sample's label in dataset order, as torchvision's ``ImageFolder.targets``: a list of
    ints (-1 for unlabelled data), from the shards' label arrays alone (no image is read). A new
    list at each access; ``labels`` is the same as one int64 array."""
    return labels(ds).tolist()


def samples(ds: PackedDataset) -> list[tuple[str, int]]:
    """``(key, label)`` of every sample in dataset order, as torchvision's ``ImageFolder.samples``.

    The key is the sample's source path relative to the converted folder (``"cat/001.jpg"``), as
    the shards store it, not an absolute path: the source folder may be gone, or on another
    machine. Read from the shards' keys and labels alone (no image is read); the keys are kept
    per process after the first access. A new list at each access."""
    out: list[tuple[str, int]] = []
    for shard in range(len(ds.manifest.shards)):
        keys = shard_keys(ds, shard)
        with ds.reading(shard):
            out += zip(keys, ds.handles.labels_of(shard, ds).tolist())
    return out


def shard_keys(ds: PackedDataset, shard: int) -> list[str]:
    keys = ds.handles.keys.get(shard)
    if keys is None:
        count = ds.manifest.shards[shard].samples
        with ds.reading(shard):
            keys = list(ds.read_keys(ds.handles.get(shard, ds), count))
        if len(keys) != count:
            raise ManifestError(
                f"{ds.root / ds.manifest.shards[shard].name}: {len(keys)} keys where the "
                f"manifest says {count} samples; the output is damaged, run packer verify "
                f"{ds.root}"
            )
        ds.handles.keys[shard] = keys
    return keys


def image_sizes(ds: PackedDataset) -> np.ndarray:
    """``(N, 2)`` int64 (height, width) of every image as returned without a crop, in dataset order,
    from the shards' index of sizes alone (no image is read): for aspect-ratio batching, or to know
    what a crop cuts from. ValueError for an output without images, or one of varying sizes that
    an older packer wrote without the index (convert it again)."""
    if not ds.layout.has_image:
        raise ValueError(f"{ds.root} stores no images")
    if ds.layout.shape is not None:
        return np.tile(np.array(ds.layout.shape[:2], np.int64), (len(ds), 1))
    parts = []
    for shard in range(len(ds.manifest.shards)):
        entry = ds.manifest.shards[shard]
        with ds.reading(shard):
            shapes = ds.read_shapes(ds.handles.get(shard, ds), entry)
        if shapes is None or shapes.shape != (entry.samples, 3):
            raise ValueError(
                f"{ds.root}: shard {entry.name} has no index of its images' sizes (written by "
                f"packer {ds.manifest.packer_version}); convert it again with this packer"
            )
        parts.append(np.asarray(shapes[:, :2], np.int64))
    return np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)


def lengths(ds: PackedDataset, field: Optional[str] = None) -> np.ndarray:
    """Every sample's length of a text field in dataset order, int64: UTF-8 bytes for text and
    json, ids for token ids (``field`` defaults to the text/token field). Read from the shards'
    indexes alone; no sample is read. For ``LengthBucketSampler``."""
    f = ds.info.length_field(field)
    parts = []
    for shard in range(len(ds.manifest.shards)):
        with ds.reading(shard):
            parts.append(np.asarray(ds.read_lengths(ds.handles.get(shard, ds), f), dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def sample_weights(ds: PackedDataset) -> torch.Tensor:
    """Per-sample weights 1 / (samples of its class), for ``WeightedRandomSampler`` class balance.

    ``WeightedRandomSampler(ds.sample_weights(), num_samples=len(ds))`` draws every class
    equally often. Unlabelled samples (label -1) get weight 0.
    """
    every = labels(ds)
    counts = np.bincount(every[every >= 0], minlength=len(ds.classes or []))
    weights = np.zeros(len(every), dtype=np.float64)
    known = every >= 0
    weights[known] = 1.0 / counts[every[known]]
    return torch.from_numpy(weights)
