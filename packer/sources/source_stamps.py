"""What a worker records of a shard's source files: the digest of each sample's bytes (to find
identical files) and the stamps of its files (size, times, inode), hashed per shard for --resume."""

from __future__ import annotations

import hashlib
import os
from typing import Iterable, Optional

import xxhash

from packer.records import SourceItem
from packer.spec.file_stamp import MISSING_SOURCE_TEXT, FileStamp
from packer.spec.file_stamp import stat_or_none as source_stat


def source_digest(data: bytes) -> str:
    """XXH3-128 of a source file's bytes (``records.SOURCE_DIGEST``), to find identical files. It
    runs once per file in the hot path, where a SHA-256 costs many times as much, even with the
    CPU's SHA instructions. Identical bytes is all the duplicate report needs: no one gains by
    forging a collision there."""
    return xxhash.xxh3_128_hexdigest(data)


def source_stamp(path: str, st: Optional[os.stat_result] = None) -> str:
    """What --resume compares of a source file: its ``FileStamp.as_source_text`` (of ``st``, its
    os.stat, when the caller took it)."""
    st = st or source_stat(path)
    return MISSING_SOURCE_TEXT if st is None else FileStamp.of(st).as_source_text()


def files_stamp(item: SourceItem, st: Optional[os.stat_result] = None) -> str:
    """The stamps of one sample's files, a paired sample's followed by its fields' names (``st``: an
    image-only sample's os.stat, when the caller took it)."""
    if item.parts:
        return "/".join(map(source_stamp, item.paths)) + item.fields_stamp
    return source_stamp(item.path, st)


def item_stamp(item: SourceItem, st: Optional[os.stat_result] = None) -> bytes:
    """One sample's line in its shard's ``sources_digest``: its index and ``files_stamp``."""
    return f"\0{item.index}\0{files_stamp(item, st)}".encode()


def sources_digest(items: Iterable[SourceItem]) -> str:
    """SHA-256 of the stamps of ``items``' files, as the worker writing their shard records it
    (``ShardResult.sources``): --resume writes a finished shard again when it differs."""
    h = hashlib.sha256()
    for item in items:
        h.update(item_stamp(item))
    return h.hexdigest()
