"""What names a remote location instead of a local folder: a URL (``s3://``, ``gs://``, ``https://``,
any fsspec scheme) or a ``pipe:`` command. The readers stream outputs from such names; the
converter, which writes local folders only, refuses them as destinations."""

from __future__ import annotations

import re

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


__all__ = ["is_url", "names_url", "CREDENTIALS"]
