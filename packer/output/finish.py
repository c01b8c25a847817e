"""A conversion's last steps in its staging folder, once every shard is written: the shards left
without samples removed, the others given names unique to the output, then the manifest and the
files made from it.

A shard is planned as ``shard-NNNNN`` and published as ``shard-NNNNN-TAG``: ``NNNNN`` counts only
shards that hold samples, and ``TAG`` is a digest of the content of the shards written together
(all of a conversion's; an append's new ones). Caches that key a shard by its file name (``wids`` with a shared
``cache_dir``, webdataset's) can then never hand back one output's shard for another's, while a
conversion of the same files with the same options still gives byte-identical files and names.
A shard with no samples (every file of its run was skipped) is not published: an empty tar is a
file other loaders fail on (DALI's ``wds2idx``) or misread.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from packer.output.files import record_renamed
from packer.output.report import REPORT_NAME, write_report
from packer.records import ShardResult
from packer.spec.manifest import Manifest, write_manifest
from packer.spec.registry import get_format
from packer.system import stop_signals_held

TAG_LENGTH = 12
"""Hex digits of the content tag in published shard names (48 bits)."""


def content_tag(results: list[ShardResult]) -> str:
    """The tag of an output whose shards are ``results``: SHA-256 over each file's SHA-256, in order."""
    h = hashlib.sha256()
    for r in results:
        for f in r.files:
            h.update(f.sha256.encode("ascii"))
    return h.hexdigest()[:TAG_LENGTH]


def published_name(position: int, tag: str) -> str:
    """The published name of the ``position``-th shard that holds samples."""
    return f"shard-{position:05d}-{tag}"


def name_shards(
    stage: Path,
    results: list[ShardResult],
    planned: list[str],
    first: int = 0,
    move: Optional[Callable[[str, str], None]] = None,
) -> list[ShardResult]:
    """Delete the files of the shards without samples and rename the others' to their published
    names (see the module), numbered from ``first`` (an append's follow the output's), returning the
    results as they now are (an empty shard with no files). ``move(old, new)`` renames a file (paths
    relative to ``stage``): by default in ``stage``; ``Staging.move`` also where it was uploaded.

    Each shard's rename is recorded for ``--resume`` (``output.record_renamed``, beside its record
    under its ``planned`` name) as soon as its files are renamed, so an interrupted rename leaves at
    most one shard to write again. Results
    already renamed by an interrupted run are renamed again only where their name changed."""
    tag = content_tag([r for r in results if r.samples])
    named = []
    position = first
    with stop_signals_held():
        for plan_name, result in zip(planned, results):
            if not result.samples:
                for f in result.files:
                    (stage / f.path).unlink(missing_ok=True)
                renamed = replace(result, files=[])
            else:
                name = published_name(position, tag)
                position += 1
                files = []
                for f in result.files:
                    if not f.path.startswith(result.name):
                        raise ValueError(f"{f.path} does not start with its shard's name {result.name}")
                    path = name + f.path[len(result.name) :]
                    if path != f.path:
                        if move is None:
                            os.replace(stage / f.path, stage / path)
                        else:
                            move(f.path, path)
                    files.append(replace(f, path=path))
                renamed = replace(result, name=name, files=files)
            if renamed != result:
                record_renamed(stage, plan_name, renamed)
            named.append(renamed)
    return named


def write_output(stage: Path, manifest: Manifest) -> None:
    """Write the files made from ``manifest`` into ``stage``: the format's own (other loaders' shard
    lists), ``report.txt``, and the manifest itself."""
    for name, data in get_format(manifest.format).files_of_output(manifest).items():
        (stage / name).write_bytes(data)
    write_report(stage / REPORT_NAME, manifest)
    write_manifest(stage, manifest)
