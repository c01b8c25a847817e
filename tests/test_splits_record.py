"""packer.spec.splits_record: ``splits.json`` written and read back, what the complete record keeps,
damage refused by name, split names, and ``check_split_member`` refusing a split of an unfinished set
or one replaced on its own."""

from __future__ import annotations

import json

import pytest

from packer.spec.class_map import class_map_digest
from packer.spec.errors import ManifestError
from packer.spec.splits_record import (
    SPLITS_NAME,
    SplitsRecord,
    check_split_member,
    is_splits_folder,
    read_splits,
    split_name_problem,
    write_splits,
)

TRAIN, VAL = "1" * 64, "2" * 64


def record(complete: bool = True, **changes) -> SplitsRecord:
    splits = {
        "train": {"samples": 8, "manifest_sha256": TRAIN, "fingerprint": "f1"},
        "val": {"samples": 2, "manifest_sha256": VAL if complete else None, "fingerprint": "f2"},
    }
    fields = dict(classes=["ant", "bee"], splits=splits, origin={"kind": "random", "fractions": {"train": 0.8}})
    return SplitsRecord(**{**fields, "complete": complete, "workers": 3, **changes})


def test_a_record_reads_back_as_written(tmp_path):
    unfinished = record(complete=False, missing={"val": ["bee"]}, unlabelled=[])
    write_splits(tmp_path, unfinished)
    assert is_splits_folder(tmp_path) and not is_splits_folder(tmp_path / "train")
    assert read_splits(tmp_path) == unfinished
    assert [p.name for p in tmp_path.iterdir()] == [SPLITS_NAME]  # no temporary file left


def test_the_complete_record_keeps_nothing_only_resume_needs(tmp_path):
    write_splits(tmp_path, record())
    data = json.loads((tmp_path / SPLITS_NAME).read_text(encoding="utf-8"))
    assert "workers" not in data and all("fingerprint" not in e for e in data["splits"].values())
    assert data["class_map_sha256"] == class_map_digest(["ant", "bee"])
    assert list(data["splits"]) == ["train", "val"] and data["splits_version"] == 1
    again = read_splits(tmp_path)
    assert again.workers is None and again.splits["val"] == {"samples": 2, "manifest_sha256": VAL}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(splits_version=2), "written by a newer packer"),
        (lambda d: d.pop("origin"), "not a valid packer splits record"),
        (lambda d: d["splits"].update({"../x": {"samples": 1}}), "split '../x' is not a valid split"),
        (lambda d: d["splits"].update({"manifest.json": {"samples": 1}}), "the name of a file packer writes"),
        (lambda d: d["splits"]["val"].update(samples="2"), "split 'val' is not a valid split"),
        (lambda d: d["splits"]["val"].update(manifest_sha256="abc"), "split 'val' has a bad manifest_sha256"),
        (lambda d: d.update(origin={"kind": "random"}), "is not one packer writes"),
        (lambda d: d.update(classes=["bee", "ant"]), "does not match its recorded digest"),
    ],
)
def test_a_damaged_record_is_refused_naming_the_file(tmp_path, change, message):
    data = record().to_dict()
    change(data)
    (tmp_path / SPLITS_NAME).write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ManifestError, match=message) as error:
        read_splits(tmp_path)
    assert str(tmp_path / SPLITS_NAME) in str(error.value)


def test_a_folder_without_a_record_or_with_no_json_is_refused(tmp_path):
    with pytest.raises(ManifestError, match="has no splits.json"):
        read_splits(tmp_path)
    (tmp_path / SPLITS_NAME).write_text("[1, 2]")
    with pytest.raises(ManifestError, match="is not a packer splits record"):
        read_splits(tmp_path)


@pytest.mark.parametrize("name", ["train", "val.2024", "A_b-c", "0"])
def test_split_names_that_are_plain_folder_names_pass(name):
    assert split_name_problem(name) is None


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "..", "-x", "trä in", "Splits.JSON", "report.txt", 3])
def test_other_split_names_are_refused(name):
    assert split_name_problem(name)


def test_a_split_of_a_complete_set_is_read_with_its_own_manifest_only(tmp_path):
    write_splits(tmp_path, record())
    check_split_member(tmp_path / "train", TRAIN)
    check_split_member(tmp_path / "val" / ".", VAL)  # "." inside a split is that split
    check_split_member(tmp_path / "train", None)  # no manifest digest to compare
    with pytest.raises(ManifestError, match="was replaced after the splits"):
        check_split_member(tmp_path / "train", VAL)


def test_a_split_of_an_unfinished_set_is_refused(tmp_path):
    write_splits(tmp_path, record(complete=False))
    with pytest.raises(ManifestError, match="is a split of an unfinished conversion"):
        check_split_member(tmp_path / "train", TRAIN)


def test_a_folder_that_is_no_split_of_the_set_passes(tmp_path):
    write_splits(tmp_path, record(complete=False))
    check_split_member(tmp_path / "other", TRAIN)  # beside the splits, not one of them
    (tmp_path / "moved").mkdir()
    check_split_member(tmp_path / "moved" / "train", TRAIN)  # a split moved out of its folder
