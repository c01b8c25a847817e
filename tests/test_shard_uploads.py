"""Shards uploaded to a bucket as the conversion writes them (packer.output.shard_uploads), against an
S3-compatible server on 127.0.0.1: the local folder holds a few shards, never the output; the result
is the local conversion's, byte for byte; a failure leaves the prefix as it was."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import FailsAt, make_tree

from packer.cli import cli
from packer.output import shard_uploads
from packer.output.shard_uploads import AHEAD, ShardUploads
from readers import make_loader, open_dataset

WORKERS = 2
TAKE = ShardUploads.take

OUTPUT_FILES = {"manifest.json", "report.txt", "shardindex.json", "image_hashes.npy"}
"""The files of a wds output of images besides its shards."""


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
    assert names == {p for p, _ in _shards(local)} | OUTPUT_FILES
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
    src = _split_set(tmp_path)
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


def _counting_takes(monkeypatch, stop_at: int = 0) -> list:
    """Count ShardUploads.take calls; with ``stop_at``, a Ctrl-C arrives as that shard finishes, or
    the first after it once the plan is recorded (an early start's shards may finish before it),
    once the uploads taken before it are done: an upload still queued at a Ctrl-C is cancelled (its
    shard written again), and how many are queued then depends on the machine's load."""
    calls: list = []
    take = TAKE  # not a stand-in an earlier call of this test put there

    def counted(self, output, folder, result):
        calls.append(result.name)
        if stop_at and len(calls) >= stop_at and self.records.resumable:
            self.settle()
            raise KeyboardInterrupt
        take(self, output, folder, result)

    monkeypatch.setattr(ShardUploads, "take", counted)
    return calls


def _objects(fs, prefix: str) -> set:
    fs.invalidate_cache()
    return {p.split("/", 2)[2] for p in fs.find(prefix)} if fs.exists(prefix) else set()


def _early_starts(monkeypatch) -> None:
    """Shards start as soon as a folder is walked (a test tree is walked in milliseconds)."""
    import packer.run.early_start as early_start

    for name, value in {"EARLY_AFTER": 0.0, "CHECK_EVERY": 0.0, "REBUILD_GROWTH": 1.0}.items():
        monkeypatch.setattr(early_start, name, value)


@pytest.mark.parametrize("order", [[], ["--shuffle", "3"]], ids=["early-start", "planned"])
def test_an_interrupted_conversion_resumes_from_the_shards_in_the_bucket(s3_server, tmp_path, monkeypatch, order):
    fs = s3_server
    src = tmp_path / "images"
    make_tree(src, {"ant": 7, "bee": 5, "cat": 6, "dog": 6})  # 12 shards of 2
    if not order:
        _early_starts(monkeypatch)
    url, prefix = f"s3://data/resumed-{len(order)}", f"data/resumed-{len(order)}"
    _counting_takes(monkeypatch, stop_at=6)
    r = _convert(src, url, *order)
    assert r.exit_code == 130 and "--resume" in r.output, r.output
    names = _objects(fs, prefix)
    assert "manifest.json" not in names and ".packer-lock" not in names  # not an output; the lock let go
    records = sorted(n for n in names if n.endswith(".done.json"))
    # the shards whose uploads had begun (a tar and an index each; one still queued is written again)
    assert len(records) >= 2 and _intact(fs, prefix) == len(records)
    assert all(n.startswith(".packer-parts/") for n in names)
    # one kept part no longer holds what its record says (same size, other bytes): that shard is written again
    tar = next(p for p in json.loads(fs.cat_file(f"{prefix}/{records[0]}"))["parts"].values() if p.endswith(".tar"))
    fs.pipe(f"{prefix}/{tar}", bytes(len(fs.cat_file(f"{prefix}/{tar}"))))
    _counting_takes(monkeypatch, stop_at=3)  # the resumed run is interrupted too
    r = _convert(src, url, *order, "--resume")
    assert r.exit_code == 130 and "--resume" in r.output, r.output
    intact = _intact(fs, prefix)
    assert intact >= len(records) + 1  # the resumed run's own shards are kept for the next
    calls = _counting_takes(monkeypatch)
    r = _convert(src, url, *order, "--resume")
    assert r.exit_code == 0, r.output
    assert len(calls) == 12 - intact  # the intact shards of both runs are not written again
    assert _convert(src, tmp_path / "local", *order).exit_code == 0
    local = json.loads((tmp_path / "local" / "manifest.json").read_text())
    fs.invalidate_cache()
    assert _shards(json.loads(fs.cat_file(f"{prefix}/manifest.json"))) == _shards(local)  # byte for byte
    assert _objects(fs, prefix) == {p for p, _ in _shards(local)} | OUTPUT_FILES
    assert CliRunner().invoke(cli, ["verify", url, "-q"]).exit_code == 0


def _intact(fs, prefix: str) -> int:
    """The shards recorded in the bucket whose parts hold what their records say (hashed here)."""
    count = 0
    for name in _objects(fs, prefix):
        if name.endswith(".done.json"):
            record = json.loads(fs.cat_file(f"{prefix}/{name}"))
            try:
                parts = [fs.cat_file(f"{prefix}/{record['parts'][f['path']]}") for f in record["files"]]
            except FileNotFoundError:
                continue
            count += all(hashlib.sha256(b).hexdigest() == f["sha256"] for b, f in zip(parts, record["files"]))
    return count


def _interrupted_in_the_walk(monkeypatch) -> list:
    """An early start interrupted in the walk, once a shard it started is in the bucket (before the
    plan is known); the takes, counted."""
    import packer.run.early_start as early_start

    _early_starts(monkeypatch)
    calls = _counting_takes(monkeypatch)

    def interrupted(self, *args):
        while not calls:  # until a shard started early is in the bucket
            self.runner.step(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(early_start.EarlyStart, "settle", interrupted)
    return calls


def test_an_interrupt_before_the_plan_leaves_the_prefix_as_it_was(s3_server, tmp_path, monkeypatch):
    """Shards an early start finished before the walk ended have no plan to resume by: an interrupt
    then leaves the prefix as it was, an empty one or an interrupted run's, which --resume continues."""
    fs = s3_server
    src = tmp_path / "images"
    make_tree(src, {"ant": 7, "bee": 5, "cat": 6, "dog": 6})  # 12 shards of 2
    _interrupted_in_the_walk(monkeypatch)
    r = _convert(src, "s3://data/walked")
    assert r.exit_code == 130 and "is as it was before" in r.output and "--resume" not in r.output, r.output
    assert _objects(fs, "data/walked") == set()
    monkeypatch.undo()
    _counting_takes(monkeypatch, stop_at=4)  # an interrupted run, with its plan: resumable
    assert _convert(src, "s3://data/walked", "--shuffle", "2").exit_code == 130
    before = {n: fs.cat_file(f"data/walked/{n}") for n in _objects(fs, "data/walked")}
    monkeypatch.undo()
    _interrupted_in_the_walk(monkeypatch)  # a plain run over it, stopped before its own plan
    r = _convert(src, "s3://data/walked")
    assert r.exit_code == 130 and "is as it was before" in r.output, r.output
    assert {n: fs.cat_file(f"data/walked/{n}") for n in _objects(fs, "data/walked")} == before
    monkeypatch.undo()
    intact = _intact(fs, "data/walked")
    assert intact >= 1
    calls = _counting_takes(monkeypatch)
    r = _convert(src, "s3://data/walked", "--shuffle", "2", "--resume")
    assert r.exit_code == 0 and len(calls) == 12 - intact, r.output


def test_resume_never_removes_another_outputs_objects(s3_server, tmp_path):
    src = tmp_path / "images"
    make_tree(src, {"ant": 4})
    assert _convert(src, "s3://data/top/val").exit_code == 0
    kept = _objects(s3_server, "data/top")
    for flags in [[], ["--resume"]]:  # a prefix holding an output one folder down is not an interrupted run's
        r = _convert(src, "s3://data/top", *flags)
        assert r.exit_code == 1 and "--overwrite" in r.output, r.output
        assert _objects(s3_server, "data/top") == kept


STOPS_AFTER_THREE = """
import sys, time
from packer.output.shard_uploads import ShardUploads

take, calls = ShardUploads.take, []


def take_then_hang(self, output, folder, result):
    take(self, output, folder, result)
    calls.append(result.name)
    if len(calls) == 3:  # three shards in the bucket and recorded: the run hangs there, to be killed
        self.records.wait()
        print("three", flush=True)
        time.sleep(600)


if __name__ == "__main__":
    ShardUploads.take = take_then_hang
    from packer.cli import main

    main()
"""


def test_a_killed_conversion_resumes_to_the_same_shards(s3_server, tmp_path, monkeypatch):
    fs = s3_server
    src = tmp_path / "images"
    make_tree(src, {"ant": 10})  # 5 shards of 2
    script = tmp_path / "hangs.py"
    script.write_text(STOPS_AFTER_THREE)
    options = ["-f", "npy", "--size", "16", "--shard-size", "2", "-q", "--workers", "1"]
    run = subprocess.Popen(
        [sys.executable, str(script), "convert", str(src), "-o", "s3://data/killed", *options],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert run.stdout.readline() == b"three\n"
    finally:
        os.killpg(run.pid, signal.SIGKILL)  # no handler runs: the lock and the parts stay
        run.wait()
    names = _objects(fs, "data/killed")
    assert ".packer-lock" in names and "manifest.json" not in names
    calls = _counting_takes(monkeypatch)
    # the dead run's lock (this machine, its process gone) is no other run's: --resume goes on
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", "s3://data/killed", *options, "--resume"])
    assert r.exit_code == 0, r.output
    assert len(calls) == 2  # the three shards in the bucket are not written again
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", str(tmp_path / "local"), *options])
    assert r.exit_code == 0, r.output
    local = json.loads((tmp_path / "local" / "manifest.json").read_text())
    fs.invalidate_cache()
    assert _shards(json.loads(fs.cat_file("data/killed/manifest.json"))) == _shards(local)  # byte for byte
    assert not {n for n in _objects(fs, "data/killed") if n.startswith(".packer")}  # no part, record or lock left


@pytest.mark.parametrize("stop", [OSError("connection reset"), KeyboardInterrupt()], ids=["failure", "interrupt"])
def test_a_failure_or_an_interrupt_as_the_manifest_goes_up(s3_server, tmp_path, monkeypatch, stop):
    """After every shard is at its published name: a failure leaves the prefix as it was; an
    interrupt keeps the parts, and --resume publishes them without writing a shard again."""
    from packer.output import upload

    fs = s3_server
    src = tmp_path / "images"
    make_tree(src, {"ant": 8})  # 4 shards
    prefix = f"data/late-{type(stop).__name__}"
    real = upload.put_checked

    def fails_at_the_report(fs, path, target, url, sha256=None):
        if target.endswith("report.txt"):
            raise stop
        return real(fs, path, target, url, sha256)

    monkeypatch.setattr(upload, "put_checked", fails_at_the_report)
    r = _convert(src, f"s3://{prefix}")
    names = _objects(fs, prefix)
    if isinstance(stop, OSError):
        assert r.exit_code == 1 and "connection reset" in r.output, r.output
        assert names == set()
        return
    assert r.exit_code == 130 and "--resume" in r.output, r.output
    assert names and all(n.startswith(".packer-parts/") for n in names)  # no published copy, no lock
    monkeypatch.setattr(upload, "put_checked", real)
    calls = _counting_takes(monkeypatch)
    r = _convert(src, f"s3://{prefix}", "--resume")
    assert r.exit_code == 0 and calls == [], r.output
    assert _convert(src, tmp_path / "local").exit_code == 0
    local = json.loads((tmp_path / "local" / "manifest.json").read_text())
    fs.invalidate_cache()
    assert _shards(json.loads(fs.cat_file(f"{prefix}/manifest.json"))) == _shards(local)
    assert not {n for n in _objects(fs, prefix) if n.startswith(".packer")}


def _split_set(tmp_path):
    """Split folders: train of 9 images (5 shards of 2), val of 4 (2 shards)."""
    src = tmp_path / "set"
    make_tree(src / "train", {"ant": 5, "bee": 4})
    make_tree(src / "val", {"ant": 2, "bee": 2})
    return src


def _only_listed_shards(fs, prefix: str) -> None:
    """Every shard object of the set at ``prefix`` is one its splits' manifests list: none left over."""
    listed = {
        f"{split}/{f}"
        for split in ("train", "val")
        for f, _ in _shards(json.loads(fs.cat_file(f"{prefix}/{split}/manifest.json")))
    }
    assert {n for n in _objects(fs, prefix) if "/shard-" in n} == listed


@pytest.mark.parametrize("stop_at", [3, 6], ids=["in the first split", "in the second split"])
def test_a_split_set_interrupted_in_a_bucket_resumes_split_by_split(s3_server, tmp_path, monkeypatch, stop_at):
    """A split set's records are kept as a conversion's are, and each finished split's manifest
    (and record of the set) with them: --resume keeps the finished splits and the finished shards of
    the split it stopped in, and gives the bytes of an uninterrupted run."""
    fs, prefix = s3_server, f"data/set-resumed-{stop_at}"
    src = tmp_path / "set"
    make_tree(src / "train", {"ant": 5, "bee": 4})  # 5 shards of 2
    make_tree(src / "val", {"ant": 2, "bee": 2})  # 2 shards of 2
    _counting_takes(monkeypatch, stop_at)
    r = _convert(src, f"s3://{prefix}", "--shuffle", "1")
    assert r.exit_code == 130 and "run the same command with --resume" in r.output, r.output
    assert not any(n.endswith("manifest.json") and not n.startswith(".packer") for n in _objects(fs, prefix))
    calls = _counting_takes(monkeypatch)
    r = _convert(src, f"s3://{prefix}", "--shuffle", "1", "--resume")
    assert r.exit_code == 0, r.output
    assert len(calls) == 7 - (stop_at - 1)  # the shards finished before the interrupt not written again
    assert _convert(src, tmp_path / "local", "--shuffle", "1").exit_code == 0
    for split in ("train", "val"):
        local = json.loads((tmp_path / "local" / split / "manifest.json").read_text())
        assert _shards(json.loads(fs.cat_file(f"{prefix}/{split}/manifest.json"))) == _shards(local)
    assert not {n for n in _objects(fs, prefix) if n.startswith(".packer")}
    assert CliRunner().invoke(cli, ["verify", f"s3://{prefix}", "-q"]).exit_code == 0
    listed = {
        f"{split}/{f}"
        for split in ("train", "val")
        for f, _ in _shards(json.loads(fs.cat_file(f"{prefix}/{split}/manifest.json")))
    }
    assert {n for n in _objects(fs, prefix) if "/shard-" in n} == listed  # no shard left over


def test_a_plain_run_after_an_interrupted_split_set_leaves_none_of_its_shards(s3_server, tmp_path, monkeypatch):
    fs, prefix = s3_server, "data/set-replaced"
    src = _split_set(tmp_path)
    _counting_takes(monkeypatch, 6)  # train finished and published, val begun
    assert _convert(src, f"s3://{prefix}", "--shuffle", "1").exit_code == 130
    assert any(n.startswith("train/shard-") for n in _objects(fs, prefix))
    monkeypatch.setattr(ShardUploads, "take", TAKE)
    r = _convert(src, f"s3://{prefix}", "--shuffle", "2")  # not --resume: other shards, the old ones gone
    assert r.exit_code == 0, r.output
    _only_listed_shards(fs, prefix)


def test_an_interrupt_while_the_shards_get_their_names_keeps_them_all(s3_server, tmp_path, monkeypatch):
    fs = s3_server
    src = tmp_path / "images"
    make_tree(src, {"ant": 8})  # 4 shards
    copy = ShardUploads._copy

    def interrupted(self, source, target, size, sha256):
        raise KeyboardInterrupt

    monkeypatch.setattr(ShardUploads, "_copy", interrupted)
    r = _convert(src, "s3://data/naming")
    assert r.exit_code == 130 and "--resume" in r.output, r.output
    names = _objects(fs, "data/naming")
    assert names and all(n.startswith(".packer-parts/") for n in names)  # no published copy
    monkeypatch.setattr(ShardUploads, "_copy", copy)
    calls = _counting_takes(monkeypatch)
    r = _convert(src, "s3://data/naming", "--resume")
    assert r.exit_code == 0 and calls == [], r.output
    assert CliRunner().invoke(cli, ["verify", "s3://data/naming", "-q"]).exit_code == 0


def test_leftovers_that_cannot_be_removed_once_published_are_the_next_runs(s3_server, tmp_path, monkeypatch, caplog):
    from packer.output import upload

    fs = s3_server
    src = tmp_path / "images"
    make_tree(src, {"ant": 8})
    remove = upload.remove_objects
    monkeypatch.setattr(upload, "remove_objects", FailsAt(remove, 1))
    r = _convert(src, "s3://data/untidy")
    assert r.exit_code == 0, r.output
    assert "is published, but objects the new output does not list could not be removed" in caplog.text
    assert any(n.startswith(".packer-parts/") for n in _objects(fs, "data/untidy"))
    assert CliRunner().invoke(cli, ["verify", "s3://data/untidy", "-q"]).exit_code == 0
    monkeypatch.setattr(upload, "remove_objects", remove)
    r = _convert(src, "s3://data/untidy", "--overwrite")
    assert r.exit_code == 0, r.output
    assert not {n for n in _objects(fs, "data/untidy") if n.startswith(".packer")}


def test_a_failed_run_after_an_interrupted_set_leaves_nothing_a_resume_would_trust(s3_server, tmp_path, monkeypatch):
    """Run 1 is interrupted once train is published; run 2 (other options, not --resume) finishes
    train, then fails in val; run 3 resumes run 2: train is written again rather than kept from
    records that name shards run 2's failure removed, and no shard of any run is left over."""
    from conftest import failing_uploads

    fs, prefix = s3_server, "data/set-failed"
    src = _split_set(tmp_path)
    _counting_takes(monkeypatch, 6)
    assert _convert(src, f"s3://{prefix}", "--shuffle", "1").exit_code == 130
    monkeypatch.setattr(ShardUploads, "take", TAKE)
    failing_uploads(monkeypatch, "shard-00001.tar")  # val's second shard (train's are named for good by then)
    r = _convert(src, f"s3://{prefix}", "--shuffle", "2")
    assert r.exit_code == 1 and "connection reset" in r.output, r.output
    monkeypatch.undo()
    r = _convert(src, f"s3://{prefix}", "--shuffle", "2", "--resume")
    assert r.exit_code == 0, r.output
    assert CliRunner().invoke(cli, ["verify", f"s3://{prefix}", "-q"]).exit_code == 0
    _only_listed_shards(fs, prefix)


def test_the_shards_of_every_interrupted_run_go_once_a_set_is_published(s3_server, tmp_path, monkeypatch):
    fs, prefix = s3_server, "data/set-twice"
    src = _split_set(tmp_path)
    _counting_takes(monkeypatch, 6)  # train published by run 1
    assert _convert(src, f"s3://{prefix}", "--shuffle", "1").exit_code == 130
    _counting_takes(monkeypatch, 6)  # and by run 2, under other names
    assert _convert(src, f"s3://{prefix}", "--shuffle", "2").exit_code == 130
    monkeypatch.setattr(ShardUploads, "take", TAKE)
    assert _convert(src, f"s3://{prefix}", "--shuffle", "3").exit_code == 0
    _only_listed_shards(fs, prefix)


def test_a_resume_that_fails_keeps_what_the_next_resume_needs(s3_server, tmp_path, monkeypatch):
    """A --resume refused for a bad option (or failing) removes no record of the run it resumes:
    the next --resume still keeps the split that was finished."""
    fs, prefix = s3_server, "data/set-typo"
    src = _split_set(tmp_path)
    _counting_takes(monkeypatch, 6)  # train finished, val begun
    assert _convert(src, f"s3://{prefix}", "--shuffle", "1").exit_code == 130
    r = _convert(src, f"s3://{prefix}", "--shuffle", "1", "--resume", "--size", "16x")
    assert r.exit_code == 2, r.output
    calls = _counting_takes(monkeypatch)
    r = _convert(src, f"s3://{prefix}", "--shuffle", "1", "--resume")
    assert r.exit_code == 0, r.output
    assert sorted(calls) == ["shard-00000", "shard-00001"]  # val's, in the order the workers finish: train kept
    _only_listed_shards(fs, prefix)
