"""packer.output.multipart against an S3-compatible server on 127.0.0.1 (moto, which records any
SHA-256 it is sent without checking it): a file too large for one request goes up in parts, each
with its SHA-256, and is checked by the answers (the ETag of its parts' MD5s here; S3's checksum
of the parts' checksums where the store checks them), never read back unless they do not show it;
a file that is not its worker's, or a failure on the way, leaves no object and no upload behind."""

from __future__ import annotations

import base64
import hashlib
import io
import threading
import time

import botocore.exceptions
import pytest
from helpers import damage_body, s3_calls

from packer.output import multipart, object_checks
from packer.spec.errors import OutputError

PART = 5 << 20  # S3's least part size (all but the last)


@pytest.fixture
def large(tmp_path, monkeypatch):
    """A file of 11 MiB that goes up in three parts of 5, 5 and 1 MiB, and its SHA-256."""
    monkeypatch.setattr(multipart, "PART", PART)
    monkeypatch.setattr(object_checks, "ONE_REQUEST", PART)
    monkeypatch.setattr(object_checks, "_CHECKING", {})
    monkeypatch.setattr(object_checks, "_CHECKING_PARTS", {})
    path = tmp_path / "shard-00000.tar"
    path.write_bytes(bytes(range(251)) * (11 * (1 << 20) // 251 + 1))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def uploads_left(fs):
    """The multipart uploads begun in the bucket ``data`` and neither completed nor aborted."""
    return fs.call_s3("list_multipart_uploads", Bucket="data").get("Uploads", [])


def read_backs(monkeypatch):
    """The objects ``put_checked`` reads back from now on (a list that grows)."""
    read, real = [], object_checks.check_uploaded
    monkeypatch.setattr(object_checks, "check_uploaded", lambda *a: read.append(a[2]) or real(*a))
    return read


def test_the_part_size_keeps_within_the_stores_count_of_parts():
    assert multipart.part_size(1 << 30) == multipart.PART
    assert multipart.part_size(multipart.PART * multipart.MAX_PARTS + 1) == multipart.PART + 1
    huge = 5 << 40  # S3's largest object
    assert -(-huge // multipart.part_size(huge)) <= multipart.MAX_PARTS


def test_a_large_file_goes_up_in_parts_checked_by_the_etag_of_their_md5s(s3_server, large, monkeypatch):
    fs, (path, digest) = s3_server, large
    read = read_backs(monkeypatch)
    sent = []
    hook = {"before-send.s3.UploadPart": lambda request, **kw: sent.append(request.headers["x-amz-checksum-sha256"])}
    with s3_calls(fs, **hook) as calls:
        object_checks.put_checked(fs, path, "data/parts/shard-00000.tar", "s3://data/parts", digest)
    assert calls == ["CreateMultipartUpload", "UploadPart", "UploadPart", "UploadPart", "CompleteMultipartUpload"]
    assert read == []  # moto's ETag, the MD5 of the MD5s of the parts it keeps, showed it
    data = path.read_bytes()
    assert fs.cat_file("data/parts/shard-00000.tar") == data
    blocks = [data[i : i + PART] for i in range(0, len(data), PART)]
    assert sent == [base64.b64encode(hashlib.sha256(b).digest()) for b in blocks]  # each part's own
    head = fs.call_s3("head_object", Bucket="data", Key="parts/shard-00000.tar")
    assert head["ContentType"] == "application/x-tar" and head["ContentLength"] == len(data)
    assert uploads_left(fs) == []


def test_a_part_damaged_on_the_way_to_a_store_that_does_not_check_is_found_by_reading_back(
    s3_server, large, monkeypatch
):
    fs, (path, digest) = s3_server, large
    read = read_backs(monkeypatch)
    with s3_calls(fs, **{"before-send.s3.UploadPart": damage_body}):  # kept damaged, under the SHA-256 sent
        with pytest.raises(OutputError, match="reads back other bytes than were uploaded"):
            object_checks.put_checked(fs, path, "data/parts/shard-00001.tar", "s3://data/parts", digest)
    assert read == ["data/parts/shard-00001.tar"]  # another ETag: read back, and refused


def test_a_file_that_is_not_its_workers_is_never_completed(s3_server, large):
    fs, (path, _) = s3_server, large
    with s3_calls(fs) as calls:
        with pytest.raises(OutputError, match="shard-00002.tar is not the file its worker wrote"):
            object_checks.put_checked(fs, path, "data/parts/shard-00002.tar", "s3://data/parts", "0" * 64)
    assert "CompleteMultipartUpload" not in calls and calls[-1] == "AbortMultipartUpload"
    assert not fs.exists("data/parts/shard-00002.tar") and uploads_left(fs) == []


def test_a_failed_part_aborts_the_upload(s3_server, large):
    fs, (path, digest) = s3_server, large

    def refuse_the_second(params, **kwargs):
        if params["PartNumber"] == 2:
            raise botocore.exceptions.ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "UploadPart")

    with s3_calls(fs, **{"before-parameter-build.s3.UploadPart": refuse_the_second}):
        with pytest.raises(PermissionError):  # s3fs's translation: the caller names the URL (store_errors)
            object_checks.put_checked(fs, path, "data/parts/shard-00003.tar", "s3://data/parts", digest)
    assert not fs.exists("data/parts/shard-00003.tar") and uploads_left(fs) == []


def composite_of(data: bytes) -> str:
    """S3's checksum of an object put in parts of ``PART`` bytes: the SHA-256 of theirs, "-N"."""
    blocks = [data[i : i + PART] for i in range(0, len(data), PART)]
    of_parts = base64.b64encode(hashlib.sha256(b"".join(hashlib.sha256(b).digest() for b in blocks)).digest())
    return f"{of_parts.decode()}-{len(blocks)}"


def test_a_store_that_checks_is_taken_at_what_it_records(s3_server, large, monkeypatch):
    """A store that checks the SHA-256s it is sent (S3): its answer to the completion gives the
    SHA-256 of the parts' SHA-256s (or, some stores, the whole file's), compared with what was sent;
    the completion lists each part's. An answer that says neither, or other ones, is no proof: read
    back. A part it refuses is said so."""
    fs, (path, digest) = s3_server, large
    monkeypatch.setattr(object_checks, "_checked_by_store", lambda fs, bucket: True)
    monkeypatch.setattr(object_checks, "checks_part_sums", lambda fs, target: True)
    read = read_backs(monkeypatch)
    data = path.read_bytes()
    listed = []
    as_s3 = {
        "before-parameter-build.s3.CompleteMultipartUpload": lambda params, **kw: listed.extend(
            p["ChecksumSHA256"] for p in params["MultipartUpload"]["Parts"]
        ),
        "after-call.s3.CompleteMultipartUpload": lambda parsed, **kw: parsed.update(ChecksumSHA256=composite_of(data)),
    }
    with s3_calls(fs, **as_s3) as calls:
        object_checks.put_checked(fs, path, "data/checked/shard-00000.tar", "s3://data/checked", digest)
    assert read == [] and "HeadObject" not in calls
    blocks = [data[i : i + PART] for i in range(0, len(data), PART)]
    assert listed == [base64.b64encode(hashlib.sha256(b).digest()).decode() for b in blocks]
    assert fs.cat_file("data/checked/shard-00000.tar") == data

    whole = base64.b64encode(bytes.fromhex(digest)).decode()
    as_whole = {"after-call.s3.CompleteMultipartUpload": lambda parsed, **kw: parsed.update(ChecksumSHA256=whole)}
    with s3_calls(fs, **as_whole):
        object_checks.put_checked(fs, path, "data/checked/shard-00001.tar", "s3://data/checked", digest)
    assert read == []

    for answer in (composite_of(data)[:-1] + "4", "AAAA-3"):  # another count of parts; another checksum
        other = {"after-call.s3.CompleteMultipartUpload": lambda parsed, **kw: parsed.update(ChecksumSHA256=answer)}
        with s3_calls(fs, **other):
            object_checks.put_checked(fs, path, "data/checked/shard-00002.tar", "s3://data/checked", digest)
    assert read == ["data/checked/shard-00002.tar"] * 2

    def bad_digest(params, **kwargs):  # as S3 answers a part whose bytes are not its SHA-256's
        if params["PartNumber"] == 3:
            raise botocore.exceptions.ClientError({"Error": {"Code": "BadDigest", "Message": "no"}}, "UploadPart")

    with s3_calls(fs, **{"before-parameter-build.s3.UploadPart": bad_digest}):
        with pytest.raises(OutputError, match="the store refused data/checked/shard-00003.tar: its bytes"):
            object_checks.put_checked(fs, path, "data/checked/shard-00003.tar", "s3://data/checked", digest)
    assert not fs.exists("data/checked/shard-00003.tar") and uploads_left(fs) == []


def test_a_store_that_checks_but_does_not_say_is_asked_then_read_back(s3_server, large, monkeypatch):
    """moto taken for a store that checks: its answer to the completion gives no checksum, and what
    it then records (the parts' checksum of checksums, unmarked) is neither form packer sent. A part
    damaged on the way, which such a store keeps, is then found by reading it back, never taken."""
    fs, (path, digest) = s3_server, large
    monkeypatch.setattr(object_checks, "_checked_by_store", lambda fs, bucket: True)
    monkeypatch.setattr(object_checks, "checks_part_sums", lambda fs, target: True)
    read = read_backs(monkeypatch)
    with s3_calls(fs, **{"before-send.s3.UploadPart": damage_body}) as calls:
        with pytest.raises(OutputError, match="reads back other bytes than were uploaded"):
            object_checks.put_checked(fs, path, "data/unsaid/shard-00000.tar", "s3://data/unsaid", digest)
    assert calls[calls.index("CompleteMultipartUpload") + 1] == "HeadObject"  # asked what it records
    assert read == ["data/unsaid/shard-00000.tar"]


def test_the_store_is_asked_once_whether_it_checks_the_sha256_of_each_part(s3_server, monkeypatch):
    fs = s3_server
    monkeypatch.setattr(object_checks, "_CHECKING_PARTS", {})
    with s3_calls(fs) as calls:
        assert not object_checks.checks_part_sums(fs, "data/probed/shard-00000.tar")  # moto keeps the part
        assert not object_checks.checks_part_sums(fs, "data/probed/shard-00001.tar")  # asked once
    assert calls == ["CreateMultipartUpload", "UploadPart", "AbortMultipartUpload"]
    assert uploads_left(fs) == [] and not fs.exists("data/probed/shard-00000.tar")

    def refused(code, operation):
        def refuse(params, **kwargs):
            raise botocore.exceptions.ClientError({"Error": {"Code": code, "Message": "no"}}, operation)

        return refuse

    monkeypatch.setattr(object_checks, "_CHECKING_PARTS", {})
    with s3_calls(fs, **{"before-parameter-build.s3.UploadPart": refused("BadDigest", "UploadPart")}):
        assert object_checks.checks_part_sums(fs, "data/probed/shard-00000.tar")  # as S3 refuses it
    assert uploads_left(fs) == []
    monkeypatch.setattr(object_checks, "_CHECKING_PARTS", {})
    no_sums = {"before-parameter-build.s3.CreateMultipartUpload": refused("NotImplemented", "CreateMultipartUpload")}
    with s3_calls(fs, **no_sums):
        assert not object_checks.checks_part_sums(fs, "data/probed/shard-00000.tar")


def test_a_store_that_checks_objects_but_keeps_parts_as_sent_is_checked_by_their_md5s(s3_server, large, monkeypatch):
    """A store whose check of an object's SHA-256 the probe saw, but which records a part's as sent
    (moto, taken for one that checks objects): what it records for the whole, a checksum of the
    checksums sent, would hold for any bytes; its ETag, of the MD5s of the parts it keeps, tells."""
    fs, (path, digest) = s3_server, large
    monkeypatch.setattr(object_checks, "_checked_by_store", lambda fs, bucket: True)
    monkeypatch.setattr(object_checks, "_CHECKING_PARTS", {})
    read = read_backs(monkeypatch)
    echoed = {"after-call.s3.CompleteMultipartUpload": lambda parsed, **kw: parsed.update(ChecksumSHA256=echo[0])}
    echo = [composite_of(path.read_bytes())]  # as S3 gives it, "-3": of the checksums packer sent
    with s3_calls(fs, **echoed, **{"before-send.s3.UploadPart": damage_body}):
        with pytest.raises(OutputError, match="reads back other bytes than were uploaded"):
            object_checks.put_checked(fs, path, "data/echoed/shard-00000.tar", "s3://data/echoed", digest)
    assert read == ["data/echoed/shard-00000.tar"]  # the ETag differed: read back, and refused
    with s3_calls(fs, **echoed):
        object_checks.put_checked(fs, path, "data/echoed/shard-00001.tar", "s3://data/echoed", digest)
    assert read == ["data/echoed/shard-00000.tar"]  # the ETag of the parts' MD5s showed it


def test_a_file_without_its_workers_sha256_goes_up_in_parts_all_the_same(s3_server, large, monkeypatch):
    fs, (path, _) = s3_server, large
    read = read_backs(monkeypatch)
    object_checks.put_checked(fs, path, "data/parts/report.txt", "s3://data/parts")
    assert read == [] and fs.cat_file("data/parts/report.txt") == path.read_bytes()


def test_no_more_parts_than_in_flight_are_read_and_unanswered(s3_server, tmp_path, monkeypatch):
    fs = s3_server
    monkeypatch.setattr(multipart, "PART", PART)
    monkeypatch.setattr(multipart, "IN_FLIGHT", 2)
    monkeypatch.setattr(object_checks, "ONE_REQUEST", PART)
    path = tmp_path / "shard-00000.tar"
    path.write_bytes(bytes(range(256)) * (5 * PART // 256))  # five parts
    held, most = [0], [0]
    lock = threading.Lock()

    class Counted(io.FileIO):  # each part read is held until the store answers it
        def readall(self):
            raise AssertionError("read whole")

        def read(self, size=-1):
            block = super().read(size)
            with lock:
                held[0] += bool(block)
                most[0] = max(most[0], held[0])
            return block

    def answered(**kwargs):
        with lock:
            held[0] -= 1

    monkeypatch.setattr(multipart, "open", lambda p, mode: Counted(p, "r"), raising=False)
    slow = {"before-send.s3.UploadPart": lambda **kw: time.sleep(0.2), "after-call.s3.UploadPart": answered}
    with s3_calls(fs, **slow):  # answers slow enough for every part to be read at once, were they not held back
        object_checks.put_checked(fs, path, "data/flight/shard-00000.tar", "s3://data/flight")
    assert most[0] == 2 and held[0] == 0
    assert fs.cat_file("data/flight/shard-00000.tar") == path.read_bytes()


def test_a_store_without_checksums_on_uploads_in_parts_gets_s3fs_upload_read_back(s3_server, large, monkeypatch):
    fs, (path, digest) = s3_server, large
    read = read_backs(monkeypatch)

    def not_implemented(params, **kwargs):  # as a store that does not implement the header
        if params.get("ChecksumAlgorithm"):
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "NotImplemented", "Message": "x-amz-checksum-algorithm"}}, "CreateMultipartUpload"
            )

    with s3_calls(fs, **{"before-parameter-build.s3.CreateMultipartUpload": not_implemented}):
        object_checks.put_checked(fs, path, "data/plain/shard-00000.tar", "s3://data/plain", digest)
    assert read == ["data/plain/shard-00000.tar"] and fs.cat_file("data/plain/shard-00000.tar") == path.read_bytes()


def test_a_file_that_went_up_in_parts_is_copied_with_a_sha256_of_its_own(s3_server, large):
    """What a store records for an object uploaded in parts is a checksum of their checksums, which
    moto carries over to a copy without marking it as one (botocore then refuses to read the copy):
    the copy that gives a shard its published name asks the store for the copy's own SHA-256."""
    fs, (path, digest) = s3_server, large
    size = path.stat().st_size
    object_checks.put_checked(fs, path, "data/copied/part", "s3://data/copied", digest)
    with s3_calls(fs) as calls:
        object_checks.copy_checked(fs, "data/copied/part", "data/copied/shard-00000.tar", size, digest)
    assert calls == ["CopyObject"]  # its answer gave the SHA-256 the store computed of the copy
    assert fs.cat_file("data/copied/shard-00000.tar") == path.read_bytes()  # and botocore reads it
    with pytest.raises(OSError, match="shard-00001.tar holds other bytes after its copy"):
        object_checks.copy_checked(fs, "data/copied/part", "data/copied/shard-00001.tar", size, "0" * 64)

    asked = []

    def not_implemented(params, **kwargs):  # Cloudflare R2's answer to the header on a copy
        asked.append(params.get("ChecksumAlgorithm"))
        if params.get("ChecksumAlgorithm"):
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "NotImplemented", "Message": "x-amz-checksum-algorithm"}}, "CopyObject"
            )

    with s3_calls(fs, **{"before-parameter-build.s3.CopyObject": not_implemented}) as calls:
        object_checks.copy_checked(fs, "data/copied/part", "data/copied/shard-00002.tar", size, digest)
    assert asked == ["SHA256", None] and calls == ["CopyObject", "HeadObject"]  # again without it, its size asked
    assert fs.cat_file("data/copied/shard-00002.tar", start=0, end=100) == path.read_bytes()[:100]


def test_uploads_in_parts_a_killed_run_left_are_aborted_page_by_page(s3_server):
    fs = s3_server
    keys = [f"out/.packer-parts/0123456789ab-{i}/shard-0000{i}.tar" for i in range(3)]
    for key in keys:
        fs.call_s3("create_multipart_upload", Bucket="data", Key=key)
    sibling = fs.call_s3("create_multipart_upload", Bucket="data", Key="out/.packer-partsX/shard-00000.tar")

    def one_a_page(parsed, **kwargs):  # as S3 pages a long listing (moto gives every upload at once)
        if len(parsed.get("Uploads", [])) > 1:
            first = parsed["Uploads"][0]
            parsed.update(
                Uploads=[first], IsTruncated=True, NextKeyMarker=first["Key"], NextUploadIdMarker=first["UploadId"]
            )

    with s3_calls(fs, **{"after-call.s3.ListMultipartUploads": one_a_page}) as calls:
        multipart.abort_unfinished(fs, "data/out/.packer-parts")
    assert calls.count("ListMultipartUploads") == 3 and calls.count("AbortMultipartUpload") == 3
    assert [u["Key"] for u in uploads_left(fs)] == ["out/.packer-partsX/shard-00000.tar"]  # not under the folder
    fs.call_s3("abort_multipart_upload", Bucket="data", Key=sibling["Key"], UploadId=sibling["UploadId"])


def test_a_publish_aborts_the_uploads_in_parts_a_killed_run_left(s3_server, tmp_path, caplog):
    from click.testing import CliRunner
    from conftest import make_tree

    from packer.cli import cli

    fs = s3_server
    left = fs.call_s3(
        "create_multipart_upload", Bucket="data", Key="killed/.packer-parts/0123456789ab-0/shard-00000.tar"
    )
    src = tmp_path / "images"
    make_tree(src, {"ant": 2, "bee": 2})
    convert = ["convert", str(src), "-f", "wds", "-o", "s3://data/killed", "--size", "16", "-q"]
    r = CliRunner().invoke(cli, convert)
    assert r.exit_code == 0, r.output
    assert uploads_left(fs) == [] and left["UploadId"]

    fs.call_s3("create_multipart_upload", Bucket="data", Key="killed/.packer-parts/0123456789ab-1/shard-00000.tar")

    asked = []

    def denied(params, **kwargs):  # credentials without the right to list them (least privilege)
        asked.append(params["Prefix"])
        raise botocore.exceptions.ClientError(
            {"Error": {"Code": "AccessDenied", "Message": "no"}}, "ListMultipartUploads"
        )

    with s3_calls(fs, **{"before-parameter-build.s3.ListMultipartUploads": denied}), caplog.at_level("WARNING"):
        r = CliRunner().invoke(cli, [*convert, "--overwrite"])
    assert r.exit_code == 0, r.output
    assert asked == ["killed/.packer-parts/"]
    assert "could not be" not in caplog.text  # published, and nothing said of what it could not look for
    for upload in uploads_left(fs):
        fs.call_s3("abort_multipart_upload", Bucket="data", Key=upload["Key"], UploadId=upload["UploadId"])


def test_a_store_that_lists_no_uploads_in_parts_is_told_once_a_run_was_killed_there(s3_server, tmp_path, caplog):
    """A store that answers ``NotImplemented`` to the listing of unfinished uploads (s3rver, some
    S3-compatible stores): a note, not a warning after every conversion; a warning naming the
    lifecycle rule where a killed run had left its parts in the prefix."""
    from click.testing import CliRunner
    from conftest import make_tree

    from packer.cli import cli

    fs = s3_server
    src = tmp_path / "images"
    make_tree(src, {"ant": 2, "bee": 2})

    def not_implemented(params, **kwargs):
        raise botocore.exceptions.ClientError(
            {"Error": {"Code": "NotImplemented", "Message": "not implemented"}}, "ListMultipartUploads"
        )

    def convert(prefix: str) -> str:
        caplog.clear()
        with s3_calls(fs, **{"before-parameter-build.s3.ListMultipartUploads": not_implemented}):
            with caplog.at_level("INFO", logger="packer.output.upload"):
                r = CliRunner().invoke(cli, ["convert", str(src), "-f", "wds", "-o", f"s3://data/{prefix}", "-q"])
        assert r.exit_code == 0, r.output
        assert fs.exists(f"data/{prefix}/manifest.json")
        [said] = [r for r in caplog.records if "uploads in parts" in r.getMessage()]
        assert "does not list unfinished uploads in parts (NotImplemented)" in said.getMessage()
        assert "AbortIncompleteMultipartUpload" in said.getMessage()
        return said.levelname

    assert convert("listless") == "INFO"
    fs.pipe_file("data/listless-killed/.packer-parts/0123456789ab-0/shard-00000.tar", b"a killed run's part")
    assert convert("listless-killed") == "WARNING"
    assert not fs.exists("data/listless-killed/.packer-parts")  # the killed run's part went on publishing


def test_a_file_of_one_copy_or_more_is_copied_in_parts_and_reads_whole(s3_server, large, monkeypatch):
    """From ``ONE_COPY`` bytes (s3fs's own threshold), s3fs copies in parts, and the copy reads whole:
    a store's checksum of the source's part checksums is not carried over to it (a one-request copy
    without a checksum of its own would carry it, unmarked, on moto)."""
    import s3fs.core

    fs, (path, digest) = s3_server, large
    size = path.stat().st_size
    monkeypatch.setattr(object_checks, "ONE_COPY", PART)
    monkeypatch.setattr(s3fs.core, "MANAGED_COPY_THRESHOLD", PART)
    object_checks.put_checked(fs, path, "data/big/part", "s3://data/big", digest)
    with s3_calls(fs) as calls:
        object_checks.copy_checked(fs, "data/big/part", "data/big/shard-00000.tar", size, digest)
    assert "UploadPartCopy" in calls and fs.cat_file("data/big/shard-00000.tar") == path.read_bytes()
    with pytest.raises(OSError, match=f"is {size} bytes after its copy"):
        object_checks.copy_checked(fs, "data/big/part", "data/big/shard-00001.tar", size - 1, digest)
