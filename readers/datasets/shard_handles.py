"""A map-style reader's open shards in one process: opened on first use, at most ``limit`` kept open
(least recently used closed first), forgotten after a fork and when pickled, so that no handle is
ever shared with another process; with each open shard its labels (views of its files) and keys."""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Optional, Protocol

import numpy as np

from packer.spec.errors import ManifestError
from packer.spec.manifest import Manifest, ShardEntry
from readers.datasets.output_files import OutputFiles


class ShardOpener(Protocol):
    """What a reader gives ``ShardHandles`` to open, check, read and close its shards."""

    manifest: Manifest
    files: OutputFiles

    def open_shard(self, shard: ShardEntry) -> Any: ...

    def close_shard(self, handle: Any) -> None: ...

    def read_labels(self, handle: Any) -> np.ndarray: ...


class ShardHandles:
    """The open shards of one reader in this process (``open``, by shard number, least recently used
    first), the ``labels`` read of them and the ``keys`` read by ``samples``."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, int(limit))
        self._forget(None)

    def _forget(self, pid: Optional[int]) -> None:
        self.open: OrderedDict[int, Any] = OrderedDict()
        self.labels: dict[int, np.ndarray] = {}  # of the open shards: views of their files (see labels_of)
        self.keys: dict[int, list[str]] = {}  # per shard, read by ``samples``: kept like the labels
        self.pid = pid

    def here(self) -> None:
        """Forget what a parent process left (a forked worker): its handles must not be used, and its
        label views may be of maps that opening a shard here unmaps (LMDB closes inherited
        environments), so they are dropped before any is read."""
        if self.pid != os.getpid():
            self._forget(os.getpid())

    def unopened(self, shards: list[int]) -> list[int]:
        """Those of ``shards`` not open in this process."""
        self.here()
        return [s for s in shards if s not in self.open]

    def get(self, shard: int, reader: ShardOpener) -> Any:
        """The open handle of ``shard``, opened by ``reader`` (closing the least recently used beyond
        ``limit``), and checked to be of the output the reader opened."""
        self.here()
        handle = self.open.get(shard)
        if handle is None:
            while len(self.open) >= self.limit:
                closed, old = self.open.popitem(last=False)
                reader.close_shard(old)
                self.labels.pop(closed, None)  # a view of the closed shard's map, which holds a file open
            handle = reader.open_shard(reader.manifest.shards[shard])
            try:
                reader.files.check_unchanged()  # after the open: the files open now are the manifest's, or this fails
            except ManifestError:
                reader.close_shard(handle)
                raise
            self.open[shard] = handle
        else:
            self.open.move_to_end(shard)
        return handle

    def labels_of(self, shard: int, reader: ShardOpener) -> np.ndarray:
        """The labels of ``shard``, read-only: a view of its mapped files (shared by every worker through
        the page cache; nothing is copied per worker, so a worker's memory does not grow with the
        dataset). Kept while the shard is open, dropped when it is closed: a map holds a file open,
        and LMDB's is unmapped with its environment, so use the view at once (index or copy it), and
        never keep it past opening another shard."""
        self.here()
        labels = self.labels.get(shard)
        if labels is None:
            labels = self.labels[shard] = reader.read_labels(self.get(shard, reader))
        return labels

    def close(self, reader: ShardOpener) -> None:
        """Close every open shard in this process."""
        if self.pid == os.getpid():
            for handle in self.open.values():
                reader.close_shard(handle)
        self._forget(self.pid)

    def __getstate__(self) -> dict:
        return {"limit": self.limit}  # another process opens its own

    def __setstate__(self, state: dict) -> None:
        self.limit = state["limit"]
        self._forget(None)


__all__ = ["ShardHandles", "ShardOpener"]
