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

- **Stall rule**: each ``STALL_BYTES`` (1 MiB) must arrive within ``STALL_WINDOW`` (60 s) spent
  waiting in reads, unless the stream ends first: a minimum pace of about 17 KiB/s, far under any
  link a training job can use; a source that sends nothing for 60 s fails then. Time the reader
  spends not reading (a training step, a paused DataLoader) does not count. http(s) and ``pipe:``
  reads return what has arrived and wait at most the time left in the window; a stalled ``pipe:``
  command is killed with its whole process group. fsspec gives no way to bound one read: its
  backend's own timeouts do, and the rule is checked after each read. Connecting and the HTTP
  answer's headers wait up to ``TIMEOUT`` (60 s) per socket read. Set these module constants to
  change the rule for a process.
- **Size cap**: no more than the manifest's byte count of a file is read from its stream (one byte
  more is "longer than the manifest"), and a tar member whose header claims more bytes than are
  left in the shard is refused before it is read, so memory stays bounded by the shard's size.

A reader killed mid-download leaves its part file (``.SHA-NAME.RANDOM.part``) in ``cache_dir``. The
first time a process uses a cache folder, it removes the part files there that no live download
can own: those not written for ``PART_STALE`` seconds (1 h) and not locked (a download holds a lock
on its part file while it runs). A download being read writes its part file at least once every
``STALL_WINDOW`` seconds spent waiting (the stall rule), so an hour without a write means its
reader died or has paused for an hour. A paused reader of this host keeps its part file by the
lock; one on another host sharing the cache, where the lock may not be seen, loses it after an
hour's pause, and then still reads and checks its shard, only without keeping it.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import IO, Iterator, Optional, Union

from packer.errors import ManifestError
from packer.manifest import MANIFEST_NAME, Manifest, parse_manifest, read_manifest
from packer.records import FileEntry
from packer.tario import iter_tar_samples

try:
    import fcntl
except ImportError:  # Windows: part files are then judged by their age alone
    fcntl = None  # type: ignore[assignment]

CHUNK = 1 << 20  # bytes per read from a remote stream, at most
TIMEOUT = 60.0  # seconds to connect and get an HTTP answer; reads after that follow the stall rule
STALL_BYTES = 1 << 20  # the stall rule (see the module): this many bytes must arrive ...
STALL_WINDOW = 60.0  # ... within this many seconds spent waiting in reads
PART_STALE = 3600.0  # seconds without a write after which an unlocked part file is a leftover
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_PART = re.compile(r"^\.[0-9a-f]{32}-[A-Za-z0-9._-]+\.[0-9a-f]{12}\.part$")  # what _Checked names its part files
_CLEANED: set[str] = set()  # cache folders this process has cleaned of leftovers (once each)
# A pipe: command in a process group of its own, so that a stalled pipeline (curl ... | zstd -d) is
# killed whole, not just its shell.
_OWN_GROUP: dict = ({} if os.name != "posix" else {"process_group": 0} if sys.version_info >= (3, 11)
                    else {"start_new_session": True})
log = logging.getLogger(__name__)


def is_url(root: object) -> bool:
    """True when ``root`` names a remote output (a URL or a ``pipe:`` command), not a local folder."""
    return isinstance(root, str) and (root.startswith("pipe:") or bool(_SCHEME.match(root)))


def file_url(root: str, name: str) -> str:
    """The URL of the file ``name`` of the output at ``root`` (for ``pipe:``, the command that reads it)."""
    if root.startswith("pipe:"):
        if "{}" not in root:
            raise ManifestError(f"{root!r}: a pipe: root needs {{}} where the file name goes, e.g. "
                                "'pipe:curl -sf https://host/out/{}'")
        return root.replace("{}", shlex.quote(name))
    return root.rstrip("/") + "/" + name


def open_manifest(root: Union[str, os.PathLike], expect_format: Optional[str] = None) -> Manifest:
    """The checked manifest of the output at ``root``, a local folder or a URL (see the module)."""
    if not is_url(root):
        return read_manifest(root, expect_format)
    url = file_url(str(root), MANIFEST_NAME)
    with open_stream(url) as stream:
        data = stream.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(f"{url} cannot be read as JSON: {e}") from None
    return parse_manifest(text, url, expect_format, str(root))


def open_stream(url: str) -> IO[bytes]:
    """A readable binary stream of ``url``, held to the stall rule (see the module): ``read(n)`` gives
    what has arrived, at most ``n`` bytes. ManifestError naming the URL when it cannot be opened."""
    if url.startswith("pipe:"):
        return _PipeStream(url[len("pipe:"):])  # type: ignore[return-value]
    if url.startswith(("http://", "https://")):
        try:
            response = urllib.request.urlopen(url, timeout=TIMEOUT)  # noqa: S310 - the user's own URL
        except urllib.error.HTTPError as e:
            missing = " (is the output there, and complete?)" if e.code == 404 else ""
            raise ManifestError(f"{url}: HTTP {e.code} {e.reason}{missing}") from None
        except (urllib.error.URLError, OSError) as e:
            raise ManifestError(f"cannot open {url}: {getattr(e, 'reason', e)}") from None
        return _HttpStream(url, response)  # type: ignore[return-value]
    try:
        import fsspec
    except ImportError:
        raise ManifestError(f"reading {url.split('://')[0]}:// URLs needs fsspec: pip install fsspec") from None
    try:
        return _FsspecStream(url, fsspec.open(url, "rb").open())  # type: ignore[return-value]
    except ImportError as e:  # fsspec names the package of a scheme it has no backend for
        raise ManifestError(f"cannot open {url}: {e}") from None
    except FileNotFoundError:
        raise ManifestError(f"{url} does not exist (is the output there, and complete?)") from None
    except (OSError, ValueError) as e:
        raise ManifestError(f"cannot open {url}: {e}") from None


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


def iter_remote_tar(root: str, entry: FileEntry, cache_dir: Optional[Union[str, os.PathLike]] = None
                    ) -> Iterator[dict]:
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
            return b"".join(iter(lambda: self.read(CHUNK), b""))
        if n == 0:
            return b""
        left = self.entry.bytes - self.count
        try:  # at the manifest's size, one byte more tells a longer stream from one that ends there
            data = self.raw.read(min(n, left) if left > 0 else 1)
        except (OSError, ValueError, http.client.HTTPException) as e:  # IncompleteRead: the connection broke
            raise ManifestError(f"reading {self.url} failed: {type(e).__name__}: {e}") from None
        if len(data) > left:
            raise ManifestError(f"{self.url} is longer than the manifest's {self.entry.bytes} bytes: the remote "
                                "copy is damaged or was changed after the manifest was written")
        self.count += len(data)
        self.hash.update(data)
        if self.copy is not None:
            self.copy.write(data)
        return data

    def finish(self) -> None:
        """After the tar's end: read what is left (padding), check size and SHA-256, keep the copy."""
        while self.read(CHUNK):
            pass
        if self.count != self.entry.bytes or self.hash.hexdigest() != self.entry.sha256:
            what = (f"{self.count} bytes, not the {self.entry.bytes} of the manifest" if self.count != self.entry.bytes
                    else "of another SHA-256 than the manifest records")
            raise ManifestError(f"{self.url} is {what}: the remote copy is damaged or was changed after the manifest "
                                "was written")
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


class _Paced:
    """A remote stream read as its bytes arrive, held to the stall rule (see the module). Each kind
    of source gives ``_read_some`` and ``close``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.total = 0  # bytes read in all
        self.got = 0  # bytes read in the current window
        self.waited = 0.0  # seconds spent in reads in the current window

    def _read_some(self, n: int, timeout: float) -> bytes:
        """Up to ``n`` bytes as soon as some have arrived, b"" at the end; TimeoutError when none
        arrive within ``timeout`` seconds."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the source."""
        raise NotImplementedError

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes, those that have arrived (all that is left when ``n`` < 0); b"" at the end."""
        if n is None or n < 0:
            return b"".join(iter(lambda: self.read(CHUNK), b""))
        if n == 0:
            return b""
        start = time.monotonic()
        try:
            data = self._read_some(min(n, CHUNK), STALL_WINDOW - self.waited)
        except TimeoutError:
            self.waited += time.monotonic() - start
            raise self._stalled() from None
        except (OSError, ValueError, http.client.HTTPException) as e:  # IncompleteRead: the connection broke
            raise ManifestError(f"reading {self.url} failed: {type(e).__name__}: {e}") from None
        self.waited += time.monotonic() - start
        if not data:  # the end came before the window's bytes: not a stall
            return data
        self.got += len(data)
        self.total += len(data)
        if self.got >= STALL_BYTES:  # this window's bytes have come: the next window starts now
            self.got, self.waited = 0, 0.0
        elif self.waited >= STALL_WINDOW:
            raise self._stalled()
        return data

    def _stalled(self) -> ManifestError:
        """The error of a stall, the stream closed first: a stalled pipe: command is killed at once,
        not when the reader lets go of the stream."""
        self.close()
        return ManifestError(
            f"{self.url} stalled: {self.got} bytes in the last {self.waited:.1f} s, under the {STALL_BYTES} bytes "
            f"a stream must deliver every {STALL_WINDOW:g} s spent waiting ({self.total} bytes read in all). The "
            "server or command is stuck or the link too slow: try again, or read from a copy nearer to this machine")

    def __enter__(self) -> "_Paced":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _HttpStream(_Paced):
    """The body of an HTTP response."""

    def __init__(self, url: str, response: http.client.HTTPResponse) -> None:
        super().__init__(url)
        self.response = response
        # read1 returns what has arrived but waits for its first byte up to the socket's timeout,
        # which is set before each read to the time left in the window. CPython keeps the socket
        # as the SocketIO's private _sock; without it, reads wait up to TIMEOUT each and the rule
        # is checked after them.
        self.sock = getattr(getattr(response.fp, "raw", None), "_sock", None)

    def _read_some(self, n: int, timeout: float) -> bytes:
        if self.response.isclosed():  # all of a Content-Length read: http.client closed it
            return b""
        if self.sock is not None:
            self.sock.settimeout(max(min(TIMEOUT, timeout), 0.001))
        return self.response.read1(n)

    def close(self) -> None:
        """Close the connection."""
        self.response.close()


class _FsspecStream(_Paced):
    """An fsspec file. One read cannot be bounded from here (the backend's timeouts bound it); the
    stall rule is checked after each."""

    def __init__(self, url: str, f: IO[bytes]) -> None:
        super().__init__(url)
        self.f = f

    def _read_some(self, n: int, timeout: float) -> bytes:
        return self.f.read(n)

    def close(self) -> None:
        """Close the file."""
        self.f.close()


class _PipeStream(_Paced):
    """Standard output of a shell command, as a stream; a failed command is a ManifestError."""

    def __init__(self, command: str) -> None:
        super().__init__(f"pipe:{command}")
        self.command = command
        try:
            self.proc = subprocess.Popen(command, shell=True, stdout=subprocess.PIPE,  # noqa: S602 - the user's
                                         bufsize=0, **_OWN_GROUP)
        except OSError as e:
            raise ManifestError(f"cannot run pipe:{command}: {e}") from None
        self.stdout: IO[bytes] = self.proc.stdout  # type: ignore[assignment] - stdout=PIPE makes one
        self.fd = self.stdout.fileno()

    def _read_some(self, n: int, timeout: float) -> bytes:
        """Up to ``n`` bytes of the command's output; at its end, ManifestError if it failed."""
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0.0))
        if not ready:
            raise TimeoutError
        data = os.read(self.fd, n)
        if not data:
            try:
                code = self.proc.wait(timeout=max(timeout, 0.001))
            except subprocess.TimeoutExpired:
                self.close()
                raise ManifestError(f"{self.url} closed its output but did not exit within {timeout:.1f} s (the "
                                    "time left of the stall window); it was stopped") from None
            if code != 0:
                raise ManifestError(f"{self.url} failed (exit status {code})")
        return data

    def close(self) -> None:
        """Stop the command (its whole process group) if it is still running, and reap it."""
        self.stdout.close()
        if self.proc.poll() is None:
            try:
                if _OWN_GROUP:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                else:
                    self.proc.kill()
            except ProcessLookupError:  # it exited just now
                pass
        self.proc.wait()
