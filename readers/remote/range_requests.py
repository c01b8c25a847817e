"""Asking a store for byte ranges of its files, for ``readers.remote.ranges``: each round of requests
held to the stall rule of the streams (``readers.remote.streams``), busy and throttling answers and
dropped connections asked again after a backoff, a presigned URL's refusal told apart (its file is
then read through s3fs), and every other failure a ManifestError naming the file and what to do."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from packer.spec.errors import ManifestError
from packer.spec.locations import CREDENTIALS
from readers.remote import streams
from readers.remote.signed_urls import REFUSED

if TYPE_CHECKING:
    from readers.remote.ranges import RangeSource

CONCURRENT = 32
"""Requests a process has in flight at once, at most (a batch needing more makes them in turns)."""


class Requests:
    """What range reads cost in this process: ``requests`` made and ``bytes`` received (read them
    around a batch for its request count, as ``scripts/bench_bucket.py`` does)."""

    requests = 0
    bytes = 0


def filesystem(url: str) -> tuple[Any, str]:
    """fsspec's filesystem of ``url`` and the path in it (ManifestError when there is no backend)."""
    try:
        import fsspec.core
    except ImportError:
        raise ManifestError(f"reading {url.split('://')[0]}:// URLs needs fsspec: pip install fsspec") from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:  # fsspec names the package of a scheme it has no backend for
        raise ManifestError(f"cannot open {url}: {e}") from None


def import_backend(url: str) -> None:
    """Import fsspec's backend of ``url`` (and, for ``s3://``, the HTTP one its presigned URLs are
    read through) in this process, where a dataset read by ranges is opened: DataLoader workers forked
    from it then find the modules there, where each would otherwise import them (aiohttp among them)
    on its first request, before its first batch. Nothing where fsspec or the backend is missing:
    the first request names what to install."""
    try:
        import fsspec
    except ImportError:
        return
    scheme = url.split("://")[0]
    for name in (scheme, "http") if scheme in ("s3", "s3a") else (scheme,):
        with contextlib.suppress(ImportError, ValueError):
            fsspec.get_filesystem_class(name)


def failed(url: str, e: BaseException, tries: str = "") -> ManifestError:
    """The ManifestError of a failed request for ``url`` (``tries``: how often it was asked), saying what to do."""
    if isinstance(e, FileNotFoundError):
        return ManifestError(
            f"{url} is gone: the output was replaced or removed after this dataset was opened. "
            "Open the dataset again to read the new output"
        )
    hint = CREDENTIALS.get(url.split("://")[0]) if "Credentials" in type(e).__name__ else None
    status = getattr(e, "status", None)
    # an HTTP answer's error is told by its status: aiohttp's message holds the URL asked, which for a
    # presigned one (signed_urls) is a grant to read the object
    said = f"HTTP {status} {getattr(e, 'message', '')}".rstrip() if isinstance(status, int) else str(e)
    return ManifestError(f"reading {url} failed{tries}: {type(e).__name__}: {said}" + (f". {hint}" if hint else ""))


def bounded(fs: Any, method: str, timeout: float, *args: Any, **kwargs: Any) -> Any:
    """``fs.method(*args, **kwargs)``, given up after ``timeout`` seconds (FSTimeoutError) where the
    backend is asynchronous (s3fs, gcsfs, HTTP: fsspec's loop is waited on with a timeout); a request
    that never gets an answer then fails the read instead of hanging it. Others are called as they are."""
    coroutine = getattr(fs, f"_{method}", None)
    if getattr(fs, "async_impl", False) and coroutine is not None and getattr(fs, "loop", None) is not None:
        from fsspec.asyn import sync

        return sync(fs.loop, coroutine, *args, timeout=timeout, **kwargs)
    return getattr(fs, method)(*args, **kwargs)


def timed_out() -> type:
    """fsspec's FSTimeoutError (``bounded``'s), imported when a request failed: fsspec is there by then."""
    from fsspec.exceptions import FSTimeoutError

    return FSTimeoutError


def stalled(url: str, window: float, tries: int) -> ManifestError:
    """The ManifestError of requests for ``url`` that got no answer within ``window`` seconds, ``tries`` times."""
    return ManifestError(
        f"reading {url} stalled: no answer within {window:.0f} s (the stall rule), {tries} times; check the "
        "connection to the store, or read the output with download=True and cache_dir="
    )


REFUSED_URL = object()
"""``answers``'s answer for a run whose presigned URL the store refused (``_refusal``)."""
UNREACHED_URL = object()
"""``answers``'s answer for a run whose presigned URL could not be reached before one of its file's
ever worked (``_refusal``)."""


def answers(fs: Any, runs: list, starts: list[int], ends: list[int]) -> list[Any]:
    """The bytes of each run (``(source, path, ...)``: a RangeSource, the path in ``fs``), from
    ``starts`` to ``ends``, asked for all at once; the runs a server answered with an error of
    ``streams.RETRIED`` (busy, throttled) asked again after ``streams.backoff``, up to
    ``streams.RETRIES`` times (s3fs and gcsfs retry such answers themselves; fsspec's HTTP does not);
    ``REFUSED_URL`` for a run whose presigned URL was refused (``_refusal``). ManifestError naming the
    URL for any other failure, or after the last try."""
    results: list = [None] * len(runs)
    todo = list(range(len(runs)))
    for attempt in range(streams.RETRIES + 1):
        # the stall rule over the round: each STALL_BYTES asked for within STALL_WINDOW
        asked = sum(ends[i] - starts[i] for i in todo)
        window = streams.STALL_WINDOW * max(1.0, asked / streams.STALL_BYTES)
        try:
            paths = [runs[i][1] for i in todo]
            got = bounded(
                fs,
                "cat_ranges",
                window,
                paths,
                [starts[i] for i in todo],
                [ends[i] for i in todo],
                on_error="return",
                batch_size=CONCURRENT,
            )
        except timed_out():  # the whole round asked again (its answers so far are not known)
            if attempt == streams.RETRIES:
                raise stalled(runs[todo[0]][0].url, window, attempt + 1) from None
            time.sleep(streams.backoff(attempt, None))
            continue
        except Exception as e:  # noqa: BLE001 - each backend raises its own
            raise failed(runs[todo[0]][0].url, e) from None
        Requests.requests += len(todo)
        again, wait = [], None
        for i, data in zip(todo, got):
            refusal = _refusal(runs[i][0], data) if isinstance(data, BaseException) else None
            if refusal is not None:
                results[i] = refusal  # by a presigned URL: signed again, or read through s3fs
                continue
            if isinstance(data, BaseException):
                busy = getattr(data, "status", None) in streams.RETRIED or _dropped(data)
                if not busy or attempt == streams.RETRIES:
                    tries = f" (after {attempt + 1} tries)" if attempt else ""
                    raise failed(runs[i][0].url, data, tries)
                again.append(i)
                wait = wait or (getattr(data, "headers", None) or {}).get("Retry-After")
            results[i] = data
        if not again:
            return results
        todo = again
        time.sleep(streams.backoff(attempt, wait))
    return results


def _refusal(source: "RangeSource", error: BaseException) -> Any:
    """``REFUSED_URL`` where ``error`` answered a presigned URL of ``source`` and is the store refusing
    it (400, 403); ``UNREACHED_URL`` for a failure to reach it at all (a proxy, a certificate the HTTP
    client does not know) before a URL of the file ever worked: either way s3fs, which knows the
    client's settings, reads the file. None otherwise."""
    signed = source.signed
    if signed is None or signed.plain:
        return None
    status = getattr(error, "status", None)
    if status in REFUSED:
        return REFUSED_URL
    if status is None and not signed.worked and not isinstance(error, FileNotFoundError):
        return UNREACHED_URL
    return None


def _dropped(error: BaseException) -> bool:
    """Whether ``error`` is a connection lost or reset, or an answer cut short: asked again, as a busy
    server's answer is (s3fs and gcsfs retry these themselves; fsspec's HTTP does not)."""
    names = {c.__name__ for c in type(error).__mro__}
    return isinstance(error, (ConnectionError, TimeoutError)) or bool(
        names & {"ClientConnectionError", "ClientPayloadError", "ServerDisconnectedError"}
    )


__all__ = [
    "answers",
    "bounded",
    "failed",
    "filesystem",
    "import_backend",
    "stalled",
    "timed_out",
    "Requests",
    "CONCURRENT",
    "REFUSED_URL",
    "UNREACHED_URL",
]
