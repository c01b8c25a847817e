"""The discovery saved in the staging folder: --resume takes it instead of walking an unchanged tree,
walks again when any folder changed, and the run maps its items from it."""

import mmap
import os

import pytest
from conftest import write_image

import packer.folder_stamps
import packer.pipeline
from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ShardSize
from packer.discover import discover
from packer.errors import OutputError
from packer.folder_stamps import FolderStamps
from packer.item_table import ItemTable
from packer.manifest import MANIFEST_NAME
from packer.output import SAVED_DISCOVERY, staging_dir

CONFIG = ConvertConfig("npy", PreprocessConfig(size=(16, 12)), ShardSize(samples=5))


@pytest.fixture
def settled(monkeypatch):
    """Folders made by the test count as settled: nothing is too close to the walk to trust (on a real
    tree, folders changed in the two seconds before the walk are not trusted)."""
    monkeypatch.setattr(packer.folder_stamps, "RACY_SECONDS", 0.0)


def interrupted(tree, out, config=CONFIG, **kwargs):
    """A conversion of ``tree`` stopped in its second shard (one worker)."""
    done = []

    def stop(n):
        done.append(n)
        if sum(done) > 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(tree, out, config, workers=1, progress=stop, **kwargs)


def no_walk(*args, **kwargs):
    raise AssertionError("the source was walked again")


def test_resume_of_an_unchanged_tree_takes_the_saved_discovery(image_tree, tmp_path, monkeypatch, settled, caplog):
    out = tmp_path / "out"
    interrupted(image_tree, out)
    assert (staging_dir(out) / SAVED_DISCOVERY / "discovery.json").is_file()
    monkeypatch.setattr(packer.pipeline, "discover_checked", no_walk)
    with caplog.at_level("INFO", logger="packer"):
        resumed = convert(image_tree, out, CONFIG, workers=1, resume=True)
    assert "as the interrupted run found them" in caplog.text
    assert resumed.processed == 10  # the finished shard kept
    monkeypatch.undo()
    convert(image_tree, tmp_path / "fresh", CONFIG, workers=1)
    assert (out / MANIFEST_NAME).read_bytes() == (tmp_path / "fresh" / MANIFEST_NAME).read_bytes()
    assert not (out / SAVED_DISCOVERY).exists()


def test_a_file_added_since_means_a_new_walk(image_tree, tmp_path, settled, caplog):
    """The walk finds the new file, so the plan differs from the interrupted one, which is refused as
    it was before the discovery was saved."""
    out = tmp_path / "out"
    interrupted(image_tree, out)
    write_image(image_tree / "ant" / "img_new.png", (9, 9))
    with caplog.at_level("INFO", logger="packer"), pytest.raises(OutputError, match="changed since the interrupted"):
        convert(image_tree, out, CONFIG, workers=1, resume=True)
    assert "ant changed since the interrupted run" in caplog.text


def test_a_tree_changed_just_before_its_walk_is_walked_again(image_tree, tmp_path, monkeypatch, caplog):
    """Without ``settled``: the test's folders were made within two seconds of the walk."""
    out = tmp_path / "out"
    interrupted(image_tree, out)
    with caplog.at_level("INFO", logger="packer"):
        assert convert(image_tree, out, CONFIG, workers=1, resume=True).processed == 10
    assert "too close to its walk to tell" in caplog.text


def test_other_options_mean_a_new_walk(image_tree, tmp_path, settled, caplog):
    """A class map with one more class at its end: walked again, and the same plan (it resumes)."""
    out = tmp_path / "out"
    interrupted(image_tree, out)
    with caplog.at_level("INFO", logger="packer"):
        resumed = convert(image_tree, out, CONFIG, workers=1, resume=True, classes=["ant", "bee", "cat", "extra"])
    assert "discovery options differ" in caplog.text and resumed.processed == 10


@pytest.mark.parametrize("damage", ["truncate keys", "remove offsets", "bad json"])
def test_a_damaged_saved_discovery_means_a_new_walk(image_tree, tmp_path, settled, damage):
    out = tmp_path / "out"
    interrupted(image_tree, out)
    saved = staging_dir(out) / SAVED_DISCOVERY
    if damage == "truncate keys":
        os.truncate(saved / "keys.bin", 10)
    elif damage == "remove offsets":
        (saved / "offsets.npy").unlink()
    else:
        (saved / "discovery.json").write_text("{")
    assert convert(image_tree, out, CONFIG, workers=1, resume=True).processed == 10
    convert(image_tree, tmp_path / "fresh", CONFIG, workers=1)
    assert (out / MANIFEST_NAME).read_bytes() == (tmp_path / "fresh" / MANIFEST_NAME).read_bytes()


def test_the_run_maps_its_items_from_the_saved_discovery(image_tree, tmp_path):
    """Once saved, the items leave the parent's heap: the plan's shards are views of the mapped file."""
    seen = {}

    def on_plan(found, tasks):
        seen["blob"] = found.items.blob
        seen["tasks"] = tasks

    shuffled = ConvertConfig("npy", PreprocessConfig(size=(16, 12)), ShardSize(samples=5), shuffle=7)
    convert(image_tree, tmp_path / "out", shuffled, workers=1, on_plan=on_plan)
    assert isinstance(seen["blob"], mmap.mmap)
    assert all(isinstance(t.items, ItemTable) and t.items.blob is seen["blob"] for t in seen["tasks"])
    convert(image_tree, tmp_path / "held", shuffled, workers=1)
    assert (tmp_path / "out" / MANIFEST_NAME).read_bytes() == (tmp_path / "held" / MANIFEST_NAME).read_bytes()


def test_folder_stamps_notice_what_changes_a_folder(tmp_path, settled):
    write_image(tmp_path / "a" / "x.png", (4, 4))
    write_image(tmp_path / "b" / "y.png", (4, 4))
    stamps = discover(tmp_path).folders
    assert isinstance(stamps, FolderStamps) and len(stamps) == 3
    assert stamps.first_change(tmp_path) is None
    (tmp_path / "b" / "y.png").rename(tmp_path / "b" / "z.png")
    assert stamps.first_change(tmp_path) == "b"
    stamps = discover(tmp_path).folders
    (tmp_path / "a" / "x.png").unlink()
    assert stamps.first_change(tmp_path) == "a"
    stamps = discover(tmp_path).folders
    os.chmod(tmp_path / "b", 0o700)
    assert stamps.first_change(tmp_path) == "b"
    stamps = discover(tmp_path).folders
    (tmp_path / "c").mkdir()
    assert stamps.first_change(tmp_path) == "/"


def test_masks_are_matched_again_to_a_reused_discovery(tmp_path, monkeypatch, settled):
    """The saved discovery is the walk's, before masks (or boxes) are matched: a resume that takes it
    matches them again and writes what an uninterrupted run writes."""
    from test_segmentation import write_data

    from packer.config import MaskConfig

    write_data(tmp_path / "seg")
    config = ConvertConfig("npy", PreprocessConfig(size=(32, 32)), ShardSize(samples=1),
                           masks=MaskConfig(str(tmp_path / "seg" / "masks")))
    done = []

    def stop(n):
        done.append(n)
        if sum(done) > 1:
            raise KeyboardInterrupt

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        convert(tmp_path / "seg" / "images", out, config, workers=1, progress=stop)
    monkeypatch.setattr(packer.pipeline, "discover_checked", no_walk)
    assert convert(tmp_path / "seg" / "images", out, config, workers=1, resume=True).processed == 2
    monkeypatch.undo()
    convert(tmp_path / "seg" / "images", tmp_path / "fresh", config, workers=1)
    assert (out / MANIFEST_NAME).read_bytes() == (tmp_path / "fresh" / MANIFEST_NAME).read_bytes()
