"""A file too large for one request uploaded to S3 in parts, each part sent with its SHA-256, and
checked by the store's answers instead of being read back (``put_in_parts``).

s3fs's ``put_file`` sends the parts of a multipart upload without checksums, so the store records
none for the object, and every shard of packer's default size (256 MB) went up and was then read
back whole to be checked: twice the traffic. Here each part carries its SHA-256 (a store that
checks it, as S3 does, refuses a part damaged on the way), the file's own SHA-256 is computed from
the same reads and compared with its worker's before the upload is completed (a file changed since
is never completed), and what the store records is compared with what was sent: S3's checksum of
the parts' checksums (where ``object_checks.checks_part_sums`` found that the store refuses a part
whose SHA-256 is not its bytes'), or, from a store that does not (moto, rclone's S3 server), the
ETag of a multipart object, the MD5 of the MD5s of the parts it keeps. Where neither shows it, the
caller reads the object back; a store that refuses checksums on multipart uploads gets s3fs's
upload, read back. A failure aborts the upload; the parts of one a killed run left are aborted once
an output is published (``abort_unfinished``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, Optional

from packer.output.upload_client import send
from packer.spec.errors import OutputError, store_refusal

log = logging.getLogger(__name__)

PART = 50 << 20
"""The size of each part (50 MiB, s3fs's own), larger where a file would need more than ``MAX_PARTS``."""
MAX_PARTS = 10_000
"""S3's limit on the parts of one upload."""
IN_FLIGHT = 4
"""Parts of one file read and not yet answered at once (each held in memory until then)."""
PAGES = 1000
"""The most pages of a listing of unfinished uploads ``abort_unfinished`` goes through (a thousand
uploads a page on S3)."""
UNSUPPORTED = frozenset({"NotImplemented", "501", "InvalidArgument", "InvalidRequest"})
"""The error codes of a store refusing a request for a header it does not implement (Cloudflare R2
answers ``x-amz-checksum-algorithm`` on a copy with ``NotImplemented``)."""


_UNCHECKED: set[str] = set()
"""The buckets whose store was found not to take checksums on uploads in parts (said once)."""


class _Part(NamedTuple):
    number: int
    sha256: bytes
    md5: Optional[bytes]
    answer: Any  # the future of the store's answer to its upload


def part_size(size: int) -> int:
    """The part size for a file of ``size`` bytes: ``PART``, or what keeps it within ``MAX_PARTS``."""
    return max(PART, -(-size // MAX_PARTS))


def put_in_parts(
    fs: Any, path: Path, target: str, url: str, sha256: Optional[str], checking: bool, **extra: Any
) -> bool:
    """Upload the file ``path`` (of ``ONE_REQUEST`` bytes or more) to the object ``target`` of the
    s3fs filesystem ``fs`` in parts, each with its SHA-256; ``extra``: more arguments of the upload
    (its ``ContentType``). Returns whether the store shows that it holds the file's bytes; False
    leaves the caller to read it back.

    ``sha256``: the file's SHA-256 as its worker wrote it (OutputError, and the upload aborted, when
    the bytes read here differ); ``checking``: whether the store refuses a part whose SHA-256 is
    not its bytes' (``object_checks.checks_part_sums``); where it does not, the MD5 of each part is
    computed too, for the ETag of the whole."""
    bucket, key, _ = fs.split_path(target)
    try:
        started = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256", **extra)
    except OSError as e:
        if (code := store_refusal(e)) not in UNSUPPORTED:
            raise
        if bucket not in _UNCHECKED:
            _UNCHECKED.add(bucket)
            log.warning(
                "%s: the store does not take checksums on uploads in parts (%s): each file of 64 MB or more "
                "is read back after its upload",
                url,
                code,
            )
        fs.put_file(str(path), target, **extra)
        return False
    upload = {"Bucket": bucket, "Key": key, "UploadId": started["UploadId"]}
    try:
        whole, parts = _send_parts(fs, path, upload, checking)
        if sha256 is not None and whole.hex() != sha256:
            raise OutputError(f"{url}: {target} is not the file its worker wrote (SHA-256); run the conversion again")
        listed = [
            {"PartNumber": p.number, "ETag": p.answer.result()["ETag"], "ChecksumSHA256": b64(p.sha256)} for p in parts
        ]
        done = fs.call_s3("complete_multipart_upload", MultipartUpload={"Parts": listed}, **upload)
    except BaseException:
        with contextlib.suppress(Exception):  # the upload's own error tells more than its abort's
            fs.call_s3("abort_multipart_upload", **upload)
        raise
    if checking:
        of_parts = f"{b64(hashlib.sha256(b''.join(p.sha256 for p in parts)).digest())}-{len(parts)}"
        sent = (of_parts, b64(whole))  # S3's checksum of the parts' checksums; a store's of the whole
        recorded = done.get("ChecksumSHA256")
        if recorded is None:  # a store that does not say it in its answer: asked
            recorded = fs.call_s3("head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED").get("ChecksumSHA256")
        if recorded in sent:
            return True
    # a store that records any checksum it is sent would give back what was sent: its ETag instead,
    # the MD5 of the MD5s it computed of the parts it keeps, and their count
    md5s = [p.md5 for p in parts if p.md5 is not None]
    if len(md5s) < len(parts):
        return False
    return etag_of(done) == f"{hashlib.md5(b''.join(md5s), usedforsecurity=False).hexdigest()}-{len(parts)}"


def _send_parts(fs: Any, path: Path, upload: dict, checking: bool) -> tuple[bytes, list[_Part]]:
    """Read ``path`` a part at a time, hash each part (and the whole file) in this thread, and send
    it, ``IN_FLIGHT`` read and unanswered at once; then wait for every answer. The file's SHA-256
    and its parts."""
    whole = hashlib.sha256()
    parts: list[_Part] = []
    pending: deque = deque()
    step = part_size(path.stat().st_size)
    # leaving the pool waits for every part sent: none is answered after the upload is aborted
    with ThreadPoolExecutor(IN_FLIGHT) as pool, open(path, "rb") as f:
        while True:
            if len(pending) == IN_FLIGHT:  # before the next read: no more parts in memory
                pending.popleft().result()
            block = f.read(step)
            if not block:
                break
            whole.update(block)
            digest = hashlib.sha256(block).digest()
            md5 = None if checking else hashlib.md5(block, usedforsecurity=False).digest()
            number = len(parts) + 1
            request = {"Body": block, "PartNumber": number, "ChecksumSHA256": b64(digest), **upload}
            # the body unsigned: its SHA-256 is in the signed request (upload_client)
            pending.append(pool.submit(send, fs, "upload_part", ChecksumAlgorithm="SHA256", **request))
            parts.append(_Part(number, digest, md5, pending[-1]))
        for answer in pending:
            answer.result()
    return whole.digest(), parts


def abort_unfinished(fs: Any, root: str) -> None:
    """Abort the multipart uploads under the folder ``root`` of the s3fs filesystem ``fs`` that were
    never completed (a killed run's): their parts stay in the store, billed, where no listing shows
    them. Best effort: OSError when the store cannot be asked."""
    if not hasattr(fs, "call_s3"):
        return
    bucket, key, _ = fs.split_path(root)
    asked = {"Bucket": bucket, "Prefix": f"{key}/"}
    for _ in range(PAGES):
        listing = fs.call_s3("list_multipart_uploads", **asked)
        uploads = listing.get("Uploads", [])
        for upload in uploads:
            with contextlib.suppress(FileNotFoundError):  # completed or aborted meanwhile
                fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        after = {"KeyMarker": listing.get("NextKeyMarker"), "UploadIdMarker": listing.get("NextUploadIdMarker")}
        if not listing.get("IsTruncated") or not uploads or not after["KeyMarker"] or after.items() <= asked.items():
            return  # the last page, or a store whose pages do not go on
        asked |= after


def b64(digest: bytes) -> str:
    """A digest as S3's checksum headers and answers give it (base64)."""
    return base64.b64encode(digest).decode()


def etag_of(answer: dict) -> str:
    """The ETag of a store's answer, bare (no quotes, no weak mark, lower case)."""
    return str(answer.get("ETag", "")).removeprefix("W/").strip('"').lower()


__all__ = [
    "put_in_parts",
    "part_size",
    "abort_unfinished",
    "b64",
    "etag_of",
    "PART",
    "MAX_PARTS",
    "IN_FLIGHT",
    "UNSUPPORTED",
]
