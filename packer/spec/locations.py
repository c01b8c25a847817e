"""What names a remote location instead of a local folder: a URL (``s3://``, ``gs://``, ``https://``,
any fsspec scheme) or a ``pipe:`` command. The readers stream outputs from such names; the
converter, which writes local folders only, refuses them as destinations."""

from __future__ import annotations

import os
import re
import threading
from typing import Any, Optional

from packer.spec.errors import client_error

_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_PATHLIB_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]+:/")
"""What ``pathlib`` makes of ``s3://bucket`` (``s3:/bucket``); drive letters (``C:/``) have one letter."""


def is_url(root: object) -> bool:
    """True when ``root`` names a remote output (a URL or a ``pipe:`` command), not a local folder."""
    return isinstance(root, str) and (root.startswith("pipe:") or bool(_SCHEME.match(root)))


def names_url(text: str) -> bool:
    """``is_url``, also for a URL that went through ``pathlib.Path`` on its way (``s3:/bucket``)."""
    return is_url(text) or bool(_PATHLIB_SCHEME.match(text))


CREDENTIALS = {
    "s3": "s3:// URLs are read and written with the standard AWS settings: AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, a profile of ~/.aws/credentials), and AWS_ENDPOINT_URL for an "
    "S3-compatible store",
    "gs": "gs:// URLs are read and written with Google's default credentials: GOOGLE_APPLICATION_CREDENTIALS "
    "(a key file) or gcloud auth application-default login",
}
"""What a credentials error of each scheme's backend means, said to the user."""


def store_error_reason(error: BaseException, url: str) -> Optional[str]:
    """What a message about ``url`` says of ``error`` when it is the storage client's own (no
    OSError): missing credentials, with the settings the scheme's client reads; botocore's others
    (an endpoint that does not answer, ...) as they are. None for any other error."""
    if "Credentials" in type(error).__name__ and url.split("://")[0] in CREDENTIALS:
        return f"{error}. {CREDENTIALS[url.split('://')[0]]}"
    return str(error) if client_error(error) else None


def unchecked_reads(fs: Any) -> Any:
    """The s3fs filesystem ``fs`` again, but for botocore's check of what it reads against the
    checksum the store recorded for the whole object: some stores (rclone's S3 server) send that
    checksum with a part of the object, which botocore then finds other than the part's, so that no
    file larger than one of s3fs's blocks reads. For callers that check what they read themselves
    (packer's SHA-256s and per-sample checksums)."""
    return configured_like(fs, response_checksum_validation="when_required")


_LIKE: dict[tuple, tuple[Any, Any]] = {}
"""The filesystems ``configured_like`` made, by process id, filesystem id and settings, each with the
filesystem it is like (held, so that its id is not another's)."""
_LIKE_LOCK = threading.Lock()


def _new_lock() -> None:
    global _LIKE_LOCK
    _LIKE_LOCK = threading.Lock()  # a fork may copy the lock held by another thread of the parent


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock)


def configured_like(fs: Any, **config: Any) -> Any:
    """The s3fs filesystem ``fs`` again (its options, so its credentials, endpoint and region, and its
    botocore session, so the service model is not read again) with ``config`` merged into its
    botocore settings (``config_kwargs``; a dict value, as ``s3``, merged into the one there). Made
    once per process, filesystem and settings; a forked process makes its own and leaves its
    parent's alone (dropping them would close their sessions on the parent's event loop)."""
    known = (os.getpid(), id(fs), repr(sorted(config.items())))
    with _LIKE_LOCK:
        held = _LIKE.get(known)
    if held is not None and held[0] is fs:
        return held[1]
    if getattr(fs, "_s3", None) is None:
        fs.connect()  # its session, to share
    options = dict(fs.storage_options)
    merged = dict(options.get("config_kwargs") or {})
    for key, value in config.items():
        merged[key] = {**(merged.get(key) or {}), **value} if isinstance(value, dict) else value
    like = type(fs)(**{**options, "config_kwargs": merged, "session": fs.session}, skip_instance_cache=True)
    with _LIKE_LOCK:
        held = _LIKE.get(known)
        if held is None or held[0] is not fs:  # none yet, or of a filesystem gone whose id this one took
            held = _LIKE[known] = (fs, like)
        return held[1]


__all__ = ["is_url", "names_url", "CREDENTIALS", "store_error_reason", "unchecked_reads", "configured_like"]
