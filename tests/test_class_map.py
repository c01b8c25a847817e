"""The class map: --classes from a file or an output, refused and appended classes, the recorded digest."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import make_tree

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.ops.splits import read_class_map
from packer.spec.class_map import class_map_digest
from packer.spec.errors import InputError, ManifestError
from packer.spec.manifest import read_manifest
from readers import open_dataset

PRE = PreprocessConfig(size=(12, 12))


def test_the_digest_depends_on_names_and_order():
    assert class_map_digest(["a", "b"]) != class_map_digest(["b", "a"])
    assert class_map_digest(["a", "b"]) == class_map_digest(("a", "b"))
    assert class_map_digest(["ab"]) != class_map_digest(["a", "b"])
    assert class_map_digest(None) is None


def test_a_later_conversion_takes_the_map_of_an_earlier_output(tmp_path):
    make_tree(tmp_path / "train", {"ant": 2, "bee": 2, "cat": 2})
    make_tree(tmp_path / "test", {"cat": 2})
    convert(tmp_path / "train", tmp_path / "train-out", ConvertConfig("npy", PRE), workers=1)
    classes = read_class_map(tmp_path / "train-out")
    convert(tmp_path / "test", tmp_path / "test-out", ConvertConfig("lmdb", PRE), workers=1, classes=classes)
    test = open_dataset(tmp_path / "test-out")
    assert test.classes == ["ant", "bee", "cat"] and {s[1] for s in test} == {2}
    assert test.class_map_sha256 == open_dataset(tmp_path / "train-out").class_map_sha256
    assert read_manifest(tmp_path / "test-out").class_counts == [0, 0, 2]


def test_a_class_map_file_decides_the_indices(tmp_path):
    make_tree(tmp_path / "src", {"ant": 1, "bee": 1})
    (tmp_path / "classes.txt").write_text("\ufeffbee\n\nant\nwasp\n")
    assert read_class_map(tmp_path / "classes.txt") == ["bee", "ant", "wasp"]
    convert(
        tmp_path / "src",
        tmp_path / "out",
        ConvertConfig("npy", PRE),
        workers=1,
        classes=read_class_map(tmp_path / "classes.txt"),
    )
    ds = open_dataset(tmp_path / "out", return_meta=True)
    assert {s[-1]["key"].split("/")[0]: s[1] for s in ds} == {"bee": 0, "ant": 1}


def test_a_class_the_map_lacks_is_refused_by_name_or_appended(tmp_path):
    make_tree(tmp_path / "src", {"ant": 1, "bee": 1, "zebra": 1})
    (tmp_path / "classes.txt").write_text("bee\nant\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            "convert",
            str(tmp_path / "src"),
            "-f",
            "npy",
            "-o",
            str(out),
            "--size",
            "12",
            "-q",
            "--classes",
            str(tmp_path / "classes.txt"),
        ],
    )
    assert result.exit_code == 1 and "'zebra'" in result.output and "--add-classes" in result.output
    assert not out.exists()
    result = CliRunner().invoke(
        cli,
        [
            "convert",
            str(tmp_path / "src"),
            "-f",
            "npy",
            "-o",
            str(out),
            "--size",
            "12",
            "-q",
            "--classes",
            str(tmp_path / "classes.txt"),
            "--add-classes",
        ],
    )
    assert result.exit_code == 0, result.output
    assert open_dataset(out).classes == ["bee", "ant", "zebra"]


def test_labels_files_use_the_given_map(tmp_path):
    make_tree(tmp_path / "src", {"x": 2})
    (tmp_path / "labels.csv").write_text("path,label\nx/img_000.png,cat\nx/img_001.png,dog\n")
    convert(
        tmp_path / "src",
        tmp_path / "out",
        ConvertConfig("npy", PRE),
        workers=1,
        labels_file=tmp_path / "labels.csv",
        classes=["dog", "cat"],
    )
    ds = open_dataset(tmp_path / "out", return_meta=True)
    assert {s[-1]["key"]: s[1] for s in ds} == {"x/img_000.png": 1, "x/img_001.png": 0}


@pytest.mark.parametrize("content, message", [("a\nb\na\n", "listed twice .*line 1"), ("\n\n", "names no class")])
def test_bad_class_map_files_are_refused(tmp_path, content, message):
    (tmp_path / "classes.txt").write_text(content)
    with pytest.raises(InputError, match=message):
        read_class_map(tmp_path / "classes.txt")


def test_a_map_for_an_unlabelled_source_or_from_an_unlabelled_output_is_refused(tmp_path):
    make_tree(tmp_path / "flat" / "..", {"flat": 2})  # images straight in flat/: unlabelled
    with pytest.raises(InputError, match="no class folders"):
        convert(tmp_path / "flat", tmp_path / "out", ConvertConfig("npy", PRE), workers=1, classes=["a"])
    convert(tmp_path / "flat", tmp_path / "out", ConvertConfig("npy", PRE), workers=1)
    with pytest.raises(InputError, match="unlabelled packer output"):
        read_class_map(tmp_path / "out")
    with pytest.raises(InputError, match="not a packer output"):
        read_class_map(tmp_path)


def test_an_edited_class_map_is_refused(tmp_path):
    make_tree(tmp_path / "src", {"ant": 1, "bee": 1})
    convert(tmp_path / "src", tmp_path / "out", ConvertConfig("npy", PRE), workers=1)
    path = tmp_path / "out" / "manifest.json"
    data = json.loads(path.read_text())
    assert data["class_map_sha256"] == class_map_digest(["ant", "bee"])
    data["classes"] = ["bee", "ant"]
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="does not match its recorded digest"):
        read_manifest(tmp_path / "out")


def test_nodes_of_a_split_conversion_use_the_given_map(tmp_path):
    make_tree(tmp_path / "src", {"cat": 1, "dog": 1, "emu": 1})
    (tmp_path / "map.txt").write_text("emu\ndog\ncat\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            "convert",
            str(tmp_path / "src"),
            "-f",
            "npy",
            "-o",
            str(out),
            "--size",
            "12",
            "-q",
            "--classes",
            str(tmp_path / "map.txt"),
            "--num-nodes",
            "1",
            "--node-rank",
            "0",
        ],
    )
    assert result.exit_code == 0, result.output
    assert CliRunner().invoke(cli, ["merge", str(out)]).exit_code == 0
    ds = open_dataset(out, return_meta=True)
    assert ds.classes == ["emu", "dog", "cat"]
    assert {s[-1]["key"].split("/")[0]: s[1] for s in ds} == {"emu": 0, "dog": 1, "cat": 2}


def test_class_indices_in_a_labels_file_are_refused_with_a_map(tmp_path):
    make_tree(tmp_path / "src", {"x": 2})
    (tmp_path / "labels.csv").write_text("x/img_000.png,0\nx/img_001.png,1\n")
    with pytest.raises(InputError, match="class indices, but with --classes"):
        convert(
            tmp_path / "src",
            tmp_path / "out",
            ConvertConfig("npy", PRE),
            workers=1,
            labels_file=tmp_path / "labels.csv",
            classes=["cat", "dog"],
            add_classes=True,
        )
