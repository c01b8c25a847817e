"""A folder of file blocks read by ranges from a bucket, shared by processes, of bounded size.

``BlockCache(cache_dir, limit)`` keeps each block as its own file, ``cache_dir/blocks/KEY/NUMBER``
(KEY names the remote file by its SHA-256 in the manifest and the block size), written under a part
name and renamed into place once whole, so that DataLoader workers and later runs sharing the folder
never read half a block. A block whose length is not the one asked for is ignored (and fetched again).

The blocks stay near ``limit`` bytes: each process, after writing an eighth of ``limit`` since it
last looked, adds them up and, when they hold more than ``limit``, removes the blocks written
longest ago (and part files an hour old, left by killed processes) until they hold three quarters.
Several processes writing at once may together go over by what each wrote since its last look.
Nothing else in ``cache_dir`` is counted or removed: only names this module gives.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from pathlib import Path
from typing import Optional, Union

log = logging.getLogger(__name__)
PART_STALE = 3600.0  # seconds after which a part file is a killed process's leftover
FOLDER = "blocks"  # the subfolder of cache_dir that holds the blocks
_KEY = re.compile(r"[0-9a-f]{32}-\d+")  # what RangeSource names a file's blocks' folder
_BLOCK = re.compile(r"\d+|\.\d+\.[0-9a-f]{12}\.part")  # a block, or its part file


class BlockCache:
    """Blocks of remote files in ``cache_dir/blocks``, about ``limit`` bytes at most (see the module).
    Plain data: it pickles to DataLoader workers."""

    def __init__(self, cache_dir: Union[str, os.PathLike], limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"cache_limit must be a positive number of bytes, not {limit}")
        self.folder, self.limit = Path(cache_dir) / FOLDER, int(limit)
        self.written = 0  # bytes this process wrote since it last added up the folder

    def get(self, key: str, number: int, length: int) -> Optional[bytes]:
        """Block ``number`` of the file ``key`` when the folder holds it whole (``length`` bytes)."""
        try:
            with open(self.folder / key / str(number), "rb") as f:
                data = f.read(length + 1)
        except OSError:
            return None
        return data if len(data) == length else None

    def drop(self, key: str, number: int) -> None:
        """Remove block ``number`` of the file ``key`` (found damaged)."""
        (self.folder / key / str(number)).unlink(missing_ok=True)

    def put(self, key: str, number: int, data: bytes) -> None:
        """Keep block ``number`` of the file ``key``; a folder that cannot be written is only logged."""
        target = self.folder / key / str(number)
        part = target.with_name(f".{number}.{uuid.uuid4().hex[:12]}.part")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(part, "wb") as f:
                f.write(data)
            os.replace(part, target)
        except OSError as e:  # a full or read-only disk: reads go on, uncached
            part.unlink(missing_ok=True)
            log.warning("block cache %s cannot keep a block: %s", self.folder, e)
            return
        self.written += len(data)
        if self.written > self.limit // 8:
            self.trim()

    def trim(self) -> int:
        """Remove the blocks written longest ago while the folder holds more than ``limit`` bytes, down
        to three quarters of it, and stale part files. Returns the bytes the folder holds after."""
        self.written = 0
        now, blocks, total = time.time(), [], 0
        for sub in _entries(self.folder):
            if not _KEY.fullmatch(sub.name):
                continue
            for entry in _entries(sub):
                if not _BLOCK.fullmatch(entry.name):
                    continue
                try:
                    stat = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if entry.name.endswith(".part"):
                    if now - stat.st_mtime > PART_STALE:
                        Path(entry.path).unlink(missing_ok=True)
                    continue
                blocks.append((stat.st_mtime, stat.st_size, entry.path))
                total += stat.st_size
        if total <= self.limit:
            return total
        blocks.sort()
        for _, size, path in blocks:
            if total <= self.limit * 3 // 4:
                break
            try:
                os.unlink(path)
            except OSError:  # another process removed it first
                continue
            total -= size
        log.info("block cache %s trimmed to %d bytes", self.folder, total)
        return total


def _entries(folder: Union[str, os.PathLike]) -> list[os.DirEntry]:
    """The entries of ``folder`` (none when it is missing or unreadable)."""
    try:
        with os.scandir(folder) as it:
            return list(it)
    except OSError:
        return []
