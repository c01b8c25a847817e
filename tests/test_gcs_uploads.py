"""Uploads to Google Cloud Storage (packer.output.object_checks.put_checked on gcsfs) against a Cloud
Storage emulator on 127.0.0.1: each checked by the MD5 the store records for what it keeps and the
SHA-256 of the file, without reading the object back; a file changed since its worker hashed it, or
an object recorded as other bytes, refused with a message; an object without an MD5 read back;
a conversion into the store verified and read as the local one."""

from __future__ import annotations

import hashlib

import pytest
from click.testing import CliRunner
from conftest import make_tree

from packer.cli import cli
from packer.output import object_checks
from packer.spec.errors import OutputError
from readers import make_loader, open_dataset


@pytest.fixture
def no_read_back(monkeypatch):
    """Every read back (``check_uploaded``) a test failure."""
    fail = lambda *a: pytest.fail("read back although the store's answer gave its MD5")  # noqa: E731
    monkeypatch.setattr(object_checks, "check_uploaded", fail)


def test_an_upload_is_checked_by_the_md5_of_the_answer_not_read_back(gcs_server, tmp_path, no_read_back):
    fs = gcs_server
    path = tmp_path / "shard-00000.tar"
    path.write_bytes(bytes(range(256)) * 400)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert object_checks.is_gcs(fs)
    object_checks.put_checked(fs, path, "data/up/shard-00000.tar", "gs://data/up", digest)
    assert fs.cat_file("data/up/shard-00000.tar") == path.read_bytes()
    assert fs.info("data/up/shard-00000.tar")["contentType"] == "application/x-tar"


def test_a_large_file_is_hashed_then_goes_up_from_the_file(gcs_server, tmp_path, monkeypatch, no_read_back):
    fs = gcs_server
    monkeypatch.setattr(object_checks, "ONE_REQUEST", 1 << 20)
    path = tmp_path / "shard-00001.tar"
    path.write_bytes(bytes(range(251)) * (24 << 10))  # 6 MB: gcsfs's upload in chunks
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    object_checks.put_checked(fs, path, "data/up/shard-00001.tar", "gs://data/up", digest)
    assert fs.cat_file("data/up/shard-00001.tar") == path.read_bytes()
    with pytest.raises(OutputError, match="shard-00002.tar is not the file its worker wrote"):
        object_checks.put_checked(fs, path, "data/up/shard-00002.tar", "gs://data/up", "0" * 64)
    assert not fs.exists("data/up/shard-00002.tar")  # hashed before it went up


def test_a_file_changed_since_its_worker_hashed_it_is_refused_before_it_goes_up(gcs_server, tmp_path):
    fs = gcs_server
    path = tmp_path / "shard-00003.tar"
    path.write_bytes(b"c" * 5000)
    with pytest.raises(OutputError, match=r"gs://data/up: data/up/shard-00003.tar is not the file its worker wrote"):
        object_checks.put_checked(fs, path, "data/up/shard-00003.tar", "gs://data/up", "0" * 64)
    assert not fs.exists("data/up/shard-00003.tar")


def test_an_object_the_store_records_as_other_bytes_is_refused(gcs_server, tmp_path, monkeypatch, no_read_back):
    from gcp_storage_emulator.handlers import objects

    fs = gcs_server
    # the store records the MD5 of other bytes than were sent (damaged on the way, or in the store)
    monkeypatch.setattr(objects, "_md5", lambda content: objects.b64encode(b"\0" * 16).decode())
    path = tmp_path / "shard-00004.tar"
    path.write_bytes(b"d" * 5000)
    with pytest.raises(OutputError, match="shard-00004.tar is not the file uploaded .the MD5 the store records"):
        object_checks.put_checked(fs, path, "data/up/shard-00004.tar", "gs://data/up")


def test_an_object_without_an_md5_is_read_back(gcs_server, tmp_path, monkeypatch):
    from gcp_storage_emulator import server

    fs = gcs_server
    said = server.Response.json

    def without_md5(response, obj):  # a store that records none (an object encrypted with the user's own key)
        return said(response, {k: v for k, v in obj.items() if k != "md5Hash"} if isinstance(obj, dict) else obj)

    monkeypatch.setattr(server.Response, "json", without_md5)
    read_back = []
    check = object_checks.check_uploaded
    monkeypatch.setattr(object_checks, "check_uploaded", lambda *a: read_back.append(a[2]) or check(*a))
    path = tmp_path / "shard-00005.tar"
    path.write_bytes(b"e" * 5000)
    object_checks.put_checked(fs, path, "data/up/shard-00005.tar", "gs://data/up")
    assert read_back == ["data/up/shard-00005.tar"]
    assert fs.cat_file("data/up/shard-00005.tar") == path.read_bytes()


@pytest.mark.parametrize("fmt", ["npy", "wds"])
def test_a_conversion_into_cloud_storage_is_verified_and_read_as_the_local_one(gcs_server, tmp_path, fmt):
    fs = gcs_server
    src = tmp_path / "images"
    make_tree(src, {"ant": 7, "bee": 6})
    local, url = tmp_path / fmt, f"gs://data/converted-{fmt}"
    shards = ["--shard-size", "4", "--size", "16x12", "-q"]
    assert CliRunner().invoke(cli, ["convert", str(src), "-f", fmt, "-o", str(local), *shards]).exit_code == 0
    done = CliRunner().invoke(cli, ["convert", str(src), "-f", fmt, "-o", url, *shards])
    assert done.exit_code == 0, done.output
    assert "every file checked, the manifest last" in done.output
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(url)) == sorted(p.name for p in local.iterdir())
    assert not fs.exists(f"{url}/.packer-parts")  # the run's parts and records gone once published
    checked = CliRunner().invoke(cli, ["verify", url, "-q"])
    assert checked.exit_code == 0 and "is intact: 13 samples" in checked.output
    batches = [
        [(b[0].numpy().tobytes(), b[1].tolist()) for b in make_loader(open_dataset(root), 4, shuffle=False)]
        for root in (url, local)
    ]
    assert batches[0] == batches[1]
