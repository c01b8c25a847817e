"""Weighted mixtures: several packer outputs drawn in fixed proportions, as one map-style dataset.

An epoch of a mixture is ``epoch_size`` samples, ``n_k`` from each part ``k`` in proportion to
its weight (largest remainders, so the counts add up exactly). Each part is read through its own
reader, so each is normalized by its own manifest's statistics, and draws its samples as a stream
that goes on across epochs: its ``n_k`` draws of epoch ``e`` are positions ``e * n_k`` to
``(e + 1) * n_k - 1`` of an endless series of permutations of the part (cycle ``c`` of a part of
``L`` samples covers positions ``c * L`` to ``(c + 1) * L - 1`` and is the permutation seeded by
``(seed, k, c)``). So a small part is repeated only once all of it was seen, a large one is seen in
full over several epochs, and which sample index ``i`` of epoch ``e`` is depends on the seed, the
epoch and ``i`` alone: any worker count, any rank split, and a mid-epoch resume
(``make_loader(mixture, ...)``, ``loader.state_dict()``) read exactly the same samples. A part's
random crops and flips are those of its cycle (the part's epoch ``c``), so a sample drawn twice,
in two cycles, is cropped anew.
"""

from __future__ import annotations

import copy
import numbers
import os
import warnings
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from readers.compose.combine import check_same_classes
from readers.datasets.mapstyle import PackedDataset
from readers.datasets.token_blocks import TokenBlocks
from readers.loading.collate import PackedBatch
from readers.loading.sampler import EpochBatch

_WARNED: list[bool] = []

PartSpec = Union[tuple[Union[str, os.PathLike, PackedDataset], float], Sequence[Any]]


def _kind(ds: Any) -> dict:
    """What must agree between a mixture's parts for their samples to batch and mean the same: the
    fields but the image's storage (text kinds and tokenizers, mask classes), the returned image's
    shape, dtype and normalization, the detection categories, how samples are returned; for token
    blocks, their size, the tokenizer, its padding id and how blocks are returned."""
    if isinstance(ds, TokenBlocks):
        s = ds.section
        return {
            "token blocks": s.block,
            "tokenizer": s.tokenizer.get("sha256"),
            "padding id": s.pad_id,
            "returned": (ds.return_dict, ds.block_mask),
        }
    m = ds.manifest
    image = m.fields.get("image")
    return {
        "fields": {name: f for name, f in m.fields.items() if name != "image"},
        "image shape": ds.image_shape,
        "image dtype": str(ds.convert.batch_dtype(np.dtype(image["dtype"]))) if image else None,
        "normalized": ds.convert.normalize is not None,
        "target": ds.has_target,
        "categories": (m.annotations or {}).get("categories"),
        "returned": (ds.return_meta, ds.one_by_one),
    }


def allocate(weights: Sequence[float], total: int) -> list[int]:
    """Whole counts in proportion to ``weights`` that add up to ``total`` (largest remainders, ties to
    the earlier part)."""
    share = [w / sum(weights) * total for w in weights]
    counts = [int(s) for s in share]
    order = sorted(range(len(share)), key=lambda k: (-(share[k] - counts[k]), k))
    for k in order[: total - sum(counts)]:
        counts[k] += 1
    return counts


class Mixture(Dataset):
    """Parts drawn in proportion to their weights; see the module. Made by ``open_mixture``."""

    def __init__(
        self, parts: Mapping[str, tuple[PackedDataset, float]], epoch_size: Optional[int] = None, seed: int = 0
    ) -> None:
        if not isinstance(parts, Mapping) or not parts:
            raise ValueError("a mixture needs its parts as a dict of name -> (dataset, weight), at least one")
        self.names = list(parts)
        self.datasets = [copy.copy(parts[n][0]) for n in self.names]  # the caller's readers keep their settings
        weights = [parts[n][1] for n in self.names]
        for name, ds, weight in zip(self.names, self.datasets, weights):
            if not isinstance(ds, (PackedDataset, TokenBlocks)):
                if getattr(ds, "section", None) is not None:  # a TokenStream: its blocks, streamed
                    why = "its blocks stream in order; open it with a cache_dir= to draw them at random"
                elif hasattr(ds, "manifest"):
                    why = (
                        "tar shards are read in order, so their samples cannot be drawn one by one; repack it for "
                        "random access (packer convert OUTPUT -f lmdb -o OUTPUT-lmdb)"
                    )
                else:
                    why = "give one output's reader (readers.open_dataset) or its folder"
                raise ValueError(f"mixture part {name!r} is {type(ds).__name__}: {why}")
            if (
                isinstance(weight, bool)
                or not isinstance(weight, numbers.Real)
                or not weight > 0
                or not np.isfinite(weight)
            ):
                raise ValueError(f"mixture part {name!r} has weight {weight!r}: weights must be positive numbers")
            if len(ds) == 0:
                raise ValueError(f"mixture part {name!r} holds no samples")
        self.weights = [float(w) for w in weights]
        blocks = [isinstance(d, TokenBlocks) for d in self.datasets]
        if any(blocks) and not all(blocks):
            raise ValueError(
                f"mixture part {self.names[blocks.index(True)]!r} holds token blocks and part "
                f"{self.names[blocks.index(False)]!r} samples: a batch holds one or the other"
            )
        check_same_classes(self.datasets)
        first = self.datasets[0]
        for name, ds in zip(self.names[1:], self.datasets[1:]):
            ours, theirs = _kind(ds), _kind(first)
            if ours != theirs:
                differ = ", ".join(k for k in ours if ours[k] != theirs[k])
                raise ValueError(
                    f"mixture parts {self.names[0]!r} and {name!r} give samples of other kinds ({differ}: "
                    f"{ {k: theirs[k] for k in ours if ours[k] != theirs[k]} } against "
                    f"{ {k: ours[k] for k in ours if ours[k] != theirs[k]} }); batches need one kind: "
                    "crop them to one size with crop=, open them with the same options, or convert "
                    "them alike"
                )
        if epoch_size is None:
            epoch_size = sum(len(d) for d in self.datasets)
        if isinstance(epoch_size, bool) or not isinstance(epoch_size, numbers.Integral) or epoch_size < 1:
            raise ValueError(f"epoch_size must be a whole number of at least 1, got {epoch_size!r}")
        self.epoch_size = int(epoch_size)
        self.seed = int(seed)
        for k, ds in enumerate(self.datasets):
            ds.seed = part_seed(self.seed, k)  # the parts' random crops follow the mixture's seed (and their cycles)
        # Token blocks are mixed by tokens, as pretraining recipes state their mixes: a part whose
        # blocks hold fewer ids (best-fit padding) gives more blocks for the same share.
        tokens = isinstance(first, TokenBlocks)
        shares = [w / d.tokens_per_block for w, d in zip(self.weights, self.datasets)] if tokens else self.weights
        self.counts = allocate(shares, self.epoch_size)
        starved = [n for n, c in zip(self.names, self.counts) if c == 0]
        if starved:
            raise ValueError(
                f"mixture part(s) {', '.join(map(repr, starved))} would get no sample of an epoch of "
                f"{self.epoch_size}: raise their weight or epoch_size"
            )
        # Sample i of an epoch is draw rank[i] of part part[i]: the parts interleaved evenly, so that
        # every stretch of the epoch has about the proportions (the loader shuffles it anyway).
        keys = np.concatenate([(np.arange(n) + 0.5) / n for n in self.counts if n]) if any(self.counts) else []
        owners = np.concatenate([np.full(n, k) for k, n in enumerate(self.counts) if n])
        ranks = np.concatenate([np.arange(n) for n in self.counts if n])
        order = np.lexsort((owners, keys))
        small = np.int32 if self.epoch_size < 2**31 else np.int64
        self._part, self._rank = (
            owners[order].astype(np.int8 if len(self.names) < 128 else np.int32),
            ranks[order].astype(small),
        )
        # -1: never set (epoch 0, and a warning in DataLoader workers, where the draws would repeat every epoch).
        self._epoch = torch.full((1,), -1, dtype=torch.int64).share_memory_()
        self._cycles: dict[tuple[int, int], np.ndarray] = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cycles"] = {}  # rebuilt where needed: a part's permutation is as large as the part
        return state

    def with_seed(self, seed: int) -> "Mixture":
        """This mixture drawn with another seed (streams, crops and flips)."""
        other = copy.copy(self)
        other.seed, other._cycles = int(seed), {}
        other.datasets = [copy.copy(d) for d in self.datasets]
        for k, ds in enumerate(other.datasets):
            ds.seed = part_seed(other.seed, k)
        return other

    def epoch_now(self) -> int:
        """The epoch drawn now (``set_epoch``; 0 before any call, with a warning in DataLoader workers)."""
        epoch = int(self._epoch.item())
        if epoch >= 0:
            return epoch
        if get_worker_info() is not None and not _WARNED:
            _WARNED.append(True)
            warnings.warn(
                "a mixture read in DataLoader workers draws epoch 0 every epoch: call mixture.set_epoch("
                "epoch) before each epoch, or read it through readers.make_loader, whose batches carry "
                "their epoch",
                stacklevel=3,
            )
        return 0

    # What make_loader and PackedLoader ask of a dataset.
    @property
    def has_target(self) -> bool:
        """Whether samples are (image, target) pairs (detection and segmentation outputs)."""
        return self.datasets[0].has_target

    @property
    def classes(self) -> Optional[list[str]]:
        """The class map every part has."""
        return self.datasets[0].classes

    def __len__(self) -> int:
        return self.epoch_size

    def set_epoch(self, epoch: int) -> None:
        """Draw epoch ``epoch``'s samples (in this process and in DataLoader workers; ``make_loader``'s
        batches carry their epoch instead)."""
        self._epoch.fill_(int(epoch))

    def order_record(self) -> dict:
        """What a loader's order over this mixture depends on beyond its sampler's (``make_loader``
        records it with the loader's state): the parts' sizes and weights, the seed."""
        return {
            "parts": {n: [len(d), w] for n, d, w in zip(self.names, self.datasets, self.weights)},
            "seed": self.seed,
        }

    def proportions(self) -> dict[str, int]:
        """How many samples each part gives an epoch."""
        return dict(zip(self.names, self.counts))

    def token_shares(self) -> dict[str, float]:
        """The share of an epoch's tokens (padding left out) each part of token blocks gives."""
        tokens = [c * d.tokens_per_block for c, d in zip(self.counts, self.datasets)]
        return {n: t / sum(tokens) for n, t in zip(self.names, tokens)}

    def draw(self, index: int, epoch: int) -> tuple[int, int]:
        """``(part, index into that part)`` of mixture sample ``index`` in ``epoch``."""
        k, _, i = self._draw(index, epoch)
        return k, i

    def _draw(self, index: int, epoch: int) -> tuple[int, int, int]:
        """``(part, cycle, index into that part)`` of mixture sample ``index`` in ``epoch``."""
        if not 0 <= index < self.epoch_size:
            raise IndexError(f"index {index} out of range for a mixture epoch of {self.epoch_size} samples")
        k = int(self._part[index])
        length = len(self.datasets[k])
        position = epoch * self.counts[k] + int(self._rank[index])
        cycle, offset = divmod(position, length)
        return k, cycle, int(self._permutation(k, cycle)[offset])

    def _permutation(self, part: int, cycle: int) -> np.ndarray:
        """Cycle ``cycle`` of part ``part``'s stream (kept for the cycles in use, two a part at most)."""
        key = (part, cycle)
        found = self._cycles.get(key)
        if found is None:
            for old in [k for k in self._cycles if k[0] == part and k[1] < cycle - 1]:
                del self._cycles[old]
            n = len(self.datasets[part])
            found = np.random.default_rng([self.seed, part, cycle]).permutation(
                np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
            )
            self._cycles[key] = found
        return found

    def __getitem__(self, index: int):
        return self.__getitems__(EpochBatch([int(index)], self.epoch_now()))[0]

    def __getitems__(self, indices: list[int]):
        """The samples at ``indices``, read part by part (and cycle by cycle) in batches, in the order asked."""
        epoch = getattr(indices, "epoch", None)
        epoch = self.epoch_now() if epoch is None else int(epoch)
        drawn = [self._draw(int(i), epoch) for i in indices]
        rows: dict[tuple[int, int], list[int]] = {}
        for row, (k, cycle, _) in enumerate(drawn):
            rows.setdefault((k, cycle), []).append(row)
        # A part's crops and flips are those of its cycle: a sample drawn again is cropped anew.
        first = self.datasets[0]
        if isinstance(first, TokenBlocks):  # one batch of the parts' blocks, in the order asked
            parts = [(self.datasets[k], rs, [drawn[r][2] for r in rs]) for (k, _), rs in rows.items()]
            return first.batch_from(parts, len(indices))  # type: ignore[arg-type]
        got = {
            (k, cycle): self.datasets[k].__getitems__(EpochBatch([drawn[r][2] for r in rs], cycle))
            for (k, cycle), rs in rows.items()
        }
        if all(isinstance(b, PackedBatch) for b in got.values()):
            first = next(iter(got.values()))
            images = torch.empty((len(indices), *first.images.shape[1:]), dtype=first.images.dtype)
            labels = torch.empty(len(indices), dtype=torch.int64)
            for k, rs in rows.items():
                at = torch.tensor(rs)
                images[at] = got[k].images.to(images.dtype)
                labels[at] = got[k].labels
            return PackedBatch(images, labels)
        out: list = [None] * len(indices)
        for k, rs in rows.items():
            for r, sample in zip(rs, list(got[k])):
                out[r] = sample
        return out

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{n!r}: ({getattr(d, 'root', '?')!s}, {w:g})" for n, d, w in zip(self.names, self.datasets, self.weights)
        )
        return f"Mixture({{{parts}}}, epoch_size={self.epoch_size}, seed={self.seed})"


def part_seed(seed: int, part: int) -> int:
    """The seed of part ``part``'s crops and flips in a mixture seeded ``seed``: drawn from both, so
    that the parts' samples of one position in a cycle do not all get the same numbers."""
    return int(np.random.SeedSequence([seed, part]).generate_state(1, np.uint32)[0])


def open_mixture(
    parts: Mapping[str, PartSpec], epoch_size: Optional[int] = None, seed: int = 0, **options: Any
) -> Mixture:
    """A ``Mixture`` of packer outputs: ``{"web": ("packed/web", 0.7), "curated": ("packed/cur", 0.3)}``.

    Each part is an output folder (opened with ``readers.open_dataset(path, **options)``: crops,
    ``normalize``, ...) or a reader already open (random access: npy, lmdb or hdf5), and a positive
    weight (weights need not add up to 1). ``epoch_size`` is the samples of one epoch (default: all
    parts' samples together); ``seed`` draws the parts' streams and, through ``make_loader``, the
    shuffle. All parts must have the same class map (or none) and give samples of one kind.
    """
    from readers import open_dataset  # the package, which imports this module

    opened: dict[str, tuple[PackedDataset, float]] = {}
    for name, spec in parts.items():
        if not isinstance(spec, (tuple, list)) or len(spec) != 2:
            raise ValueError(f"mixture part {name!r} must be (output folder or dataset, weight), got {spec!r}")
        source, weight = spec
        opened[name] = (source if isinstance(source, Dataset) else open_dataset(source, seed=seed, **options), weight)
    return Mixture(opened, epoch_size, seed)


__all__ = ["Mixture", "open_mixture", "allocate"]
