"""``packer convert ... --executor ray -o s3://...`` on a real local Ray instance against an S3-compatible
server on 127.0.0.1 (moto): each task writes its shard in a folder of its own node and uploads it as
the run's parts (packer.output.part_target), the driver records and publishes; the output is the
local conversion's, an interrupted run resumes from the shards in the bucket, a failed one leaves
the prefix as it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from conftest import make_tree
from helpers import wait_for
from ray_cluster import hooked_ray, slow_tree

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import ShardSize
from packer.output.shard_uploads import ShardUploads
from packer.output.upload import PARTS, STATE
from packer.spec.manifest import read_manifest

pytestmark = pytest.mark.xdist_group("ray")  # one test process runs the Ray tests: one Ray instance at a time


@pytest.fixture(scope="module")
def cluster(s3_server, tmp_path_factory):
    """A local Ray instance (2 CPUs) started once the S3 server's variables are set: its tasks read the
    store's settings from their own environment, as a node of a cluster does."""
    with hooked_ray(tmp_path_factory) as started:
        yield SimpleNamespace(**vars(started), fs=s3_server)


def _shards(manifest: dict) -> list:
    return [(f["path"], f["sha256"], f["bytes"]) for s in manifest["shards"] for f in s["files"]]


def _own_shard_folders() -> list:
    return [p for p in os.listdir(tempfile.gettempdir()) if p.startswith("packer-ray-shard-")]


def _takes(monkeypatch) -> tuple[list, list]:
    """The shards the driver uploaded itself (``ShardUploads.take``: none may be, a stand-in that fails
    the run) and the parts of those its tasks uploaded (``take_uploaded``), as the run goes."""
    taken_here, taken_uploaded = [], []

    def take(self, output, folder, result):
        taken_here.append(result.name)
        raise AssertionError(f"the driver uploaded {result.name} itself")

    real = ShardUploads.take_uploaded

    def take_uploaded(self, output, folder, result, fingerprint=None):
        taken_uploaded.append(dict(result.parts))
        return real(self, output, folder, result, fingerprint)

    monkeypatch.setattr(ShardUploads, "take", take)
    monkeypatch.setattr(ShardUploads, "take_uploaded", take_uploaded)
    return taken_here, taken_uploaded


@pytest.mark.parametrize("fmt", ["npy", "wds"])
def test_the_tasks_upload_their_shards_and_the_output_is_the_local_one(cluster, tmp_path, monkeypatch, fmt):
    src = tmp_path / "images"
    make_tree(src, {"ant": 5, "bee": 4, "cat": 5})
    taken_here, taken_uploaded = _takes(monkeypatch)
    url = f"s3://data/ray-{fmt}"
    options = ["-f", fmt, "--size", "16", "--shard-size", "4", "-q"]
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", url, *options, "--executor", "ray"])
    assert r.exit_code == 0, r.output
    assert not taken_here and len(taken_uploaded) == 4  # every shard went up from its task, none from here
    assert all(p.startswith(f"{PARTS}/") for parts in taken_uploaded for p in parts.values())
    convert(src, tmp_path / "local", ConvertConfig(fmt, PreprocessConfig(size=(16, 16)), ShardSize(samples=4)))
    fs = cluster.fs
    published = json.loads(fs.cat_file(f"data/ray-{fmt}/manifest.json"))
    assert _shards(published) == _shards(json.loads((tmp_path / "local" / "manifest.json").read_text()))
    for path, sha256, size in _shards(published):
        assert fs.cat_file(f"data/ray-{fmt}/{path}") == (tmp_path / "local" / path).read_bytes()
    assert not fs.exists(f"data/ray-{fmt}/{PARTS}") and not _own_shard_folders()
    assert CliRunner().invoke(cli, ["verify", url, "-q"]).exit_code == 0


def test_a_split_set_from_the_cluster_into_a_bucket(cluster, tmp_path, monkeypatch):
    src = tmp_path / "images"
    make_tree(src, {"ant": 6, "bee": 6})
    url = "s3://data/ray-split"
    options = ["-f", "npy", "--size", "16", "--shard-size", "3", "--split", "train=0.5,val=0.5", "-q"]
    with monkeypatch.context() as m:
        taken_here, taken_uploaded = _takes(m)
        r = CliRunner().invoke(cli, ["convert", str(src), "-o", url, *options, "--executor", "ray"])
    assert r.exit_code == 0 and not taken_here and len(taken_uploaded) == 4, r.output
    assert {p.split("/")[2] for parts in taken_uploaded for p in parts.values()} == {"train", "val"}
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", str(tmp_path / "local"), *options])
    assert r.exit_code == 0, r.output
    for split in ("train", "val"):
        local = json.loads((tmp_path / "local" / split / "manifest.json").read_text())
        assert _shards(json.loads(cluster.fs.cat_file(f"data/ray-split/{split}/manifest.json"))) == _shards(local)
    assert CliRunner().invoke(cli, ["verify", url, "-q"]).exit_code == 0


def test_a_failed_conversion_leaves_the_prefix_as_it_was(cluster, tmp_path):
    src = tmp_path / "images"
    make_tree(src, {"ant": 6, "bee": 6})
    (src / "bee" / "img_005.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)  # the last shard's
    url = "s3://data/ray-failed"
    options = ["-f", "wds", "--size", "16", "--shard-size", "3", "-q", "--strict"]
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", url, *options, "--executor", "ray"])
    assert r.exit_code == 1 and "img_005.png" in r.output, r.output
    cluster.fs.invalidate_cache("data")
    assert not cluster.fs.exists("data/ray-failed") or cluster.fs.find("data/ray-failed") == []
    assert not _own_shard_folders()


def test_an_interrupted_conversion_resumes_from_the_shards_the_tasks_uploaded(cluster, tmp_path):
    """A real subprocess joins the Ray instance, is stopped by Ctrl-C once a shard is recorded in the
    bucket: exit 130, no manifest; --resume keeps the recorded shards and finishes equal to a local run."""
    src = tmp_path / "src"
    slow_tree(src)
    url, fs = "s3://data/ray-resumed", cluster.fs
    options = ["-f", "wds", "--size", "16", "--shard-size", "4", "-q", "--executor", "ray"]
    command = [sys.executable, "-m", "packer", "convert", str(src), "-o", url, *options, "--address", cluster.address]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)

    def recorded() -> list:
        fs.invalidate_cache("data/ray-resumed")
        found = fs.find(f"data/ray-resumed/{STATE}") if fs.exists(f"data/ray-resumed/{STATE}") else []
        return [p for p in found if p.endswith(".done.json")]

    wait_for(lambda: recorded() or proc.poll() is not None, "a shard recorded in the bucket")
    assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGINT)
    code, err = proc.wait(timeout=60), proc.stderr.read()
    assert code == 130 and "--resume" in err, err
    assert not fs.exists("data/ray-resumed/manifest.json")
    kept = len(recorded())
    for marker in cluster.markers.glob("slow-*"):
        marker.unlink()
    done = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    # the kept shards were not written again: fewer slow files decoded than the 24 of a whole run
    decoded = len(list(cluster.markers.glob("slow-*")))
    assert kept >= 1 and decoded <= (6 - kept)  # one marker a shard's process, 6 shards
    local = tmp_path / "local"
    convert(src, local, ConvertConfig("wds", PreprocessConfig(size=(16, 16)), ShardSize(samples=4)), workers=2)
    published = json.loads(fs.cat_file("data/ray-resumed/manifest.json"))
    assert _shards(published) == [(f.path, f.sha256, f.bytes) for s in read_manifest(local).shards for f in s.files]
    assert not fs.exists(f"data/ray-resumed/{PARTS}")


def test_an_append_from_the_cluster_grows_the_output_in_the_bucket(cluster, tmp_path, monkeypatch):
    src = tmp_path / "images"
    make_tree(src, {"ant": 5, "bee": 4})
    url = "s3://data/ray-grown"
    options = ["-f", "npy", "--size", "16", "--shard-size", "3", "-q", "--executor", "ray"]
    assert CliRunner().invoke(cli, ["convert", str(src), "-o", url, *options]).exit_code == 0
    make_tree(src, {"ant": 8})  # three more files of a known class
    with monkeypatch.context() as m:
        taken_here, taken_uploaded = _takes(m)
        r = CliRunner().invoke(cli, ["convert", str(src), "-o", url, *options, "--append"])
    assert r.exit_code == 0 and "appended 3 samples in 1 new shard(s)" in r.output, r.output
    assert not taken_here and len(taken_uploaded) == 1
    assert json.loads(cluster.fs.cat_file("data/ray-grown/manifest.json"))["samples"] == 12
    assert CliRunner().invoke(cli, ["verify", url, "-q"]).exit_code == 0
    assert not cluster.fs.exists(f"data/ray-grown/{PARTS}")
