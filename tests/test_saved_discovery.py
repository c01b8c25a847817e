"""The discovery saved in the staging folder: --resume takes it instead of walking an unchanged tree,
walks again when any folder changed or anything about it does not fit."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import make_tree, write_image
from helpers import later_shards_unfinished

import packer.ops.convert
import packer.sources.folder_stamps
import packer.sources.origin
import packer.sources.saved_discovery
from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ShardSize
from packer.output.files import SAVED_DISCOVERY, staging_dir
from packer.sources.discover import discover
from packer.sources.folder_stamps import FolderStamps
from packer.spec.errors import OutputError
from packer.spec.manifest import MANIFEST_NAME

CONFIG = ConvertConfig("npy", PreprocessConfig(size=(16, 12)), ShardSize(samples=5))


@pytest.fixture
def settled(monkeypatch):
    """Folders made by the test count as settled: nothing is too close to the walk to trust (on a real
    tree, folders changed in the two seconds before the walk are not trusted)."""
    monkeypatch.setattr(packer.sources.folder_stamps, "RACY_SECONDS", 0.0)


def interrupted(tree, out, config=CONFIG, **kwargs):
    """A conversion of ``tree`` stopped in its second shard (one worker)."""
    done = []

    def stop(n):
        done.append(n)
        if sum(done) > 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), later_shards_unfinished():
        convert(tree, out, config, workers=1, progress=stop, **kwargs)


def no_walk(*args, **kwargs):
    raise AssertionError("the source was walked again")


def test_resume_of_an_unchanged_tree_takes_the_saved_discovery(image_tree, tmp_path, monkeypatch, settled, caplog):
    out = tmp_path / "out"
    interrupted(image_tree, out)
    assert (staging_dir(out) / SAVED_DISCOVERY / "discovery.json").is_file()
    monkeypatch.setattr(packer.sources.origin, "discover_checked", no_walk)
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


@pytest.mark.parametrize(
    "damage", ["truncate keys", "remove block ends", "bad json", "flip a key byte", "flip a label"]
)
def test_a_damaged_saved_discovery_means_a_new_walk(image_tree, tmp_path, settled, damage, caplog):
    """Whatever the damage, the resume walks again (a flipped byte in a compressed block of paths
    failed in the middle of the run; a flipped label would have been read as another class)."""
    out = tmp_path / "out"
    interrupted(image_tree, out)
    saved = staging_dir(out) / SAVED_DISCOVERY
    if damage == "truncate keys":
        os.truncate(saved / "keys.bin", 10)
    elif damage == "remove block ends":
        (saved / "key_block_ends.npy").unlink()
    elif damage.startswith("flip"):
        path = saved / ("keys.bin" if damage == "flip a key byte" else "label_values.npy")
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
    else:
        (saved / "discovery.json").write_text("{")
    with caplog.at_level("INFO", logger="packer"):
        assert convert(image_tree, out, CONFIG, workers=1, resume=True).processed == 10
    assert "cannot be read" in caplog.text or damage == "bad json"
    convert(image_tree, tmp_path / "fresh", CONFIG, workers=1)
    assert (out / MANIFEST_NAME).read_bytes() == (tmp_path / "fresh" / MANIFEST_NAME).read_bytes()


def test_a_resume_from_another_working_directory_reads_the_same_files(tmp_path, monkeypatch, settled):
    """A source given relative to the first run's working directory, resumed by its absolute path from
    another: the saved items are read under the source as it is named now."""
    a, b = tmp_path / "A", tmp_path / "B"
    make_tree(a / "src", {"ant": 5, "bee": 6})
    for p in (a / "src").rglob("*.png"):  # the same names, other pictures, under B/src
        write_image(b / "src" / p.relative_to(a / "src"), (40, 30), seed=999)
    out = tmp_path / "out"
    monkeypatch.chdir(a)
    interrupted("src", out)
    monkeypatch.chdir(b)
    with_reuse = convert(a / "src", out, CONFIG, workers=1, resume=True)
    assert with_reuse.processed == 6
    convert(a / "src", tmp_path / "fresh", CONFIG, workers=1)
    assert (out / MANIFEST_NAME).read_bytes() == (tmp_path / "fresh" / MANIFEST_NAME).read_bytes()


def test_a_symlink_retargeted_outside_the_tree_means_a_new_walk(tmp_path, settled):
    """root/b -> ext/cur -> root/a: b is not walked (a is), but it is stamped, so pointing ext/cur
    elsewhere is noticed."""
    root, ext = tmp_path / "root", tmp_path / "ext"
    make_tree(root, {"a": 6})
    make_tree(ext / "new", {"x": 4})
    os.symlink(root / "a", ext / "cur")
    os.symlink(ext / "cur", root / "b")
    out = tmp_path / "out"
    interrupted(root, out)
    os.unlink(ext / "cur")
    os.symlink(ext / "new" / "x", ext / "cur")
    with pytest.raises(OutputError, match="changed since the interrupted"):  # the walk finds b's 4 new files
        convert(root, out, CONFIG, workers=1, resume=True)


def test_a_packer_output_inside_the_source_is_stamped(image_tree, tmp_path, settled):
    """An output inside the source is left out of the walk; once its manifest goes, it is a class folder."""
    old = image_tree / "old-out"
    old.mkdir()
    (old / "manifest.json").write_text(json.dumps({"manifest_version": 1, "shards": []}))
    write_image(old / "preview.png", (8, 8))
    out = tmp_path / "out"
    interrupted(image_tree, out)
    (old / "manifest.json").unlink()
    with pytest.raises(OutputError, match="changed since the interrupted"):
        convert(image_tree, out, CONFIG, workers=1, resume=True)


def test_a_save_cut_short_is_never_taken(image_tree, tmp_path, monkeypatch, settled):
    """A resume that walks again saves its discovery anew; stopped in the middle, it leaves no
    discovery.json, so the next resume walks (rather than read half of one and half of another)."""
    out = tmp_path / "out"
    interrupted(image_tree, out)
    (image_tree / "ant" / "notes.csv").write_text("x")  # a folder changed, the samples did not
    real = np.save

    def torn(path, arr, *args, **kwargs):
        if str(path).endswith("folder_stamps.npy"):
            open(path, "wb").close()
            raise KeyboardInterrupt
        return real(path, arr, *args, **kwargs)

    monkeypatch.setattr(packer.sources.saved_discovery.np, "save", torn)
    with pytest.raises(KeyboardInterrupt):
        convert(image_tree, out, CONFIG, workers=1, resume=True)
    monkeypatch.setattr(packer.sources.saved_discovery.np, "save", real)
    assert not (staging_dir(out) / SAVED_DISCOVERY / "discovery.json").exists()
    assert convert(image_tree, out, CONFIG, workers=1, resume=True).processed == 10


def test_a_discovery_that_cannot_be_saved_is_a_warning(image_tree, tmp_path, monkeypatch, caplog):
    real = packer.sources.saved_discovery._write

    def full(folder, found, options):
        real(folder, found, options)  # most of it written, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(packer.sources.saved_discovery, "_write", full)
    with caplog.at_level("WARNING", logger="packer"):
        convert(image_tree, tmp_path / "out", CONFIG, workers=1)
    assert "cannot save the discovery" in caplog.text and "No space left on device" in caplog.text
    assert not (tmp_path / "out" / SAVED_DISCOVERY).exists()


def test_a_source_under_a_folder_whose_name_is_not_utf8(tmp_path, monkeypatch, settled):
    parent = os.path.join(os.fsencode(tmp_path), b"caf\xe9")
    os.mkdir(parent)
    src = Path(os.fsdecode(os.path.join(parent, b"src")))
    make_tree(src, {"ant": 5, "bee": 6})
    out = tmp_path / "out"
    interrupted(src, out)
    monkeypatch.setattr(packer.sources.origin, "discover_checked", no_walk)
    assert convert(src, out, CONFIG, workers=1, resume=True).processed == 6


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
    config = ConvertConfig(
        "npy", PreprocessConfig(size=(32, 32)), ShardSize(samples=1), masks=MaskConfig(str(tmp_path / "seg" / "masks"))
    )
    done = []

    def stop(n):
        done.append(n)
        if sum(done) > 1:
            raise KeyboardInterrupt

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt), later_shards_unfinished():
        convert(tmp_path / "seg" / "images", out, config, workers=1, progress=stop)
    monkeypatch.setattr(packer.sources.origin, "discover_checked", no_walk)
    assert convert(tmp_path / "seg" / "images", out, config, workers=1, resume=True).processed == 2
    monkeypatch.undo()
    convert(tmp_path / "seg" / "images", tmp_path / "fresh", config, workers=1)
    assert (out / MANIFEST_NAME).read_bytes() == (tmp_path / "fresh" / MANIFEST_NAME).read_bytes()
