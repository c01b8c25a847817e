"""A shard uploaded by the worker that wrote it (packer.output.part_target), against an S3-compatible
server on 127.0.0.1: each file checked and deleted, named as the run's part; stopped between files;
a part that is not the run's refused by the driver."""

from __future__ import annotations

import hashlib

import pytest

from packer.output.part_target import PartTarget
from packer.output.prefix_lock import release
from packer.output.prefix_reservation import reserve
from packer.output.shard_uploads import ShardUploads
from packer.output.upload import PARTS
from packer.records import ShardResult
from packer.spec.entries import FileEntry
from packer.spec.errors import OutputError

TOKEN = "0123456789abcdef"


def _shard(folder, name: str = "shard-00000", sizes=(3000, 10)) -> ShardResult:
    files = []
    for n, size in enumerate(sizes):
        data = bytes(range(256)) * (size // 256) + bytes(size % 256)
        path = folder / f"{name}.{n}.bin"
        path.write_bytes(data)
        files.append(FileEntry(path.name, size, hashlib.sha256(data).hexdigest()))
    return ShardResult(name, 3, files)


def test_each_file_goes_up_checked_as_a_part_of_the_run_and_leaves_the_disk(s3_server, tmp_path):
    result = _shard(tmp_path)
    local = {f.path: (tmp_path / f.path).read_bytes() for f in result.files}
    parts = PartTarget("s3://data/parts", TOKEN, "train").put_parts(tmp_path, result)
    assert set(parts) == set(local)
    for path, part in parts.items():
        assert part.startswith(f"{PARTS}/{TOKEN[:12]}-") and part.endswith(f"/train/{path}")
        assert s3_server.cat_file(f"data/parts/{part}") == local[path]
        assert not (tmp_path / path).exists()


def test_a_file_that_is_not_what_its_worker_hashed_is_an_error_naming_the_url(s3_server, tmp_path):
    result = _shard(tmp_path)
    (tmp_path / result.files[1].path).write_bytes(b"0123456789")  # the same size, other bytes
    with pytest.raises(OutputError, match="s3://data/bad"):
        PartTarget("s3://data/bad", TOKEN).put_parts(tmp_path, result)


def test_a_stopped_run_uploads_no_more_files(s3_server, tmp_path):
    result = _shard(tmp_path)
    asked = []

    def stopped() -> bool:
        asked.append(1)
        return len(asked) > 1  # stopped once the first file is up

    assert PartTarget("s3://data/stopped", TOKEN).put_parts(tmp_path, result, stopped) is None
    assert len(s3_server.find(f"data/stopped/{PARTS}")) == 1 and (tmp_path / result.files[1].path).exists()


def test_the_driver_takes_only_parts_of_its_own_run(s3_server, tmp_path):
    dest = reserve("s3://data/taken", overwrite=False)
    uploads = ShardUploads(dest, tmp_path / "output")
    (tmp_path / "output").mkdir()
    result = _shard(tmp_path)
    result.parts = PartTarget(dest.url, "f" * 16).put_parts(tmp_path, result)  # another run's token
    with pytest.raises(OutputError, match="without a part of this run"):
        uploads.take_uploaded(tmp_path / "output", tmp_path, result)
    result = _shard(tmp_path, "shard-00001")
    result.parts = uploads.target(tmp_path / "output").put_parts(tmp_path, result)
    uploads.take_uploaded(tmp_path / "output", tmp_path, result)
    assert uploads.holds(tmp_path / "output", result.files[0].path) and uploads.bytes == 3010
    orphan = _shard(tmp_path, "shard-00002")  # put up by a task whose result never came back
    uploads.target(tmp_path / "output").put_parts(tmp_path, orphan)
    try:
        uploads.abandon()  # a failure: every part of this run goes, the other run's stay
    finally:
        release(dest)
    s3_server.invalidate_cache("data/taken")
    left = [p.split("/", 2)[2] for p in s3_server.find(f"data/taken/{PARTS}")]
    assert len(left) == 2 and all(p.startswith(f"{PARTS}/ffffffffffff-") for p in left)
