"""The blocks of remote files kept in this process's memory (``MEMORY``), for ``readers.remote.ranges``:
least recently used dropped past a limit, each request's answer counted once, whole, however many
of its blocks are views of it."""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from typing import Any, Optional, Union

Buffer = Union[bytes, memoryview]
"""Bytes as ranges are read: a block, or a view of one (read-only either way)."""
MEMORY_LIMIT = 256 << 20
"""Bytes of blocks kept in each process's memory (least recently used dropped first)."""


class BlockMemory:
    """This process's blocks of every RangeSource, least recently used dropped past ``limit`` bytes.

    A block may be a view of a larger answer (a run of neighbouring blocks asked for in one request),
    which stays in memory while any of its blocks does: ``held`` counts each answer once, whole, and
    an answer's blocks go together when the oldest of them goes (one alone frees nothing), so the
    limit bounds the memory really held."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0
        self.blocks: OrderedDict[tuple[str, int], Buffer] = OrderedDict()
        self.answers: dict[int, tuple[bytes, set]] = {}
        """The answers the kept blocks are in, by id: the answer (held, so its id is not another's)
        and the keys of its blocks kept."""
        self.batch: dict[tuple[str, int], Buffer] = {}
        """The blocks of the last ``fetch_all``, held whatever the limit until the next: a batch larger
        than the memory is still read from one round of requests."""
        self.spans: dict[str, list[tuple[int, int, bytes]]] = {}
        """The answers of the last ``fetch_all`` cut to its samples' bytes, by file key, as ``(start,
        end, bytes)``: held until the next, as ``batch``, and not as blocks (each begins or ends
        inside one)."""
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
        """Bytes ``[start, end)`` of the file ``key`` from an answer of the last batch that holds them
        all (a view, no copy), or None."""
        for first, last, data in self.spans.get(key, ()):
            if first <= start and end <= last:
                return memoryview(data).toreadonly()[start - first : end - first]
        return None

    def drop_spans(self, key: str) -> None:
        """Forget the last batch's answers of the file ``key`` (one failed a check)."""
        self.spans.pop(key, None)

    def drop(self, key: tuple[str, int]) -> None:
        with self.lock:
            self.batch.pop(key, None)
            data = self.blocks.pop(key, None)
            if data is not None:
                self._release(key, data)

    def put(self, key: tuple[str, int], data: Buffer) -> None:
        with self.lock:
            if key in self.blocks:
                return
            self.blocks[key] = data
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

    def _release(self, key: tuple[str, int], data: Buffer) -> None:
        """The block ``key`` is no longer kept: its answer's bytes no longer count once none of its
        blocks is."""
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
