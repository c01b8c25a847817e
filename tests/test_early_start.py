"""Shards started while discovery walks (packer.run.early_start): the output is the one a run without them
writes, shards that the final plan does not have are written again, and a failure leaves nothing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from compare import assert_same_output, check_files
from conftest import make_tree, write_image
from helpers import interrupted_after, no_staging

import packer.run.early_start
import packer.run.plan
import packer.sources.discover
from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ShardSize
from packer.spec.errors import DecodeError
from packer.spec.manifest import read_manifest

CONFIG = ConvertConfig(format="npy", preprocess=PreprocessConfig(size=(16, 16), resize="stretch"))


@pytest.fixture
def watched(monkeypatch):
    """Early starts at every folder the walk finishes (a test tree is walked in milliseconds), and the
    shards that started early, by their first sample's key."""
    monkeypatch.setattr(packer.run.early_start, "EARLY_AFTER", 0.0)
    monkeypatch.setattr(packer.run.early_start, "CHECK_EVERY", 0.0)
    monkeypatch.setattr(packer.run.early_start, "REBUILD_GROWTH", 1.0)
    started: list[str] = []

    class Recording(packer.run.early_start.ShardWork):
        def job(self, number, task, **own):  # early_start makes a job for each early shard here
            started.append(task.items[0].relpath)
            return super().job(number, task, **own)

    monkeypatch.setattr(packer.run.early_start, "ShardWork", Recording)
    return started


def _never_early(monkeypatch) -> None:
    monkeypatch.setattr(packer.run.early_start, "EARLY_AFTER", 1e9)


def _tree(root: Path, classes: int = 6, per_class: int = 20) -> Path:
    make_tree(root, {f"c{i:02d}": per_class for i in range(classes)}, size=(24, 20), ext="png")
    return root


@pytest.mark.parametrize("fmt", ["npy", "wds", "lmdb", "hdf5"])
def test_shards_started_during_the_walk_give_the_same_output(tmp_path, watched, monkeypatch, fmt):
    tree = _tree(tmp_path / "src")
    config = ConvertConfig(format=fmt, preprocess=CONFIG.preprocess, shard_size=ShardSize(samples=25))
    early = convert(tree, tmp_path / "early", config, workers=2)
    assert len(watched) >= 2  # shards did start while the walk went on
    assert watched[0] == "c00/img_000.png"
    _never_early(monkeypatch)
    plain = convert(tree, tmp_path / "plain", config, workers=2)
    assert_same_output(tmp_path / "early", tmp_path / "plain")
    check_files(tmp_path / "early", read_manifest(tmp_path / "early"))
    assert early.processed == plain.processed == 120
    assert no_staging(tmp_path / "early")


@pytest.mark.long
def test_a_large_source_under_auto_starts_early_with_a_fixed_cut(tmp_path, watched, monkeypatch):
    tree = _tree(tmp_path / "src", classes=8, per_class=25)
    monkeypatch.setattr(packer.run.plan, "ESTIMATE_PREFIX", 16)
    monkeypatch.setattr(packer.run.plan, "AUTO_FIXED_MAX_SAMPLES", 3)  # 64 shards of 3 from 192 samples on
    convert(tree, tmp_path / "early", CONFIG, workers=2)
    manifest = read_manifest(tmp_path / "early")
    assert manifest.sharding["samples_per_shard"] == 3 and "balanced_for_workers" not in manifest.sharding
    assert [s.samples for s in manifest.shards] == [3] * 66 + [2]
    assert watched  # the cut was known before the walk ended
    _never_early(monkeypatch)
    convert(tree, tmp_path / "plain", CONFIG, workers=2)
    assert_same_output(tmp_path / "early", tmp_path / "plain")


def test_a_source_below_the_fixed_cut_is_balanced_and_starts_nothing_early(tmp_path, watched, monkeypatch):
    tree = _tree(tmp_path / "src", classes=4, per_class=10)
    monkeypatch.setattr(packer.run.plan, "ESTIMATE_PREFIX", 16)
    monkeypatch.setattr(packer.run.plan, "AUTO_FIXED_MAX_SAMPLES", 3)  # the fixed cut would need 192 samples
    convert(tree, tmp_path / "out", CONFIG, workers=2)
    manifest = read_manifest(tmp_path / "out")
    assert manifest.sharding["balanced_for_workers"] == 2
    assert watched == []


def test_fields_found_late_cancel_the_early_shards(tmp_path, watched, monkeypatch, caplog):
    """Texts paired with the images of the last class make every sample a pair: the image-only shards
    started early are not the plan's, and are written again."""
    tree = _tree(tmp_path / "src", classes=4, per_class=10)
    for path in sorted(tree.rglob("*.png")):
        path.with_suffix(".txt").write_text(f"caption of {path.stem}")
    for path in sorted((tree / "c00").glob("*.txt")):
        path.unlink()  # the first class has none: the walk sees images alone first
    config = ConvertConfig(format="npy", preprocess=CONFIG.preprocess, shard_size=ShardSize(samples=5))
    with caplog.at_level(logging.WARNING, logger="packer"):
        convert(tree, tmp_path / "early", config, workers=2)
    assert watched  # image-only shards started over the first class
    assert "do not match the final plan" in caplog.text
    manifest = read_manifest(tmp_path / "early")
    assert list(manifest.fields)[:2] == ["image", "text"]
    _never_early(monkeypatch)
    convert(tree, tmp_path / "plain", config, workers=2)
    assert_same_output(tmp_path / "early", tmp_path / "plain")


def test_a_strict_failure_in_an_early_shard_leaves_no_staging_folder(tmp_path, watched):
    tree = _tree(tmp_path / "src")
    sorted((tree / "c00").glob("*.png"))[3].write_bytes(b"not a png")
    config = ConvertConfig(format="npy", preprocess=CONFIG.preprocess, shard_size=ShardSize(samples=10))
    with pytest.raises(DecodeError):
        convert(tree, tmp_path / "out", config, workers=2, strict=True)
    assert no_staging(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_symlinked_class_folder_is_not_started_early(tmp_path, watched, monkeypatch):
    """Files of symlinked folders are spliced in after the walk: no shard over them starts early."""
    tree = _tree(tmp_path / "src", classes=3, per_class=10)
    other = _tree(tmp_path / "elsewhere", classes=1, per_class=10)
    (tree / "z-linked").symlink_to(other / "c00")
    config = ConvertConfig(format="npy", preprocess=CONFIG.preprocess, shard_size=ShardSize(samples=5))
    convert(tree, tmp_path / "early", config, workers=2)
    assert watched and not any(key.startswith("z-linked") for key in watched)
    _never_early(monkeypatch)
    convert(tree, tmp_path / "plain", config, workers=2)
    assert_same_output(tmp_path / "early", tmp_path / "plain")


def test_early_shards_of_a_walk_with_skipped_files(tmp_path, watched, monkeypatch):
    """Images at the root beside class folders are skipped, and other files ignored, early or not."""
    tree = _tree(tmp_path / "src", classes=3, per_class=10)
    write_image(tree / "loose.png", (24, 20))
    (tree / "c01" / "notes.csv").write_text("a,b\n")
    config = ConvertConfig(format="wds", preprocess=CONFIG.preprocess, shard_size=ShardSize(samples=4))
    early = convert(tree, tmp_path / "early", config, workers=2)
    assert watched
    _never_early(monkeypatch)
    plain = convert(tree, tmp_path / "plain", config, workers=2)
    assert_same_output(tmp_path / "early", tmp_path / "plain")
    assert [s.path for s in early.skipped] == [s.path for s in plain.skipped] == ["loose.png"]


def test_a_ctrl_c_after_the_walk_resumes_with_the_early_shards_kept(tmp_path, watched, monkeypatch, caplog):
    tree = _tree(tmp_path / "src", classes=4, per_class=10)
    config = ConvertConfig(format="npy", preprocess=CONFIG.preprocess, shard_size=ShardSize(samples=5))
    interrupted_after(tree, tmp_path / "early", config, items=5)
    assert watched and not (tmp_path / "early").exists()
    with caplog.at_level(logging.INFO, logger="packer"):
        result = convert(tree, tmp_path / "early", config, workers=2, resume=True)
    assert "resuming: 1 of 8 shards already finished" in caplog.text  # shard 0, written during the walk
    assert result.processed == 35
    _never_early(monkeypatch)
    convert(tree, tmp_path / "plain", config, workers=2)
    assert_same_output(tmp_path / "early", tmp_path / "plain")


def test_a_ctrl_c_during_the_walk_leaves_no_staging_folder(tmp_path, watched, monkeypatch):
    tree = _tree(tmp_path / "src", classes=4, per_class=10)
    config = ConvertConfig(format="npy", preprocess=CONFIG.preprocess, shard_size=ShardSize(samples=5))
    walked = packer.sources.discover._samples_found

    def interrupted(*args, **kwargs):  # the walk is over, the plan not yet made
        raise KeyboardInterrupt

    monkeypatch.setattr(packer.sources.discover, "_samples_found", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert(tree, tmp_path / "out", config, workers=2)
    assert watched and no_staging(tmp_path / "out")
    monkeypatch.setattr(packer.sources.discover, "_samples_found", walked)
    convert(tree, tmp_path / "out", config, workers=2, resume=True)
    check_files(tmp_path / "out", read_manifest(tmp_path / "out"))


def test_a_class_folder_made_during_the_walk_relabels_the_early_shards(tmp_path, watched, monkeypatch, caplog):
    """A class folder that appears while the tree is walked moves every class index up by one: the
    shards started early hold the old labels, and are written again."""
    tree = _tree(tmp_path / "src", classes=4, per_class=10)
    config = ConvertConfig(format="npy", preprocess=CONFIG.preprocess, shard_size=ShardSize(samples=5))
    feed = packer.run.early_start.EarlyStart._feed

    def adding_a_class(self):
        feed(self)
        if self._jobs:
            (tree / "a-new").mkdir(exist_ok=True)  # listed by the final class map, not by the walk

    monkeypatch.setattr(packer.run.early_start.EarlyStart, "_feed", adding_a_class)
    with caplog.at_level(logging.WARNING, logger="packer"):
        convert(tree, tmp_path / "early", config, workers=2)
    assert "do not match the final plan" in caplog.text
    assert read_manifest(tmp_path / "early").classes[0] == "a-new"
    _never_early(monkeypatch)
    convert(tree, tmp_path / "plain", config, workers=2)
    assert_same_output(tmp_path / "early", tmp_path / "plain")


def test_queued_early_shards_hold_their_own_samples_only(tmp_path, watched, monkeypatch):
    """At most ``workers`` early shards wait in the queue, each with a compact copy of its samples:
    none keeps the listing of the whole tree alive."""
    tree = _tree(tmp_path / "src", classes=6, per_class=20)
    config = ConvertConfig(format="npy", preprocess=CONFIG.preprocess, shard_size=ShardSize(samples=4))
    queued, holding = [], []
    feed = packer.run.early_start.EarlyStart._feed

    def looking(self):
        feed(self)
        if self.runner is not None:
            queued.append(self.runner.queued)

    class HoldingWhat(packer.run.early_start.ShardWork):
        def job(self, number, task, **own):
            holding.append(len(task.items.records))
            return super().job(number, task, **own)

    monkeypatch.setattr(packer.run.early_start.EarlyStart, "_feed", looking)
    monkeypatch.setattr(packer.run.early_start, "ShardWork", HoldingWhat)
    convert(tree, tmp_path / "out", config, workers=2)
    assert watched and max(queued) <= 2
    assert set(holding) == {4}


def test_a_stray_text_file_among_the_images_does_not_stop_the_early_start(tmp_path, watched, monkeypatch):
    tree = _tree(tmp_path / "src", classes=4, per_class=10)
    (tree / "c00" / "README.txt").write_text("where these photographs come from")
    (tree / "c02" / "meta.json").write_text("{}")
    config = ConvertConfig(format="npy", preprocess=CONFIG.preprocess, shard_size=ShardSize(samples=5))
    early = convert(tree, tmp_path / "early", config, workers=2)
    assert watched and watched[0] == "c00/img_000.png"
    _never_early(monkeypatch)
    plain = convert(tree, tmp_path / "plain", config, workers=2)
    assert_same_output(tmp_path / "early", tmp_path / "plain")
    assert early.ignored == plain.ignored == {".json": 1, ".txt": 1}


def test_no_early_start_with_the_output_inside_the_source(tmp_path, watched):
    """Taking the output's lock makes its parent folders: inside the source, walked as a class."""
    tree = _tree(tmp_path / "src", classes=3, per_class=10)
    config = ConvertConfig(format="npy", preprocess=CONFIG.preprocess, shard_size=ShardSize(samples=5))
    convert(tree, tree / "m-new" / "out", config, workers=2)
    assert watched == []
    assert read_manifest(tree / "m-new" / "out").classes == ["c00", "c01", "c02"]


def test_a_run_without_resume_keeps_an_interrupted_run_until_its_walk_ends(tmp_path, watched, monkeypatch):
    """A run that forgot --resume, stopped during its walk, must not have discarded the interrupted run."""
    tree = _tree(tmp_path / "src", classes=4, per_class=10)
    config = ConvertConfig(format="npy", preprocess=CONFIG.preprocess, shard_size=ShardSize(samples=5))
    _never_early(monkeypatch)
    interrupted_after(tree, tmp_path / "out", config, items=5)
    stage = tmp_path / ".out.packer-partial"
    records = sorted(p.name for p in stage.glob("*.done.json"))
    assert records
    monkeypatch.setattr(packer.run.early_start, "EARLY_AFTER", 0.0)
    walked = packer.sources.discover._samples_found

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(packer.sources.discover, "_samples_found", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert(tree, tmp_path / "out", config, workers=2)
    assert watched == [] and sorted(p.name for p in stage.glob("*.done.json")) == records
    monkeypatch.setattr(packer.sources.discover, "_samples_found", walked)
    convert(tree, tmp_path / "out", config, workers=2, resume=True)
    check_files(tmp_path / "out", read_manifest(tmp_path / "out"))


def test_auto_keeps_the_balanced_cut_for_images_of_their_own_sizes(tmp_path, watched, monkeypatch):
    """An estimate from the first samples could make shards of varying images far over 256 MiB."""
    tree = _tree(tmp_path / "src", classes=8, per_class=25)
    monkeypatch.setattr(packer.run.plan, "ESTIMATE_PREFIX", 16)
    monkeypatch.setattr(packer.run.plan, "AUTO_FIXED_MAX_SAMPLES", 3)
    config = ConvertConfig(format="npy", preprocess=PreprocessConfig(resize="none"))
    convert(tree, tmp_path / "out", config, workers=2)
    assert read_manifest(tmp_path / "out").sharding["balanced_for_workers"] == 2
    assert watched == []
