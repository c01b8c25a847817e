"""Shards uploaded to a bucket as the conversion writes them (packer.output.shard_uploads), against an
S3-compatible server on 127.0.0.1: the local folder holds a few shards, never the output; the result
is the local conversion's, byte for byte; a failure leaves the prefix as it was."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import FailsAt, make_tree

from packer.cli import cli
from packer.output import shard_uploads
from packer.output.shard_uploads import AHEAD, ShardUploads
from readers import make_loader, open_dataset

WORKERS = 2


def _convert(src, out, *more: str):
    command = ["convert", str(src), "-f", "wds", "-o", str(out), "--size", "16", "--shard-size", "2", "-q"]
    return CliRunner().invoke(cli, [*command, "--workers", str(WORKERS), *more])


def _shards(manifest: dict) -> list:
    return [(f["path"], f["sha256"]) for s in manifest["shards"] for f in s["files"]]


@pytest.mark.parametrize("order", [[], ["--shuffle", "3"]], ids=["early-start", "planned"])
def test_the_local_folder_holds_a_few_shards_never_the_output(s3_server, tmp_path, monkeypatch, order):
    fs = s3_server
    src = tmp_path / "images"
    make_tree(src, {"ant": 13, "bee": 11})  # 12 shards of 2
    seen: list[int] = []  # at each finished shard: shard files on the local disk (written, or set aside to go up)
    take = ShardUploads.take

    def watched(self, output, folder, result):
        seen.append(len([*folder.glob("shard-*.tar"), *folder.glob(".upload-*.tar")]))
        take(self, output, folder, result)

    monkeypatch.setattr(ShardUploads, "take", watched)
    r = _convert(src, f"s3://data/streamed-{len(order)}", *order)
    assert r.exit_code == 0, r.output
    assert len(seen) == 12
    # being written (one a worker, the one just finished among them) and waiting for their upload (AHEAD)
    assert max(seen) <= WORKERS + AHEAD
    fs.invalidate_cache()
    remote = json.loads(fs.cat_file(f"data/streamed-{len(order)}/manifest.json"))
    assert _convert(src, tmp_path / "local", *order).exit_code == 0
    local = json.loads((tmp_path / "local" / "manifest.json").read_text())
    assert _shards(remote) == _shards(local)  # the same files under the same names
    names = {p.split("/", 2)[2] for p in fs.find(f"data/streamed-{len(order)}")}
    assert names == {p for p, _ in _shards(local)} | {"manifest.json", "report.txt", "shardindex.json"}
    assert CliRunner().invoke(cli, ["verify", f"s3://data/streamed-{len(order)}", "-q"]).exit_code == 0


def test_uploads_overlap_the_conversion(s3_server, tmp_path, monkeypatch):
    src = tmp_path / "images"
    make_tree(src, {"ant": 12})
    before_end: list[int] = []
    finish = ShardUploads.finish

    def watched(self):
        before_end.append(self.bytes)  # uploaded and checked before the last shard's upload was awaited
        finish(self)

    monkeypatch.setattr(ShardUploads, "finish", watched)
    assert _convert(src, "s3://data/overlap").exit_code == 0
    assert before_end and before_end[0] > 0


def test_a_split_set_streams_split_by_split(s3_server, tmp_path):
    fs = s3_server
    src = tmp_path / "set"
    make_tree(src / "train", {"ant": 5, "bee": 4})
    make_tree(src / "val", {"ant": 2, "bee": 2})
    r = _convert(src, "s3://data/set")
    assert r.exit_code == 0, r.output
    assert sum(len(y) for _, y in make_loader(open_dataset("s3://data/set/train"), 4)) == 9
    names = {p.split("/", 2)[2] for p in fs.find("data/set")}
    assert not any(n.split("/")[-1].count("-") == 1 and n.split("/")[-1].startswith("shard-") for n in names)
    assert {n.split("/")[0] for n in names} == {"train", "val", "splits.json"}


def test_a_failed_upload_during_the_conversion_leaves_nothing(s3_server, tmp_path, monkeypatch):
    from packer.output import upload

    fs = s3_server
    src = tmp_path / "images"
    make_tree(src, {"ant": 12})
    monkeypatch.setattr(upload, "put_checked", FailsAt(upload.put_checked, 5))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    r = _convert(src, "s3://data/failed")
    assert r.exit_code == 1 and "connection reset" in r.output, r.output
    fs.invalidate_cache()
    assert not fs.exists("data/failed") or not fs.find("data/failed")  # every object of the run removed
    assert not list((tmp_path / "tmp").iterdir())  # and the local folder
    assert not shard_uploads._SINKS


def test_s3_uploads_are_checked_by_the_sha256_the_store_records(s3_server, tmp_path, monkeypatch):
    from packer.output import upload
    from packer.spec.errors import OutputError

    fs = s3_server
    path = tmp_path / "shard-00000.tar"
    path.write_bytes(b"x" * 100_000)
    monkeypatch.setattr(upload, "check_uploaded", lambda *a: pytest.fail("read back although S3 recorded a SHA-256"))
    upload.put_checked(fs, path, "data/checked/shard-00000.tar", "s3://data/checked")
    assert fs.cat_file("data/checked/shard-00000.tar") == path.read_bytes()
    monkeypatch.setattr(upload, "sha256_of", lambda p: "0" * 64)  # the file now differs from what the store holds
    with pytest.raises(OutputError, match="is not the file uploaded"):
        upload.put_checked(fs, path, "data/checked/shard-00000.tar", "s3://data/checked")


def test_large_files_are_read_back_instead(s3_server, tmp_path, monkeypatch):
    from packer.output import upload

    path = tmp_path / "shard-00000.tar"
    path.write_bytes(b"y" * 5000)
    monkeypatch.setattr(upload, "ONE_REQUEST", 4096)  # as if it were over s3fs's one-request size
    read_back = []
    checked = upload.check_uploaded
    monkeypatch.setattr(upload, "check_uploaded", lambda *a: read_back.append(a[2]) or checked(*a))
    upload.put_checked(s3_server, path, "data/large/shard-00000.tar", "s3://data/large")
    assert read_back == ["data/large/shard-00000.tar"]
