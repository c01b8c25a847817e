"""Shards of existing outputs placed in a staging folder as they are (``packer combine``,
``--append``): hard-linked where allowed, copied otherwise, checked against their manifest; and
the names a combined manifest gives its inputs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from packer import __version__
from packer.records import ShardResult
from packer.spec.entries import FileEntry
from packer.spec.errors import OutputError
from packer.spec.listed_files import sha256_of
from packer.spec.manifest import Manifest, ShardEntry
from packer.spec.shard_names import LMDB_SUFFIX


def place_shard(stage: Path, root: Path, shard: ShardEntry, planned: str, link: bool) -> ShardResult:
    """One input shard's files in ``stage`` under the planned name, hard-linked where allowed (LMDB
    files are copied: py-lmdb refuses to open one file twice in a process, and a link is the same file,
    so a reader of the input and one of the result could not live in one process)."""
    files = []
    for f in shard.files:
        path = planned + f.path[len(shard.name) :]
        source, target = root / f.path, stage / path
        if link and not f.path.endswith(LMDB_SUFFIX):
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
        else:
            shutil.copyfile(source, target)
        if target.stat().st_size != f.bytes:
            raise OutputError(
                f"{source} is {target.stat().st_size} bytes, its manifest says {f.bytes}: run packer verify {root}"
            )
        files.append(FileEntry(path, f.bytes, f.sha256, f.structure_crc32))
    return ShardResult(planned, shard.samples, files, image_sources=dict(shard.image_sources or {}))


def input_names(roots: list[Path]) -> list[str]:
    """How the combined manifest names each input: its folder's name, numbered (``NAME#1``, from 1
    in input order) when two inputs' folders have the same name (never a path: an output holds none)."""
    plain = [r.name for r in roots]
    return plain if len(set(plain)) == len(plain) else [f"{name}#{n}" for n, name in enumerate(plain, start=1)]


def combine_entry(names: list[str], roots: list[Path], manifests: list[Manifest], samples: int) -> dict:
    """The history entry of a combine: each input's name, samples, format version, manifest SHA-256
    and own history."""
    return {
        "action": "combine",
        "packer_version": __version__,
        "samples": samples,
        "inputs": [
            {
                "name": name,
                "samples": m.samples,
                "format_version": m.format_version,
                "manifest_sha256": sha256_of(root / "manifest.json"),
                **({"history": m.history} if m.history else {}),
            }
            for name, root, m in zip(names, roots, manifests)
        ],
    }


__all__ = ["place_shard", "input_names", "combine_entry"]
