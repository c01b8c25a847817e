"""Outputs in an S3 bucket, read through the real client stack (s3fs, botocore) from an S3-compatible
server on 127.0.0.1 (moto's server mode, as s3fs's own tests use), found with the standard AWS
variables: streamed tar reads, packer info and verify of a bucket, a changed object, no credentials."""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner
from conftest import make_tree

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import ShardSize
from packer.spec.errors import ManifestError
from packer.spec.manifest import read_manifest
from readers import make_loader, open_dataset

AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",  # none of this machine's own settings
    "AWS_CONFIG_FILE": "/nonexistent/config",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """A wds output uploaded to ``s3://data/wds`` of an S3 server on 127.0.0.1, and its local folder."""
    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line a request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = pytest.MonkeyPatch()
    for key, value in {**AWS, "AWS_ENDPOINT_URL": f"http://{host}:{port}"}.items():
        env.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    src = tmp_path_factory.mktemp("src") / "images"
    make_tree(src, {"ant": 7, "bee": 6})
    local = tmp_path_factory.mktemp("out") / "wds"
    convert(src, local, ConvertConfig("wds", PreprocessConfig(size=(16, 12)), ShardSize(samples=4)), workers=2)
    fs = s3fs.S3FileSystem()
    fs.mkdir("data")
    fs.put(f"{local}/", "data/wds/", recursive=True)
    yield fs, local
    env.undo()
    s3fs.S3FileSystem.clear_instance_cache()
    server.stop()


def _batches(root, workers: int) -> list:
    loader = make_loader(open_dataset(root, shuffle=0), 4, shuffle=False, num_workers=workers)
    return [(images.numpy().tobytes(), labels.tolist()) for images, labels in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bucket_streams_the_batches_the_local_output_gives(bucket, workers):
    fs, local = bucket
    assert _batches("s3://data/wds", workers) == _batches(local, workers)


def test_info_and_verify_of_a_bucket(bucket):
    fs, local = bucket
    runner = CliRunner()
    r = runner.invoke(cli, ["info", "s3://data/wds"])
    assert r.exit_code == 0 and "13 in 4 shard(s)" in r.output and "ant" in r.output and "bee" in r.output
    r = runner.invoke(cli, ["verify", "s3://data/wds", "-q"])
    assert r.exit_code == 0 and "is intact: 13 samples in 4 shard(s)" in r.output, r.output


def test_an_object_changed_under_a_reader_is_an_error_never_mixed_data(bucket, tmp_path):
    fs, local = bucket
    fs.cp("data/wds/", "data/changed/", recursive=True)
    shard = read_manifest(local).shards[1].files[0].path  # a .tar
    data = bytearray((local / shard).read_bytes())
    data[1000] ^= 0xFF  # a byte of a member's data: the tar still parses
    fs.pipe(f"data/changed/{shard}", bytes(data))
    r = CliRunner().invoke(cli, ["verify", "s3://data/changed", "-q"])
    assert r.exit_code == 1 and shard in r.output and "SHA-256" in r.output
    with pytest.raises(ManifestError, match="SHA-256"):
        list(open_dataset("s3://data/changed", shuffle=0))


def test_no_credentials_says_which_variables_are_read(bucket, monkeypatch):
    import s3fs

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        with pytest.raises(ManifestError, match="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
            open_dataset("s3://data/wds")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def test_a_prefix_without_manifest_is_not_an_output(bucket):
    fs, local = bucket
    fs.pipe("data/half/shard-00000.tar", b"\0" * 1024)
    with pytest.raises(ManifestError, match="does not exist"):
        open_dataset("s3://data/half")
