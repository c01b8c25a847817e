"""packer.run.staging: the lifecycle every operation shares, on real folders: the lock, the plan
record, what a failure or a Ctrl-C leaves, resuming, and publishing a finished folder."""

from __future__ import annotations

import errno
import shutil

import pytest
from conftest import make_tree

from packer import ConvertConfig, PreprocessConfig, convert
from packer.output.files import STAGING_MARK, is_packer_output, lock_file, read_plan
from packer.records import ShardTask
from packer.run.staging import Staging
from packer.spec.errors import OutputError
from packer.spec.manifest import read_manifest


def test_a_second_run_cannot_take_the_lock_until_the_first_releases_it(tmp_path):
    out = tmp_path / "out"
    with Staging(out) as first:
        assert first.held and lock_file(out).exists()
        with pytest.raises(OutputError, match="another packer run is writing"):
            Staging(out).lock()
        assert first.lock() is first  # taking it again in the same run does nothing
    assert not first.held and not lock_file(out).exists()
    with Staging(out) as again:
        assert again.held


def test_start_makes_a_marked_folder_with_its_plan_and_replaces_an_unfinished_one(tmp_path):
    staging = Staging(tmp_path / "out")
    folder = staging.start({"fingerprint": "abc", "workers": 2})
    assert folder == tmp_path / ".out.packer-partial" and (folder / STAGING_MARK).is_file()
    assert staging.plan() == read_plan(folder) == {"fingerprint": "abc", "workers": 2}
    (folder / "shard-00000.npy").write_bytes(b"half written")
    staging.start()
    assert sorted(p.name for p in folder.iterdir()) == [STAGING_MARK] and staging.plan() is None


def test_start_refuses_a_folder_packer_did_not_make(tmp_path):
    staging = Staging(tmp_path / "out")
    staging.folder.mkdir()
    (staging.folder / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="was not made by packer"):
        staging.start()
    assert (staging.folder / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("options", "error", "kept"),
    [
        ({}, KeyboardInterrupt, True),  # a resumable run keeps its finished shards for --resume
        ({}, ValueError, False),
        ({"resumable": False}, KeyboardInterrupt, False),  # append, combine: run again instead
        ({"shared": True}, ValueError, True),  # the nodes' folder holds other runs' shards
        ({"shared": True}, KeyboardInterrupt, True),
    ],
)
def test_what_a_failure_leaves_of_the_folder(tmp_path, options, error, kept):
    staging = Staging(tmp_path / "out")
    staging.start()
    with pytest.raises(error):
        with staging.writing(**options) as folder:
            (folder / "shard-00000.npy").write_bytes(b"x")
            raise error()
    assert staging.folder.exists() == kept


def test_an_os_error_while_writing_names_where_and_what_to_do(tmp_path):
    staging = Staging(tmp_path / "out")
    staging.start()
    with pytest.raises(OutputError, match=r"cannot write the output in .*No space left.*free some space"):
        with staging.writing():
            raise OSError(errno.ENOSPC, "No space left on device", str(staging.folder / "shard-00000.npy"))
    assert not staging.folder.exists()


def test_resume_keeps_nothing_and_refuses_a_changed_plan(tmp_path, caplog):
    staging = Staging(tmp_path / "out")
    tasks = [ShardTask("shard-00000", ())]
    fresh = staging.resume_or_start(tasks, None, False, expected="one", recorded="one", version=1, workers=2)
    assert fresh == {} and staging.plan()["fingerprint"] == "one" and staging.plan()["workers"] == 2
    with pytest.raises(OutputError, match="changed since the interrupted run.*run without --resume"):
        staging.resume_or_start(tasks, staging.plan(), True, expected="two", recorded="two", version=1, workers=2)
    assert staging.plan()["fingerprint"] == "one"  # refused: the interrupted run is left as it was
    kept = staging.resume_or_start(tasks, staging.plan(), True, expected="one", recorded="one", version=1, workers=2)
    assert kept == {}  # nothing was recorded as finished


def test_publish_writes_the_manifest_last_and_moves_the_folder_into_place(tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"ant": 2, "bee": 2})
    made = tmp_path / "made"
    convert(src, made, ConvertConfig("npy", PreprocessConfig(size=(8, 8))), workers=1)
    manifest = read_manifest(made)
    out = tmp_path / "out"
    with Staging(out) as staging:
        staging.start({"fingerprint": "x", "workers": 1})
        with staging.writing() as folder:
            for shard in manifest.shards:
                for f in shard.files:
                    shutil.copyfile(made / f.path, folder / f.path)
            for name in manifest.side_files:  # image_hashes.npy
                shutil.copyfile(made / name, folder / name)
            staging.publish(manifest, overwrite=False)
    assert is_packer_output(out) and not staging.folder.exists()
    assert read_manifest(out).shards == manifest.shards
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in made.iterdir())
    assert (out / "manifest.json").read_bytes() == (made / "manifest.json").read_bytes()


def test_a_failed_repair_releases_the_lock_it_took(tmp_path):
    out = tmp_path / "out"
    stray = tmp_path / ".out.packer-old"  # what an interrupted publish leaves, here holding someone's file
    stray.mkdir()
    (stray / "notes.txt").write_text("not a packer output")
    with pytest.raises(OutputError, match="is left from an earlier run but is not a packer output"):
        with Staging(out):
            pass
    assert not lock_file(out).exists()
    with Staging(out).lock(repair=False) as again:  # free: another run may take it
        assert again.held
    assert (stray / "notes.txt").read_text() == "not a packer output"
