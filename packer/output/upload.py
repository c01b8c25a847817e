"""An output written to object storage (``packer convert SRC -o s3://bucket/prefix``): a finished local
output uploaded under a URL so that no reader ever sees it half written.

The steps: the prefix is checked (an output there is replaced only with ``overwrite``; other objects
without a manifest are refused) and a lock object written (``.packer-lock``, refused while another
run's is younger than ``LOCK_LEASE``); every file but the manifests is uploaded, in parallel, and read
back to compare its size and SHA-256 with what was written; then each ``manifest.json`` (and a split
set's ``splits.json``) last, so a prefix without one is never an output; then, with ``overwrite``,
the objects of the replaced output that the new one does not list are removed, and the lock.
Credentials and endpoint are fsspec's backend's own (for ``s3://``: the standard AWS variables,
``AWS_ENDPOINT_URL`` included).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

from packer.spec.errors import OutputError
from packer.spec.manifest import MANIFEST_NAME

LOCK_NAME = ".packer-lock"
LOCK_LEASE = 3600.0
"""Seconds a lock object holds off other runs; an older one is a killed run's."""
LAST = (MANIFEST_NAME, "splits.json")
"""Files uploaded after all the others, in this order: what makes the prefix an output."""
UPLOADS = 4
"""Files uploaded at once."""


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path in it; OutputError when no backend can write it."""
    try:
        import fsspec

        return fsspec.core.url_to_fs(url)
    except ImportError as e:
        raise OutputError(
            f"writing {url} needs fsspec's backend for it: {e} (pip install 'packer-datasets[s3]')"
        ) from None
    except ValueError as e:
        raise OutputError(f"cannot write {url}: {e}") from None


def check_destination(url: str, overwrite: bool) -> None:
    """OutputError, before any work, when ``url`` cannot take an output: one is there and ``overwrite``
    is not given, other objects are there without a manifest, or another run holds its lock."""
    fs, root = filesystem(url)
    names = _names(fs, root)
    if any(n in names for n in LAST):
        if not overwrite:
            raise OutputError(f"{url} already holds a packer output; pass --overwrite to replace it")
    elif names - {LOCK_NAME}:
        stale = LOCK_NAME in names and _lock_age(fs, root) > LOCK_LEASE
        if not (overwrite and stale):
            raise OutputError(
                f"{url} holds objects but no manifest.json: it is not a packer output, refusing to write there "
                "(a killed upload's leftovers are replaced with --overwrite once its lock is an hour old)"
            )
    if LOCK_NAME in names and _lock_age(fs, root) <= LOCK_LEASE:
        raise OutputError(
            f"another conversion is writing {url} (its lock {url}/{LOCK_NAME} is {_lock_age(fs, root):.0f} s old); "
            "wait for it, or remove the lock object if that run died"
        )


def upload_output(local: Path, url: str, overwrite: bool, progress: Optional[Callable[[int], None]] = None) -> int:
    """Upload the finished output (or split set) in ``local`` to ``url`` as the module says; returns the
    bytes uploaded. ``progress`` gets each file's bytes once it is uploaded and checked."""
    check_destination(url, overwrite)
    fs, root = filesystem(url)
    old = _names(fs, root) - {LOCK_NAME}
    fs.pipe_file(
        f"{root}/{LOCK_NAME}",
        json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}).encode(),
    )
    try:
        files = sorted(p for p in local.rglob("*") if p.is_file())
        relative = {p: p.relative_to(local).as_posix() for p in files}
        first = [p for p in files if p.name not in LAST]
        last = sorted((p for p in files if p.name in LAST), key=lambda p: (LAST.index(p.name), relative[p]))

        def put(path: Path) -> int:
            target = f"{root}/{relative[path]}"
            fs.put_file(str(path), target)
            _check_uploaded(fs, path, target, url)
            if progress is not None:
                progress(path.stat().st_size)
            return path.stat().st_size

        with ThreadPoolExecutor(UPLOADS) as pool:
            sent = sum(pool.map(put, first))
        sent += sum(put(p) for p in last)  # one by one, after every shard: the output appears whole
        if overwrite:
            for name in sorted(old - set(relative.values())):
                fs.rm_file(f"{root}/{name}")  # the replaced output's objects, once the new manifest is in place
    finally:
        fs.rm_file(f"{root}/{LOCK_NAME}")
    return sent


def _check_uploaded(fs: Any, path: Path, target: str, url: str) -> None:
    """OutputError unless the object ``target`` reads back as ``path``: its size, then its SHA-256."""
    size = path.stat().st_size
    found = fs.info(target).get("size")
    if found != size:
        raise OutputError(f"{url}: {target} is {found} bytes after its upload, not {size}; run the conversion again")
    local, remote = hashlib.sha256(), hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            local.update(block)
    with fs.open(target, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            remote.update(block)
    if local.digest() != remote.digest():
        raise OutputError(f"{url}: {target} reads back other bytes than were uploaded; run the conversion again")


def _names(fs: Any, root: str) -> set[str]:
    """The objects under ``root``, relative to it, as the store has them now (not a cached listing)."""
    fs.invalidate_cache(root)
    try:
        found = fs.find(root)
    except FileNotFoundError:
        return set()
    prefix = root.rstrip("/") + "/"
    return {p[len(prefix) :] for p in found if p.startswith(prefix)}


def _lock_age(fs: Any, root: str) -> float:
    """Seconds since the lock object under ``root`` was written (by its own record)."""
    try:
        return time.time() - float(json.loads(fs.cat_file(f"{root}/{LOCK_NAME}"))["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return LOCK_LEASE + 1  # unreadable: treated as a dead run's


__all__ = ["check_destination", "upload_output", "LOCK_NAME", "LOCK_LEASE"]
