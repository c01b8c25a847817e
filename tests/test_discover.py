"""Discovery: class folders, litter, ignored files, labels files, deterministic order."""

import os

import pytest
from conftest import make_tree, write_image

from packer.records import UNLABELLED, Skipped
from packer.sources.discover import discover
from packer.sources.labels_file import read_labels_file
from packer.sources.walk import is_image_name, is_litter
from packer.spec.errors import InputError


def touch(path, data=b"x"):
    """A file whose content does not matter to discovery."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def rels(found):
    return [i.relpath for i in found.items]


def test_class_folders_sorted_with_indices(tmp_path):
    for name in ["zebra", "Apple", "mango"]:
        touch(tmp_path / name / "a.png")
    found = discover(tmp_path)
    assert found.classes == ["Apple", "mango", "zebra"]
    assert [(i.relpath, i.label) for i in found.items] == [
        ("Apple/a.png", 0),
        ("mango/a.png", 1),
        ("zebra/a.png", 2),
    ]
    assert [i.index for i in found.items] == [0, 1, 2]
    assert found.skipped == [] and found.ignored == {}


def test_item_paths_point_at_files(image_tree):
    found = discover(image_tree)
    assert found.root == image_tree
    assert len(found.items) == 15
    for item in found.items:
        assert os.path.isfile(item.path)
        assert os.path.samefile(item.path, image_tree / item.relpath)


def test_image_tree_fixture(image_tree):
    found = discover(image_tree)
    assert found.classes == ["ant", "bee", "cat"]
    assert [i.label for i in found.items] == [0] * 5 + [1] * 4 + [2] * 6
    assert rels(found)[:2] == ["ant/img_000.png", "ant/img_001.png"]
    assert found.ignored == {".txt": 1}
    assert found.skipped == []


def test_deeper_files_belong_to_top_level_class(tmp_path):
    touch(tmp_path / "cat" / "a.png")
    touch(tmp_path / "cat" / "sub" / "deeper" / "b.png")
    touch(tmp_path / "dog" / "x" / "c.jpg")
    found = discover(tmp_path)
    assert found.classes == ["cat", "dog"]
    assert [(i.relpath, i.label) for i in found.items] == [
        ("cat/a.png", 0),
        ("cat/sub/deeper/b.png", 0),
        ("dog/x/c.jpg", 1),
    ]


def test_flat_folder_is_unlabelled(tmp_path):
    for name in ["b.png", "a.jpg", "c.webp"]:
        touch(tmp_path / name)
    found = discover(tmp_path)
    assert found.classes is None
    assert rels(found) == ["a.jpg", "b.png", "c.webp"]
    assert all(i.label == UNLABELLED == -1 for i in found.items)
    assert found.skipped == []


def test_litter_ignored(tmp_path):
    touch(tmp_path / "cat" / "a.png")
    touch(tmp_path / "cat" / ".DS_Store")
    touch(tmp_path / "cat" / "._a.png")
    touch(tmp_path / "cat" / ".hidden.png")
    touch(tmp_path / "cat" / "Thumbs.db")
    touch(tmp_path / "cat" / "thumbs.db")
    touch(tmp_path / "cat" / "desktop.ini")
    touch(tmp_path / "cat" / "Desktop.INI")
    touch(tmp_path / "cat" / "ehthumbs.db")
    touch(tmp_path / ".hidden" / "b.png")  # hidden top-level folder: not a class
    touch(tmp_path / "cat" / ".thumbnails" / "c.png")  # hidden subfolder
    touch(tmp_path / "._dog.png")
    touch(tmp_path / ".DS_Store")
    found = discover(tmp_path)
    assert found.classes == ["cat"]
    assert rels(found) == ["cat/a.png"]
    assert found.skipped == []
    assert found.ignored == {}


def test_is_litter_and_is_image_name():
    assert is_litter(".DS_Store") and is_litter("._x.jpg") and is_litter("THUMBS.DB")
    assert not is_litter("a.jpg") and not is_litter("thumbs.db.jpg")
    for name in ["a.jpg", "a.JPEG", "b.Png", "c.bmp", "d.gif", "e.WebP", "f.tif", "g.TIFF"]:
        assert is_image_name(name), name
    for name in ["a.txt", "a", "jpg", "a.jpg.bak", "a.svg"]:
        assert not is_image_name(name), name


def test_upper_case_extensions_recognised(tmp_path):
    touch(tmp_path / "A.JPG")
    touch(tmp_path / "b.Png")
    touch(tmp_path / "c.JPEG")
    found = discover(tmp_path)
    assert rels(found) == ["A.JPG", "b.Png", "c.JPEG"]
    assert found.ignored == {}


def test_non_images_counted_by_extension(tmp_path):
    touch(tmp_path / "cat" / "a.png")
    touch(tmp_path / "cat" / "notes.txt")
    touch(tmp_path / "cat" / "more.TXT")
    touch(tmp_path / "cat" / "data.csv")
    touch(tmp_path / "cat" / "README")
    touch(tmp_path / "cat" / "x" / "y.json")
    found = discover(tmp_path)
    assert rels(found) == ["cat/a.png"]
    assert found.ignored == {".txt": 2, ".csv": 1, "(no extension)": 1, ".json": 1}
    assert list(found.ignored) == sorted(found.ignored)


def test_empty_class_folder_kept(tmp_path):
    touch(tmp_path / "a" / "1.png")
    (tmp_path / "b").mkdir()
    touch(tmp_path / "c" / "1.png")
    found = discover(tmp_path)
    assert found.classes == ["a", "b", "c"]
    assert [i.label for i in found.items] == [0, 2]


def test_root_files_beside_class_folders_skipped(tmp_path):
    touch(tmp_path / "cat" / "a.png")
    touch(tmp_path / "stray.jpg")
    touch(tmp_path / "readme.md")
    found = discover(tmp_path)
    assert rels(found) == ["cat/a.png"]
    assert found.items[0].index == 0
    assert [s.path for s in found.skipped] == ["stray.jpg"]
    assert "class folder" in found.skipped[0].reason
    assert found.ignored == {".md": 1}


def test_order_is_sorted_and_deterministic(tmp_path):
    names = ["b/10.png", "b/2.png", "a/z.png", "a/B.png", "a/a.png", "b/sub/0.png", "c/é.png"]
    for n in reversed(names):
        touch(tmp_path / n)
    first = discover(tmp_path)
    assert rels(first) == sorted(names)
    assert [i.index for i in first.items] == list(range(len(names)))
    again = discover(tmp_path)
    assert again.items == first.items
    assert again.classes == first.classes


def test_order_is_the_paths_sorted_when_names_prefix_each_other(tmp_path):
    """The walk emits files in sorted order with no sort of them all: a folder sorts as its name and a
    slash, so ``b.png`` comes before ``b/x.png`` and ``b/x.png`` before ``b0.png``, as sorting the
    paths does."""
    names = [
        "a/b.png",
        "a/b/x.png",
        "a/b0.png",
        "a/b-c.png",
        "a/b-/y.png",
        "a/ba/z.png",
        "a/é/q.png",
        "a/z.png",
        "b/1.png",
    ]
    for n in reversed(names):
        touch(tmp_path / n)
    assert rels(discover(tmp_path)) == sorted(names)


def test_folder_reachable_by_a_symlink_is_found_under_its_real_path(tmp_path):
    """Symlinked folders are walked after every real one: a symlink that sorts before the folder it
    points at does not take its files, and is not walked twice."""
    touch(tmp_path / "b" / "real" / "x.png")
    touch(tmp_path / "b" / "y.png")
    touch(tmp_path / "a" / "z.png")
    (tmp_path / "a" / "link").symlink_to(tmp_path / "b" / "real", target_is_directory=True)
    outside = tmp_path.parent / (tmp_path.name + "-outside")
    touch(outside / "o.png")
    (tmp_path / "a" / "away").symlink_to(outside, target_is_directory=True)
    found = discover(tmp_path)
    assert rels(found) == ["a/away/o.png", "a/z.png", "b/real/x.png", "b/y.png"]
    assert [(i.index, i.label) for i in found.items] == [(0, 0), (1, 0), (2, 1), (3, 1)]


def test_single_field_items_share_the_walks_buffers(tmp_path):
    """A folder of images is held as an ItemTable: no SourceItem object per file until one is asked for."""
    from packer.sources.item_table import ItemTable

    for n in ["c/1.png", "c/2.png", "d/3.png"]:
        touch(tmp_path / n)
    found = discover(tmp_path)
    assert isinstance(found.items, ItemTable) and found.items.rows is None
    assert found.items.labels.tolist() == [0, 0, 1]
    assert found.items[2].path == os.path.join(str(tmp_path), "d", "3.png")


def test_items_cover_make_tree(tmp_path):
    paths = make_tree(tmp_path, {"x": 2, "y": 3})
    found = discover(tmp_path)
    assert sorted(str(p) for p in paths) == [i.path for i in found.items]


def test_missing_source_raises(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        discover(tmp_path / "nope")


def test_source_is_a_file_raises(tmp_path):
    f = touch(tmp_path / "a.png")
    with pytest.raises(InputError):
        discover(f)


def test_symlinked_class_folder_files_found(tmp_path):
    """A class folder that is a symlink counts as a class, so its files must be found too."""
    real = tmp_path / "elsewhere" / "dogs"
    touch(real / "d.png")
    src = tmp_path / "src"
    touch(src / "cat" / "c.png")
    os.symlink(real, src / "dog")
    found = discover(src)
    assert found.classes == ["cat", "dog"]
    assert [(i.relpath, i.label) for i in found.items] == [("cat/c.png", 0), ("dog/d.png", 1)]


# --------------------------------------------------------------------------- labels files


def labelled_tree(tmp_path):
    src = tmp_path / "src"
    for rel in ["a.png", "b.png", "sub/c.png", "d.png"]:
        touch(src / rel)
    return src


def test_labels_csv_with_header_and_class_names(tmp_path):
    src = labelled_tree(tmp_path)
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label\na.png,dog\nb.png,cat\nsub/c.png,dog\nd.png,cat\n")
    found = discover(src, csv)
    assert found.classes == ["cat", "dog"]
    assert [(i.relpath, i.label) for i in found.items] == [
        ("a.png", 1),
        ("b.png", 0),
        ("d.png", 0),
        ("sub/c.png", 1),
    ]
    assert found.skipped == []


def test_labels_csv_without_header(tmp_path):
    src = labelled_tree(tmp_path)
    csv = tmp_path / "labels.csv"
    csv.write_text("a.png,dog\nb.png,cat\nsub/c.png,dog\nd.png,cat\n")
    found = discover(src, csv)
    assert found.classes == ["cat", "dog"]
    assert len(found.items) == 4


def test_labels_csv_integer_labels(tmp_path):
    src = labelled_tree(tmp_path)
    csv = tmp_path / "labels.csv"
    csv.write_text("a.png,3\nb.png,0\nsub/c.png,3\nd.png,1\n")
    found = discover(src, csv)
    assert found.classes == ["0", "1", "2", "3"]
    assert {i.relpath: i.label for i in found.items} == {"a.png": 3, "b.png": 0, "sub/c.png": 3, "d.png": 1}


def test_labels_csv_overrides_class_folders(tmp_path):
    src = tmp_path / "src"
    touch(src / "cat" / "1.png")
    touch(src / "dog" / "2.png")
    csv = tmp_path / "labels.csv"
    csv.write_text("cat/1.png,b\ndog/2.png,a\n")
    found = discover(src, csv)
    assert found.classes == ["a", "b"]
    assert [(i.relpath, i.label) for i in found.items] == [("cat/1.png", 1), ("dog/2.png", 0)]


def test_labels_csv_unlisted_and_missing_files_skipped(tmp_path):
    src = labelled_tree(tmp_path)
    csv = tmp_path / "labels.csv"
    csv.write_text("a.png,x\nsub/c.png,y\nd.png,x\ngone.png,y\n")
    found = discover(src, csv)
    assert rels(found) == ["a.png", "d.png", "sub/c.png"]
    assert [i.index for i in found.items] == [0, 1, 2]
    by_path = {s.path: s.reason for s in found.skipped}
    assert set(by_path) == {"b.png", "gone.png"}
    assert "no label" in by_path["b.png"] and "labels.csv" in by_path["b.png"]
    assert "not found" in by_path["gone.png"]


def test_labels_csv_comments_blank_lines_and_backslashes(tmp_path):
    src = labelled_tree(tmp_path)
    csv = tmp_path / "labels.csv"
    csv.write_text("# a comment\n\na.png, x \nsub\\c.png,y\n./b.png,x\nd.png,y\n")
    found = discover(src, csv)
    assert {i.relpath: i.label for i in found.items} == {"a.png": 0, "b.png": 0, "sub/c.png": 1, "d.png": 1}
    assert found.skipped == []


def test_labels_csv_conflicting_duplicates_raise(tmp_path):
    src = labelled_tree(tmp_path)
    csv = tmp_path / "labels.csv"
    csv.write_text("a.png,x\nb.png,y\na.png,y\n")
    with pytest.raises(InputError, match="a.png"):
        discover(src, csv)


def test_labels_csv_identical_duplicates_allowed(tmp_path):
    csv = tmp_path / "labels.csv"
    csv.write_text("a.png,x\na.png,x\n")
    assert read_labels_file(csv) == {"a.png": "x"}


def test_labels_csv_short_row_raises(tmp_path):
    csv = tmp_path / "labels.csv"
    csv.write_text("a.png,x\nb.png\n")
    with pytest.raises(InputError, match=":2"):
        read_labels_file(csv)


def test_missing_labels_file_raises(tmp_path):
    src = labelled_tree(tmp_path)
    with pytest.raises(InputError, match="labels file"):
        discover(src, tmp_path / "nope.csv")


def test_skipped_record_to_dict():
    assert Skipped("a.png", "why").to_dict() == {"path": "a.png", "reason": "why"}


def test_write_image_files_discovered(tmp_path):
    write_image(tmp_path / "one" / "x.JPG", format="JPEG")
    found = discover(tmp_path)
    assert rels(found) == ["one/x.JPG"] and found.classes == ["one"]


def test_labels_csv_other_header_names(tmp_path):
    src = labelled_tree(tmp_path)
    csv = tmp_path / "labels.csv"
    csv.write_text("file_name,label\na.png,dog\nb.png,cat\nsub/c.png,dog\nd.png,cat\n")
    found = discover(src, csv)
    assert found.classes == ["cat", "dog"]
    assert found.skipped == []


def test_symlink_loop_does_not_hang(tmp_path):
    """A folder linking to its own parent is walked once, not forever."""
    root = tmp_path / "src"
    write_image(root / "a" / "x.png", (8, 8))
    (root / "a" / "loop").symlink_to(root, target_is_directory=True)
    found = discover(root)
    assert [i.relpath for i in found.items] == ["a/x.png"]


# Text and paired samples ---------------------------------------------------------------------------
def test_text_folders_are_text_samples(tmp_path):
    touch(tmp_path / "pos" / "1.txt")
    touch(tmp_path / "neg" / "2.TXT")
    touch(tmp_path / "neg" / "notes.csv")
    found = discover(tmp_path)
    assert found.fields == ("text",) and rels(found) == ["neg/2.TXT", "pos/1.txt"]
    assert [i.parts[0][0] for i in found.items] == ["text", "text"] and found.ignored == {".csv": 1}


def test_a_stray_text_file_among_images_does_not_pair(tmp_path):
    touch(tmp_path / "cat" / "a.png")
    touch(tmp_path / "cat" / "README.txt")
    found = discover(tmp_path)
    assert found.fields == ("image",) and rels(found) == ["cat/a.png"] and found.items[0].parts == ()
    assert found.ignored == {".txt": 1}


def test_files_sharing_a_stem_are_one_sample(tmp_path):
    for name in ("0001.jpg", "0001.txt", "0001.json", "0002.jpg", "0002.txt", "0003.jpg", "0003.png", "0003.txt"):
        touch(tmp_path / "a" / name)
    touch(tmp_path / "a" / "0004.txt")
    assert discover(tmp_path).fields == ("image", "text")  # json: 1 of 3 image stems, below PAIRED_SHARE
    found = discover(tmp_path, fields=("json", "text", "image"))  # stored in FIELD_KINDS order whatever the order
    assert found.fields == ("image", "text", "json")
    assert rels(found) == ["a/0001"]  # 0002 lacks json, 0003 has two images, 0004 has only text
    reasons = {s.path: s.reason for s in found.skipped}
    assert reasons["a/0002"].startswith("missing json") and "--allow-missing" in reasons["a/0002"]
    assert "several files for one field" in reasons["a/0003"]
    assert reasons["a/0004"].startswith("missing image and json")
    found = discover(tmp_path, fields=("image", "text", "json"), allow_missing=True)
    assert rels(found) == ["a/0001", "a/0002"]
    assert [f for f, _ in found.items[1].parts] == ["image", "text"]
    assert found.items[0].path.endswith("0001.jpg") and found.items[0].label == 0


def test_fields_can_be_chosen(tmp_path):
    for name in ("0001.jpg", "0001.txt", "0001.json"):
        touch(tmp_path / "a" / name)
    found = discover(tmp_path, fields=("image", "text"))
    assert found.fields == ("image", "text") and rels(found) == ["a/0001"] and found.ignored == {".json": 1}
    assert discover(tmp_path, fields=("text",)).items[0].relpath == "a/0001.txt"


def test_labels_file_names_paired_samples_by_stem_or_file(tmp_path):
    for stem in ("x", "y"):
        touch(tmp_path / f"{stem}.png")
        touch(tmp_path / f"{stem}.txt")
    labels = tmp_path / "labels.csv"
    labels.write_text("path,label\nx,cat\ny.png,dog\n")
    found = discover(tmp_path, labels_file=labels)
    assert [(i.relpath, i.label) for i in found.items] == [("x", 0), ("y", 1)] and found.classes == ["cat", "dog"]


def test_one_annotation_file_among_images_does_not_pair(tmp_path):
    for i in range(6):
        touch(tmp_path / "cat" / f"{i}.png")
    touch(tmp_path / "cat" / "0.json")
    found = discover(tmp_path)
    assert found.fields == ("image",) and len(found.items) == 6 and found.ignored == {".json": 1}
    for i in range(1, 3):
        touch(tmp_path / "cat" / f"{i}.json")
    assert discover(tmp_path).fields == ("image", "json")  # half of the images have one: paired


def test_labels_header_is_any_first_row_without_a_sample(tmp_path):
    for name in ("cat/1.jpg", "dog/2.jpg"):
        touch(tmp_path / "src" / name)
    labels = tmp_path / "labels.csv"
    labels.write_text("img_name,class_id\ncat/1.jpg,5\ndog/2.jpg,0\n")
    found = discover(tmp_path / "src", labels_file=labels)
    assert [(i.relpath, i.label) for i in found.items] == [("cat/1.jpg", 5), ("dog/2.jpg", 0)]
    assert found.classes == [str(i) for i in range(6)] and found.skipped == []


def _hostile_tree(root):
    """Class folders with nested ones, a file at the root, ignored files, symlinked folders inside and
    outside the tree, a name that is not UTF-8 and an unreadable folder."""
    for n in [
        "a/1.png",
        "a/sub/2.png",
        "a/sub/x.csv",
        "b/3.png",
        "b-c/4.png",
        "c/é.png",
        "c/d/e/5.png",
        "top.png",
        "d/6.png",
        "d/7.txt",
    ]:
        touch(root / n)
    outside = root.parent / (root.name + "-outside")
    touch(outside / "o.png")
    (root / "b" / "away").symlink_to(outside, target_is_directory=True)
    (root / "b" / "again").symlink_to(root / "c" / "d", target_is_directory=True)
    (root / "d" / "loop").symlink_to(root, target_is_directory=True)
    touch(root / "c" / os.fsdecode(b"bad\xff.png"))
    locked = root / "e"
    locked.mkdir()
    touch(locked / "hidden.png")
    locked.chmod(0)
    return locked


@pytest.mark.parametrize("fields", [None, ("image", "text")])
def test_the_parallel_walk_finds_what_the_serial_walk_finds(tmp_path, monkeypatch, fields):
    """With several processes the root's subfolders are walked in a pool: the same items, labels,
    skipped and ignored files, in the same order, as one process finds."""
    import packer.sources.discover
    import packer.sources.walk

    root = tmp_path / "src"
    locked = _hostile_tree(root)
    try:
        serial = discover(root, fields=fields)
        monkeypatch.setattr(packer.sources.walk, "PARALLEL_AFTER", 0.0)
        parallel = discover(root, fields=fields, processes=2)
    finally:
        locked.chmod(0o755)
    assert list(parallel.items) == list(serial.items)
    assert (parallel.classes, parallel.skipped, parallel.ignored) == (serial.classes, serial.skipped, serial.ignored)
    assert len(parallel.folders) == len(serial.folders)
    if fields is None:
        assert "b/away/o.png" in rels(serial) and "b/again/5.png" not in rels(serial)  # under c/d, its real path
        assert "c/d/e/5.png" in rels(serial)


def test_a_folder_two_processes_both_list_means_one_walk_again(tmp_path, monkeypatch):
    """A folder reachable by two real paths (a bind mount) seen by two processes: the walk is done
    again in one process, which lists it once."""
    import packer.sources.discover
    import packer.sources.walk

    root = tmp_path / "src"
    for n in ["a/1.png", "b/2.png", "c/3.png"]:
        touch(root / n)
    serial = discover(root)
    real = packer.sources.walk._merged
    calls = []

    def overlapping(result, walk):
        calls.append(1)
        if len(calls) == 1:
            raise packer.sources.walk._Overlap()
        return real(result, walk)

    monkeypatch.setattr(packer.sources.walk, "PARALLEL_AFTER", 0.0)
    monkeypatch.setattr(packer.sources.walk, "_merged", overlapping)
    again = discover(root, processes=2)
    assert list(again.items) == list(serial.items) and calls == [1]


def test_a_deep_chain_of_symlinked_folders_is_walked_as_deep_as_the_system_resolves(tmp_path):
    """Each symlinked folder holds a symlink to the next, 1,200 deep (deeper than Python's recursion
    limit): walked until the system refuses to resolve the path (40 symlinks on Linux), where the
    last link counts as an ignored file (it is not a folder one can list), never a crash."""
    root, chain = tmp_path / "src", tmp_path / "chain"
    touch(root / "a" / "0.png")
    depth = 1200
    for i in range(depth):
        touch(chain / str(i) / "x.png")
    (root / "a" / "next").symlink_to(chain / "0", target_is_directory=True)
    for i in range(depth - 1):
        (chain / str(i) / "next").symlink_to(chain / str(i + 1), target_is_directory=True)
    found = discover(root)
    deepest = max(len(rel.split("/")) for rel in rels(found)) - 2
    assert len(rels(found)) == deepest + 1 and 30 <= deepest < depth
    assert found.ignored == {"(no extension)": 1} and found.skipped == []


def test_class_runs_across_compressed_blocks(tmp_path):
    """Labels are runs of the sorted listing: folders that end inside a block, span several blocks,
    and files outside any class folder, each labelled as its top folder says."""
    from packer.sources.item_table import LabelRuns
    from packer.sources.record_blocks import BLOCK

    sizes = {"a": 3, "b": 2 * BLOCK + 5, "b0": 1, "c": BLOCK - 1}
    for name, n in sizes.items():
        for i in range(n):
            touch(tmp_path / name / f"{i:04d}.png")
    touch(tmp_path / "loose.png")
    found = discover(tmp_path)
    assert isinstance(found.items.labels, LabelRuns) and found.classes == ["a", "b", "b0", "c"]
    assert [(it.relpath.split("/")[0], it.label) for it in found.items] == [
        (name, k) for k, (name, n) in enumerate(sizes.items()) for _ in range(n)
    ]
    assert [s.path for s in found.skipped] == ["loose.png"]
