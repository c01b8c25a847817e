"""Presigned URLs for range reads of S3 objects: each file is signed once per process (botocore's
``generate_presigned_url``, through s3fs, with the credentials s3fs found), and its byte ranges are
then asked over plain HTTP (fsspec's HTTP filesystem, aiohttp), not each request signed and sent
through botocore's client. A range request then costs the reader far less CPU, which is what limits
a worker reading small samples from a bucket (``scripts/bench_bucket.py`` measures both ways;
docs/BENCHMARKS.md has the figures). The URLs never appear in a message: they grant reading.

A URL is good for ``SIGNED_FOR`` seconds and is signed again at half that age. A URL the store
refuses (400 or 403: temporary credentials that ran out before it, a clock off, a bucket in another
region; or any answer that is not the range asked for, as S3's redirect to a bucket's region) is
signed again once; refused again, that file is read through s3fs as before, whose errors
say what is wrong. Stores that need more than a URL carries (requester-pays buckets, keys sent in
headers: s3fs's ``requester_pays``, ``s3_additional_kwargs``) are always read through s3fs.
"""

from __future__ import annotations

import time
from typing import Any, Optional

SIGNED_FOR = 3600
"""Seconds a presigned URL is good for; it is signed again once half of them have gone."""
REFUSED = frozenset({400, 403})
"""Answers to a presigned URL after which it is signed again (then the file is read through s3fs)."""
FRESH = 60.0
"""Seconds within which a refused URL counts as refused fresh: signing does not work for this file."""


class SignedUrl:
    """The presigned GET URL of the object ``path`` of the s3fs filesystem ``s3``, for this process:
    ``target()`` gives the filesystem and path to ask for ranges (fsspec's HTTP filesystem and the
    URL while signing works, else ``s3`` and ``path``); ``refused()`` after the store refused it."""

    def __init__(self, s3: Any, path: str) -> None:
        self.s3, self.path = s3, path
        self.url: Optional[str] = None
        self.signed_at = 0.0
        self.plain = not can_sign(s3)
        """Read through s3fs: signing is not for this store, or it was refused twice."""

    def target(self) -> tuple[Any, str]:
        """The filesystem and path of the next round of range requests."""
        if self.plain:
            return self.s3, self.path
        if self.url is None or time.monotonic() - self.signed_at > SIGNED_FOR / 2:
            try:
                self.url = _signer(self.s3).url(self.path, expires=SIGNED_FOR)
            except Exception:  # noqa: BLE001 - no signer here (anonymous access, say): s3fs reads it
                self.plain = True
                return self.s3, self.path
            self.signed_at = time.monotonic()
        return _http(), self.url

    def refused(self) -> None:
        """The store refused the URL: signed again at the next round, or, when it was signed within
        ``FRESH`` seconds, never again (s3fs reads the file, and names what is wrong if it fails too)."""
        if self.url is not None and time.monotonic() - self.signed_at < FRESH:
            self.plain = True
        self.url = None


def can_sign(fs: Any) -> bool:
    """Whether range reads of ``fs`` may go by presigned URLs: an s3fs filesystem with no request
    parameters a URL does not carry."""
    return (
        hasattr(fs, "call_s3")
        and hasattr(fs, "url")
        and not getattr(fs, "req_kw", None)
        and not getattr(fs, "s3_additional_kwargs", None)
        and not getattr(fs, "anon", False)  # an anonymous URL is no faster, and s3fs knows its bucket's rules
    )


_SIGNERS: dict[int, tuple[Any, Any]] = {}
"""This process's signer of each s3fs filesystem, by its id (the filesystem held, so its id is not
another's): by the instance, not its options, whose environment (an endpoint) may have changed."""


def _signer(fs: Any) -> Any:
    """An s3fs filesystem like ``fs`` (same options, so the same credentials, endpoint and region)
    that presigns with Signature Version 4: botocore presigns S3 URLs with version 2 unless the
    client's ``signature_version`` is set, and S3 refuses version 2 for buckets made since 2020."""
    held = _SIGNERS.get(id(fs))
    if held is None or held[0] is not fs:
        options = dict(fs.storage_options)
        options["config_kwargs"] = {**options.get("config_kwargs", {}), "signature_version": "s3v4"}
        held = _SIGNERS[id(fs)] = (fs, type(fs)(**options, skip_instance_cache=True))
    return held[1]


def _http() -> Any:
    """fsspec's HTTP filesystem, with URLs sent as they are (``encoded``: a signature's quoting
    untouched)."""
    import fsspec

    return fsspec.filesystem("http", encoded=True)


__all__ = ["SignedUrl", "can_sign", "SIGNED_FOR", "REFUSED"]
