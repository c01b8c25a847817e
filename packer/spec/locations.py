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


__all__ = ["is_url", "names_url"]
