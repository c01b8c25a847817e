"""What names a remote location instead of a local folder: a URL (``s3://``, ``gs://``, ``https://``,
any fsspec scheme) or a ``pipe:`` command. The readers stream outputs from such names; the
converter, which writes local folders only, refuses them as destinations."""

from __future__ import annotations

import re
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
    options = dict(fs.storage_options)
    config = {**(options.get("config_kwargs") or {}), "response_checksum_validation": "when_required"}
    return type(fs)(**{**options, "config_kwargs": config})


__all__ = ["is_url", "names_url", "CREDENTIALS", "store_error_reason", "unchecked_reads"]
