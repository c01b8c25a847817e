"""Presigned URLs for range reads of S3 objects: each file is signed once in each process that opens
it (botocore's ``generate_presigned_url``, through s3fs, with the credentials s3fs found), and its
byte ranges are then asked over plain HTTP (fsspec's HTTP filesystem, aiohttp), not each request
signed and sent through botocore's client. A range request then costs the reader far less CPU,
which is what limits a worker reading small samples from a bucket (``scripts/bench_bucket.py``
measures both ways; docs/BENCHMARKS.md has the figures). No message or log record shows a URL's
query: it grants reading the object.

A URL is good for ``SIGNED_FOR`` seconds and is signed again at half that age. A URL the store
refuses (400 or 403: temporary credentials that ran out before it, a clock off, a bucket in another
region; or any answer that is not the range asked for, as S3's redirect to a bucket's region; or no
connection at all before a URL of the file ever worked: a proxy or CA the HTTP client lacks) is
signed again once; refused again, that file is read through s3fs as before, whose errors say what
is wrong. A URL refused just after it was signed sends its whole bucket through s3fs, in that
process. Stores that need more than a URL carries (requester-pays buckets, keys sent in headers:
s3fs's ``requester_pays``, ``s3_additional_kwargs``; a ``verify`` or proxies of its own or in the
environment) are always read through s3fs, and so is everything with ``PACKER_S3_PRESIGNED=0``. The
HTTP client takes the CA bundle from ``AWS_CA_BUNDLE``, as botocore does.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any, Optional

from packer.spec.locations import configured_like

SIGNED_FOR = 3600
"""Seconds a presigned URL is good for; it is signed again once half of them have gone."""
REFUSED = frozenset({400, 403})
"""Answers to a presigned URL after which it is signed again (then the file is read through s3fs)."""
FRESH = 60.0
"""Seconds within which a refused URL counts as refused fresh: signing does not work for this file."""
SWITCH = "PACKER_S3_PRESIGNED"
"""The environment variable that, set to ``0``, sends every range through s3fs's client."""
_PLAIN: set[tuple[int, str]] = set()
"""The buckets, by filesystem id and name, whose URLs were refused fresh in this process: every file
of theirs is read through s3fs, without a refused round each."""


class SignedUrl:
    """The presigned GET URL of the object ``path`` of the s3fs filesystem ``s3``, for this process:
    ``target()`` gives the filesystem and path to ask for ranges (fsspec's HTTP filesystem and the
    URL while signing works, else ``s3`` and ``path``); ``refused()`` after the store refused it."""

    def __init__(self, s3: Any, path: str) -> None:
        self.s3, self.path = s3, path
        self.bucket = (id(s3), path.split("/", 1)[0])
        self.url: Optional[str] = None
        self.signed_at = 0.0
        self.worked = False
        """Whether a range came back by a URL of this file (after which a failure to connect is one
        to report, not a reason to go through s3fs)."""
        self.plain = not can_sign(s3) or self.bucket in _PLAIN
        """Read through s3fs: signing is not for this store, or it was refused."""

    def target(self) -> tuple[Any, str]:
        """The filesystem and path of the next round of range requests."""
        self.plain = self.plain or self.bucket in _PLAIN
        if self.plain:
            return self.s3, self.path
        try:
            http = _http()
            if self.url is None or time.monotonic() - self.signed_at > SIGNED_FOR / 2:
                self.url = _signer(self.s3).url(self.path, expires=SIGNED_FOR)
                self.signed_at = time.monotonic()
        except Exception:  # noqa: BLE001 - no signer or TLS settings here (a CA bundle unread): s3fs reads it
            self.plain = True
            return self.s3, self.path
        return http, self.url

    def refused(self, bucket: bool = True) -> None:
        """The URL was refused: signed again at the next round, or, when it was signed within
        ``FRESH`` seconds, never again (s3fs reads the file, and names what is wrong if it fails too);
        with ``bucket`` (the store refused it, not a failure to connect), for any file of its bucket."""
        if self.url is not None and time.monotonic() - self.signed_at < FRESH:
            self.plain = True
            if bucket:
                _PLAIN.add(self.bucket)
        self.url = None


def can_sign(fs: Any) -> bool:
    """Whether range reads of ``fs`` may go by presigned URLs: an s3fs filesystem with no request
    parameters a URL does not carry and no connection settings of its own (``verify``, proxies in
    its botocore config or the environment, which the HTTP client would not know), unless
    ``PACKER_S3_PRESIGNED=0``."""
    client = getattr(fs, "client_kwargs", None) or {}
    config = getattr(fs, "config_kwargs", None) or {}
    return (
        os.environ.get(SWITCH, "1") != "0"
        and hasattr(fs, "call_s3")
        and hasattr(fs, "url")
        and not getattr(fs, "req_kw", None)
        and not getattr(fs, "s3_additional_kwargs", None)
        and not getattr(fs, "anon", False)  # an anonymous URL is no faster, and s3fs knows its bucket's rules
        and "verify" not in client
        and "proxies" not in config
        and not any(os.environ.get(v) for v in _PROXIES)
    )


_PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
"""Variables that send botocore's requests through a proxy: where one is set, s3fs reads (aiohttp
would take them with ``trust_env``, which looks them up again at every request: twice the CPU)."""


def _signer(fs: Any) -> Any:
    """An s3fs filesystem like ``fs`` (same options, so the same credentials, endpoint and region)
    that presigns with Signature Version 4: botocore presigns S3 URLs with version 2 unless the
    client's ``signature_version`` is set, and S3 refuses version 2 for buckets made since 2020."""
    return configured_like(fs, signature_version="s3v4")


class _Unsigned(logging.Filter):
    """Takes the query out of URLs in fsspec's HTTP log records (it logs each URL it asks at DEBUG):
    a presigned URL's query is a grant to read the object."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "X-Amz-" in message:
            record.msg, record.args = _QUERY.sub("?<presigned>", message), None
        if record.exc_info:  # a traceback's messages may hold the URL too: logged as text, cleaned
            record.exc_text = _QUERY.sub("?<presigned>", logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


_QUERY = re.compile(r"\?[^\s'\"]*X-Amz-[^\s'\"]*")


_TLS: dict[str, Any] = {}
"""This process's TLS context of each CA bundle (``AWS_CA_BUNDLE``), made once."""


def _http() -> Any:
    """fsspec's HTTP filesystem, with URLs sent as they are (``encoded``: a signature's quoting
    untouched), the CA bundle taken from ``AWS_CA_BUNDLE`` as botocore takes it, and its log kept
    free of the URLs' queries."""
    import fsspec

    log = logging.getLogger("fsspec.http")
    if not any(isinstance(f, _Unsigned) for f in log.filters):
        log.addFilter(_Unsigned())
    bundle = os.environ.get("AWS_CA_BUNDLE")
    options: dict[str, Any] = {}
    if bundle:
        import ssl

        if bundle not in _TLS:  # two threads at once may each make one: either serves
            _TLS[bundle] = ssl.create_default_context(cafile=bundle)
        options["ssl"] = _TLS[bundle]  # each request's (fsspec passes its options to aiohttp's get)
    return fsspec.filesystem("http", encoded=True, **options)


__all__ = ["SignedUrl", "can_sign", "SIGNED_FOR", "REFUSED", "SWITCH"]
