"""An uploaded object checked against the file it came from, without reading it back where the store
says what it holds (``put_checked``): S3 checks the SHA-256 sent with an object uploaded in one
request (the one its worker computed as it wrote the file), records it and gives it in its answer,
so that checksum is compared, once ``checks_sums`` has found that the store refuses a wrong one; a
store that does not (moto, rclone's S3 server) is checked by the MD5 of the bytes it keeps (its
ETag). A file too large for one request goes up in parts, each with its SHA-256, checked alike
(``packer.output.multipart``). On Google Cloud Storage, the MD5 the store records for an object
is compared with the file's. Other filesystems' objects, and any object no check covers, are read
back and hashed. ``holds`` asks the same of an object already there (a part an interrupted run
left); ``copy_checked`` copies a part to its published name inside the store and checks the copy:
by the SHA-256 the store's answer to the copy gives (S3 carries over the source's; the copy of a
file that went up in parts asks for one of its own), else by its size.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import mimetypes
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from packer.output.multipart import UNSUPPORTED, b64, etag_of, put_in_parts
from packer.output.upload_client import send
from packer.spec.errors import OutputError, damaged_in_store, store_refusal
from packer.spec.listed_files import sha256_of
from packer.spec.locations import unchecked_reads

ONE_REQUEST = 64 << 20
"""Files below this size go up in one request with their SHA-256 (s3fs sends files below twice its
50 MiB part size in one request); larger ones in parts (``packer.output.multipart``)."""
PROBE = ".packer-parts/checksum-probe"
"""Where ``checks_sums`` puts its probe object, under the prefix: among the runs' parts, which every
published run removes (one a killed run left is no stranger's object: ``upload.OWN_NAME``)."""
SUM_REFUSALS = frozenset({"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch"})
"""The error codes of a store refusing an upload whose checksum is not its bytes' (S3's is
``BadDigest``). A probe refused with another code (S3's catch-all ``InvalidRequest`` among them)
says nothing of the store's checks: it is then taken for a store that does not check."""
_WRONG = b64(hashlib.sha256(b"not the probe's bytes").digest())
"""The SHA-256 the probes send with bytes it is not of."""
_CHECKING: dict[tuple[Any, str], bool] = {}
_CHECKING_PARTS: dict[tuple[Any, str], bool] = {}
_PROBING = threading.Lock()
ONE_COPY = 150 << 20
"""Objects below this size are copied by one ``CopyObject`` request (s3fs's own limit for one: S3
allows 5 GB, but a long copy can fail after its answer began); larger ones by s3fs, in parts."""


def checks_sums(fs: Any, root: str) -> bool:
    """Whether the store of ``fs`` refuses an upload whose SHA-256 header is not its bytes' (AWS S3
    does; moto and rclone's S3 server record any header they are sent, and keep bytes damaged on the
    way). Asked once per endpoint and bucket, by the upload of a probe object (``PROBE`` under the
    prefix ``root``) with a wrong SHA-256: a store that checks refuses it; one that keeps it is asked
    to remove it at once. False for a filesystem other than s3fs's. Until asked, no store is trusted
    to have checked (``put_checked``). The probe sends its SHA-256 in a header, as each upload does.
    Whether the store checks the parts of an upload in parts is asked apart (``checks_part_sums``)."""
    if not hasattr(fs, "call_s3"):
        return False
    bucket, key, _ = fs.split_path(f"{root}/{PROBE}")
    return _asked_once(_CHECKING, fs, bucket, lambda: _refuses_a_wrong_sum(fs, bucket, key))


def checks_part_sums(fs: Any, target: str) -> bool:
    """Whether the store of the s3fs filesystem ``fs`` refuses a part of an upload in parts whose
    SHA-256 is not its bytes' (S3 does): a store that checks an object's may still record a part's
    as sent, and then what it records for the whole, a checksum of those sent, proves nothing.
    Asked once per endpoint and bucket, the first time a file goes up in parts: by an upload begun
    at ``target`` itself with one part sent with a wrong SHA-256, then aborted (no object is made)."""
    bucket, key, _ = fs.split_path(target)
    return _asked_once(_CHECKING_PARTS, fs, bucket, lambda: _refuses_a_wrong_part(fs, bucket, key))


def _asked_once(answers: dict, fs: Any, bucket: str, ask: Callable[[], bool]) -> bool:
    """``answers``' answer for the store of ``fs`` and ``bucket``, ``ask``-ed the first time."""
    known = _store(fs, bucket)
    with _PROBING:
        if known not in answers:
            answers[known] = ask()
        return answers[known]


def _refused_for_its_sum(error: OSError) -> bool:
    """Whether a probe's refusal ``error`` is the store's check of the SHA-256 sent (any other
    refusal, S3's catch-all ``InvalidRequest`` among them, says nothing of it); ``error`` raised
    again where no answer came (the connection): the store's error."""
    code = store_refusal(error)
    if code is None:
        raise error
    return code in SUM_REFUSALS


def _refuses_a_wrong_part(fs: Any, bucket: str, key: str) -> bool:
    try:
        started = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256")
    except OSError as e:
        if store_refusal(e) not in UNSUPPORTED:
            raise
        return False  # no checksums on uploads in parts: put_in_parts falls back to s3fs's
    upload = {"Bucket": bucket, "Key": key, "UploadId": started["UploadId"]}
    try:
        send(  # sent as the parts it vouches for are
            fs,
            "upload_part",
            Body=b"packer's checksum probe",
            PartNumber=1,
            ChecksumAlgorithm="SHA256",
            ChecksumSHA256=_WRONG,
            **upload,
        )
    except OSError as e:
        return _refused_for_its_sum(e)
    finally:
        with contextlib.suppress(Exception):  # an upload never completed makes no object
            fs.call_s3("abort_multipart_upload", **upload)
    return False


def _store(fs: Any, bucket: str) -> tuple[str, str]:
    """The endpoint of the S3 client of ``fs`` (connected first) and ``bucket``: what a probe's
    answer holds for (fsspec's token of an s3fs filesystem does not tell endpoints apart)."""
    if getattr(fs, "_s3", None) is None:
        fs.connect()
    return str(fs.s3.meta.endpoint_url), bucket


def _refuses_a_wrong_sum(fs: Any, bucket: str, key: str) -> bool:
    try:
        # sent as the uploads it vouches for are (upload_client: the body unsigned)
        send(fs, "put_object", Bucket=bucket, Key=key, Body=b"packer's checksum probe", ChecksumSHA256=_WRONG)
    except OSError as e:
        return _refused_for_its_sum(e)
    fs.call_s3("delete_object", Bucket=bucket, Key=key)
    return False


def _checked_by_store(fs: Any, bucket: str) -> bool:
    """Whether ``checks_sums`` found that the store of ``fs`` checks the SHA-256 sent with an upload
    into ``bucket`` (False where it was not asked)."""
    known = _store(fs, bucket)
    with _PROBING:
        return _CHECKING.get(known, False)


def put_checked(fs: Any, path: Path, target: str, url: str, sha256: Optional[str] = None) -> None:
    """Upload the file ``path`` as the object ``target`` and check it (OutputError naming ``url`` when
    it differs), without reading it back where the store says what it holds:

    - On S3 the upload carries the file's SHA-256 (``sha256``: its worker's, where it is known;
      a file changed since, or bytes damaged on the way, are refused). Where the store checks it
      on receipt (``checks_sums``), the SHA-256 its answer gives (where it gives none, the
      object's size and recorded SHA-256, asked) is compared with the file's.
    - Where it does not check it, the ETag of its answer, the MD5 it computed of the bytes it keeps
      (for an object put in one request: not with some of S3's encryptions), is compared with the
      MD5 of the bytes sent, and their SHA-256 with ``sha256``.
    - Files of ``ONE_REQUEST`` bytes or more go up in parts, each with its SHA-256, checked alike by
      the answers to them (``multipart.put_in_parts``).
    - On Google Cloud Storage, the MD5 the store records for the object (``md5Hash``) is compared
      with the file's, and the file's SHA-256 with ``sha256`` (``_put_to_gcs``).
    - Elsewhere (another filesystem), or where neither check can be made, the object is read back
      (``check_uploaded``).

    ``sha256``: the file's, where it is known already (a shard's, from its worker); else it is
    computed."""
    size = path.stat().st_size
    if is_gcs(fs):
        _put_to_gcs(fs, path, target, url, sha256)
        return
    if not hasattr(fs, "call_s3"):
        fs.put_file(str(path), target)
        check_uploaded(fs, path, target, url, sha256)
        return
    bucket, key, _ = fs.split_path(target)
    typed = {"ContentType": kind} if (kind := mimetypes.guess_type(path.name)[0]) else {}
    checking = _checked_by_store(fs, bucket)
    with _refusals_said(url, target):
        if size >= ONE_REQUEST:
            checking = checking and checks_part_sums(fs, target)
            shown = put_in_parts(fs, path, target, url, sha256, checking, **typed)
        else:
            shown = _put_whole(fs, path, target, url, sha256, checking, **typed)
    _forget_listings(fs, target)
    if not shown:  # read back: an ETag that is no MD5 (a store's own, an encryption's), or not this one
        check_uploaded(fs, path, target, url, sha256)


def _put_whole(fs: Any, path: Path, target: str, url: str, sha256: Optional[str], checking: bool, **extra: Any) -> bool:
    """Upload the file ``path`` in one request, as s3fs's ``put_file`` does, but keep the answer;
    whether it shows that the store holds the file's bytes (``put_checked``). The request carries
    the worker's SHA-256, in a signed header, and the body unsigned (``upload_client.send``: botocore
    does not hash the bytes at all): a store that checks it refuses bytes other than the worker's;
    one that records it as it came is checked by the bytes sent."""
    bucket, key, _ = fs.split_path(target)
    data = path.read_bytes()
    sent = sha256 or hashlib.sha256(data).hexdigest()
    answer = send(
        fs,
        "put_object",
        Bucket=bucket,
        Key=key,
        Body=data,
        ChecksumAlgorithm="SHA256",
        ChecksumSHA256=b64(bytes.fromhex(sent)),
        **extra,
    )
    if checking:
        if _recorded_sha256(answer) is None:  # a store that does not say it: asked
            answer = fs.call_s3("head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        recorded = _recorded_sha256(answer)
        if recorded is not None:
            stored = answer.get("ContentLength", len(data))  # a PUT's answer has no length
            if stored != len(data) or recorded != sent:
                raise OutputError(
                    f"{url}: {target} is not the file uploaded (size or SHA-256); run the conversion again"
                )
            return True
    if etag_of(answer) != hashlib.md5(data, usedforsecurity=False).hexdigest():
        return False
    # the store keeps the bytes sent: are they the worker's?
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise OutputError(f"{url}: {target} is not the file its worker wrote (SHA-256); run the conversion again")
    return True


def is_gcs(fs: Any) -> bool:
    """Whether ``fs`` is gcsfs's filesystem of Google Cloud Storage (``gs://``)."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "gs" in protocols and hasattr(fs, "consistency")


def _put_to_gcs(fs: Any, path: Path, target: str, url: str, sha256: Optional[str]) -> None:
    """Upload the file ``path`` to Google Cloud Storage as ``target``, checked without reading it
    back: the MD5 the store records for the object (its ``md5Hash``, asked in one request) is
    compared with the MD5 of the file, and the file's SHA-256 with the worker's, both taken before
    it goes up (a file below ``ONE_REQUEST`` bytes is read once, for both and for its upload). Where
    the store records no MD5 (a composite object, one encrypted with a key of the user's own), the
    object is read back."""
    typed = {"content_type": kind} if (kind := mimetypes.guess_type(path.name)[0]) else {}
    data = path.read_bytes() if path.stat().st_size < ONE_REQUEST else None
    md5, whole = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    for block in _blocks(path, data):
        md5.update(block)
        whole.update(block)
    if sha256 is not None and whole.hexdigest() != sha256:
        raise OutputError(f"{url}: {target} is not the file its worker wrote (SHA-256); run the conversion again")
    if data is not None:
        fs.pipe_file(target, data, **typed)
    else:
        fs.put_file(str(path), target, **typed)
    recorded = fs.info(target).get("md5Hash")
    if not recorded:
        check_uploaded(fs, path, target, url, sha256)
    elif base64.b64decode(recorded) != md5.digest():
        raise OutputError(
            f"{url}: {target} is not the file uploaded (the MD5 the store records for it); run the conversion again"
        )


def _blocks(path: Path, data: Optional[bytes]) -> Iterator[bytes]:
    """The bytes of the file ``path``: ``data`` where it was read already, else a MiB at a time."""
    if data is not None:
        yield data
        return
    with open(path, "rb") as f:
        yield from iter(lambda: f.read(1 << 20), b"")


@contextlib.contextmanager
def _refusals_said(url: str, target: str) -> Iterator[None]:
    """A store's refusal of an upload whose bytes are not those of the SHA-256 sent with them (a file
    changed on the local disk since its worker hashed it, or bytes damaged on the way) as an
    OutputError that says so."""
    try:
        yield
    except OSError as e:
        if store_refusal(e) not in SUM_REFUSALS:
            raise
        raise OutputError(
            f"{url}: the store refused {target}: its bytes were not those its worker wrote (their SHA-256), "
            "changed on disk or on the way; run the conversion again"
        ) from None


def copy_checked(fs: Any, source: str, target: str, size: int, sha256: Optional[str] = None) -> None:
    """Copy the object ``source``, of ``size`` bytes (checked when it went up), to ``target`` inside
    the store, then check the copy (OSError when it differs). On S3, one ``CopyObject`` request: its
    answer gives the SHA-256 the store records for the copy (S3 carries over the source's, which was
    checked when the source went up), compared with ``sha256`` (the file's); where the answer gives
    none (other S3-compatible stores), the copy's size is asked. A source that went up in parts
    (``ONE_REQUEST`` bytes or more) has a checksum of its parts' checksums, which moto carries over
    to the copy without marking it as one (botocore then refuses to read the copy): its copy asks
    the store to compute one of its own, and where the store refuses that request (Cloudflare R2:
    ``NotImplemented``), it is copied again without, and its size asked.
    Elsewhere, and from ``ONE_COPY`` bytes, ``cp_file`` copies it (s3fs then asks the source's size
    first, to copy in parts; fsspec's ``copy`` would also list both names as folders, two more
    requests for each file) and the size is asked."""
    recorded = None
    if hasattr(fs, "call_s3") and size < ONE_COPY:
        (bucket, key, _), (into, name, _) = fs.split_path(source), fs.split_path(target)
        copy = {"Bucket": into, "Key": name, "CopySource": {"Bucket": bucket, "Key": key}}
        try:
            computed = {"ChecksumAlgorithm": "SHA256"} if size >= ONE_REQUEST else {}
            answer = fs.call_s3("copy_object", **copy, **computed)
        except OSError as e:
            if not computed or store_refusal(e) not in UNSUPPORTED:
                raise
            answer = {}  # its size asked
            fs.call_s3("copy_object", **copy)
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
    where the store checks the checksums it is sent (``checks_sums``), else read back. False when it
    is gone."""
    try:
        if hasattr(fs, "call_s3"):
            bucket, key, _ = fs.split_path(target)
            head = fs.call_s3("head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED")
            found, recorded = head.get("ContentLength"), _recorded_sha256(head)
            if not _checked_by_store(fs, bucket):  # recorded as sent: no proof of the bytes kept
                recorded = None
        else:
            found, recorded = fs.info(target).get("size"), None
    except FileNotFoundError:
        return False
    if found != size:
        return False
    return (recorded or _sha256_of_object(fs, target)) == sha256


def _sha256_of_object(fs: Any, target: str) -> str:
    """The SHA-256 of the object ``target`` read back. Where botocore finds the bytes other than the
    checksum the store recorded (bytes a store that records any checksum it is sent kept damaged,
    or a store that sends the whole object's checksum with each part of it), it is read again
    without that check: this SHA-256 decides."""
    try:
        return _read_sha256(fs, target)
    except Exception as e:
        if not damaged_in_store(e):
            raise
        return _read_sha256(unchecked_reads(fs), target)


def _read_sha256(fs: Any, target: str) -> str:
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


__all__ = [
    "put_checked",
    "check_uploaded",
    "copy_checked",
    "holds",
    "checks_sums",
    "checks_part_sums",
    "is_gcs",
    "ONE_REQUEST",
    "ONE_COPY",
    "PROBE",
]
