"""packer.output.object_checks against an S3-compatible server on 127.0.0.1 (moto, which records any
SHA-256 it is sent without checking it, as rclone's S3 server does): whether a store checks the
SHA-256 it is sent is asked once, by a probe; an upload is checked by the SHA-256 a store that
checks gives, by the MD5 of the bytes it keeps (its ETag) where it does not, and read back where
neither says; an object already there is held as recorded or not; a copy is one object's, checked
by the SHA-256 the store's answer gives for it, else by its size."""

from __future__ import annotations

import base64
import hashlib

import botocore.exceptions
import pytest
from helpers import damage_body, s3_calls, whole_checksums_with_parts

from packer.output import object_checks
from packer.spec.errors import OutputError


@pytest.fixture
def checking_store(monkeypatch):
    """Every S3 store taken for one that checks the SHA-256 sent with each upload, as S3 does (moto
    does not, and no server that does installs here)."""
    monkeypatch.setattr(object_checks, "_checked_by_store", lambda fs, bucket: True)


def test_the_store_is_asked_once_whether_it_checks_the_sha256_it_is_sent(s3_server, monkeypatch):
    fs = s3_server
    monkeypatch.setattr(object_checks, "_CHECKING", {})
    with s3_calls(fs) as calls:
        assert not object_checks.checks_sums(fs, "data/probed")  # moto keeps an upload with a wrong one
        assert calls == ["PutObject", "DeleteObject"]
        assert not object_checks.checks_sums(fs, "data/elsewhere")  # the same bucket: not asked again
        assert calls == ["PutObject", "DeleteObject"]
    assert not fs.exists(f"data/probed/{object_checks.PROBE}")  # kept, so removed at once
    from packer.output.upload import OWN_NAME

    assert OWN_NAME.fullmatch(object_checks.PROBE)  # one a killed run leaves is packer's own, removed later

    def refused(code):
        def refuse(params, **kwargs):
            if params["Key"].endswith(object_checks.PROBE):
                raise botocore.exceptions.ClientError({"Error": {"Code": code, "Message": "no"}}, "PutObject")

        return refuse

    monkeypatch.setattr(object_checks, "_CHECKING", {})
    with s3_calls(fs, **{"before-parameter-build.s3.PutObject": refused("BadDigest")}):  # as S3 refuses a wrong SHA-256
        assert object_checks.checks_sums(fs, "data/probed")
    for code in ("InvalidRequest", "AccessDenied"):  # any other refusal says nothing of its checks
        monkeypatch.setattr(object_checks, "_CHECKING", {})
        with s3_calls(fs, **{"before-parameter-build.s3.PutObject": refused(code)}):
            assert not object_checks.checks_sums(fs, "data/probed")


def test_a_prefix_is_reserved_once_its_store_was_asked_and_let_go_when_it_cannot_be(s3_server, monkeypatch):
    from packer.output.prefix_lock import LOCK_NAME
    from packer.output.prefix_reservation import release, reserve

    fs = s3_server
    monkeypatch.setattr(object_checks, "_CHECKING", {})
    dest = reserve("s3://data/reserved", overwrite=False)
    try:
        assert list(object_checks._CHECKING.values()) == [False]  # moto asked: it does not check
    finally:
        release(dest)
    monkeypatch.setattr(object_checks, "_CHECKING", {})

    def unreachable(params, **kwargs):
        if params["Key"].endswith(object_checks.PROBE):
            raise ConnectionResetError("connection reset")

    with s3_calls(fs, **{"before-parameter-build.s3.PutObject": unreachable}):
        with pytest.raises(OutputError, match="cannot write s3://data/unreached: .*connection reset"):
            reserve("s3://data/unreached", overwrite=False)
    assert not fs.exists(f"data/unreached/{LOCK_NAME}") and object_checks._CHECKING == {}  # let go, not cached


def test_s3_uploads_are_checked_by_the_sha256_the_store_records(s3_server, tmp_path, monkeypatch, checking_store):
    fs = s3_server
    path = tmp_path / "shard-00000.tar"
    path.write_bytes(b"x" * 100_000)
    fail = lambda *a: pytest.fail("read back although S3 recorded a SHA-256")  # noqa: E731
    monkeypatch.setattr(object_checks, "check_uploaded", fail)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    sent = []
    header = {
        "before-send.s3.PutObject": lambda request, **kwargs: sent.append(request.headers["x-amz-checksum-sha256"])
    }
    with s3_calls(fs, **header):
        object_checks.put_checked(fs, path, "data/checked/shard-00000.tar", "s3://data/checked", digest)
    assert fs.cat_file("data/checked/shard-00000.tar") == path.read_bytes()
    assert sent == [base64.b64encode(bytes.fromhex(digest))]  # the worker's, not hashed again

    other = base64.b64encode(b"\0" * 32).decode()  # a store whose answer records another SHA-256
    elsewhere = {"after-call.s3.PutObject": lambda parsed, **kwargs: parsed.update(ChecksumSHA256=other)}
    with s3_calls(fs, **elsewhere):
        with pytest.raises(OutputError, match="is not the file uploaded"):
            object_checks.put_checked(fs, path, "data/checked/shard-00000.tar", "s3://data/checked")


def test_an_upload_the_store_finds_other_than_its_sha256_is_refused_with_a_message(s3_server, tmp_path):
    """A store that checks (S3) refuses bytes whose SHA-256 is not the worker's, sent with them: a
    file changed on the local disk since its worker wrote it, or bytes damaged on the way."""
    fs = s3_server
    path = tmp_path / "shard-00006.tar"
    path.write_bytes(b"w" * 3000)

    def refuse(params, **kwargs):  # as S3 answers an upload whose bytes are not its SHA-256's
        if params["ChecksumSHA256"] != base64.b64encode(hashlib.sha256(params["Body"]).digest()).decode():
            raise botocore.exceptions.ClientError({"Error": {"Code": "BadDigest", "Message": "no"}}, "PutObject")

    with s3_calls(fs, **{"before-parameter-build.s3.PutObject": refuse}):
        object_checks.put_checked(fs, path, "data/refused/shard-00005.tar", "s3://data/refused")  # its own
        with pytest.raises(
            OutputError, match="the store refused data/refused/shard-00006.tar: its bytes were not those"
        ):
            object_checks.put_checked(fs, path, "data/refused/shard-00006.tar", "s3://data/refused", "0" * 64)
    assert not fs.exists("data/refused/shard-00006.tar")


def test_a_store_that_does_not_check_is_checked_by_the_md5_of_what_it_keeps(s3_server, tmp_path, monkeypatch):
    fs = s3_server
    monkeypatch.setattr(object_checks, "_CHECKING", {})
    object_checks.checks_sums(fs, "data/md5")  # moto: no
    path = tmp_path / "shard-00003.tar"
    path.write_bytes(bytes(range(256)) * 200)
    with s3_calls(fs) as calls:
        object_checks.put_checked(fs, path, "data/md5/shard-00003.tar", "s3://data/md5")
        assert calls == ["PutObject"]  # its ETag is the MD5 of the bytes it keeps: this file's

    with s3_calls(fs, **{"before-send.s3.PutObject": damage_body}) as calls:
        with pytest.raises(OutputError, match="reads back other bytes than were uploaded"):
            object_checks.put_checked(fs, path, "data/md5/shard-00004.tar", "s3://data/md5")
        assert calls[0] == "PutObject" and "GetObject" in calls  # another MD5: read back, and refused
    kept = fs.cat_file("data/md5/shard-00004.tar", start=1000, end=1001)  # what moto kept, with the SHA-256 sent
    assert kept != path.read_bytes()[1000:1001]
    head = fs.call_s3("head_object", Bucket="data", Key="md5/shard-00004.tar", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"]  # recorded as sent: which is why it proves nothing here

    unlike = {"after-call.s3.PutObject": lambda parsed, **kwargs: parsed.update(ETag='"abc-2"')}
    with s3_calls(fs, **unlike) as calls:  # an ETag that is no MD5 (a store's own, an encryption's): read back
        object_checks.put_checked(fs, path, "data/md5/shard-00005.tar", "s3://data/md5")
        assert "GetObject" in calls


def test_an_object_there_is_held_by_its_recorded_sha256_or_read_back(s3_server, tmp_path, monkeypatch):
    fs = s3_server
    path = tmp_path / "part"
    path.write_bytes(b"z" * 3000)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    object_checks.put_checked(fs, path, "data/held/part", "s3://data/held")  # S3 records its SHA-256
    fs.pipe("data/held/piped", path.read_bytes())  # no checksum recorded: read back
    reads = []
    read = object_checks._sha256_of_object
    monkeypatch.setattr(object_checks, "_sha256_of_object", lambda fs, t: reads.append(t) or read(fs, t))
    assert object_checks.holds(fs, "data/held/part", 3000, digest) and reads == ["data/held/part"]  # moto: read
    reads.clear()
    monkeypatch.setattr(object_checks, "_checked_by_store", lambda fs, bucket: True)  # a store that checks, as S3
    assert object_checks.holds(fs, "data/held/part", 3000, digest) and reads == []
    assert not object_checks.holds(fs, "data/held/part", 3000, "0" * 64)  # another file's
    assert not object_checks.holds(fs, "data/held/part", 2999, digest)  # another size
    assert object_checks.holds(fs, "data/held/piped", 3000, digest) and reads == ["data/held/piped"]
    fs.pipe("data/held/piped", b"y" * 3000)
    assert not object_checks.holds(fs, "data/held/piped", 3000, digest)  # same size, other bytes
    assert not object_checks.holds(fs, "data/held/gone", 3000, digest)


def test_a_copy_is_one_object_copied_then_its_size_checked(s3_server, monkeypatch):
    fs = s3_server
    fs.pipe("data/copies/part", b"c" * 1000)  # no checksum recorded: the copy's answer has none either

    async def listed(*a, **k):
        pytest.fail("a copy listed the store (fsspec's copy asks whether each name is a folder)")

    monkeypatch.setattr(type(fs), "_lsdir", listed)
    object_checks.copy_checked(fs, "data/copies/part", "data/copies/shard", 1000)
    assert fs.cat_file("data/copies/shard") == b"c" * 1000
    with pytest.raises(OSError, match="is 1000 bytes after its copy from data/copies/part, not 999"):
        object_checks.copy_checked(fs, "data/copies/part", "data/copies/other", 999)


def test_a_copy_is_checked_by_the_sha256_its_answer_records_without_another_request(s3_server, tmp_path):
    fs = s3_server
    path = tmp_path / "part"
    path.write_bytes(b"d" * 2000)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    object_checks.put_checked(fs, path, "data/copies/checked-part", "s3://data/copies")  # with its SHA-256
    with s3_calls(fs) as calls:
        object_checks.copy_checked(fs, "data/copies/checked-part", "data/copies/checked-shard", 2000, digest)
        assert calls == ["CopyObject"]  # neither the source's size nor the copy's asked: the answer said
        with pytest.raises(OSError, match="checked-other holds other bytes after its copy .* SHA-256 differs"):
            object_checks.copy_checked(fs, "data/copies/checked-part", "data/copies/checked-other", 2000, "0" * 64)
        calls.clear()
        object_checks.copy_checked(fs, "data/copies/checked-part", "data/copies/unknown", 2000)  # no hash: the size
        assert calls == ["CopyObject", "HeadObject"]
    assert fs.cat_file("data/copies/checked-shard") == path.read_bytes()
    # a store whose answer to a copy does not give its SHA-256 (rclone's S3 server): the copy's size is asked
    unsaid = {"after-call.s3.CopyObject": lambda parsed, **kwargs: parsed["CopyObjectResult"].pop("ChecksumSHA256")}
    with s3_calls(fs, **unsaid) as calls:
        object_checks.copy_checked(fs, "data/copies/checked-part", "data/copies/sized", 2000, digest)
        assert calls == ["CopyObject", "HeadObject"]
        with pytest.raises(OSError, match="sized-wrong is 2000 bytes after its copy .*, not 1999"):
            object_checks.copy_checked(fs, "data/copies/checked-part", "data/copies/sized-wrong", 1999, digest)


def test_an_upload_is_checked_by_its_answer_in_one_request(s3_server, tmp_path, checking_store):
    fs = s3_server
    path = tmp_path / "shard-00001.tar"
    path.write_bytes(b"e" * 4000)
    with s3_calls(fs) as calls:
        object_checks.put_checked(fs, path, "data/answered/shard-00001.tar", "s3://data/answered")
        assert calls == ["PutObject"]  # the answer says the SHA-256 the store checked and recorded
    head = fs.call_s3("head_object", Bucket="data", Key="answered/shard-00001.tar")
    assert head["ContentType"] == "application/x-tar" and head["ContentLength"] == 4000  # as s3fs's put_file
    # a store whose answer does not say it: the recorded SHA-256 is asked
    unsaid = {"after-call.s3.PutObject": lambda parsed, **kwargs: parsed.pop("ChecksumSHA256")}
    with s3_calls(fs, **unsaid) as calls:
        object_checks.put_checked(fs, path, "data/answered/shard-00002.tar", "s3://data/answered")
        assert calls == ["PutObject", "HeadObject"]


def test_a_store_that_sends_the_whole_objects_checksum_with_a_part_is_read_back_all_the_same(
    s3_server, tmp_path, monkeypatch
):
    """rclone's S3 server answers a ranged read with the whole object's SHA-256: botocore refuses each
    part, so an object larger than one of s3fs's blocks read back again without botocore's check
    (the SHA-256 computed here decides)."""
    import s3fs

    data = bytes(range(256)) * 16384  # 4 MiB, read a MiB at a time
    s3_server.pipe("data/parts/whole", data)
    whole_checksums_with_parts(monkeypatch, hashlib.sha256(data).digest())
    fs = s3fs.S3FileSystem(default_block_size=256 << 10, skip_instance_cache=True)  # ranges of a part
    with pytest.raises(Exception, match="did not match calculated checksum"):  # botocore's own check
        object_checks._read_sha256(fs, "data/parts/whole")
    assert object_checks._sha256_of_object(fs, "data/parts/whole") == hashlib.sha256(data).hexdigest()
    s3_server.pipe("data/parts/other", data[:-1] + b"!")  # kept damaged: the SHA-256 here tells it
    assert object_checks._sha256_of_object(fs, "data/parts/other") != hashlib.sha256(data).hexdigest()
