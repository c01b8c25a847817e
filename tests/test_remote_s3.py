"""Outputs in an S3 bucket, read through the real client stack (s3fs, botocore) from an S3-compatible
server on 127.0.0.1 (moto's server mode, as s3fs's own tests use), found with the standard AWS
variables: streamed tar reads, packer info and verify of a bucket, a changed object, no credentials."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from conftest import FailsAt, make_tree
from helpers import damage_body, whole_checksums_with_parts

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import ShardSize
from packer.spec.errors import ManifestError
from packer.spec.manifest import read_manifest
from readers import make_loader, open_dataset


@pytest.fixture(scope="module")
def bucket(s3_server, tmp_path_factory):
    """A wds output uploaded to ``s3://data/wds`` of an S3 server on 127.0.0.1, and its local folder."""
    src = tmp_path_factory.mktemp("src") / "images"
    make_tree(src, {"ant": 7, "bee": 6})
    local = tmp_path_factory.mktemp("out") / "wds"
    convert(src, local, ConvertConfig("wds", PreprocessConfig(size=(16, 12)), ShardSize(samples=4)), workers=2)
    s3_server.put(f"{local}/", "data/wds/", recursive=True)
    return s3_server, local


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


def test_verify_of_a_bucket_checks_the_image_hashes_too(bucket, tmp_path):
    fs, local = bucket
    src = tmp_path / "images"
    make_tree(src, {"ant": 3})
    assert CliRunner().invoke(cli, ["convert", str(src), "-f", "npy", "-o", "s3://data/hashed", "-q"]).exit_code == 0
    data = bytearray(fs.cat_file("data/hashed/image_hashes.npy"))
    data[-1] ^= 1
    fs.pipe("data/hashed/image_hashes.npy", bytes(data))
    r = CliRunner().invoke(cli, ["verify", "s3://data/hashed", "-q"])
    assert r.exit_code == 1 and "output: s3://data/hashed/image_hashes.npy" in r.output, r.output


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


def _put_damaged(fs, path, target: str) -> None:
    """Upload the file ``path`` as ``target`` with its SHA-256, one byte changed after botocore hashed
    it: as a store that records the SHA-256 it is sent without checking it (moto, rclone's S3 server)
    keeps bytes damaged on the way, under the checksum of the bytes sent."""
    fs.s3.meta.events.register("before-send.s3.PutObject", damage_body)
    try:
        fs.put_file(str(path), target, ChecksumAlgorithm="SHA256")
    finally:
        fs.s3.meta.events.unregister("before-send.s3.PutObject", damage_body)


def test_an_object_kept_damaged_under_its_checksum_is_an_error_never_a_traceback(bucket, tmp_path):
    """botocore finds such an object's bytes other than their checksum as it reads them: a reader, a
    verify and a conversion into the prefix say it as of any damaged copy."""
    fs, local = bucket
    fs.cp("data/wds/", "data/kept-damaged/", recursive=True)
    shard = read_manifest(local).shards[1].files[0].path
    _put_damaged(fs, local / shard, f"data/kept-damaged/{shard}")
    r = CliRunner().invoke(cli, ["verify", "s3://data/kept-damaged", "-q"])
    assert r.exit_code == 1 and shard in r.output and "damaged" in r.output, r.output
    with pytest.raises(ManifestError, match=f"{shard}.*damaged"):
        list(open_dataset("s3://data/kept-damaged", shuffle=0))
    _put_damaged(fs, local / "manifest.json", "data/kept-damaged/manifest.json")
    src = tmp_path / "images"
    make_tree(src, {"ant": 2, "bee": 2})
    r = CliRunner().invoke(cli, ["convert", str(src), "-f", "wds", "-o", "s3://data/kept-damaged", "--overwrite"])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.exception  # a message, no traceback
    assert "an object there is not what its recorded checksum is of: the remote copy is damaged" in r.output


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


def test_a_store_that_sends_the_whole_objects_checksum_with_a_part_streams_all_the_same(bucket, monkeypatch):
    """rclone's S3 server answers a ranged read with the whole object's SHA-256, which botocore finds
    other than the part's: the stream reads on without botocore's check (the reader's SHA-256 of the
    file decides, as for any stream)."""
    import hashlib

    import s3fs

    from readers.remote.streams import open_stream

    fs, _ = bucket
    data = bytes(range(256)) * 16384  # 4 MiB
    fs.pipe("data/parts/stream", data)
    whole_checksums_with_parts(monkeypatch, hashlib.sha256(data).digest())
    monkeypatch.setattr(s3fs.S3FileSystem, "default_block_size", 256 << 10)  # a part a read
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        stream = open_stream("s3://data/parts/stream")
        try:
            assert stream.read() == data and stream.unchecked  # botocore refused a part: read on unchecked
        finally:
            stream.close()
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def test_an_endpoint_that_does_not_answer_is_named_never_a_traceback(bucket, tmp_path, monkeypatch):
    """A store that is down (or a wrong AWS_ENDPOINT_URL): botocore's connection errors are no
    OSError, and came through info, verify, a reader and a conversion as tracebacks."""
    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # nothing listens on port 1
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # the same answer, without botocore's and s3fs's retries
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    s3fs.S3FileSystem.clear_instance_cache()
    src = tmp_path / "images"
    make_tree(src, {"ant": 2, "bee": 2})
    try:
        for command in (
            ["info", "s3://data/wds"],
            ["verify", "s3://data/wds"],
            ["convert", str(src), "-f", "npy", "-o", "s3://data/x"],
        ):
            r = CliRunner().invoke(cli, command)
            assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (command, r.exception)
            assert "Could not connect to the endpoint URL" in r.output, r.output
        with pytest.raises(ManifestError, match="cannot open s3://data/wds/manifest.json: Could not connect"):
            open_dataset("s3://data/wds")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def test_a_prefix_without_manifest_is_not_an_output(bucket):
    fs, local = bucket
    fs.pipe("data/half/shard-00000.tar", b"\0" * 1024)
    with pytest.raises(ManifestError, match="does not exist"):
        open_dataset("s3://data/half")


def _convert(src, url, *more: str):
    return CliRunner().invoke(cli, ["convert", str(src), "-f", "wds", "-o", url, "--size", "16", "-q", *more])


def test_convert_into_a_bucket_uploads_a_checked_output_manifest_last(bucket, tmp_path):
    fs, local = bucket
    src = tmp_path / "images"
    make_tree(src, {"ant": 3, "bee": 2})
    r = _convert(src, "s3://data/new", "--shard-size", "2")
    assert r.exit_code == 0, r.output
    assert "to s3://data/new in" in r.output and "packer-upload-" not in r.output  # the summary names the bucket
    assert "uploaded" in r.output and not any(p.name.startswith("packer-upload-") for p in tmp_path.iterdir())
    m = json.loads(fs.cat_file("data/new/manifest.json"))
    names = {p.split("/", 2)[2] for p in fs.find("data/new")}
    assert {f["path"] for s in m["shards"] for f in s["files"]} | {"manifest.json", "report.txt"} <= names
    assert ".packer-lock" not in names and m["samples"] == 5
    assert CliRunner().invoke(cli, ["verify", "s3://data/new", "-q"]).exit_code == 0
    assert sum(len(labels) for _, labels in make_loader(open_dataset("s3://data/new"), 2)) == 5
    r = _convert(src, "s3://data/new")
    assert r.exit_code == 1 and "already holds a packer output; pass --overwrite" in r.output
    make_tree(src, {"cat": 2})
    r = _convert(src, "s3://data/new", "--overwrite")
    assert r.exit_code == 0, r.output
    fs.invalidate_cache()  # this filesystem object listed the prefix before the upload
    m2 = json.loads(fs.cat_file("data/new/manifest.json"))
    kept = {f["path"] for s in m2["shards"] for f in s["files"]}
    old = {f["path"] for s in m["shards"] for f in s["files"]} - kept
    assert m2["samples"] == 7 and old and not any(fs.exists(f"data/new/{p}") for p in old)  # replaced, then removed


def test_a_bucket_destination_is_refused_while_locked_or_foreign(bucket, tmp_path):
    import time

    fs, local = bucket
    src = tmp_path / "images"
    make_tree(src, {"ant": 2})
    fs.pipe("data/foreign/notes.txt", b"someone else's")
    r = _convert(src, "s3://data/foreign", "--overwrite")
    assert r.exit_code == 1 and "holds objects that are not packer's (notes.txt)" in r.output
    assert fs.cat_file("data/foreign/notes.txt") == b"someone else's"
    fs.pipe("data/app/manifest.json", b'{"name": "my web app"}')  # packer's name, not packer's manifest
    r = _convert(src, "s3://data/app", "--overwrite")
    assert r.exit_code == 1 and "is not a packer manifest" in r.output
    assert fs.cat_file("data/app/manifest.json") == b'{"name": "my web app"}'
    r = _convert(src, "s3://nobucket/x")
    assert r.exit_code == 1 and "cannot write s3://nobucket/x" in r.output and "does not exist" in r.output
    fs.pipe("data/locked/.packer-lock", json.dumps({"host": "h", "pid": 1, "started": time.time()}).encode())
    r = _convert(src, "s3://data/locked")
    assert r.exit_code == 1 and "another conversion is writing" in r.output
    # a lock of this machine is another run's while its process lives (a dead one's: test_shard_uploads)
    from packer.output import prefix_lock

    alive = {**prefix_lock.this_machine(), "pid": os.getpid(), "started": prefix_lock.process_start(os.getpid())}
    fs.pipe("data/locked/.packer-lock", json.dumps(alive).encode())
    r = _convert(src, "s3://data/locked", "--resume")
    assert r.exit_code == 1 and "another conversion is writing" in r.output
    # a process of that number that started later is not the lock's (its number was reused)
    fs.pipe("data/locked/.packer-lock", json.dumps({**alive, "started": alive["started"] - 1}).encode())
    r = _convert(src, "s3://data/locked")
    assert r.exit_code == 0, r.output


def _token_corpus(folder, documents: int):
    """A corpus of ``documents`` JSON Lines documents in ``folder / "corpus"`` and a tokenizer trained on it."""
    from helpers import corpus_texts, make_bpe_tokenizer

    texts = corpus_texts(documents, longest=60)
    (folder / "corpus").mkdir()
    (folder / "corpus" / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return folder / "corpus", make_bpe_tokenizer(folder / "tokenizer.json", texts)


def test_a_token_output_uploaded_to_a_bucket(bucket, tmp_path, monkeypatch):
    from packer.output.shard_uploads import ShardUploads

    fs, local = bucket
    corpus, tokenizer = _token_corpus(tmp_path, 20)
    taken = []
    take = ShardUploads.take
    monkeypatch.setattr(ShardUploads, "take", lambda self, *a: taken.append(a[2].name) or take(self, *a))
    command = ["convert", str(corpus), "-f", "npy", "-o", "s3://data/tokens", "--shard-size", "4"]
    r = CliRunner().invoke(cli, [*command, "--tokenizer", str(tokenizer), "--pack", "16", "-q"])
    assert r.exit_code == 0, r.output
    shards = json.loads(fs.cat_file("data/tokens/manifest.json"))["shards"]
    assert len(taken) == len(shards) > 1  # each shard uploaded as it was written, not the output at its end
    assert json.loads(fs.cat_file("data/tokens/manifest.json"))["tokens"]["documents"] == 20
    assert CliRunner().invoke(cli, ["verify", "s3://data/tokens", "-q"]).exit_code == 0


def test_an_interrupted_token_conversion_into_a_bucket_leaves_it_as_it_was(bucket, tmp_path, monkeypatch):
    from packer.tokens import tokenizing

    fs, local = bucket
    corpus, tokenizer = _token_corpus(tmp_path, 20)

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(tokenizing, "_encode", interrupted)
    command = ["convert", str(corpus), "-f", "npy", "-o", "s3://data/tokens-stopped", "--tokenizer", str(tokenizer)]
    r = CliRunner().invoke(cli, [*command, "--pack", "16", "-q"])
    assert r.exit_code == 130 and "is as it was before" in r.output and "--resume" not in r.output, r.output
    fs.invalidate_cache()
    assert not fs.exists("data/tokens-stopped") or not fs.find("data/tokens-stopped")


def test_a_failed_upload_leaves_the_prefix_as_it_was(bucket, tmp_path, monkeypatch):
    import packer.output.upload as upload

    fs, local = bucket
    src = tmp_path / "images"
    make_tree(src, {"ant": 3, "bee": 2})
    assert _convert(src, "s3://data/kept", "--shard-size", "2").exit_code == 0
    fs.invalidate_cache()
    before = {p: fs.cat_file(p) for p in fs.find("data/kept")}
    checked = upload.put_checked
    fails_third = FailsAt(checked, 3)
    monkeypatch.setattr(upload, "put_checked", fails_third)
    make_tree(src, {"cat": 2})
    r = _convert(src, "s3://data/kept", "--shard-size", "2", "--overwrite")
    assert r.exit_code == 1 and "cannot write s3://data/kept: connection reset" in r.output
    fs.invalidate_cache()
    assert {p: fs.cat_file(p) for p in fs.find("data/kept")} == before  # the old output, whole; no lock
    fails_third.calls = 0
    r = _convert(src, "s3://data/fresh", "--shard-size", "2")
    assert r.exit_code == 1 and not fs.find("data/fresh")  # nothing of the run left: a new run may start
    monkeypatch.setattr(upload, "put_checked", checked)
    assert _convert(src, "s3://data/fresh", "--shard-size", "2").exit_code == 0
    assert sum(len(labels) for _, labels in make_loader(open_dataset("s3://data/kept"), 2)) == 5


@pytest.mark.parametrize("failing", ["shardindex.json", "manifest.json"])
def test_an_overwrite_failing_before_its_manifest_puts_back_the_files_it_replaced(
    bucket, tmp_path, monkeypatch, failing
):
    """An --overwrite uploads the new report, image hashes and shard list under the old output's names
    before its manifest: when the run fails there (here the upload of the shard list, or of the
    manifest, fails once), the old output's are put back, and nothing of the run is left."""
    import packer.output.upload as upload

    fs, _ = bucket
    src, url = tmp_path / "images", f"s3://data/replaced-{failing.split('.')[0]}"
    make_tree(src, {"ant": 3, "bee": 2})
    assert _convert(src, url, "--shard-size", "2").exit_code == 0
    fs.invalidate_cache()
    before = {p: fs.cat_file(p) for p in fs.find(url)}
    checked, failed = upload.put_checked, []

    def fails_once(fs_, path, target, *more):
        if target.endswith(f"/{failing}") and not failed:
            failed.append(target)
            raise OSError("connection reset")
        return checked(fs_, path, target, *more)

    monkeypatch.setattr(upload, "put_checked", fails_once)
    make_tree(src, {"cat": 2})  # other images: another report, other hashes, more shards
    r = _convert(src, url, "--shard-size", "2", "--overwrite")
    assert r.exit_code == 1 and "connection reset" in r.output and failed
    fs.invalidate_cache()
    assert {p: fs.cat_file(p) for p in fs.find(url)} == before  # the old output whole, nothing of the run


HANGS_AT_THE_MANIFEST = """
import time
import packer.output.upload as upload

checked = upload.put_checked


def hangs_at_the_manifest(fs, path, target, *more):
    if target.endswith("/manifest.json"):  # every other file is up: the run hangs there, to be killed
        print("manifest", flush=True)
        time.sleep(600)
    return checked(fs, path, target, *more)


if __name__ == "__main__":
    upload.put_checked = hangs_at_the_manifest
    from packer.cli import main

    main()
"""


def test_an_overwrite_killed_before_its_manifest_is_rolled_back_by_the_next_run(bucket, tmp_path):
    """SIGKILL lets no handler run: the new report, hashes and shard list stay beside the old manifest.
    The run kept the old ones in the store before replacing them; the next run into the prefix (here
    an append with nothing new) puts them back, so no shard list names the killed run's shards."""
    import signal
    import subprocess
    import sys

    fs, _ = bucket
    src, url = tmp_path / "images", "s3://data/killed-overwrite"
    make_tree(src, {"ant": 3, "bee": 2})
    assert _convert(src, url, "--shard-size", "2").exit_code == 0
    fs.invalidate_cache()
    before = {p: fs.cat_file(p) for p in fs.find(url)}
    more = tmp_path / "more"
    make_tree(more, {"cat": 3, "dog": 2})
    script = tmp_path / "hangs.py"
    script.write_text(HANGS_AT_THE_MANIFEST)
    command = ["convert", str(more), "-f", "wds", "-o", url, "--size", "16", "-q", "--shard-size", "2", "--overwrite"]
    run = subprocess.Popen([sys.executable, str(script), *command], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert b"manifest\n" in iter(run.stdout.readline, b"")  # after the summary line
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    fs.invalidate_cache()
    now = {p: fs.cat_file(p) for p in fs.find(url)}
    shown = {p: b for p, b in now.items() if ".packer" not in p}
    assert shown[f"{url[5:]}/manifest.json"] == before[f"{url[5:]}/manifest.json"]
    assert shown[f"{url[5:]}/shardindex.json"] != before[f"{url[5:]}/shardindex.json"]  # the window SIGKILL opens
    r = _convert(src, url, "--append")
    assert r.exit_code == 0, r.output
    fs.invalidate_cache()
    after = {p: fs.cat_file(p) for p in fs.find(url)}
    assert {p: b for p, b in after.items() if p in before} == before  # the old output's files as they were
    assert not [p for p in after if "/.packer-parts/replaced/" in p or p.endswith("/.packer-lock")]  # kept copies
    assert json.loads(after[f"{url[5:]}/manifest.json"])["samples"] == 5
    assert CliRunner().invoke(cli, ["verify", url, "-q"]).exit_code == 0


def test_convert_into_a_bucket_without_credentials_says_which_are_read(bucket, tmp_path, monkeypatch):
    import s3fs

    src = tmp_path / "images"
    make_tree(src, {"ant": 2})
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        r = _convert(src, "s3://data/creds")
        assert r.exit_code == 1 and "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in r.output
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def test_a_split_set_in_a_bucket_is_described_and_verified_split_by_split(bucket, tmp_path):
    fs, local = bucket
    src = tmp_path / "images"
    make_tree(src / "train", {"ant": 3, "bee": 2})
    make_tree(src / "val", {"ant": 1, "bee": 1})
    assert _convert(src, "s3://data/splits").exit_code == 0
    runner = CliRunner()
    r = runner.invoke(cli, ["info", "s3://data/splits"])
    assert r.exit_code == 0 and "s3://data/splits/train" in r.output and "s3://data/splits/val" in r.output
    r = runner.invoke(cli, ["verify", "s3://data/splits", "-q"])
    assert r.exit_code == 0 and "is intact: 7 samples" in r.output, r.output


def test_a_wds_token_output_converted_into_a_bucket_streams_from_it(bucket, tmp_path):
    from readers import TokenStream

    fs, local = bucket
    corpus, tokenizer = _token_corpus(tmp_path, 30)
    base = ["convert", str(corpus), "-f", "wds", "--shard-size", "5", "--tokenizer", str(tokenizer), "--pack", "16"]
    for out in ("s3://data/stream-wds", str(tmp_path / "stream-wds")):
        r = CliRunner().invoke(cli, [*base, "-o", out, "-q"])
        assert r.exit_code == 0, r.output
    stream = open_dataset("s3://data/stream-wds", seed=4)
    assert isinstance(stream, TokenStream)
    near = open_dataset(tmp_path / "stream-wds")
    rows = [tuple(r) for b in make_loader(stream, 4, num_workers=2) for r in b["input_ids"].tolist()]
    assert sorted(rows) == sorted(tuple(near[i]["input_ids"].tolist()) for i in range(len(near)))
    assert CliRunner().invoke(cli, ["verify", "s3://data/stream-wds", "-q"]).exit_code == 0


def test_token_blocks_read_from_a_bucket_through_a_verified_cache(bucket, tmp_path):
    import torch

    fs, local = bucket
    corpus, tokenizer = _token_corpus(tmp_path, 30)
    for fmt in ("npy", "lmdb"):
        command = ["convert", str(corpus), "-f", fmt, "-o", str(tmp_path / fmt), "--shard-size", "5"]
        assert CliRunner().invoke(cli, [*command, "--tokenizer", str(tokenizer), "--pack", "16", "-q"]).exit_code == 0
        fs.put(f"{tmp_path / fmt}/", f"data/blocks-{fmt}/", recursive=True)
        with pytest.raises(ValueError, match="pass cache_dir="):
            open_dataset(f"s3://data/blocks-{fmt}")
        remote = open_dataset(f"s3://data/blocks-{fmt}", cache_dir=tmp_path / "cache")
        near = open_dataset(tmp_path / fmt)
        assert len(remote) == len(near) > 5
        assert all(torch.equal(remote[i]["input_ids"], near[i]["input_ids"]) for i in range(len(near)))
        batches = [b["input_ids"].tolist() for b in make_loader(remote, 4, num_workers=2, seed=3)]
        assert batches == [b["input_ids"].tolist() for b in make_loader(near, 4, seed=3)]
    # a shard changed in the bucket is never read: its download does not match the manifest
    name = read_manifest(tmp_path / "npy").shards[-1].files[0].path
    data = bytearray((tmp_path / "npy" / name).read_bytes())
    data[-1] ^= 0xFF
    fs.pipe(f"data/blocks-npy/{name}", bytes(data))
    fresh = open_dataset("s3://data/blocks-npy", cache_dir=tmp_path / "other-cache")
    with pytest.raises(ManifestError, match="SHA-256"):
        fresh[len(fresh) - 1]


@pytest.mark.parametrize("fmt", ["npy", "lmdb", "hdf5"])
def test_a_map_style_output_in_a_bucket_reads_at_random_through_a_cache(bucket, tmp_path, fmt):
    fs, _ = bucket
    src = tmp_path / "images"
    make_tree(src, {"ant": 4, "bee": 3})
    local = tmp_path / fmt
    convert(src, local, ConvertConfig(fmt, PreprocessConfig(size=(16, 12)), ShardSize(samples=3)), workers=2)
    fs.put(f"{local}/", f"data/map-{fmt}/", recursive=True)
    remote = open_dataset(f"s3://data/map-{fmt}", cache_dir=tmp_path / "cache")
    near = open_dataset(local)
    order = [6, 0, 3, 5, 1]  # at random: each shard downloaded when a sample of it is first asked for
    assert [(remote[i][0].tolist(), remote[i][1]) for i in order] == [(near[i][0].tolist(), near[i][1]) for i in order]
    batches = [
        [(x.numpy().tobytes(), y.tolist()) for x, y in make_loader(d, 3, num_workers=2, seed=2)] for d in (remote, near)
    ]
    assert batches[0] == batches[1]
