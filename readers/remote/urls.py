"""Packer outputs read by URL: the manifest and the tar shards streamed, never downloaded whole first.

A root is a URL when it starts with a scheme (``https://host/out``, ``s3://bucket/out``,
``file:///data/out``) or with ``pipe:``:

- ``http://`` and ``https://``: read with the standard library (no extra package);
- ``pipe:COMMAND``: COMMAND's standard output, run by the shell, with ``{}`` where the file name
  goes (``pipe:aws s3 cp s3://bucket/out/{} -``);
- any other scheme: through fsspec (``s3://`` needs ``s3fs``, ``gs://`` ``gcsfs``).

Each shard stream is checked against the manifest as it goes: its byte count and SHA-256, when the
tar ends. With ``cache_dir``, a shard read through to its end is kept there under its SHA-256
(written to a temporary name, renamed only once complete and verified, so a half download is never
used) and later passes read the local copy.

Every stream is held to two rules, so that a stuck or hostile source ends in a ManifestError
naming the URL rather than a hang or a full memory:

- **Stall rule**: each ``STALL_BYTES`` must arrive within ``STALL_WINDOW`` seconds spent waiting in
  reads (1 MiB in 60 s); the streams, and this rule in full, are in ``readers.remote.streams``.
- **Size cap**: no more than the manifest's byte count of a file is read from its stream (one byte
  more is "longer than the manifest"), and a tar member whose header claims more bytes than are
  left in the shard is refused before it is read, so memory stays bounded by the shard's size.

A reader killed mid-download leaves its part file (``.SHA-NAME.RANDOM.part``) in ``cache_dir``. The
first time a process uses a cache folder, it removes the part files there that no live download
can own: those not written for ``PART_STALE`` seconds (1 h) and not locked (a download holds a lock
on its part file while it runs). A download being read writes its part file at least once every
``STALL_WINDOW`` seconds spent waiting (the stall rule of ``readers.remote.streams``), so an hour without a
write means its reader died or has paused for an hour. A paused reader of this host keeps its part file by the
lock; one on another host sharing the cache, where the lock may not be seen, loses it after an
hour's pause, and then still reads and checks its shard, only without keeping it.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import shlex
import time
import uuid
from pathlib import Path
from typing import IO, Callable, Iterator, Optional, Union

from packer.spec.entries import FileEntry
from packer.spec.errors import ManifestError
from packer.spec.locations import is_url
from packer.spec.manifest import MANIFEST_NAME, Manifest, parse_manifest, read_manifest
from packer.spec.registry import FORMATS
from packer.spec.tario import iter_tar_samples
from readers.remote import streams
from readers.remote.streams import open_stream

try:
    import fcntl
except ImportError:  # Windows: part files are then judged by their age alone
    fcntl = None  # type: ignore[assignment]

MANIFEST_BYTES = 256 << 20
"""The most a remote manifest may hold (its size is not known in advance): a server sending an
endless one must not fill the memory."""
PART_STALE = 3600.0  # seconds without a write after which an unlocked part file is a leftover
_PART = re.compile(r"^\.[0-9a-f]{32}-[A-Za-z0-9._-]+\.[0-9a-f]{12}\.part$")  # what _Checked names its part files
_CLEANED: set[str] = set()  # cache folders this process has cleaned of leftovers (once each)
log = logging.getLogger(__name__)


def file_url(root: str, name: str) -> str:
    """The URL of the file ``name`` of the output at ``root`` (for ``pipe:``, the command that reads it)."""
    if root.startswith("pipe:"):
        if "{}" not in root:
            raise ManifestError(
                f"{root!r}: a pipe: root needs {{}} where the file name goes, e.g. "
                "'pipe:curl -sf https://host/out/{}'"
            )
        return root.replace("{}", shlex.quote(name))
    return root.rstrip("/") + "/" + name


def open_manifest(root: Union[str, os.PathLike], expect_format: Optional[str] = None) -> Manifest:
    """The checked manifest of the output at ``root``, a local folder or a URL (see the module)."""
    if not is_url(root):
        return read_manifest(root, expect_format)
    url = file_url(str(root), MANIFEST_NAME)
    with open_stream(url) as stream:
        parts, size = [], 0
        while chunk := stream.read(1 << 20):  # each read gives what has arrived: up to the end
            parts.append(chunk)
            size += len(chunk)
            if size > MANIFEST_BYTES:
                raise ManifestError(
                    f"{url} is longer than {MANIFEST_BYTES} bytes, more than any manifest "
                    "packer writes; is the URL an output's?"
                )
        data = b"".join(parts)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(f"{url} cannot be read as JSON: {e}") from None
    return parse_manifest(text, url, expect_format, str(root))


def read_remote_file(root: str, entry: FileEntry) -> bytes:
    """The whole (small) file ``entry`` of the output at ``root``, checked against the manifest's size
    and SHA-256 (ManifestError when they differ)."""
    url = file_url(root, entry.path)
    stream = _Checked(open_stream(url), url, entry, None)
    try:
        data = stream.read()
        stream.finish()  # the same size and SHA-256 check as a streamed shard's
    finally:
        stream.close()
    return data


def cached_copy(root: str, entry: FileEntry, folder: Path) -> Path:
    """A verified local copy of the file ``entry`` of the output at ``root``, as ``folder / entry.path``:
    the one there when it has the manifest's size, else downloaded (checked against the manifest's
    size and SHA-256 as it streams, kept only once complete: a part file renamed into place)."""
    target = Path(folder) / entry.path
    if target.is_file() and target.stat().st_size == entry.bytes:
        return target
    url = file_url(root, entry.path)
    stream = _Checked(open_stream(url), url, entry, target)
    try:
        stream.finish()
    finally:
        stream.close()
    if not target.is_file():  # its part file was removed as a leftover meanwhile: downloaded again
        return cached_copy(root, entry, folder)
    return target


def remote_splits(root: str) -> Optional[list[str]]:
    """The split names of a split set at the URL ``root`` (its ``splits.json``), or None when it has
    none (an output, or nothing)."""
    try:
        with open_stream(file_url(root, "splits.json")) as stream:
            data = stream.read(MANIFEST_BYTES + 1)
    except ManifestError:
        return None
    try:
        return [str(name) for name in json.loads(data.decode("utf-8"))["splits"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ManifestError(f"{file_url(root, 'splits.json')} is not a packer split set's record: {e}") from None


def check_remote_output(
    root: str, manifest: Manifest, progress: Optional[Callable[[int], None]] = None
) -> list[tuple[str, str]]:
    """``packer verify`` of an output at a URL: every file its manifest lists streamed once (nothing
    kept) and compared with the manifest's size and SHA-256, and the files made from the manifest
    (other loaders' shard lists) compared with what it makes of them now. Returns ``(where, what)``
    of each problem; ``progress`` gets each shard's samples as it is checked. The files listed beside
    the shards (the image hashes) are checked as the shards' are."""
    problems: list[tuple[str, str]] = []

    def check(where: str, entry: FileEntry) -> None:
        url = file_url(root, entry.path)
        try:
            stream = _Checked(open_stream(url), url, entry, None)
            try:
                stream.finish()  # reads it all, then compares size and SHA-256
            finally:
                stream.close()
        except ManifestError as e:
            problems.append((where, str(e)))

    for shard in manifest.shards:
        for entry in shard.files:
            check(shard.name, entry)
        if progress is not None:
            progress(shard.samples)
    if manifest.image_hashes is not None:
        hashes = manifest.image_hashes
        check("output", FileEntry(str(hashes.get("path")), int(hashes.get("bytes", -1)), str(hashes.get("sha256"))))
    for name, expected in FORMATS[manifest.format].files_of_output(manifest).items():
        url = file_url(root, name)
        try:
            with open_stream(url) as stream:
                found = b"".join(iter(lambda: stream.read(streams.CHUNK), b""))
        except ManifestError as e:
            problems.append(("output", str(e)))
            continue
        if found != expected:
            problems.append(
                ("output", f"{url} does not match the manifest (other loaders would read the wrong shards)")
            )
    return problems


def iter_remote_tar(root: str, entry: FileEntry, cache_dir: Optional[Union[str, os.PathLike]] = None) -> Iterator[dict]:
    """The samples of the tar shard ``entry`` of the output at ``root``, as ``iter_tar_samples``
    gives them, streamed and checked against the manifest's size and SHA-256 once the tar ends
    (ManifestError when they differ). With ``cache_dir``, from the cached copy when there is one,
    else streamed while a copy is kept (see the module)."""
    url = file_url(root, entry.path)
    cached = None
    if cache_dir is not None:
        clean_cache(cache_dir, once=True)
        cached = Path(cache_dir) / f"{entry.sha256[:32]}-{Path(entry.path).name}"
    if cached is not None and cached.is_file() and cached.stat().st_size == entry.bytes:
        # Checked as it is read, like a download: a cached copy damaged since is removed, and the
        # next pass streams the shard again.
        local = _Checked(open(cached, "rb"), f"{cached} (cached {url})", entry, None)
        try:
            yield from iter_tar_samples(local, name=local.url, size=entry.bytes)  # type: ignore[arg-type]
            local.finish()
        except ManifestError:
            cached.unlink(missing_ok=True)
            raise
        finally:
            local.close()
        return
    stream = _Checked(open_stream(url), url, entry, cached)
    try:
        yield from iter_tar_samples(stream, name=url, size=entry.bytes)  # type: ignore[arg-type]
        stream.finish()
    finally:
        stream.close()


def clean_cache(cache_dir: Union[str, os.PathLike], once: bool = False) -> list[Path]:
    """Remove the part files in ``cache_dir`` that no live download can own (see the module): not
    written for ``PART_STALE`` seconds and not locked. With ``once``, only the first time this
    process asks for that folder. Returns the paths removed."""
    folder = Path(cache_dir)
    key = os.path.abspath(folder)
    if once and key in _CLEANED:
        return []
    _CLEANED.add(key)
    removed: list[Path] = []
    try:  # regular files only: opening a FIFO to test its lock would wait forever
        names = [e.name for e in os.scandir(folder) if _PART.match(e.name) and e.is_file(follow_symlinks=False)]
    except OSError:  # no folder yet (made on the first download), or not readable: nothing to clean
        return removed
    now = time.time()
    for name in names:
        path = folder / name
        try:
            if now - path.stat().st_mtime < PART_STALE or _locked(path):
                continue
            path.unlink()
        except OSError:  # gone already (another process cleaned it, or its download finished)
            continue
        removed.append(path)
    if removed:
        log.info("removed %d part file(s) of unfinished downloads from %s", len(removed), folder)
    return removed


def _locked(path: Path) -> bool:
    """Whether a process holds the lock of the part file ``path``: a download running (of this host at
    least; over NFS, of any)."""
    if fcntl is None:
        return False
    with open(path, "rb") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:  # a filesystem without locks: the part file's age decides alone
            return False
    return False


class _Checked:
    """A stream that counts and hashes what passes, never reads past the manifest's size, and copies
    it to ``cached`` if given (under a locked part file until it is complete and verified)."""

    def __init__(self, raw: IO[bytes], url: str, entry: FileEntry, cached: Optional[Path]) -> None:
        self.raw, self.url, self.entry, self.cached = raw, url, entry, cached
        self.hash = hashlib.sha256()
        self.count = 0
        self.tmp: Optional[Path] = None
        self.copy: Optional[IO[bytes]] = None
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            self.tmp = cached.with_name(f".{cached.name}.{uuid.uuid4().hex[:12]}.part")
            self.copy = open(self.tmp, "wb")
            if fcntl is not None:
                try:  # held until the copy is closed: clean_cache leaves a locked part file alone
                    fcntl.flock(self.copy.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:  # a filesystem without locks: the part file's age protects it
                    pass

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that is left when ``n`` < 0); ManifestError past the manifest's size."""
        if n is None or n < 0:
            return b"".join(iter(lambda: self.read(streams.CHUNK), b""))
        if n == 0:
            return b""
        left = self.entry.bytes - self.count
        try:  # at the manifest's size, one byte more tells a longer stream from one that ends there
            data = self.raw.read(min(n, left) if left > 0 else 1)
        except (OSError, ValueError, http.client.HTTPException) as e:  # IncompleteRead: the connection broke
            raise ManifestError(f"reading {self.url} failed: {type(e).__name__}: {e}") from None
        if len(data) > left:
            raise ManifestError(
                f"{self.url} is longer than the manifest's {self.entry.bytes} bytes: the remote "
                "copy is damaged or was changed after the manifest was written"
            )
        self.count += len(data)
        self.hash.update(data)
        if self.copy is not None:
            self.copy.write(data)
        return data

    def finish(self) -> None:
        """After the tar's end: read what is left (padding), check size and SHA-256, keep the copy."""
        while self.read(streams.CHUNK):
            pass
        if self.count != self.entry.bytes or self.hash.hexdigest() != self.entry.sha256:
            what = (
                f"{self.count} bytes, not the {self.entry.bytes} of the manifest"
                if self.count != self.entry.bytes
                else "of another SHA-256 than the manifest records"
            )
            raise ManifestError(
                f"{self.url} is {what}: the remote copy is damaged or was changed after the manifest was written"
            )
        if self.copy is not None and self.tmp is not None and self.cached is not None:
            self.copy.close()
            self.copy = None
            try:
                os.replace(self.tmp, self.cached)
            except FileNotFoundError:  # removed as a leftover while this reader paused: not kept this time
                log.info("%s was read and checked but not cached: its part file was removed", self.url)
            self.tmp = None

    def close(self) -> None:
        """Close the stream; a copy not finished and verified is deleted."""
        self.raw.close()
        if self.copy is not None:
            self.copy.close()
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)
