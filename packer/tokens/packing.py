"""Documents into blocks: the two packings of ``--pack-mode``, as plans of which tokens each block holds.

``concat``: the documents (in order, or in a seeded shuffled order) form one stream; block ``i`` is
``stream[i * block : i * block + block + 1]``, so consecutive blocks share one token (the last
target of one is the first input of the next) and no token is lost, at a shard's end either. The
last block keeps its true length. A shard's stream is the slice of the corpus its blocks cover.

``best-fit``: each document whole in one block where it fits (best-fit decreasing: the longest
first, each into the open block it leaves the least room in); a document longer than a block is
cut into full blocks overlapping by one token, as concat cuts the stream, and its remainder is
placed like a document, but first in its block and only in a block that holds no other remainder:
the label of the position before a run is the run's first id, and a remainder's first id is the
middle of a document, which no end-of-text token should learn to predict. A block's unused
positions are padding.

A plan is ``Piece`` runs per block (a document's ids from ``start``, ``length`` of them): the
shard writer gathers them from the tokenized corpus, so the plan holds no token itself.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from packer.spec.errors import ConfigError
from packer.spec.token_blocks import MAX_SHARD_TOKENS


@dataclass
class ShardPlan:
    """One shard of a plan: its stream as ``(document, start, length)`` pieces of the documents (N x 3
    int64, in stream order; each piece's start is where position ids restart) and its blocks'
    ``(start, length)`` in that stream (M x 2 int64)."""

    pieces: np.ndarray
    spans: np.ndarray

    @property
    def blocks(self) -> int:
        """The blocks of this shard."""
        return len(self.spans)

    @property
    def tokens(self) -> int:
        """The length of this shard's stream."""
        return int(self.pieces[:, 2].sum())


@dataclass
class PackPlan:
    """Where every block's tokens come from, shard by shard, and how many positions are padding."""

    shards: list[ShardPlan]
    block: int
    stored: int
    padding: int

    @property
    def blocks(self) -> int:
        """Blocks in all shards."""
        return sum(s.blocks for s in self.shards)


def document_order(count: int, seed: Optional[int]) -> np.ndarray:
    """The order documents are packed in: as read, or a permutation drawn from ``seed``."""
    if seed is None:
        return np.arange(count, dtype=np.int64)
    return np.random.default_rng(seed).permutation(count).astype(np.int64)


def concat_plan(lengths: np.ndarray, order: np.ndarray, block: int, blocks_per_shard: int) -> PackPlan:
    """The concat plan of documents of ``lengths`` taken in ``order`` (see the module)."""
    lengths = np.asarray(lengths, np.int64)[order]
    total = int(lengths.sum())
    count = -(-(total - 1) // block) if total > 1 else (1 if total else 0)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    shards = []
    for first in range(0, count, blocks_per_shard):
        last = min(first + blocks_per_shard, count)
        lo, hi = first * block, min(last * block + 1, total)  # the shard's stream slice
        shards.append(_slice_plan(lo, hi, starts, ends, order, first, last, block))
    stored = sum(s.tokens for s in shards)
    return PackPlan(shards, block, stored, count * (block + 1) - _block_tokens(total, count, block))


def _block_tokens(total: int, count: int, block: int) -> int:
    """The positions that hold a token in ``count`` concat blocks of a ``total``-token stream."""
    if not count:
        return 0
    return (count - 1) * (block + 1) + (total - (count - 1) * block)


def _slice_plan(
    lo: int, hi: int, starts: np.ndarray, ends: np.ndarray, order: np.ndarray, first: int, last: int, block: int
) -> ShardPlan:
    """A concat shard: the pieces of the documents that overlap the stream slice ``[lo, hi)``, as one
    run of pieces for the whole slice (its blocks are cut from it by position)."""
    a = int(np.searchsorted(ends, lo, side="right"))
    b = int(np.searchsorted(starts, hi, side="left"))
    docs = np.arange(a, b)
    piece_start = np.maximum(starts[docs], lo) - starts[docs]
    piece_end = np.minimum(ends[docs], hi) - starts[docs]
    pieces = np.stack([order[docs], piece_start, piece_end - piece_start], axis=1).astype(np.int64)
    if hi - lo > MAX_SHARD_TOKENS:
        raise ConfigError(f"a shard of {hi - lo} tokens is beyond uint32 positions; use a smaller --shard-size")
    begin = np.arange(last - first, dtype=np.int64) * block
    return ShardPlan(pieces, np.stack([begin, np.minimum(block + 1, hi - lo - begin)], axis=1))


def split_document(length: int, block: int) -> Iterator[tuple[int, int]]:
    """``(start, length)`` of the pieces a document of ``length`` ids is cut into for blocks of
    ``block`` inputs: the whole document when it fits in ``block + 1``; otherwise full blocks of
    ``block + 1`` overlapping by one, then the rest (which shares its first id with the last full one)."""
    if length <= block + 1:
        yield 0, length
        return
    start = 0
    while length - start > block + 1:
        yield start, block + 1
        start += block
    if length - start > 1:  # a single id left was already the last full piece's last target
        yield start, length - start


def best_fit_plan(lengths: np.ndarray, order: np.ndarray, block: int, blocks_per_shard: int) -> PackPlan:
    """The best-fit decreasing plan of documents of ``lengths`` (see the module); ``order`` breaks
    ties between equally long documents, so a shuffled order gives another placement."""
    room = block + 1
    full: list[list[tuple[int, int, int]]] = []  # a long document's full pieces, one block each
    rest: list[tuple[int, int, int]] = []
    for doc in order.tolist():
        for start, length in split_document(int(lengths[doc]), block):
            (full.append([(doc, start, length)]) if length == room else rest.append((doc, start, length)))
    rank = {doc: i for i, doc in enumerate(order.tolist())}
    rest.sort(key=lambda p: (-p[2], rank[p[0]], p[1]))
    bins: list[list[tuple[int, int, int]]] = []
    plain, continued = _OpenBins(), _OpenBins()  # open bins without, and with, a document's remainder
    for piece in rest:
        remainder = piece[1] > 0  # the rest of a long document: first, in a block without another
        fits = [
            (free, kind)
            for kind in ((plain,) if remainder else (plain, continued))
            if (free := kind.smallest(piece[2]))
        ]
        if fits:
            free, kind = min(fits, key=lambda fit: fit[0])
            free, b = kind.take(free)
        else:
            free, b, kind = room, len(bins), plain
            bins.append([])
        if remainder:
            bins[b].insert(0, piece)
        else:
            bins[b].append(piece)
        if free > piece[2]:
            (continued if remainder or kind is continued else plain).add(free - piece[2], b)
    blocks = full + bins
    stored = sum(p[2] for blk in blocks for p in blk)
    shards = []
    for first in range(0, len(blocks), blocks_per_shard):
        part = blocks[first : first + blocks_per_shard]
        pieces = np.array([p for blk in part for p in blk], np.int64).reshape(-1, 3)
        sizes = np.array([sum(p[2] for p in blk) for blk in part], np.int64)
        if int(sizes.sum()) > MAX_SHARD_TOKENS:
            raise ConfigError("a shard's tokens are beyond uint32 positions; use a smaller --shard-size")
        shards.append(ShardPlan(pieces, np.stack([np.cumsum(sizes) - sizes, sizes], axis=1)))
    return PackPlan(shards, block, stored, len(blocks) * room - stored)


class _OpenBins:
    """Open bins by their free room, for best-fit: the smallest room that takes a piece, in O(log n)."""

    def __init__(self) -> None:
        self.rooms: list[int] = []  # distinct free rooms, sorted
        self.by_room: dict[int, list[int]] = {}

    def smallest(self, length: int) -> Optional[int]:
        """The smallest free room of an open bin that holds ``length`` ids, or None."""
        i = bisect.bisect_left(self.rooms, length)
        return self.rooms[i] if i < len(self.rooms) else None

    def take(self, free: int) -> tuple[int, int]:
        """``(free, bin)``: an open bin of room ``free``, no longer open here."""
        b = self.by_room[free].pop()
        if not self.by_room[free]:
            del self.by_room[free]
            self.rooms.pop(bisect.bisect_left(self.rooms, free))
        return free, b

    def add(self, free: int, b: int) -> None:
        """Bin ``b`` open with room ``free``."""
        if free not in self.by_room:
            bisect.insort(self.rooms, free)
            self.by_room[free] = []
        self.by_room[free].append(b)


__all__ = ["ShardPlan", "PackPlan", "document_order", "concat_plan", "best_fit_plan", "split_document"]
