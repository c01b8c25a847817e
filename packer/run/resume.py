"""Resuming an interrupted conversion: the plan's fingerprint, and which finished shards still hold.

``--resume`` continues from the shards an interrupted run recorded in its staging folder; these
decide which of them are kept (their options, plan and source files unchanged) and which are
written again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict
from typing import Sequence

from packer import __version__
from packer.config import ConvertConfig
from packer.records import SOURCE_DIGEST, ShardResult, ShardTask, SourceItem
from packer.sources.item_table import ItemTable
from packer.sources.source_stamps import files_stamp, sources_digest
from packer.spec.text import TextConfig

log = logging.getLogger(__name__)


SOURCES_PER_SHARD = "per-shard"
"""The plan record's ``sources`` when the workers stamp each shard's source files (``source_stamps.sources_digest``)
and the fingerprint covers only options and plan. Plans without it (older packers', and split runs',
whose nodes must all see the same files) have each file's stamp in the fingerprint, taken before
any worker started."""


FINGERPRINT_BLOCK = 8192
"""Items of an ``ItemTable`` whose lines are hashed at a time."""


def plan_fingerprint(
    config: ConvertConfig, tasks: list[ShardTask], strict: bool = False, stamps: bool = False, extra: str = ""
) -> str:
    """SHA-256 of everything that decides the output but the source files' contents: options and
    shard plan (each sample's index, key, label and fields), and ``extra`` (the annotations of a
    detection output). With ``stamps``, also each source file's size, inode and modification and
    change times, as older packers recorded it (the same bytes: their interrupted runs still resume)."""
    h = hashlib.sha256()
    preprocess = config.preprocess.to_dict()
    if preprocess.get("geometry") == "fractional":
        del preprocess["geometry"]  # what runs of packers before --geometry recorded: they still resume
    options = {
        "format": config.format,
        "preprocess": preprocess,
        "strict": strict,
        "shard_size": config.shard_size.describe(),
        "shuffle": config.shuffle,
        "codec": config.codec.to_dict(),
    }
    if config.text != TextConfig():  # absent for image outputs, so their fingerprints stay as they were
        options["text"] = {**asdict(config.text), "tokenizer": config.text.tokenizer_info()}
    if config.detection is not None:  # absent otherwise, so that other fingerprints stay as they were
        options["detection"] = {**asdict(config.detection), "path": None, "targets": extra}
    if config.masks is not None:
        options["masks"] = {**asdict(config.masks), "folder": None, "files": extra}
    if not config.image_hashes:  # absent otherwise: shards' records then carry the hashes
        options["image_hashes"] = False
    if config.drop_duplicates:  # which samples the shards hold, and at what distance they were compared
        options["drop_duplicates"] = config.dup_distance
    h.update(json.dumps(options, sort_keys=True).encode())
    scattered: dict[int, ItemTable] = {}
    for task in tasks:
        h.update(task.name.encode())
        if stamps:
            lines = [f"\0{item.index}\0{item.relpath}\0{item.label}\0{files_stamp(item)}" for item in task.items]
            h.update("".join(lines).encode())
        elif isinstance(task.items, ItemTable) and task.items.scattered:
            # A shuffled plan: its rows, then (below) the table they pick from, read in order once.
            # Reading each item where the shard wants it would decompress a block per item.
            h.update(b"\0rows\0" + task.items.row_bytes())
            whole = task.items.whole()
            scattered.setdefault(id(whole.records), whole)
        else:
            hash_plan_lines(h, task.items)
    for whole in scattered.values():
        h.update(b"\0table\0")
        hash_plan_lines(h, whole)
    return h.hexdigest()


def hash_plan_lines(h, items: Sequence[SourceItem]) -> None:
    """Hash ``items``' plan lines (each one's index, key, label and fields): of an ``ItemTable``
    without an object per item, ``FINGERPRINT_BLOCK`` items at a time (a shard may be huge); of other
    items in one update, the same bytes as one per item in less time (``packer.run.early_start`` compares
    shards by them too)."""
    if not isinstance(items, ItemTable):
        h.update("".join(f"\0{it.index}\0{it.relpath}\0{it.label}\0{it.fields_stamp}" for it in items).encode())
        return
    for a in range(0, len(items), FINGERPRINT_BLOCK):
        h.update(items[a : a + FINGERPRINT_BLOCK].plan_lines().encode())


def plan_record(fingerprint: str, workers: int) -> dict:
    """The plan record a new staging folder starts with (``output.write_plan``): what --resume must find
    unchanged, with per-shard source stamps and the packer that made it."""
    return {"fingerprint": fingerprint, "workers": workers, "sources": SOURCES_PER_SHARD, "packer": __version__}


def current_digests(finished: dict[str, ShardResult]) -> dict[str, ShardResult]:
    """The ``finished`` shards whose source digests are this packer's (``records.SOURCE_DIGEST``).
    The others, recorded by an older packer, are written again, so that every digest of the run
    can be compared for the duplicate report."""
    kept = {}
    for name, result in finished.items():
        if result.digest == SOURCE_DIGEST:
            kept[name] = result
        else:
            log.warning("%s: recorded by an older packer (%s source digests); writing it again", name, result.digest)
    return kept


def current_hashes(finished: dict[str, ShardResult]) -> dict[str, ShardResult]:
    """The ``finished`` shards whose image hashes (if any) are of this packer's rule
    (``packer.pixels.looks.HASH_KIND``). The others are written again, so that one output's
    ``image_hashes.npy`` never holds rows of two rules (compared, they would match nothing)."""
    from packer.pixels.looks import HASH_KIND

    kept = {}
    for name, result in finished.items():
        if result.looks is None or result.looks_kind == HASH_KIND:
            kept[name] = result
        else:
            log.warning("%s: its images were hashed by another rule (%s); writing it again", name, result.looks_kind)
    return kept


def current_layout(finished: dict[str, ShardResult], version: int) -> dict[str, ShardResult]:
    """The ``finished`` shards written at on-disk format ``version``, the one this run writes. The
    others (an older packer's: hdf5 keys in the global heap, lmdb files without their structure
    checksum) are written again, so that one output never holds two layouts."""
    kept = {}
    for name, result in finished.items():
        if result.format_version == version:
            kept[name] = result
        else:
            log.warning(
                "%s: written at another format version (%s, this run writes %d); writing it again",
                name,
                result.format_version or "before packer 0.3.0",
                version,
            )
    return kept


def unchanged_sources(finished: dict[str, ShardResult], tasks: list[ShardTask]) -> dict[str, ShardResult]:
    """The ``finished`` shards whose source files are as their worker found them (size, times,
    inode; see ``source_stamps.sources_digest``). The others are written again, from the files as they are
    now, as an uninterrupted run would; so is a shard recorded without stamps."""
    kept = {}
    for task in tasks:
        result = finished.get(task.name)
        if result is None:
            continue
        if result.sources and result.sources == sources_digest(task.items):
            kept[task.name] = result
        else:
            log.warning("%s: its source files changed since the interrupted run; writing it again", task.name)
    return kept
