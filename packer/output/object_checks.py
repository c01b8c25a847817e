"""An uploaded object checked against the file it came from, without reading it back where the store
says what it holds: S3 records the SHA-256 of an object uploaded in one request with it
(botocore's ``ChecksumAlgorithm``) and says it in its answer, so that checksum is compared;
elsewhere, or for a multipart upload (whose recorded checksum is one of its parts' checksums), the
object is read back and hashed. ``holds`` asks the same of an object already there (a part an interrupted run left);
``copy_checked`` copies a part to its published name inside the store and checks the copy: by the
SHA-256 the store's answer to the copy records for it where it says (S3 does), else by its size.
"""

from __future__ import annotations

import base64
import hashlib
import mimetypes
from pathlib import Path
from typing import Any, Optional

from packer.spec.errors import OutputError
from packer.spec.listed_files import sha256_of

ONE_REQUEST = 64 << 20
"""Files below this size go up in one request with their SHA-256 (s3fs sends files below twice its
50 MiB part size in one request); larger ones in parts, read back to be checked."""
ONE_COPY = 150 << 20
"""Objects below this size are copied by one ``CopyObject`` request (s3fs's own limit for one: S3
allows 5 GB, but a long copy can fail after its answer began); larger ones by s3fs, in parts."""


def put_checked(fs: Any, path: Path, target: str, url: str, sha256: Optional[str] = None) -> None:
    """Upload the file ``path`` as the object ``target`` and check it (OutputError naming ``url`` when
    it differs). On S3 the upload carries the file's SHA-256 (botocore's ``ChecksumAlgorithm``), which
    the store checks on receipt and records, and says in its answer: that SHA-256 is compared with the
    file's, and no byte is read back (where the answer does not say it, the object's size and recorded
    SHA-256 are asked). Elsewhere, or where the store recorded none (a multipart upload records a
    checksum of its parts' checksums; S3 refuses a multipart upload whose parts s3fs sends without
    theirs, so files of ``ONE_REQUEST`` bytes or more go without it), the object is read back
    (``check_uploaded``). ``sha256``: the file's, where it is known already (a shard's, from its
    worker); else it is computed."""
    size = path.stat().st_size
    answer: Optional[dict] = None
    if hasattr(fs, "call_s3") and size < ONE_REQUEST:  # s3fs: S3 and S3-compatible stores
        # botocore hashes the bytes it sends (never the worker's hash passed on: a store that does not
        # check it would record it as it came, and the comparison below would hold for any bytes).
        # One request, as s3fs's put_file makes it, but whose answer is kept.
        bucket, key, _ = fs.split_path(target)
        typed = {"ContentType": kind} if (kind := mimetypes.guess_type(path.name)[0]) else {}
        answer = fs.call_s3(
            "put_object", Bucket=bucket, Key=key, Body=path.read_bytes(), ChecksumAlgorithm="SHA256", **typed
        )
        _forget_listings(fs, target)
        if _recorded_sha256(answer) is None:  # a store that does not say it: asked
            answer = fs.call_s3("head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    else:
        fs.put_file(str(path), target)
    recorded = _recorded_sha256(answer)
    if recorded is None:  # none, or a multipart upload's checksum of checksums
        check_uploaded(fs, path, target, url, sha256)
        return
    stored = answer.get("ContentLength", size)  # type: ignore[union-attr]  # a PUT's answer has no length
    if stored != size or recorded != (sha256 or sha256_of(path)):
        raise OutputError(f"{url}: {target} is not the file uploaded (size or SHA-256); run the conversion again")


def copy_checked(fs: Any, source: str, target: str, size: int, sha256: Optional[str] = None) -> None:
    """Copy the object ``source``, of ``size`` bytes (checked when it went up), to ``target`` inside
    the store, then check the copy (OSError when it differs). On S3, one ``CopyObject`` request: its
    answer gives the SHA-256 the store records for the copy (S3 carries over the source's, which was
    checked when the source went up), compared with ``sha256`` (the file's); where the answer gives
    none (other S3-compatible stores, a source uploaded in parts), the copy's size is asked.
    Elsewhere, and from ``ONE_COPY`` bytes, ``cp_file`` copies it (s3fs then asks the source's size
    first, to copy in parts; fsspec's ``copy`` would also list both names as folders, two more
    requests for each file) and the size is asked."""
    recorded = None
    if hasattr(fs, "call_s3") and size < ONE_COPY:
        (bucket, key, _), (into, name, _) = fs.split_path(source), fs.split_path(target)
        answer = fs.call_s3("copy_object", Bucket=into, Key=name, CopySource={"Bucket": bucket, "Key": key})
        _forget_listings(fs, target)
        recorded = _recorded_sha256(answer.get("CopyObjectResult"))
    else:
        fs.cp_file(source, target)
    if recorded is not None and sha256 is not None:
        if recorded != sha256:
            raise OSError(f"{target} holds other bytes after its copy from {source} (its recorded SHA-256 differs)")
        return
    copied = fs.info(target).get("size")
    if copied != size:
        raise OSError(f"{target} is {copied} bytes after its copy from {source}, not {size}")


def _forget_listings(fs: Any, target: str) -> None:
    """Drop s3fs's cached listings of the folders above ``target`` (as its own ``put_file`` and
    ``cp_file`` do), on the filesystem's event loop: that cache is not safe across threads, and
    uploads run on several."""
    from fsspec.asyn import sync  # s3fs's own dependency: here only for an s3fs filesystem

    async def forget() -> None:
        fs.invalidate_cache(target)

    sync(fs.loop, forget)


def _recorded_sha256(head: Optional[dict]) -> Optional[str]:
    """The SHA-256 (hex) S3 recorded for an object uploaded in one request with it, from an answer
    that gives it (``head_object``'s, ``put_object``'s, a copy's ``CopyObjectResult``); None where it
    gives none or a multipart upload's checksum of checksums."""
    recorded = (head or {}).get("ChecksumSHA256")
    return None if not recorded or "-" in recorded else base64.b64decode(recorded).hex()


def holds(fs: Any, target: str, size: int, sha256: str) -> bool:
    """Whether the object ``target`` is ``size`` bytes with the SHA-256 ``sha256`` (a shard an
    interrupted run uploaded, before ``--resume`` keeps it): compared with the checksum S3 recorded
    where it did, else read back. False when it is gone."""
    try:
        if hasattr(fs, "call_s3"):
            bucket, key, _ = fs.split_path(target)
            head = fs.call_s3("head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED")
            found, recorded = head.get("ContentLength"), _recorded_sha256(head)
        else:
            found, recorded = fs.info(target).get("size"), None
    except FileNotFoundError:
        return False
    if found != size:
        return False
    return (recorded or _sha256_of_object(fs, target)) == sha256


def _sha256_of_object(fs: Any, target: str) -> str:
    remote = hashlib.sha256()
    with fs.open(target, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            remote.update(block)
    return remote.hexdigest()


def check_uploaded(fs: Any, path: Path, target: str, url: str, sha256: Optional[str] = None) -> None:
    """OutputError unless the object ``target`` reads back as ``path``: its size, then its SHA-256
    (``sha256`` where it is known, else computed)."""
    size = path.stat().st_size
    found = fs.info(target).get("size")
    if found != size:
        raise OutputError(f"{url}: {target} is {found} bytes after its upload, not {size}; run the conversion again")
    if _sha256_of_object(fs, target) != (sha256 or sha256_of(path)):
        raise OutputError(f"{url}: {target} reads back other bytes than were uploaded; run the conversion again")


__all__ = ["put_checked", "check_uploaded", "copy_checked", "holds", "ONE_REQUEST", "ONE_COPY"]
