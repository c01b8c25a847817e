"""Byte streams of remote sources, each held to the stall rule: ``open_stream(url)``.

``open_stream`` opens ``http://`` and ``https://`` URLs with the standard library, ``pipe:COMMAND``
as COMMAND's standard output (run by the shell, in a process group of its own), and any other
scheme through fsspec. ``readers.remote.urls`` builds these URLs from an output's root and checks what
they deliver against the manifest.

- **Stall rule**: each ``STALL_BYTES`` (1 MiB) must arrive within ``STALL_WINDOW`` (60 s) spent
  waiting in reads, unless the stream ends first: a minimum pace of about 17 KiB/s, far under any
  link a training job can use; a source that sends nothing for 60 s fails then. Time the reader
  spends not reading (a training step, a paused DataLoader) does not count. http(s) and ``pipe:``
  reads return what has arrived and wait at most the time left in the window (for http, over all
the receives of one read: a chunked body's framing included); a stalled ``pipe:``
  command is killed with its whole process group. fsspec gives no way to bound one read: its
  backend's own timeouts do, and the rule is checked after each read. Connecting and the HTTP
  answer's headers wait up to ``TIMEOUT`` (60 s) per socket read: a server that trickles its
  headers is bounded only by that. Set these module constants to
  change the rule for a process (they are read at each use). A stall is a ManifestError naming the
  URL, not a hang.
"""

from __future__ import annotations

import http.client
import os
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import IO, Optional

from packer.spec.errors import ManifestError, client_error, damaged_in_store
from packer.spec.locations import store_error_reason, unchecked_reads

CHUNK = 1 << 20  # bytes per read from a remote stream, at most
TIMEOUT = 60.0  # seconds to connect and get an HTTP answer; reads after that follow the stall rule
STALL_BYTES = 1 << 20  # the stall rule (see the module): this many bytes must arrive ...
STALL_WINDOW = 60.0  # ... within this many seconds spent waiting in reads
# A pipe: command in a process group of its own, so that a stalled pipeline (curl ... | zstd -d) is
# killed whole, not just its shell.
_OWN_GROUP: dict = (
    {} if os.name != "posix" else {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
)


RETRIES = 4
"""Opens of an http(s) URL tried again after a server error or a throttling answer (``RETRIED``):
with waits of 0.5, 1, 2 and 4 s (or what ``Retry-After`` asks, up to ``RETRY_WAIT_MOST``). fsspec's
backends retry on their own (botocore: its standard retry mode)."""
RETRIED = frozenset({429, 500, 502, 503, 504})
RETRY_WAIT_MOST = 30.0


def backoff(attempt: int, retry_after: Optional[str]) -> float:
    """Seconds to wait before try ``attempt + 2``: the server's ``Retry-After`` (in seconds) where it
    gives one, else doubling from half a second; never more than ``RETRY_WAIT_MOST``."""
    try:
        asked = float(retry_after) if retry_after is not None else None
    except ValueError:
        asked = None
    return min(RETRY_WAIT_MOST, asked if asked is not None and asked >= 0 else 0.5 * 2**attempt)


def open_stream(url: str) -> IO[bytes]:
    """A readable binary stream of ``url``, held to the stall rule (see the module): ``read(n)`` gives
    what has arrived, at most ``n`` bytes. ManifestError naming the URL when it cannot be opened."""
    if url.startswith("pipe:"):
        return _PipeStream(url[len("pipe:") :])  # type: ignore[return-value]
    if url.startswith(("http://", "https://")):
        for attempt in range(RETRIES + 1):
            try:
                response = urllib.request.urlopen(url, timeout=TIMEOUT)  # noqa: S310 - the user's own URL
                break
            except urllib.error.HTTPError as e:
                e.close()
                if e.code in RETRIED and attempt < RETRIES:  # busy or throttled: again, after a wait
                    time.sleep(backoff(attempt, e.headers.get("Retry-After")))
                    continue
                missing = " (is the output there, and complete?)" if e.code == 404 else ""
                tries = f" (after {attempt + 1} tries)" if e.code in RETRIED else ""
                raise ManifestError(f"{url}: HTTP {e.code} {e.reason}{missing}{tries}") from None
            except (urllib.error.URLError, OSError) as e:
                raise ManifestError(f"cannot open {url}: {getattr(e, 'reason', e)}") from None
            except (http.client.HTTPException, ValueError) as e:  # a garbled answer (BadStatusLine), a bad URL
                raise ManifestError(f"cannot open {url}: {type(e).__name__}: {e}") from None
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
    except Exception as e:  # noqa: BLE001 - the backends' own (botocore's NoCredentialsError, google.auth's)
        reason = store_error_reason(e, url)  # no credentials, an endpoint that does not answer, ...
        if reason is None:
            raise
        raise ManifestError(f"cannot open {url}: {reason}") from None


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
            "server or command is stuck or the link too slow: try again, or read from a copy nearer to this machine"
        )

    def __enter__(self) -> "_Paced":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _HttpStream(_Paced):
    """The body of an HTTP response."""

    def __init__(self, url: str, response: http.client.HTTPResponse) -> None:
        super().__init__(url)
        self.response = response
        self.deadline = 0.0  # when the read in progress must have returned (time.monotonic)
        # One read1 may receive many times from the socket (a chunked body's size lines and
        # trailers), so each receive gets the time left until the read's deadline, not a fresh
        # timeout: the socket's reads go through ``_receive``. CPython keeps the socket as the
        # SocketIO's private _sock; without it, each receive waits up to TIMEOUT and the rule is
        # checked after the read.
        raw = getattr(response.fp, "raw", None)
        self.sock = getattr(raw, "_sock", None)
        if self.sock is not None:
            self._readinto = raw.readinto  # type: ignore[union-attr]
            raw.readinto = self._receive  # type: ignore[union-attr]

    def _receive(self, buffer) -> int:
        """The socket's ``readinto``, bounded by the deadline of the read in progress."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no more time left in the stall window")
        self.sock.settimeout(left)  # type: ignore[union-attr]
        return self._readinto(buffer)

    def _read_some(self, n: int, timeout: float) -> bytes:
        if self.response.isclosed():  # all of a Content-Length read: http.client closed it
            return b""
        self.deadline = time.monotonic() + max(timeout, 0.001)  # the window's time left, whatever TIMEOUT is
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
        self.unchecked = False

    def _read_some(self, n: int, timeout: float) -> bytes:
        try:
            return self.f.read(n)
        except Exception as e:
            if damaged_in_store(e) and not self.unchecked:
                # bytes other than the store's recorded checksum: damaged, or the whole object's
                # checksum sent with a part of it (rclone's S3 server): read on from here without
                # botocore's check, the reader's own SHA-256 or per-sample checksums deciding
                self._reopen_unchecked()
                return self._read_some(n, timeout)
            if client_error(e):  # the connection broke, ...: as the other streams' failures
                raise ManifestError(f"reading {self.url} failed: {type(e).__name__}: {e}") from None
            raise

    def _reopen_unchecked(self) -> None:
        at, fs, path = self.f.tell(), self.f.fs, self.f.path  # an s3fs file: its place, filesystem, path
        self.f.close()
        self.f = unchecked_reads(fs).open(path, "rb")
        self.f.seek(at)
        self.unchecked = True

    def close(self) -> None:
        """Close the file."""
        self.f.close()


class _PipeStream(_Paced):
    """Standard output of a shell command, as a stream; a failed command is a ManifestError."""

    def __init__(self, command: str) -> None:
        super().__init__(f"pipe:{command}")
        self.command = command
        try:
            self.proc = subprocess.Popen(
                command,
                shell=True,
                stdout=subprocess.PIPE,  # noqa: S602 - the user's
                bufsize=0,
                **_OWN_GROUP,
            )
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
                raise ManifestError(
                    f"{self.url} closed its output but did not exit within {timeout:.1f} s (the "
                    "time left of the stall window); it was stopped"
                ) from None
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
