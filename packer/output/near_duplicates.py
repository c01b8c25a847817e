"""Near-duplicate images found by their perceptual hashes (``packer.pixels.looks``), without
comparing every pair.

Two images are near-duplicates when the hash of one is within ``distance`` bits (Hamming) of any of
the other's ``LOOKS`` hashes (its own or one of its trimmed windows', which is what catches a crop).
The hashes are indexed by multi-index hashing (Norouzi et al., "Fast search in Hamming space with
multi-index hashing", CVPR 2012): each 64-bit hash is cut into three chunks (22, 21, 21 bits); two
hashes within ``distance`` bits differ in at most ``distance // 3`` bits in one of their chunks, so
only the hashes listed under an image's chunk values with up to that many bits flipped are compared.
Each chunk's table is a sorted order and a count per value of the chunk's low bits (as many as the
set needs, 2**22 at most), looked up for a whole batch of hashes at once in numpy. Among a million
random images' hashes a search at distance 4 or 5 compares about 200 pairs an image, not a million.
"""

from __future__ import annotations

import functools
import itertools
from typing import Iterable, Iterator, Optional

import numpy as np

from packer.config import DUP_DISTANCE
from packer.pixels.looks import FLAT

CHUNKS = ((42, 22), (21, 21), (0, 21))
"""(shift, bits) of the three chunks of a hash."""
_CANDIDATES = 1 << 22
"""Candidate pairs compared at once at most (a few tens of MB of arrays), whatever the hashes."""
_BATCH = 1 << 14
"""Hashes looked up at once: a step's candidates (about 200 a hash among a million) then fit in the
caches; 2**17 took 8% longer, 2**19 30% (a million random hashes, EPYC Zen 4)."""


def popcount(values: np.ndarray) -> np.ndarray:
    """The set bits of each uint64 (numpy's own where it has it, numpy >= 2.0)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(values)
    x = values.astype(np.uint64, copy=True)
    x -= (x >> np.uint64(1)) & np.uint64(0x5555555555555555)
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return ((x * np.uint64(0x0101010101010101)) >> np.uint64(56)).astype(np.uint8)


def _flips(bits: int, radius: int) -> np.ndarray:
    """Every mask of ``bits`` bits with at most ``radius`` set (uint64), the empty one first."""
    masks = [0]
    for r in range(1, radius + 1):
        masks += [sum(1 << b for b in chosen) for chosen in itertools.combinations(range(bits), r)]
    return np.array(masks, dtype=np.uint64)


class _Index:
    """The hashes of a set (``owners[k]``: the image hash ``k`` belongs to), one table per chunk: the
    hashes and owners in the order of the chunk's values, and where each value's run starts."""

    def __init__(self, hashes: np.ndarray, owners: np.ndarray) -> None:
        # A chunk's table is keyed by its low bits only, as many as the hashes need (a few per key):
        # a small set does not pay for 2**22 counts, and a key shared by chunks that differ above
        # those bits only adds candidates, which the distance then drops.
        self.key_bits = [min(bits, max(8, int(len(hashes)).bit_length())) for _, bits in CHUNKS]
        self.tables = []
        for (shift, _), key_bits in zip(CHUNKS, self.key_bits):
            keys = ((hashes >> np.uint64(shift)) & np.uint64((1 << key_bits) - 1)).astype(np.int64)
            order = _stable_order(keys, key_bits)
            counts = np.bincount(keys, minlength=1 << key_bits).astype(np.int32)
            starts = np.zeros(1 << key_bits, np.int64)
            np.cumsum(counts[:-1], out=starts[1:])
            self.tables.append((hashes[order], owners[order], counts, starts))

    def matches(self, queries: np.ndarray, distance: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(query positions, owners)`` of every indexed hash within ``distance`` of a query, in
        batches (a pair may come more than once). A batch's candidates are taken ``_CANDIDATES`` at a
        time, so that hashes shared by many images cost time, never the machine's memory."""
        radius = distance // 3
        for start in range(0, len(queries), _BATCH):
            batch = queries[start : start + _BATCH]
            for (shift, _), key_bits, (hashes, owners, counts, starts) in zip(CHUNKS, self.key_bits, self.tables):
                # A chunk within `radius` bits has its key within as many of the key's bits.
                flips = _flips(key_bits, radius)
                keys = ((batch >> np.uint64(shift)) & np.uint64((1 << key_bits) - 1))[:, None] ^ flips
                keys = keys.astype(np.int64).reshape(-1)
                n = counts[keys].astype(np.int64)
                ends = np.cumsum(n)
                if not len(ends) or not ends[-1]:
                    continue
                cuts = np.searchsorted(ends, np.arange(_CANDIDATES, int(ends[-1]), _CANDIDATES), side="left")
                for lo, hi in zip([0, *(cuts + 1).tolist()], [*(cuts + 1).tolist(), len(keys)]):
                    if lo >= hi:
                        continue
                    part, before = n[lo:hi], int(ends[lo - 1]) if lo else 0
                    total = int(ends[hi - 1]) - before
                    if not total:
                        continue
                    # Candidate c is hash first[c] of the table, looked up by key slot lo + slot[c]'s run.
                    local_ends = ends[lo:hi] - before
                    first = np.repeat(starts[keys[lo:hi]] - (local_ends - part), part) + np.arange(total)
                    asked = np.repeat(np.repeat(batch, len(flips))[lo:hi], part)
                    close = np.flatnonzero(popcount(asked ^ hashes[first]) <= distance)
                    slot = np.searchsorted(local_ends, close, side="right") + lo
                    yield slot // len(flips) + start, owners[first[close]]


def _stable_order(keys: np.ndarray, bits: int) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of keys under 2**32, in two passes of 16 bits or fewer,
    which numpy sorts by radix: twice as fast as one sort of the wide keys."""
    low_bits = bits // 2
    low = (keys & ((1 << low_bits) - 1)).astype(np.uint16)
    high = (keys >> low_bits).astype(np.uint16)
    first = np.argsort(low, kind="stable")
    return first[np.argsort(high[first], kind="stable")]


def _index(looks: np.ndarray) -> _Index:
    """An index of every hash of ``looks`` (N x LOOKS)."""
    count, per = looks.shape
    return _Index(np.ascontiguousarray(looks).reshape(-1), np.repeat(np.arange(count), per))


def _shaped(looks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``looks`` that have a shape to compare (not ``FLAT``: an image of one colour), and
    their positions."""
    looks = np.asarray(looks, dtype=np.uint64)
    kept = np.flatnonzero(looks[:, 0] != FLAT)
    return looks[kept], kept


def near_pairs(looks: np.ndarray, distance: int = DUP_DISTANCE) -> np.ndarray:
    """The pairs ``(i, j)``, ``i < j``, of near-duplicates among the images of ``looks`` (N x LOOKS
    uint64, ``packer.pixels.looks.image_looks`` of each), sorted, each once (P x 2, int64). Images of
    one colour (``FLAT``) are no one's near-duplicates."""
    looks, rows = _shaped(looks)
    if len(looks) < 2:
        return np.zeros((0, 2), np.int64)
    found = [np.stack([q, o], axis=1) for q, o in _index(looks).matches(looks[:, 0], distance)]
    return rows[_unique_pairs(np.concatenate(found) if found else np.zeros((0, 2), np.int64))]


def _unique_pairs(pairs: np.ndarray) -> np.ndarray:
    """``pairs`` each as ``(smaller, larger)``, without an image paired with itself, sorted, without repeats."""
    pairs = np.sort(pairs.astype(np.int64, copy=False), axis=1)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    if not len(pairs):
        return pairs.reshape(0, 2)
    width = int(pairs[:, 1].max()) + 1  # one number a pair: np.unique over rows is several times slower
    joined = np.unique(pairs[:, 0] * width + pairs[:, 1])
    return np.stack([joined // width, joined % width], axis=1)


class _Classes:
    """The images of a set grouped by their own hash: identical hashes are near-duplicates at any
    distance, so the search compares one image of each (a scraped set holding a placeholder ten
    thousand times makes one query, not ten thousand, and no ten thousand squared pairs)."""

    def __init__(self, looks: np.ndarray) -> None:
        self.own, self.first, self.of = np.unique(looks[:, 0], return_index=True, return_inverse=True)
        self.of = self.of.reshape(-1)
        # An image whose windows' hashes differ from its class's first image's adds them to the index.
        odd = np.flatnonzero(np.any(looks != looks[self.first[self.of]], axis=1))
        rows = np.union1d(self.first, odd)
        self.index = _Index(np.ascontiguousarray(looks[rows]).reshape(-1), np.repeat(self.of[rows], looks.shape[1]))

    @functools.cached_property
    def _by_class(self) -> tuple[np.ndarray, np.ndarray]:
        """The images in class order, and where each class's run starts (made when first asked for)."""
        order = np.argsort(self.of, kind="stable")
        return order, np.concatenate([[0], np.cumsum(np.bincount(self.of, minlength=len(self.own)))])

    def members(self, classes: Iterable[int]) -> np.ndarray:
        """The images of ``classes``, sorted."""
        order, starts = self._by_class
        return np.sort(np.concatenate([order[starts[c] : starts[c + 1]] for c in classes]))

    def shared(self) -> np.ndarray:
        """The classes of more than one image (identical hashes)."""
        return np.flatnonzero(np.bincount(self.of, minlength=len(self.own)) > 1)


def near_groups(looks: np.ndarray, distance: int = DUP_DISTANCE) -> list[list[int]]:
    """The groups of near-duplicates among the images of ``looks`` (N x LOOKS uint64): those that
    ``near_pairs`` joins, directly or through others, each sorted, ordered by their first image;
    found without listing every pair (an image of one colour, ``FLAT``, is in none)."""
    looks, rows = _shaped(looks)
    if len(looks) < 2:
        return []
    classes = _Classes(looks)
    joined = _Joined()
    for q, o in classes.index.matches(classes.own, distance):
        joined.add(np.stack([q, o], axis=1))
    grouped = [classes.members(group) for group in joined.groups()]
    seen = {c for group in joined.groups() for c in group}
    grouped += [classes.members([c]) for c in classes.shared().tolist() if c not in seen]  # identical hashes only
    return sorted((rows[g].tolist() for g in grouped), key=lambda g: g[0])


def cross_matches(first: np.ndarray, second: np.ndarray, distance: int = DUP_DISTANCE) -> np.ndarray:
    """For each image ``i`` of ``first`` that nearly duplicates an image of ``second``, the first
    such image ``j``: pairs ``(i, j)`` sorted by ``i`` (P x 2, int64). One match an image, whatever
    the number of copies on the other side."""
    (first, in_first), (second, in_second) = _shaped(first), _shaped(second)
    if not len(first) or not len(second):
        return np.zeros((0, 2), np.int64)
    mine, theirs = _Classes(first), _Classes(second)
    found = [np.stack([q, o], axis=1) for q, o in theirs.index.matches(mine.own, distance)]
    found += [np.stack([o, q], axis=1) for q, o in mine.index.matches(theirs.own, distance)]
    if not found:
        return np.zeros((0, 2), np.int64)
    pairs = np.concatenate(found)
    nearest = np.full(len(mine.own), np.iinfo(np.int64).max)
    np.minimum.at(nearest, pairs[:, 0], theirs.first[pairs[:, 1]])  # each class's first image is its smallest
    images = np.flatnonzero(nearest[mine.of] != np.iinfo(np.int64).max)
    return np.stack([in_first[images], in_second[nearest[mine.of[images]]]], axis=1)


class _Joined:
    """Pairs of classes joined so far, kept to a star a group whenever they grow past ``_CANDIDATES``:
    near copies of one image in the thousands join as many classes, not their square."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.count = 0
        self._groups: Optional[list[list[int]]] = None

    def add(self, pairs: np.ndarray) -> None:
        pairs = pairs[pairs[:, 0] != pairs[:, 1]]
        if len(pairs):
            self.parts.append(pairs)
            self.count += len(pairs)
            self._groups = None
        if self.count > _CANDIDATES:
            stars = [np.stack([np.full(len(g) - 1, g[0]), g[1:]], axis=1) for g in self.groups()]
            self.parts = [np.concatenate(stars)] if stars else []
            self.count = sum(len(p) for p in self.parts)

    def groups(self) -> list[list[int]]:
        if self._groups is None:
            self._groups = groups_of(np.concatenate(self.parts)) if self.parts else []
        return self._groups


def groups_of(pairs: np.ndarray) -> list[list[int]]:
    """The connected groups of the images ``pairs`` join, each sorted, ordered by their first image."""
    if not len(pairs):
        return []
    nodes, flat = np.unique(pairs, return_inverse=True)
    a, b = flat.reshape(-1, 2).T
    label = np.arange(len(nodes))
    while True:  # each node takes the smallest label of its neighbours, then its label's label
        low = np.minimum(label[a], label[b])
        before = label.copy()
        np.minimum.at(label, a, low)
        np.minimum.at(label, b, low)
        label = label[label]
        if np.array_equal(label, before):
            break
    order = np.argsort(label, kind="stable")
    cuts = np.flatnonzero(np.diff(label[order])) + 1
    return [nodes[part].tolist() for part in np.split(order, cuts)]


__all__ = ["cross_matches", "near_groups", "groups_of", "near_pairs", "popcount"]
