"""``packer.spec.file_stamp``: one definition of "has this file changed", and every form of it that runs
in progress keep on disk, each exactly as the code before it wrote it. The expected values are
written out from ``os.stat`` here, never made by the code under test."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from packer.ops import append as appending
from packer.output import files as output
from packer.output.shard_samples import read_samples, write_samples
from packer.records import ShardResult, SourceItem
from packer.sources import saved_discovery, source_stamps
from packer.sources.folder_stamps import FolderStamps
from packer.spec.file_stamp import MISSING_FOLDER_RECORD, MISSING_SOURCE_TEXT, FileStamp
from packer.targets.annotations import _digest as annotations_digest


@pytest.fixture
def file(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(b"x" * 100)
    return path


def test_a_stamp_holds_the_stat_fields(file):
    st = os.stat(file)
    stamp = FileStamp.at(file)
    assert stamp == FileStamp.of(st) == FileStamp.at_or_none(str(file))
    assert (stamp.size, stamp.mtime_ns, stamp.ctime_ns, stamp.inode, stamp.device) == (
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
        st.st_ino,
        st.st_dev,
    )
    assert stamp.changed_at_ns == max(st.st_mtime_ns, st.st_ctime_ns)
    assert hash(stamp) == hash(FileStamp.of(st))  # a cache key
    with pytest.raises(AttributeError):
        stamp.size = 1  # frozen


def test_each_stored_form_is_the_one_written_before(file):
    st = os.stat(file)
    stamp = FileStamp.of(st)
    # packer/sources/folder_stamps.py, a row of folder_stamps.npy
    assert stamp.as_folder_record() == (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
    # packer/output/files.py file_stamp, a shard record's file_stamps
    assert stamp.as_shard_file_record() == [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
    assert json.dumps(stamp.as_shard_file_record()) == (
        f"[{st.st_size}, {st.st_mtime_ns}, {st.st_ctime_ns}, {st.st_ino}, {st.st_dev}]"
    )
    # packer/output/shard_samples.py, a shard record's samples_file
    assert stamp.as_side_file_record() == [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    # packer/sources/saved_discovery.py, discovery.json's labels_file
    assert stamp.as_labels_file_record(str(file)) == [str(file), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    # packer/sources/source_stamps.py source_stamp, hashed into sources digests and plan fingerprints
    assert stamp.as_source_text() == f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
    # packer/targets/annotations.py, a line of an annotations folder's digest
    assert stamp.as_annotations_line("labels/a.txt") == f"labels/a.txt\0{st.st_size}\0{st.st_mtime_ns}\0".encode()
    # in memory only: readers/datasets/base.py, readers/datasets/lmdb.py; packer/sources/discover.py's loop guard
    assert stamp.reader_identity() == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    assert stamp.which_file() == (st.st_dev, st.st_ino)


def test_the_sites_write_the_forms_written_before(file, tmp_path):
    st = os.stat(file)
    assert source_stamps.source_stamp(str(file)) == f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
    assert source_stamps.source_stamp(str(file), st) == f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
    item = SourceItem(0, str(file), "a.png", parts=(("text", str(file)), ("image", str(file))))
    line = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
    assert source_stamps.files_stamp(item) == f"{line}/{line}\0text\0image"
    assert output._shard_file_record(file) == [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
    options = saved_discovery.discovery_options(file, None, False, None, False)
    assert options["labels_file"] == [str(file), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    folders = FolderStamps(0)
    folders.add("a", FileStamp.of(st))
    folders.add("b", None)
    stamps = folders.arrays()[2]
    assert stamps.dtype == np.int64
    assert stamps.tolist() == [[st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns], [-1, -1, -1, -1]]
    labels = tmp_path / "labels"
    (labels / "sub").mkdir(parents=True)
    (labels / "sub" / "b.txt").write_text("0 0.5 0.5 0.1 0.1\n")
    (labels / "a.txt").write_text("1 0.5 0.5 0.2 0.2\n")
    expected = hashlib.sha256()
    for rel in ("a.txt", "sub/b.txt"):
        s = os.stat(labels / rel)
        expected.update(f"{rel}\0{s.st_size}\0{s.st_mtime_ns}\0".encode())
    assert annotations_digest(labels) == expected.hexdigest()


def test_the_side_file_stamp_is_the_one_written_before(tmp_path):
    result = ShardResult("shard-00000", 2, [], keys=["a", "b"], labels=[0, 1], digests=["1" * 32, "2" * 32]).packed()
    recorded = write_samples(tmp_path, "shard-00000", result)
    st = os.stat(tmp_path / "shard-00000.done.samples.npy")
    assert recorded == [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    result.samples_file = (str(tmp_path / "shard-00000.done.samples.npy"), recorded)
    assert read_samples(result) is not None
    result.samples_file = (result.samples_file[0], [st.st_size + 1, *recorded[1:]])
    assert read_samples(result) is None  # not the side file the record stamped


def test_a_changed_size_changes_the_stamp(file):
    before = FileStamp.at(file)
    st = os.stat(file)
    with open(file, "ab") as f:
        f.write(b"y")
    os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))  # the modification time put back
    after = FileStamp.at(file)
    assert after.size == before.size + 1 and after.mtime_ns == before.mtime_ns
    assert after != before and after.without_device() != before.without_device()
    assert after.as_source_text() != before.as_source_text()
    assert not after.same_file_without_device(before.as_shard_file_record())


def test_a_touched_modification_time_changes_the_stamp(file):
    before = FileStamp.at(file)
    os.utime(file, ns=(before.mtime_ns, before.mtime_ns + 10**9))
    after = FileStamp.at(file)
    assert after.size == before.size and after.inode == before.inode and after.mtime_ns == before.mtime_ns + 10**9
    assert after != before
    assert after.as_folder_record() != before.as_folder_record()
    assert after.as_side_file_record() != before.as_side_file_record()
    assert after.as_annotations_line("a") != before.as_annotations_line("a")
    assert after.reader_identity() != before.reader_identity()
    assert not after.same_file_without_device(before.as_shard_file_record())


def test_a_replaced_file_has_a_new_inode(file, tmp_path):
    before = FileStamp.at(file)
    new = tmp_path / "new.png"
    new.write_bytes(file.read_bytes())
    os.utime(new, ns=(before.mtime_ns, before.mtime_ns))  # as cp -p leaves it
    os.replace(new, file)
    after = FileStamp.at(file)
    assert after.size == before.size and after.mtime_ns == before.mtime_ns
    assert after.inode != before.inode and after.which_file() != before.which_file()
    assert after.as_source_text() != before.as_source_text()
    assert after.reader_identity() != before.reader_identity()
    assert not after.same_file_without_device(before.as_shard_file_record())


def test_a_missing_file(tmp_path):
    gone = tmp_path / "gone.png"
    assert FileStamp.at_or_none(gone) is None
    with pytest.raises(FileNotFoundError):
        FileStamp.at(gone)
    assert MISSING_SOURCE_TEXT == source_stamps.source_stamp(str(gone)) == "missing"
    assert MISSING_FOLDER_RECORD == (-1, -1, -1, -1)
    assert output._shard_file_record(gone) == []
    options = saved_discovery.discovery_options(gone, None, False, None, False)
    assert options["labels_file"] == [str(gone)]


def test_a_shard_file_record_matches_without_its_device(file, tmp_path, monkeypatch):
    st = os.stat(file)
    stamp = FileStamp.of(st)
    elsewhere = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev + 1]  # a Ray node's device
    assert stamp.same_file_without_device(elsewhere)
    for damaged in (None, {}, "abcd", [], elsewhere[:4], [*elsewhere, 0], [str(v) for v in elsewhere]):
        assert not stamp.same_file_without_device(damaged)
    monkeypatch.setattr(output, "sha256_of", lambda path: pytest.fail("read for its SHA-256"))
    assert output._intact(tmp_path, "a.png", st.st_size, "0" * 64, elsewhere)
    monkeypatch.undo()
    assert not output._intact(tmp_path, "a.png", st.st_size, "0" * 64, [st.st_size, 1, 2, 3, 4])  # hashed: differs
    assert not output._intact(tmp_path, "a.png", st.st_size, "0" * 64, {"damaged": 1})


def test_modified_after_counts_a_later_change_time(file):
    st = os.stat(file)
    item = SourceItem(0, str(file), "a.png")
    when = max(st.st_mtime_ns, st.st_ctime_ns)
    assert not appending._modified_after(item, when)
    assert appending._modified_after(item, when - 1)
    os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))  # a copy's older modification time
    assert appending._modified_after(item, os.stat(file).st_ctime_ns - 1)  # its change time still counts
    assert not appending._modified_after(SourceItem(1, str(file) + ".gone", "gone.png"), 0)


def test_readers_output_identity(file, tmp_path):
    from packer.spec.manifest import MANIFEST_NAME
    from readers.datasets.output_files import output_identity

    manifest = tmp_path / MANIFEST_NAME
    manifest.write_text("{}")
    st = os.stat(manifest)
    assert output_identity(tmp_path) == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    manifest.unlink()
    assert output_identity(tmp_path) == ("missing",)
