"""packer convert --append: new source files as new shards; the existing shards, bytes and readers untouched."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import FORMATS, write_image
from helpers import shard_file

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import ShardSize
from packer.ops.append import append, config_of
from packer.output.verify import verify
from packer.spec.errors import ConfigError, InputError
from packer.spec.manifest import read_manifest
from readers import open_dataset

PRE = PreprocessConfig(size=(16, 12))


def add(root: Path, cls: str, seeds: list[int]) -> None:
    for seed in seeds:
        write_image(root / cls / f"{cls}-{seed:03d}.png", (20, 16), seed=seed)


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def samples(root: Path) -> list:
    ds = open_dataset(root, return_meta=True, normalize=False)
    items = list(ds) if type(ds).__name__ == "WdsDataset" else [ds[i] for i in range(len(ds))]
    return [(meta["key"], label, image) for image, label, meta in items]


def again(out: Path, **kw) -> ConvertConfig:
    """The configuration ``out`` was converted with (what the CLI uses for options left out)."""
    return config_of(read_manifest(out), ShardSize(samples=3), **kw)


@pytest.mark.parametrize("fmt", FORMATS)
def test_new_files_become_new_shards_and_old_shards_keep_their_bytes(tmp_path, fmt):
    src, out = tmp_path / "src", tmp_path / "out"
    add(src, "cat", [1, 2, 3])
    add(src, "dog", [4, 5])
    convert(src, out, ConvertConfig(fmt, PRE, ShardSize(samples=2)), workers=1)
    before = read_manifest(out)
    old_files = {f.path: f.sha256 for s in before.shards for f in s.files}
    old_samples = samples(out)
    add(src, "cat", [6])
    add(src, "dog", [7, 8, 9])
    result = append(src, out, again(out), workers=1)
    assert result.added == 4 and not result.changed and not result.removed
    m = read_manifest(out)
    assert m.samples == 9 and m.classes == ["cat", "dog"] and m.class_counts == [4, 5]
    assert m.shards[: len(before.shards)] == before.shards  # the same names, files and SHA-256s
    assert {f.path: f.sha256 for s in m.shards[: len(before.shards)] for f in s.files} == old_files
    new = m.shards[len(before.shards) :]
    assert [s.samples for s in new] == [3, 1] and new[0].name.startswith(f"shard-{len(before.shards):05d}-")
    assert verify(out) == []
    got = samples(out)
    assert [g[:2] for g in got[:5]] == [o[:2] for o in old_samples]
    assert all(torch.equal(g[2], o[2]) for g, o in zip(got, old_samples))
    assert [(k, label) for k, label, _ in got[5:]] == [
        ("cat/cat-006.png", 0),
        ("dog/dog-007.png", 1),
        ("dog/dog-008.png", 1),
        ("dog/dog-009.png", 1),
    ]
    fresh = tmp_path / "fresh"  # a conversion of the new files alone stores the same pixels for them
    add(tmp_path / "only", "cat", [6])
    convert(tmp_path / "only", fresh, ConvertConfig(fmt, PRE), workers=1)
    assert torch.equal(samples(fresh)[0][2], got[5][2])
    entry = m.history[-1]
    assert entry["action"] == "append" and entry["samples"] == 4 and entry["shards"] == [s.name for s in new]
    assert "T" in entry["at"] and m.stats["original_sizes"]["width"]["counts"][0] == 9  # 20 px wide: bin [0, 32)
    assert m.stats["pixels"]["count"] == 9 * 16 * 12


def test_npy_shards_are_hard_linked_and_wds_keys_stay_unique(tmp_path):
    for fmt in ("npy", "wds"):
        src, out = tmp_path / f"src-{fmt}", tmp_path / fmt
        add(src, "cat", [1, 2])
        convert(src, out, ConvertConfig(fmt, PRE), workers=1)
        first = shard_file(out, 0, ".tar" if fmt == "wds" else ".images.npy")
        inode = os.stat(first).st_ino
        add(src, "cat", [3])
        append(src, out, again(out), workers=1)
        assert os.stat(first).st_ino == inode  # the same file, linked into the new version
    tars = [shard_file(tmp_path / "wds", n, ".tar") for n in (0, 1)]
    with tarfile.open(tars[0]) as a, tarfile.open(tars[1]) as b:
        assert not {n.split(".")[0] for n in a.getnames()} & {n.split(".")[0] for n in b.getnames()}


def test_a_new_class_is_refused_unless_added_at_the_end(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    add(src, "cat", [1])
    add(src, "dog", [2])
    convert(src, out, ConvertConfig("lmdb", PRE), workers=1)
    add(src, "ant", [3])  # sorts first: a fresh conversion would shift every label
    with pytest.raises(InputError, match="has 1 class\\(es\\) that .* lacks: 'ant'; pass --add-classes"):
        append(src, out, again(out))
    append(src, out, again(out), add_classes=True, workers=1)
    m = read_manifest(out)
    assert m.classes == ["cat", "dog", "ant"] and m.class_counts == [1, 1, 1]
    assert [(k, label) for k, label, _ in samples(out)] == [
        ("cat/cat-001.png", 0),
        ("dog/dog-002.png", 1),
        ("ant/ant-003.png", 2),
    ]
    assert m.history[-1]["classes_added"] == ["ant"]


def test_other_preprocessing_is_refused_with_the_difference_named(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    add(src, "cat", [1])
    convert(src, out, ConvertConfig("npy", PRE), workers=1)
    add(src, "cat", [2])
    with pytest.raises(ConfigError, match="these options differ: size: \\[8, 8\\] where .* has \\[16, 12\\]"):
        append(src, out, ConvertConfig("npy", PreprocessConfig(size=(8, 8))))
    with pytest.raises(ConfigError, match="is a npy output: append to it with --format npy"):
        append(src, out, ConvertConfig("wds", PRE))
    runner = CliRunner()
    refused = runner.invoke(cli, ["convert", str(src), "-f", "npy", "-o", str(out), "--append", "--size", "32"])
    assert refused.exit_code == 2 and "--size differs from how" in refused.output
    refused = runner.invoke(cli, ["convert", str(src), "-f", "npy", "-o", str(out), "--append", "--shuffle", "3"])
    assert refused.exit_code == 2 and "--shuffle cannot be given with it" in refused.output
    done = runner.invoke(cli, ["convert", str(src), "-f", "npy", "-o", str(out), "--append", "-q"])
    assert done.exit_code == 0 and "appended 1 samples in 1 new shard(s)" in done.output, done.output
    same = runner.invoke(cli, ["convert", str(src), "-f", "npy", "-o", str(out), "--append", "-q", "--size", "16x12"])
    assert same.exit_code == 0 and "nothing to append" in same.output, same.output
    info = runner.invoke(cli, ["info", str(out)])
    assert "history   " in info.output and "appended 1 samples in 1 shard(s)" in info.output


def test_changed_and_removed_files_are_reported_and_nothing_else_changes(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    add(src, "cat", [1, 2, 3])
    convert(src, out, ConvertConfig("hdf5", PRE), workers=1)
    before = digests(out)
    old_times = os.stat(src / "cat" / "cat-001.png")
    time.sleep(0.05)
    write_image(src / "cat" / "cat-001.png", (20, 16), seed=99)  # changed since the output was written,
    os.utime(src / "cat" / "cat-001.png", ns=(old_times.st_atime_ns, old_times.st_mtime_ns))  # as cp -p leaves it
    (src / "cat" / "cat-002.png").unlink()
    result = append(src, out, again(out))
    assert result.added == 0 and result.changed == ["cat/cat-001.png"] and result.removed == ["cat/cat-002.png"]
    assert digests(out) == before  # nothing new: the output is not rewritten at all


def test_a_reader_opened_before_keeps_its_version_and_one_opened_after_sees_the_new(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    add(src, "cat", [1, 2, 3, 4])
    convert(src, out, ConvertConfig("npy", PRE, ShardSize(samples=2)), workers=1)
    early = open_dataset(out)
    first = early[0][0]
    add(src, "cat", [5, 6])
    append(src, out, again(out), workers=1)
    assert len(early) == 4 and torch.equal(early[0][0], first) and early[3][1] == 0
    assert len(open_dataset(out)) == 6


def test_an_interrupted_append_leaves_the_output_as_it_was(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    add(src, "cat", [1, 2])
    convert(src, out, ConvertConfig("wds", PRE), workers=1)
    before = digests(out)
    add(src, "cat", list(range(3, 40)))
    ready = tmp_path / "ready"
    code = f"""
import time, pathlib, packer.run.staging as a  # the lifecycle writes the manifest, then publishes
from packer.ops.append import append, config_of
from packer.config import ShardSize
from packer.spec.manifest import read_manifest
real = a.write_output
def stall(stage, manifest):
    real(stage, manifest)  # the new version is complete in its staging folder, not yet published
    pathlib.Path({str(ready)!r}).write_text("x")
    time.sleep(60)
a.write_output = stall
out = pathlib.Path({str(out)!r})
append({str(src)!r}, out, config_of(read_manifest(out), ShardSize(samples=5)), workers=1)
"""
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the append never got to publishing"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert digests(out) == before
    assert verify(out) == [] and len(open_dataset(out)) == 2
    append(src, out, again(out), workers=1)  # the left staging folder does not stand in the way
    assert read_manifest(out).samples == 39 and verify(out) == []


def test_duplicates_of_stored_samples_are_reported(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    add(src, "cat", [1, 2])
    convert(src, out, ConvertConfig("npy", PRE), workers=1)
    write_image(src / "cat" / "copy.png", (20, 16), seed=1)  # cat-001.png's bytes under another name
    append(src, out, again(out), workers=1)
    assert read_manifest(out).duplicates == [["cat/cat-001.png", "cat/copy.png"]]
    assert json.loads((out / "manifest.json").read_text())["history"][0]["samples"] == 1
    # Copies on both sides of the next append: one group of four, as a fresh conversion finds them,
    # not the output's group, the new files' group and the group across them overlapping.
    write_image(src / "cat" / "copy2.png", (20, 16), seed=1)
    write_image(src / "cat" / "copy3.png", (20, 16), seed=1)
    append(src, out, again(out), workers=1)
    assert read_manifest(out).duplicates == [["cat/cat-001.png", "cat/copy.png", "cat/copy2.png", "cat/copy3.png"]]


def test_outputs_an_append_would_get_wrong_are_refused(tmp_path):
    src = tmp_path / "src"
    add(src, "cat", [1, 2, 3, 4])
    add(src, "dog", [5, 6, 7, 8])
    convert(src, tmp_path / "set", ConvertConfig("npy", PRE), workers=1)  # no split folders: one output
    from packer.ops.splits import convert_splits

    convert_splits(
        src, tmp_path / "splits", ConvertConfig("npy", PRE), fractions=[("train", 0.5), ("val", 0.5)], seed=0, workers=1
    )
    add(src, "cat", [9])
    with pytest.raises(ConfigError, match="is a split of the set in .*convert the set again"):
        append(src, tmp_path / "splits" / "train", again(tmp_path / "splits" / "train"))
    labels = tmp_path / "labels.csv"
    labels.write_text("cat/cat-001.png,dog\ncat/cat-002.png,cat\n")
    by_file = tmp_path / "by-file"
    convert(src, by_file, ConvertConfig("npy", PRE), labels_file=labels, workers=1)
    with pytest.raises(ConfigError, match="was labelled by a --labels file.*pass --labels"):
        append(src, by_file, again(by_file))
    more = tmp_path / "more.csv"
    more.write_text("cat/cat-003.png,dog\n")
    result = append(src, by_file, again(by_file), labels_file=more, workers=1)
    assert [(k, label) for k, label, _ in samples(by_file)][-1] == (
        "cat/cat-003.png",
        read_manifest(by_file).classes.index("dog"),
    )
    # The held files, which more.csv does not list, are neither skipped nor removed: still there, stored.
    m = read_manifest(by_file)
    assert result.removed == [] and m.history[-1]["removed"] == 0
    assert not {"cat/cat-001.png", "cat/cat-002.png"} & {s["path"] for s in m.skipped} and m.samples == 3
    assert m.source["files"] == 9 == m.samples + len(m.skipped)  # as a fresh conversion counts the tree
    runner = CliRunner()
    wrong = runner.invoke(cli, ["convert", str(src), "-f", "wds", "-o", str(tmp_path / "set"), "--append"])
    assert wrong.exit_code == 2 and "is a npy output: append to it with --format npy" in wrong.output
    address = runner.invoke(
        cli, ["convert", str(src), "-f", "npy", "-o", str(tmp_path / "set"), "--append", "--address", "auto"]
    )
    assert address.exit_code == 2 and "--address is for --executor ray" in address.output


def test_a_lock_file_of_lmdb_tools_a_fixed_file_and_many_workers(tmp_path):
    import lmdb

    from packer.run.executor import LocalExecutor

    src, out = tmp_path / "src", tmp_path / "out"
    add(src, "cat", [1, 2])
    (src / "cat" / "broken.png").write_bytes(b"not yet an image")
    convert(src, out, ConvertConfig("lmdb", PRE), workers=1)
    assert [s["path"] for s in read_manifest(out).skipped] == ["cat/broken.png"]
    lmdb.open(str(shard_file(out, 0, ".lmdb")), subdir=False, readonly=True).close()  # leaves NAME.lmdb-lock
    time.sleep(0.05)
    write_image(src / "cat" / "broken.png", (20, 16), seed=7)  # fixed since
    add(src, "cat", list(range(10, 15)))
    result = append(src, out, config_of(read_manifest(out), ShardSize()), executor=LocalExecutor(4))
    m = read_manifest(out)
    assert result.added == 6 and m.skipped == [] and m.source["files"] == 8
    assert len(m.shards) == 2  # six new samples: one new shard, not one per worker
    assert verify(out) == []


def test_appending_a_container_is_refused_with_what_to_do(tmp_path):
    import shutil

    src = tmp_path / "src"
    add(src, "cat", [1, 2])
    convert(src, tmp_path / "shards", ConvertConfig("wds", PRE), workers=1)
    convert(src, tmp_path / "out", ConvertConfig("npy", PRE), workers=1)
    (tmp_path / "tars").mkdir()
    for tar in (tmp_path / "shards").glob("*.tar"):
        shutil.copy(tar, tmp_path / "tars")
    refused = CliRunner().invoke(
        cli, ["convert", str(tmp_path / "tars"), "-f", "npy", "-o", str(tmp_path / "out"), "--append"]
    )
    assert refused.exit_code == 2 and "is a tar container: --append adds the new files of a folder" in refused.output
