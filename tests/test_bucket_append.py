"""``packer convert SRC -o s3://bucket/prefix --append`` against an S3-compatible server on 127.0.0.1:
the output in the bucket grows as a local one does (byte for byte the same shards, manifest and
hashes), with nothing of it downloaded but what an append reads; a reader opened before keeps its
version; a failure leaves the prefix as it was; what cannot be appended to is refused."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

import pytest
from click.testing import CliRunner
from conftest import FailsAt, failing_uploads, make_tree, write_image

from packer.cli import cli
from packer.output import held_files, upload
from readers import make_loader, open_dataset

FORMATS = ["npy", "wds", "hdf5", "lmdb"]


def _run(*args: str):
    return CliRunner().invoke(cli, [*args, "-q"] if args[0] == "convert" else list(args))


def _convert(src, out, fmt: str, *more: str):
    return _run("convert", str(src), "-f", fmt, "-o", str(out), "--size", "16", "--shard-size", "3", "-j", "2", *more)


def _objects(fs, prefix: str) -> dict[str, str]:
    """Every object under ``prefix``: its name there -> SHA-256 of its bytes."""
    fs.invalidate_cache()
    return {p[len(prefix) + 1 :]: hashlib.sha256(fs.cat_file(p)).hexdigest() for p in fs.find(prefix)}


def _files(folder) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.rglob("*")
        if p.is_file()
    }


def _comparable(manifest: dict) -> dict:
    """A manifest less what differs between two runs of one append (when, and how long)."""
    return {**manifest, "history": [{k: v for k, v in h.items() if k != "at"} for h in manifest["history"]]}


def _grown(src, copy: bool = True):
    """The source grown by two new files, and (``copy``) a copy of a file the output holds."""
    for n in range(2):
        write_image(src / "bee" / f"new_{n}.png", (40 + n, 30), seed=900 + n)
    if copy:
        shutil.copyfile(src / "ant" / "img_000.png", src / "bee" / "new_copy.png")


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_output_in_a_bucket_grows_as_a_local_one_does(s3_server, tmp_path, fmt):
    fs, url = s3_server, f"s3://data/grow-{fmt}"
    src = tmp_path / "images"
    make_tree(src, {"ant": 4, "bee": 3})
    assert _convert(src, url, fmt).exit_code == 0
    assert _convert(src, tmp_path / "local", fmt).exit_code == 0
    before = _objects(fs, f"data/grow-{fmt}")
    _grown(src)
    r = _convert(src, url, fmt, "--append")
    assert r.exit_code == 0, r.output
    assert f"appended 3 samples in 1 new shard(s) to {url} " in r.output and "packer-upload-" not in r.output
    assert _convert(src, tmp_path / "local", fmt, "--append").exit_code == 0
    after, local = _objects(fs, f"data/grow-{fmt}"), _files(tmp_path / "local")
    manifest = json.loads(fs.cat_file(f"data/grow-{fmt}/manifest.json"))
    assert _comparable(manifest) == _comparable(json.loads((tmp_path / "local" / "manifest.json").read_text()))
    assert {k: v for k, v in after.items() if k != "manifest.json"} == {
        k: v for k, v in local.items() if k != "manifest.json"
    }  # shards, report, shard lists and hashes, byte for byte
    assert all(after[name] == digest for name, digest in before.items() if name.startswith("shard-"))  # untouched
    assert manifest["samples"] == 10 and manifest["duplicates"] == [["ant/img_000.png", "bee/new_copy.png"]]
    assert _run("verify", url, "-q").exit_code == 0
    keys = [k for _, _, k in _samples(url, tmp_path / "cache")]
    assert keys[-3:] == ["bee/new_0.png", "bee/new_1.png", "bee/new_copy.png"] and len(keys) == 10


def _in_bucket(fs, tmp_path, url: str, fmt: str = "npy") -> tuple:
    """A source folder converted into ``url``, then grown (``_grown``): the folder, and the objects
    under ``url`` before the append (``_objects``)."""
    src = tmp_path / "images"
    make_tree(src, {"ant": 4, "bee": 3})
    assert _convert(src, url, fmt).exit_code == 0
    before = _objects(fs, url[5:])
    _grown(src)
    return src, before


def _samples(root: str, cache) -> list:
    """``(image bytes, label, key)`` of every sample of the output at ``root``, in stored order."""
    options = {"shuffle": 0} if root.endswith("wds") else {"cache_dir": cache} if root.endswith("lmdb") else {}
    ds = open_dataset(root, return_meta=True, **options)
    samples = ds if root.endswith("wds") else (ds[i] for i in range(len(ds)))
    return [(image.numpy().tobytes(), int(label), meta["key"]) for image, label, meta in samples]


def test_a_reader_opened_before_the_append_keeps_reading_its_version(s3_server, tmp_path):
    src = tmp_path / "images"
    make_tree(src, {"ant": 4, "bee": 3})
    url = "s3://data/grow/packer-before"  # a name the run's own local folders once took
    assert _convert(src, url, "npy").exit_code == 0
    ds = open_dataset(url, return_meta=True)  # random access by ranges, its manifest read now
    first = [(image.numpy().tobytes(), meta["key"]) for image, _, meta in (ds[i] for i in range(len(ds)))]
    _grown(src)
    assert _convert(src, url, "npy", "--append").exit_code == 0
    again = [(image.numpy().tobytes(), meta["key"]) for image, _, meta in (ds[i] for i in range(len(ds)))]
    assert len(ds) == 7 and again == first
    assert len(open_dataset(url)) == 10
    assert sum(len(labels) for _, labels in make_loader(open_dataset(url), 4, num_workers=2)) == 10


def test_an_append_reads_only_the_index_files_of_npy_shards(s3_server, tmp_path, monkeypatch):
    src = tmp_path / "images"
    make_tree(src, {"ant": 4, "bee": 3})
    url = "s3://data/grow-index"
    assert _convert(src, url, "npy").exit_code == 0
    fetched = []
    fetch = held_files.StoreFiles.fetch

    def watched(self, listed, into):
        fetched.append(listed[0])
        fetch(self, listed, into)

    monkeypatch.setattr(held_files.StoreFiles, "fetch", watched)
    _grown(src, copy=False)  # a copy's shard is compared byte for byte: fetched whole
    assert _convert(src, url, "npy", "--append").exit_code == 0
    assert fetched and all(name.endswith((".keys.npy", ".crc32.npy")) or name == "image_hashes.npy" for name in fetched)
    # each shard's index read once: the output's three, and the new one's, read back from the bucket
    assert len([n for n in fetched if n.endswith(".keys.npy")]) == len(set(fetched)) // 2 == 4


@pytest.mark.parametrize("at", ["a shard", "the manifest"])
def test_a_failed_append_leaves_the_prefix_as_it_was(s3_server, tmp_path, monkeypatch, at):
    fs = s3_server
    src = tmp_path / "images"
    make_tree(src, {"ant": 4, "bee": 3})
    url = f"s3://data/grow-fails-{at[4:]}"
    assert _convert(src, url, "wds").exit_code == 0
    before = _objects(fs, url[5:])
    _grown(src)
    from packer.output import object_checks, shard_uploads

    real = object_checks.put_checked
    if at == "a shard":
        monkeypatch.setattr(shard_uploads.upload, "put_checked", FailsAt(real, 1))
    else:
        fails = FailsAt(real, 99)

        def manifest_fails(fs_, path, target, url_, sha256=None):
            if target.endswith("/manifest.json") and fails.n == 99:  # the new one's, not the old one put back
                fails.n = fails.calls + 1
            return fails(fs_, path, target, url_, sha256)

        monkeypatch.setattr(upload, "put_checked", manifest_fails)
    r = _convert(src, url, "wds", "--append")
    assert r.exit_code == 1 and "connection reset" in r.output
    assert _objects(fs, url[5:]) == before  # the same names, the same bytes: replaced files put back
    monkeypatch.undo()
    assert _run("verify", url, "-q").exit_code == 0
    assert _convert(src, url, "wds", "--append").exit_code == 0  # and the next try appends
    assert len(open_dataset(url, shuffle=0)) == 10


def test_an_interrupted_append_leaves_the_prefix_as_it_was(s3_server, tmp_path, monkeypatch):
    from packer.output.shard_uploads import ShardUploads

    fs = s3_server
    src, before = _in_bucket(fs, tmp_path, "s3://data/grow-ctrl-c")
    write_image(src / "bee" / "new_2.png", (44, 30), seed=903)  # two new shards of 3 and 1

    take = ShardUploads.take

    def interrupted(self, output, folder, result):
        take(self, output, folder, result)
        raise KeyboardInterrupt  # Ctrl-C once the first new shard is uploaded

    monkeypatch.setattr(ShardUploads, "take", interrupted)
    r = _convert(src, "s3://data/grow-ctrl-c", "npy", "--append")
    assert r.exit_code == 130 and "interrupted; s3://data/grow-ctrl-c is as it was" in r.output
    assert _objects(fs, "data/grow-ctrl-c") == before


def test_a_lost_answer_to_the_manifest_upload_is_not_a_failure(s3_server, tmp_path, monkeypatch):
    """The store took the new manifest, then the connection dropped: the output is the new one, whole."""
    src = tmp_path / "images"
    make_tree(src, {"ant": 4, "bee": 3})
    real = upload.put_checked

    def answer_lost(fs_, path, target, url_, sha256=None):
        real(fs_, path, target, url_, sha256)
        if target.endswith("/manifest.json"):
            raise OSError("connection reset")

    for more in ([], ["--overwrite"], ["--append"]):
        if more == ["--append"]:
            _grown(src)
        monkeypatch.setattr(upload, "put_checked", answer_lost)
        r = _convert(src, "s3://data/grow-lost", "npy", *more)
        monkeypatch.undo()
        assert r.exit_code == 0, r.output
        assert _run("verify", "s3://data/grow-lost", "-q").exit_code == 0
    assert len(open_dataset("s3://data/grow-lost")) == 10


def test_an_append_that_cannot_put_the_manifest_back_leaves_its_objects(s3_server, tmp_path, monkeypatch):
    """The new manifest did not go up, nor could the old one be put back (the store is gone): the new
    objects stay rather than be removed under a manifest that might list them."""
    fs = s3_server
    src, before = _in_bucket(fs, tmp_path, "s3://data/grow-down")
    import s3fs

    failing_uploads(monkeypatch, "manifest.json")  # the new one's
    copy = s3fs.S3FileSystem._cp_file  # the coroutine behind every instance's copy

    async def failing_copy(self, path1, path2, **kwargs):  # and the old one's put back from its copy
        if path2.endswith("/manifest.json") and "/.packer-parts/" not in path2:
            raise OSError("connection reset")
        return await copy(self, path1, path2, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_cp_file", failing_copy)
    s3fs.S3FileSystem.clear_instance_cache()  # the run's filesystem made anew: its copy binds the coroutine
    r = _convert(src, "s3://data/grow-down", "npy", "--append")
    assert r.exit_code == 1 and "connection reset" in r.output
    monkeypatch.undo()
    after = _objects(fs, "data/grow-down")
    assert after["manifest.json"] == before["manifest.json"] and set(before) < set(after)
    assert _run("verify", "s3://data/grow-down", "-q").exit_code == 0  # the output as it was is whole


def test_a_hashes_file_that_cannot_be_read_stops_the_append(s3_server, tmp_path, monkeypatch):
    """A read that fails (not a file that differs) is no reason to publish the output without hashes."""
    import s3fs

    fs = s3_server
    src, before = _in_bucket(fs, tmp_path, "s3://data/grow-unread")
    get_file = s3fs.S3FileSystem._get_file  # the coroutine behind every instance's get_file

    async def flaky(self, rpath, lpath, **kwargs):
        if "image_hashes" in rpath:
            raise ConnectionError("connection reset")
        return await get_file(self, rpath, lpath, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_get_file", flaky)
    s3fs.S3FileSystem.clear_instance_cache()  # the run's filesystem made anew: its get_file binds the coroutine
    r = _convert(src, "s3://data/grow-unread", "npy", "--append")
    assert r.exit_code == 1 and "reading s3://data/grow-unread/image_hashes.npy failed" in r.output, r.output
    monkeypatch.undo()
    assert _objects(fs, "data/grow-unread") == before


def test_nothing_to_append_leaves_the_prefix_as_it_was(s3_server, tmp_path):
    fs = s3_server
    src = tmp_path / "images"
    make_tree(src, {"ant": 3})
    assert _convert(src, "s3://data/grow-same", "lmdb").exit_code == 0
    before = _objects(fs, "data/grow-same")
    r = _convert(src, "s3://data/grow-same", "lmdb", "--append")
    assert r.exit_code == 0 and "nothing to append" in r.output and "s3://data/grow-same already" in r.output
    assert "modified after" not in r.output  # the store's time of the manifest, in whole seconds, read right
    assert _objects(fs, "data/grow-same") == before
    changed = src / "ant" / "img_001.png"
    os.utime(changed, (time.time() + 60, time.time() + 60))  # written after the output was
    r = _convert(src, "s3://data/grow-same", "lmdb", "--append")
    assert "1 file(s) that s3://data/grow-same holds were modified after it was written" in r.output
    assert _objects(fs, "data/grow-same") == before


def test_what_an_append_cannot_add_to_is_refused(s3_server, tmp_path):
    fs = s3_server
    src = tmp_path / "images"
    make_tree(src, {"ant": 3, "bee": 3})
    r = _convert(src, "s3://data/grow-none", "npy", "--append")
    assert r.exit_code == 1 and "holds no packer output (no manifest.json); --append adds" in r.output
    assert not fs.exists("data/grow-none/.packer-lock")
    r = _convert(src, "s3://data/grow-x", "npy", "--append", "--overwrite")
    assert r.exit_code == 2 and "--append with --overwrite" in r.output
    assert _convert(src, "s3://data/grow-set", "npy", "--split", "train=0.5,val=0.5").exit_code == 0
    r = _convert(src, "s3://data/grow-set", "npy", "--append")
    assert r.exit_code == 1 and "holds a split set: append to one split's output" in r.output
    r = _convert(src, "s3://data/grow-set/train", "npy", "--append")
    assert r.exit_code == 2 and "is a split of the set" in r.output
    # a shard changed in the bucket since its manifest was written is never read as the output's
    assert _convert(src, "s3://data/grow-changed", "npy").exit_code == 0
    manifest = json.loads(fs.cat_file("data/grow-changed/manifest.json"))
    keys = next(f["path"] for f in manifest["shards"][0]["files"] if f["path"].endswith(".keys.npy"))
    data = bytearray(fs.cat_file(f"data/grow-changed/{keys}"))
    data[-1] ^= 1
    fs.pipe(f"data/grow-changed/{keys}", bytes(data))
    _grown(src)
    r = _convert(src, "s3://data/grow-changed", "npy", "--append")
    assert r.exit_code == 1 and f"s3://data/grow-changed/{keys} is not the file its manifest lists" in r.output
    fs.invalidate_cache()
    assert json.loads(fs.cat_file("data/grow-changed/manifest.json")) == manifest
    assert not [p for p in fs.find("data/grow-changed") if "/.packer" in p]
