"""The client that sends the bytes of packer's uploads to S3 without hashing them again to sign them.

botocore signs the SHA-256 of a request's body with it (``X-Amz-Content-SHA256``) unless its
``payload_signing_enabled`` setting is off, and it leaves it on for every upload that carries its
own checksum header, over ``https://`` too. Every file packer uploads in one request, and every part
of one uploaded in parts, carries the SHA-256 of its bytes in a signed ``x-amz-checksum-sha256``
header (its worker's, or the part's), so that signing the body as well is one more pass of SHA-256
over every byte uploaded, in the thread that sends it: a store that checks the checksum (S3) refuses
other bytes, and what one that does not keeps is checked after by its answer's ETag
(``object_checks``), so bytes changed on the way are caught either way (over ``http://`` to a store
that does not check, only after the upload, where a signed body would be refused by a store that
checks signatures). ``send`` makes those requests through a twin of the output's s3fs
filesystem with the setting off (its session shared: botocore's service model is not read again),
and through the filesystem itself, signed, where a store refuses them unsigned (said once per
store, remembered for the run).
"""

from __future__ import annotations

import logging
from typing import Any

from packer.spec.errors import store_refusal
from packer.spec.locations import configured_like

log = logging.getLogger(__name__)

UNSIGNED_REFUSALS = frozenset(
    {
        "AccessDenied",
        "SignatureDoesNotMatch",
        "XAmzContentSHA256Mismatch",
        "NotImplemented",
        "InvalidRequest",
        "InvalidArgument",
    }
)
"""The error codes of a store that may refuse a request for an unsigned body: such a request is sent
again signed; one that is refused signed too raises the signed request's error."""
_SIGNED_ONLY: set[tuple[str, str]] = set()
"""The stores (endpoint, bucket) that refused an unsigned body and took it signed."""


def send(fs: Any, method: str, **request: Any) -> dict:
    """``fs.call_s3(method, **request)`` for a request whose body's SHA-256 is in ``request``
    (``ChecksumSHA256``, which the store checks or packer checks after by the ETag), its body not
    hashed again to be signed (see the module). Signed as botocore would where the filesystem's own
    settings ask for it (``config_kwargs={"s3": {"payload_signing_enabled": True}}``)."""
    if "ChecksumSHA256" not in request:
        raise ValueError(f"{method} without ChecksumSHA256 would send its body with nothing to check it")
    if getattr(fs, "_s3", None) is None:
        fs.connect()
    store = (str(fs.s3.meta.endpoint_url), request["Bucket"])
    if store not in _SIGNED_ONLY and not _asks_signed(fs):
        try:
            return _twin(fs).call_s3(method, **request)
        except OSError as e:
            if store_refusal(e) not in UNSIGNED_REFUSALS:
                raise
            answer = fs.call_s3(method, **request)  # its error, where it fails too
            if store not in _SIGNED_ONLY:  # said once (twice at worst, from two threads at once)
                log.info("%s refused an upload with an unsigned body (%s): signed from now on", store[0], e)
                _SIGNED_ONLY.add(store)
            return answer
    return fs.call_s3(method, **request)


def _asks_signed(fs: Any) -> bool:
    """Whether the filesystem's own options turn payload signing on (the user's, kept)."""
    s3 = (getattr(fs, "config_kwargs", None) or {}).get("s3") or {}
    return bool(s3.get("payload_signing_enabled"))


def _twin(fs: Any) -> Any:
    """The s3fs filesystem like ``fs`` with ``payload_signing_enabled`` off."""
    return configured_like(fs, s3={"payload_signing_enabled": False})


__all__ = ["send", "UNSIGNED_REFUSALS"]
