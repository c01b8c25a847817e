"""packer.output.upload_client against an S3-compatible server on 127.0.0.1 (moto), through s3fs and
botocore: an upload's body goes unsigned, its SHA-256 in a signed header, in one request and in
parts; a store that refuses unsigned bodies gets them signed, from then on."""

from __future__ import annotations

import base64
import hashlib

import botocore.exceptions
import pytest
from helpers import s3_calls

from packer.output import multipart, object_checks, upload_client


@pytest.fixture
def sent_headers():
    """The headers of each request botocore sends meanwhile, by operation (``s3_calls``'s events)."""
    seen: list[tuple[str, dict]] = []

    def keep(request, event_name, **kwargs):
        seen.append((event_name.rsplit(".", 1)[1], dict(request.headers)))

    return seen, keep


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def test_an_upload_goes_with_its_sha256_signed_and_its_body_unsigned(s3_server, tmp_path, sent_headers):
    fs = s3_server
    seen, keep = sent_headers
    path = tmp_path / "shard-00000.tar"
    path.write_bytes(b"u" * 50_000)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with s3_calls(fs, **{"before-send.s3.PutObject": keep}):
        object_checks.put_checked(fs, path, "data/unsigned/shard-00000.tar", "s3://data/unsigned", digest)
    assert fs.cat_file("data/unsigned/shard-00000.tar") == path.read_bytes()
    [(_, headers)] = seen
    assert _text(headers["X-Amz-Content-SHA256"]) == "UNSIGNED-PAYLOAD"  # botocore did not hash the body
    assert _text(headers["x-amz-checksum-sha256"]) == base64.b64encode(bytes.fromhex(digest)).decode()
    signed = _text(headers["Authorization"]).split("SignedHeaders=")[1].split(",")[0].split(";")
    assert "x-amz-checksum-sha256" in signed  # the checksum the store checks is under the signature


def test_each_part_of_an_upload_in_parts_goes_unsigned_too(s3_server, tmp_path, monkeypatch, sent_headers):
    fs = s3_server
    seen, keep = sent_headers
    monkeypatch.setattr(multipart, "PART", 5 << 20)  # S3's smallest part
    monkeypatch.setattr(object_checks, "ONE_REQUEST", 1 << 20)
    path = tmp_path / "shard-00001.tar"
    path.write_bytes(bytes(range(256)) * (44 << 10))  # 11 MiB: three parts
    with s3_calls(fs, **{"before-send.s3.UploadPart": keep}):
        object_checks.put_checked(fs, path, "data/unsigned/shard-00001.tar", "s3://data/unsigned")
    assert fs.cat_file("data/unsigned/shard-00001.tar") == path.read_bytes()
    assert [_text(h["X-Amz-Content-SHA256"]) for _, h in seen] == ["UNSIGNED-PAYLOAD"] * 3


def test_a_store_that_refuses_unsigned_bodies_gets_them_signed_from_then_on(s3_server, tmp_path, monkeypatch):
    fs = s3_server
    monkeypatch.setattr(upload_client, "_SIGNED_ONLY", set())
    refused: list[str] = []

    def refuse_unsigned(request, **kwargs):  # as a store that takes only signed bodies would answer
        if _text(request.headers["X-Amz-Content-SHA256"]) == "UNSIGNED-PAYLOAD":
            refused.append(request.url)
            error = {"Error": {"Code": "NotImplemented", "Message": "UNSIGNED-PAYLOAD is not implemented"}}
            raise botocore.exceptions.ClientError(error, "PutObject")

    path = tmp_path / "shard-00002.tar"
    path.write_bytes(b"s" * 3000)
    with s3_calls(fs, **{"before-send.s3.PutObject": refuse_unsigned}) as calls:
        object_checks.put_checked(fs, path, "data/signed/shard-00002.tar", "s3://data/signed")
        assert calls == ["PutObject", "PutObject"] and len(refused) == 1  # refused unsigned, taken signed
        object_checks.put_checked(fs, path, "data/signed/shard-00003.tar", "s3://data/signed")
        assert calls[2:] == ["PutObject"] and len(refused) == 1  # signed at once for this store
    assert fs.cat_file("data/signed/shard-00003.tar") == path.read_bytes()


def test_a_refusal_of_the_signed_request_too_is_the_error_raised(s3_server, tmp_path, monkeypatch):
    fs = s3_server
    monkeypatch.setattr(upload_client, "_SIGNED_ONLY", set())

    tries: list[int] = []

    def deny(params, **kwargs):  # no right to write: refused however it is sent
        tries.append(len(params["Body"]))
        raise botocore.exceptions.ClientError({"Error": {"Code": "AccessDenied", "Message": "denied"}}, "PutObject")

    path = tmp_path / "shard-00004.tar"
    path.write_bytes(b"d" * 1000)
    with s3_calls(fs, **{"before-parameter-build.s3.PutObject": deny}):
        with pytest.raises(PermissionError, match="denied"):
            object_checks.put_checked(fs, path, "data/denied/shard-00004.tar", "s3://data/denied")
    assert tries == [1000, 1000]  # unsigned, then signed: the signed request's refusal is raised
    assert not upload_client._SIGNED_ONLY  # nothing learnt of the store
