"""A file too large for one request uploaded to S3 in parts, each part sent with its SHA-256, and
checked by the store's answers instead of being read back (``put_in_parts``).

s3fs's ``put_file`` sends the parts of a multipart upload without checksums, so the store records
none for the object, and every shard of packer's default size (256 MB) went up and was then read
back whole to be checked: twice the traffic. Here each part carries its SHA-256 (a store that
checks it, as S3 does, refuses a part damaged on the way), the file's own SHA-256 is computed from
the same reads and compared with its worker's before the upload is completed (a file changed since
is never completed), and the answer to the completion is compared with what was sent: S3's
checksum of the parts' checksums, or, from a store that does not check checksums (moto, rclone's
S3 server), the ETag of a multipart object, the MD5 of its parts' MD5s. An answer that is neither
leaves the caller to read the object back. Any failure aborts the upload: no part is left behind.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
from collections import deque
from pathlib import Path
from typing import Any, NamedTuple, Optional

from packer.spec.errors import OutputError

PART = 50 << 20
"""The size of each part (s3fs's own), larger where a file would need more than ``MAX_PARTS``."""
MAX_PARTS = 10_000
"""S3's limit on the parts of one upload."""
IN_FLIGHT = 4
"""Parts of one file sent at once, each held in memory until the store answers."""


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
    """Upload the file ``path`` to the object ``target`` of the s3fs filesystem ``fs`` in parts, each
    with its SHA-256; ``extra``: more arguments of the upload (its ``ContentType``). Returns whether
    the store's answers show that it holds the file's bytes; False leaves the caller to read it back.

    ``sha256``: the file's SHA-256 as its worker wrote it (OutputError, and the upload aborted, when
    the bytes read here differ); ``checking``: whether the store refuses a part whose SHA-256 is not
    its bytes' (``object_checks.checks_sums``); where it does not, the MD5 of each part is computed
    too, for the ETag of the whole."""
    bucket, key, _ = fs.split_path(target)
    started = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256", **extra)
    upload = {"Bucket": bucket, "Key": key, "UploadId": started["UploadId"]}
    try:
        parts = _send_parts(fs, path, upload, checking, sha256, url, target)
        listed = [
            {"PartNumber": p.number, "ETag": p.answer.result()["ETag"], "ChecksumSHA256": _b64(p.sha256)} for p in parts
        ]
        done = fs.call_s3("complete_multipart_upload", MultipartUpload={"Parts": listed}, **upload)
    except BaseException:
        with contextlib.suppress(Exception):  # the upload's own error tells more than its abort's
            fs.call_s3("abort_multipart_upload", **upload)
        raise
    if checking:  # the store checked each part, and the list given with their checksums
        recorded = str(done.get("ChecksumSHA256") or "")  # S3's: the SHA-256 of the parts' SHA-256s, "-N"
        if recorded and recorded.split("-")[0] != _b64(hashlib.sha256(b"".join(p.sha256 for p in parts)).digest()):
            raise OutputError(f"{url}: {target} is not the file uploaded (its SHA-256s); run the conversion again")
        return True
    # a store that records any checksum it is sent would give back what was sent: its ETag instead,
    # the MD5 of the MD5s it computed of the parts it keeps, and their count
    etag = str(done.get("ETag", "")).removeprefix("W/").strip('"').lower()
    of_parts = hashlib.md5(b"".join(p.md5 or b"" for p in parts), usedforsecurity=False).hexdigest()
    return etag == f"{of_parts}-{len(parts)}"


def _send_parts(
    fs: Any, path: Path, upload: dict, checking: bool, sha256: Optional[str], url: str, target: str
) -> list[_Part]:
    """Read ``path`` a part at a time, hash each part (and the whole file) in this thread, and send
    it on the filesystem's event loop, ``IN_FLIGHT`` at once; then wait for every answer."""
    whole = hashlib.sha256()
    parts: list[_Part] = []
    pending: deque = deque()
    step = part_size(path.stat().st_size)
    try:
        with open(path, "rb") as f:
            for number, block in enumerate(iter(lambda: f.read(step), b""), 1):
                if len(pending) == IN_FLIGHT:
                    pending.popleft().result()
                whole.update(block)
                digest = hashlib.sha256(block).digest()
                md5 = None if checking else hashlib.md5(block, usedforsecurity=False).digest()
                request = fs._call_s3(
                    "upload_part",
                    Body=block,
                    PartNumber=number,
                    ChecksumAlgorithm="SHA256",
                    ChecksumSHA256=_b64(digest),
                    **upload,
                )
                pending.append(asyncio.run_coroutine_threadsafe(request, fs.loop))
                parts.append(_Part(number, digest, md5, pending[-1]))
        for answer in pending:
            answer.result()
    except BaseException:
        for answer in pending:  # answered before the upload is aborted: a part sent after it would stay
            with contextlib.suppress(BaseException):
                answer.result()
        raise
    if sha256 is not None and whole.hexdigest() != sha256:
        raise OutputError(f"{url}: {target} is not the file its worker wrote (SHA-256); run the conversion again")
    return parts


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


__all__ = ["put_in_parts", "part_size", "PART", "MAX_PARTS", "IN_FLIGHT"]
