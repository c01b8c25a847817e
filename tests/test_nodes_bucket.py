"""A conversion split with --num-nodes into a bucket, then ``packer merge s3://...``, against an
S3-compatible server on 127.0.0.1 (moto): each node uploads its shards and records beside the
others', the merge checks every planned shard in the store and publishes the output, manifest last;
the result is a single run's, byte for byte."""

from __future__ import annotations

import json
import tempfile
import time

import pytest
from click.testing import CliRunner
from conftest import failing_uploads, make_tree

from packer.cli import cli
from packer.output.shard_uploads import ShardUploads
from packer.output.upload import PARTS

OPTIONS = ["--size", "16", "--shard-size", "3", "-j", "1", "--num-nodes", "2", "-q"]


def _node(src, url: str, rank: int, *more: str, fmt: str = "wds"):
    command = ["convert", str(src), "-o", url, "-f", fmt, *OPTIONS, "--node-rank", str(rank), *more]
    return CliRunner().invoke(cli, command)


def _shards(manifest: dict) -> list:
    return [(f["path"], f["sha256"]) for s in manifest["shards"] for f in s["files"]]


def _names(fs, prefix: str) -> list:
    fs.invalidate_cache(prefix)
    return sorted(p.split("/", 2)[2] for p in fs.find(prefix))


@pytest.mark.parametrize("fmt", ["wds", "npy"])
def test_two_nodes_and_a_merge_give_a_single_runs_output(s3_server, tmp_path, monkeypatch, fmt):
    scratch = tmp_path / "tmp"  # where every node's and the merge's local folder goes (TMPDIR)
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    src = tmp_path / "images"
    make_tree(src, {"ant": 7, "bee": 6})
    url, prefix = f"s3://data/nodes-{fmt}", f"data/nodes-{fmt}"
    r = _node(src, url, 0, fmt=fmt)
    assert r.exit_code == 0 and f"packer merge {url}" in r.output, r.output
    assert not any(n.startswith("manifest") for n in _names(s3_server, prefix))  # nothing published by a node
    r = CliRunner().invoke(cli, ["merge", url])
    assert r.exit_code == 1 and "2 of 5 shards are missing" in r.output and "node(s) 1 again" in r.output, r.output
    assert f"{url}/{PARTS}" in r.output  # where the nodes' work is, not a local temporary folder
    r = _node(src, url, 1, fmt=fmt)
    assert r.exit_code == 0 and "wrote 2 shard(s)" in r.output, r.output
    r = _node(src, url, 1, fmt=fmt)  # run again: its recorded shards are kept from the store
    assert r.exit_code == 0 and "wrote 0 shard(s) (and kept 2 from an earlier run)" in r.output, r.output
    r = CliRunner().invoke(cli, ["merge", url])
    assert r.exit_code == 0 and f"to {url} in" in r.output and "the manifest last" in r.output, r.output
    local = tmp_path / "local"
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", str(local), "-f", fmt, *OPTIONS[:4], "-j", "2", "-q"])
    assert r.exit_code == 0, r.output
    published = json.loads(s3_server.cat_file(f"{prefix}/manifest.json"))
    assert _shards(published) == _shards(json.loads((local / "manifest.json").read_text()))
    for path, _ in _shards(published):
        assert s3_server.cat_file(f"{prefix}/{path}") == (local / path).read_bytes()
    assert not any(n.startswith(PARTS) for n in _names(s3_server, prefix))
    assert CliRunner().invoke(cli, ["verify", url, "-q"]).exit_code == 0
    assert not list(scratch.iterdir())  # every node's and the merge's local folder removed


def test_a_node_started_with_other_options_is_refused_before_it_writes(s3_server, tmp_path):
    src = tmp_path / "images"
    make_tree(src, {"ant": 4, "bee": 4})
    url = "s3://data/nodes-mixed"
    assert _node(src, url, 0).exit_code == 0
    written = _names(s3_server, "data/nodes-mixed")
    r = _node(src, url, 1, "--mode", "L")
    assert r.exit_code == 1 and "node 1 cannot join the conversion" in r.output, r.output
    assert _names(s3_server, "data/nodes-mixed") == written


def test_nodes_and_the_merge_respect_what_the_prefix_holds(s3_server, tmp_path):
    src = tmp_path / "images"
    make_tree(src, {"ant": 4, "bee": 2})
    url = "s3://data/nodes-held"
    lock = {"host": "elsewhere", "pid": 1, "started": time.time(), "token": "x"}
    s3_server.pipe("data/nodes-held/.packer-lock", json.dumps(lock).encode())  # a conversion running
    r = _node(src, url, 0)
    assert r.exit_code == 1 and "wait for it before starting the nodes" in r.output, r.output
    s3_server.rm("data/nodes-held/.packer-lock")
    for rank in (0, 1):
        assert _node(src, url, rank).exit_code == 0
    assert CliRunner().invoke(cli, ["merge", url]).exit_code == 0
    r = _node(src, url, 0)
    assert r.exit_code == 1 and "pass --overwrite to every node" in r.output, r.output
    make_tree(src, {"cat": 3})
    for rank in (0, 1):
        assert _node(src, url, rank, "--overwrite").exit_code == 0
    r = CliRunner().invoke(cli, ["merge", url])
    assert r.exit_code == 1 and "--overwrite" in r.output, r.output
    assert CliRunner().invoke(cli, ["merge", url, "--overwrite"]).exit_code == 0
    manifest = json.loads(s3_server.cat_file("data/nodes-held/manifest.json"))
    assert manifest["samples"] == 9 and manifest["classes"] == ["ant", "bee", "cat"]
    names = _names(s3_server, "data/nodes-held")
    assert {path for path, _ in _shards(manifest)} | {"manifest.json"} <= set(names)
    assert not any(n.startswith(PARTS) for n in names)  # the replaced output's shards went too
    assert len([n for n in names if n.endswith(".tar")]) == len(manifest["shards"])


def test_a_node_whose_upload_fails_keeps_what_it_finished(s3_server, tmp_path, monkeypatch):
    src = tmp_path / "images"
    make_tree(src, {"ant": 7, "bee": 6})
    url = "s3://data/nodes-failed"
    with monkeypatch.context() as m:
        failing_uploads(m, "shard-00004.tar")  # node 0's third shard
        r = _node(src, url, 0)
    assert r.exit_code == 1 and "connection reset" in r.output, r.output
    r = _node(src, url, 0)
    assert r.exit_code == 0 and "wrote 1 shard(s) (and kept 2 from an earlier run)" in r.output, r.output
    assert _node(src, url, 1).exit_code == 0
    assert CliRunner().invoke(cli, ["merge", url]).exit_code == 0
    assert CliRunner().invoke(cli, ["verify", url, "-q"]).exit_code == 0


def test_an_interrupted_node_keeps_its_finished_shards_for_its_next_run(s3_server, tmp_path, monkeypatch):
    src = tmp_path / "images"
    make_tree(src, {"ant": 7, "bee": 6})
    url = "s3://data/nodes-stopped"
    take = ShardUploads.take

    def stopped_at_the_third(self, output, folder, result):
        if result.name == "shard-00004":  # node 0's third shard: a Ctrl-C once the two before are up
            self.settle()
            raise KeyboardInterrupt
        take(self, output, folder, result)

    with monkeypatch.context() as m:
        m.setattr(ShardUploads, "take", stopped_at_the_third)
        r = _node(src, url, 0)
    assert r.exit_code == 130 and f"kept in {url}" in r.output, r.output
    r = _node(src, url, 0)
    assert r.exit_code == 0 and "wrote 1 shard(s) (and kept 2 from an earlier run)" in r.output, r.output


def test_nodes_started_at_once_with_other_options_are_refused_before_they_write(s3_server, tmp_path, monkeypatch):
    """Two nodes that both found no plan in the store (started at the same moment): the plan created
    first is the one; the other node, with other options, is refused before it writes a shard."""
    src = tmp_path / "images"
    make_tree(src, {"ant": 4, "bee": 4})
    url, prefix = "s3://data/nodes-at-once", "data/nodes-at-once"
    assert _node(src, url, 0).exit_code == 0
    written = _names(s3_server, prefix)
    monkeypatch.setattr(ShardUploads, "restore", lambda self: None)  # node 1 saw no plan when it started
    r = _node(src, url, 1, "--mode", "L")
    assert r.exit_code == 1 and "another node recorded another plan there" in r.output, r.output
    assert _names(s3_server, prefix) == written  # nothing of node 1's, node 0's plan and shards kept
    monkeypatch.undo()
    assert _node(src, url, 1).exit_code == 0 and CliRunner().invoke(cli, ["merge", url]).exit_code == 0


def test_a_single_run_does_not_discard_the_nodes_work_unless_told(s3_server, tmp_path):
    src = tmp_path / "images"
    make_tree(src, {"ant": 4, "bee": 4})
    url = "s3://data/nodes-then-one"
    assert _node(src, url, 0).exit_code == 0
    one = ["convert", str(src), "-o", url, "-f", "wds", "--size", "16", "-q"]
    r = CliRunner().invoke(cli, one)
    assert r.exit_code == 1 and "split over 2 nodes" in r.output and f"packer merge {url}" in r.output, r.output
    r = CliRunner().invoke(cli, [*one, "--overwrite"])
    assert r.exit_code == 0, r.output
    assert not any(n.startswith(PARTS) for n in _names(s3_server, "data/nodes-then-one"))


def test_a_running_nodes_lease_holds_off_the_merge_a_single_run_and_its_own_rank(s3_server, tmp_path):
    src = tmp_path / "images"
    make_tree(src, {"ant": 4, "bee": 4})
    url, prefix = "s3://data/nodes-leased", "data/nodes-leased"
    for rank in (0, 1):
        assert _node(src, url, rank).exit_code == 0
    assert not any("/nodes/" in n for n in _names(s3_server, prefix))  # each node let go of its lease
    lease = {"host": "another-machine", "pid": 1, "started": 1, "token": "f" * 32}  # node 1, still running there
    s3_server.pipe(f"{prefix}/{PARTS}/nodes/rank-1.lock", json.dumps(lease).encode())
    r = CliRunner().invoke(cli, ["merge", url])
    assert r.exit_code == 1 and "node 1 of a conversion split over nodes is writing" in r.output, r.output
    r = _node(src, url, 1)
    assert r.exit_code == 1 and "node 1 is already running" in r.output, r.output
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", url, "-f", "wds", "--size", "16", "-q", "--overwrite"])
    assert r.exit_code == 1 and "node 1 of a conversion split over nodes is writing" in r.output, r.output
    assert _node(src, url, 0).exit_code == 0  # another rank goes on
    s3_server.rm(f"{prefix}/{PARTS}/nodes/rank-1.lock")  # node 1 ended
    assert CliRunner().invoke(cli, ["merge", url]).exit_code == 0
    assert not any(n.startswith(PARTS) for n in _names(s3_server, prefix))


def test_a_node_run_again_asks_the_store_about_its_own_shards_only(s3_server, tmp_path, monkeypatch):
    from packer.output import upload

    src = tmp_path / "images"
    make_tree(src, {"ant": 7, "bee": 6})  # 5 shards of 3: node 0 writes 3 (6 files), node 1 writes 2 (4 files)
    url = "s3://data/nodes-asked"
    for rank in (0, 1):
        assert _node(src, url, rank).exit_code == 0
    asked, real = [], upload.holds

    def holds(fs, path, *recorded):
        asked.append(path.rsplit("/", 1)[-1])
        return real(fs, path, *recorded)

    monkeypatch.setattr(upload, "holds", holds)
    r = _node(src, url, 1)
    assert r.exit_code == 0 and "kept 2 from an earlier run" in r.output, r.output
    assert sorted(asked) == ["shard-00001.idx", "shard-00001.tar", "shard-00003.idx", "shard-00003.tar"]
    asked.clear()
    assert CliRunner().invoke(cli, ["merge", url]).exit_code == 0
    assert len(asked) == 10  # the merge: every node's
