"""The blocks of remote files kept in this process's memory (``MEMORY``), for ``readers.remote.ranges``:
least recently used dropped past a limit, each request's answer counted once, whole, however many
of its blocks are views of it."""

from __future__ import annotations

import bisect
import os
import sys
import threading
import weakref
from collections import OrderedDict
from typing import Any, Optional, Union

Buffer = Union[bytes, memoryview]
"""Bytes as ranges are read: a block, or a view of one (read-only either way)."""
MEMORY_LIMIT = 256 << 20
"""Bytes of blocks kept in each process's memory (least recently used dropped first)."""
CUT_LOOKBACK = 4
"""The kept cut answers starting at or before a read's start that ``cut_answer`` looks at (answers
of two batches may overlap; one missed is asked for again, never read wrong)."""


class BlockMemory:
    """This process's blocks of every RangeSource, least recently used dropped past ``limit`` bytes.

    A block may be a view of a larger answer (a run of neighbouring blocks asked for in one request),
    which stays in memory while any of its blocks does: ``held`` counts each answer once, whole, and
    an answer's blocks go together when the oldest of them goes (one alone frees nothing), so the
    limit bounds the memory really held."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0
        self.blocks: OrderedDict[tuple, Buffer] = OrderedDict()
        """The kept blocks by ``(file key, number)``, and the kept cut answers (``put_span``) by
        ``(file key, start, end)``, least recently used first."""
        self.answers: dict[int, tuple[bytes, set]] = {}
        """The answers the kept blocks are in, by id: the answer (held, so its id is not another's)
        and the keys of its blocks kept."""
        self.batch: dict[tuple[str, int], Buffer] = {}
        """The blocks of the last ``fetch_all``, held whatever the limit until the next: a batch larger
        than the memory is still read from one round of requests."""
        self.spans: dict[str, list[tuple[int, int, bytes]]] = {}
        """The answers of the last ``fetch_all`` cut to its samples' bytes (each begins or ends inside
        a block, so is no block), by file key, as ``(start, end, bytes)``: held until the next, as
        ``batch``."""
        self.cuts: dict[str, list[tuple[int, int]]] = {}
        """The ``(start, end)`` of the kept cut answers of each file key, sorted: where ``span`` looks."""
        self.lock = threading.Lock()
        _MEMORIES.add(self)

    def get(self, key: tuple[str, int]) -> Optional[Buffer]:
        with self.lock:
            data = self.batch.get(key)
            if data is not None:
                return data
            data = self.blocks.get(key)
            if data is not None:
                self.blocks.move_to_end(key)
            return data

    def span(self, key: str, start: int, end: int) -> Optional[memoryview]:
        """Bytes ``[start, end)`` of the file ``key`` from a cut answer that holds them all, the last
        batch's or a kept one (a view, no copy), or None."""
        found = self.cut_answer(key, start, end)
        return None if found is None else memoryview(found[2]).toreadonly()[start - found[0] : end - found[0]]

    def cut_answer(self, key: str, start: int, end: int) -> Optional[tuple[int, int, bytes]]:
        """The cut answer ``(first, last, bytes)`` of the file ``key`` that holds its bytes ``[start,
        end)``: the last batch's, else a kept one (then used: the last to go), or None."""
        for first, last, data in self.spans.get(key, ()):
            if first <= start and end <= last:
                return first, last, data
        with self.lock:
            kept = self.cuts.get(key)
            if not kept:
                return None
            at = bisect.bisect_right(kept, (start, sys.maxsize))
            # answers of two batches may overlap: the few that start before ``start`` are looked at
            for first, last in kept[max(0, at - CUT_LOOKBACK) : at][::-1]:
                if end <= last:
                    data = self.blocks[key, first, last]
                    self.blocks.move_to_end((key, first, last))
                    return first, last, data  # type: ignore[return-value]
        return None

    def put_span(self, key: str, start: int, end: int, data: bytes) -> None:
        """Keep the cut answer ``data``, the bytes ``[start, end)`` of the file ``key``, as a block
        is kept (least recently used dropped past the limit, its bytes counted once with the blocks
        that are views of it)."""
        self.put((key, start, end), data)

    def drop_spans(self, key: str) -> None:
        """Forget the cut answers of the file ``key``, the last batch's and those kept (one failed a check)."""
        self.spans.pop(key, None)
        with self.lock:
            for first, last in list(self.cuts.get(key, ())):
                self._release((key, first, last), self.blocks.pop((key, first, last)))

    def drop(self, key: tuple[str, int]) -> None:
        with self.lock:
            self.batch.pop(key, None)
            data = self.blocks.pop(key, None)
            if data is not None:
                self._release(key, data)

    def put(self, key: tuple, data: Buffer) -> None:
        with self.lock:
            if key in self.blocks:
                return
            self.blocks[key] = data
            if len(key) == 3:  # a cut answer: found by its place in the file
                bisect.insort(self.cuts.setdefault(key[0], []), key[1:])
            answer = _answer_of(data)
            kept = self.answers.setdefault(id(answer), (answer, set()))
            if not kept[1]:
                self.held += len(answer)
            kept[1].add(key)
            while self.held > self.limit and len(self.blocks) > 1:
                oldest = next(iter(self.blocks.values()))  # never ``key``'s, the newest, while others are
                for other in list(self.answers[id(_answer_of(oldest))][1]):  # the whole answer goes
                    if other != key:  # but the block being put
                        self._release(other, self.blocks.pop(other))

    def _release(self, key: tuple, data: Buffer) -> None:
        """The block ``key`` is no longer kept: its answer's bytes no longer count once none of its
        blocks is."""
        if len(key) == 3:
            kept = self.cuts[key[0]]
            kept.remove(key[1:])
            if not kept:
                del self.cuts[key[0]]
        answer = _answer_of(data)
        kept = self.answers[id(answer)][1]
        kept.discard(key)
        if not kept:
            del self.answers[id(answer)]
            self.held -= len(answer)


def _answer_of(block: Buffer) -> Any:
    """The answer a block is a view of (itself, where it is one)."""
    return block.obj if isinstance(block, memoryview) else block


_MEMORIES: weakref.WeakSet = weakref.WeakSet()
"""Every BlockMemory of this process, whose locks a fork makes anew."""

MEMORY = BlockMemory(MEMORY_LIMIT)
"""The blocks of this process (a forked DataLoader worker starts with a copy of its parent's: the
same bytes, keyed by file SHA-256)."""


def _new_locks() -> None:
    for memory in list(_MEMORIES):  # a fork may copy a lock held by another thread of the parent
        memory.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks)


__all__ = ["BlockMemory", "Buffer", "MEMORY", "MEMORY_LIMIT"]
