"""Splits converted as one: split folders and --split, one class map, splits.json, resume, readers' checks."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import FORMATS, make_tree, write_image

import packer.ops.splits as dataset_splits
from packer import ConvertConfig, PreprocessConfig
from packer.cli import cli
from packer.config import ShardSize
from packer.ops.split_plans import parse_split_spec, split_counts, split_folders
from packer.ops.splits import convert_splits
from packer.sources.discover import discover
from packer.spec.errors import ConfigError, DecodeError, InputError, ManifestError, OutputError
from packer.spec.splits_record import SPLITS_NAME, read_splits
from readers import concat, open_dataset

PRE = PreprocessConfig(size=(12, 12))


@pytest.fixture
def split_tree(tmp_path) -> Path:
    """train has classes a, b, c; val has a and c only (its c must still be label 2)."""
    root = tmp_path / "ds"
    make_tree(root / "train", {"a": 3, "b": 2, "c": 3}, size=(20, 16))
    make_tree(root / "val", {"a": 2, "c": 2}, size=(20, 16))
    return root


def interrupt_at_val(monkeypatch) -> None:
    """Make the conversion of split ``val`` stop as Ctrl-C would, the splits before it finished."""
    real = dataset_splits.convert

    def stop_at_val(source, target, *args, **kwargs):
        if Path(target).name == "val":
            raise KeyboardInterrupt
        return real(source, target, *args, **kwargs)

    monkeypatch.setattr(dataset_splits, "convert", stop_at_val)


def labels_by_name(out: Path) -> list[tuple[str, str]]:
    """(class folder of the sample's key, class name of its label) for every sample."""
    ds = open_dataset(out, return_meta=True)
    pairs = []
    for sample in ds:
        meta = sample[-1]
        pairs.append((meta["key"].split("/")[0], ds.classes[meta["label"]]))
    return pairs


@pytest.mark.parametrize("fmt", FORMATS)
def test_split_folders_share_one_class_map(split_tree, tmp_path, fmt):
    out = tmp_path / "out"
    result = convert_splits(split_tree, out, ConvertConfig(fmt, PRE, ShardSize(samples=3)), workers=1)
    assert list(result.results) == ["train", "val"]
    train, val = open_dataset(out / "train"), open_dataset(out / "val")
    assert train.classes == val.classes == ["a", "b", "c"]
    assert train.class_map_sha256 == val.class_map_sha256 == result.record.class_map_sha256
    assert val.class_counts == [2, 0, 2]  # c keeps index 2 although val has no b
    for split in ("train", "val"):
        pairs = labels_by_name(out / split)
        assert pairs and all(folder == name for folder, name in pairs)
    record = read_splits(out)
    assert record.complete and record.missing == {"val": ["b"]}
    assert {n: e["samples"] for n, e in record.splits.items()} == {"train": 8, "val": 4}
    assert len(concat([train, val])) == 12


def test_the_cli_names_the_missing_class_and_the_splits(split_tree, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["convert", str(split_tree), "-f", "npy", "-o", str(out), "--size", "12", "-q"])
    assert result.exit_code == 0, result.output
    assert "split folders found: train 8, val 4" in result.output
    assert "split val has no sample of 1 class(es): 'b'" in result.output
    info = CliRunner().invoke(cli, ["info", str(out)])
    assert info.exit_code == 0 and "one map for every split: a, b, c" in info.output
    verify = CliRunner().invoke(cli, ["verify", "-q", str(out)])
    assert verify.exit_code == 0 and "2 splits (train, val), 12 samples verified" in verify.output


def test_no_splits_keeps_split_named_folders_as_classes(split_tree, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli, ["convert", str(split_tree), "-f", "npy", "-o", str(out), "--size", "12", "-q", "--no-splits"]
    )
    assert result.exit_code == 0, result.output
    assert open_dataset(out).classes == ["train", "val"]


def test_split_names_beside_other_folders_are_refused_not_guessed(tmp_path):
    make_tree(tmp_path / "src", {"train": 1, "zebra": 1})
    with pytest.raises(InputError, match="named like splits .*'train'.* beside other folders .*'zebra'.*--no-splits"):
        split_folders(tmp_path / "src")
    result = CliRunner().invoke(cli, ["convert", str(tmp_path / "src"), "-f", "npy", "-o", str(tmp_path / "o"), "-q"])
    assert result.exit_code == 1 and "--no-splits" in result.output and not (tmp_path / "o").exists()
    result = CliRunner().invoke(
        cli, ["convert", str(tmp_path / "src"), "-f", "npy", "-o", str(tmp_path / "o"), "-q", "--no-splits"]
    )
    assert result.exit_code == 0 and open_dataset(tmp_path / "o").classes == ["train", "zebra"]
    make_tree(tmp_path / "two", {"Train": 1, "test": 1, "VAL": 1})
    assert split_folders(tmp_path / "two") == ["Train", "VAL", "test"]
    make_tree(tmp_path / "cased", {"train": 1, "Train": 1})
    with pytest.raises(InputError, match="differ only in case"):
        split_folders(tmp_path / "cased")


def test_a_random_split_is_stratified_seeded_and_exact_per_class(tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"a": 10, "b": 7, "c": 1}, size=(12, 10))
    config = ConvertConfig("npy", PRE)
    spec = parse_split_spec("train=0.7,val=0.2,test=0.1")
    first = convert_splits(src, tmp_path / "one", config, fractions=spec, seed=5, workers=1)
    convert_splits(src, tmp_path / "two", config, fractions=spec, seed=5, workers=1)
    convert_splits(src, tmp_path / "three", config, fractions=spec, seed=6, workers=1)
    assert first.record.origin == {"kind": "random", "fractions": {"train": 0.7, "val": 0.2, "test": 0.1}, "seed": 5}

    def members(out: Path) -> dict[str, list[str]]:
        return {
            name: sorted(s[-1]["key"] for s in open_dataset(out / name, return_meta=True))
            for name in ("train", "val", "test")
        }

    one = members(tmp_path / "one")
    assert one == members(tmp_path / "two") and one != members(tmp_path / "three")
    keys = [k for ks in one.values() for k in ks]
    assert len(keys) == len(set(keys)) == 18  # disjoint, and every sample in one split
    for name, fraction in spec:
        per_class = Counter(k.split("/")[0] for k in one[name])
        for cls, n in {"a": 10, "b": 7, "c": 1}.items():
            assert abs(per_class[cls] - n * fraction) < 1
    assert {tuple(open_dataset(tmp_path / "one" / n).classes) for n in one} == {("a", "b", "c")}


def test_split_counts_are_within_one_sample_and_add_up():
    for n in range(0, 40):
        for fractions in ([0.9, 0.1], [0.7, 0.2, 0.1], [1 / 3, 1 / 3, 1 / 3], [0.5, 0.5]):
            counts = split_counts(n, fractions)
            assert sum(counts) == n
            assert all(abs(c - n * f) < 1 for c, f in zip(counts, fractions))


@pytest.mark.parametrize(
    "text, message",
    [
        ("train=0.9", "at least two"),
        ("train=0.9,val=0.2", "add up to 1.1"),
        ("train=0.5,train=0.5", "named twice"),
        ("train=half,val=0.5", "NAME=FRACTION"),
        ("../x=0.5,val=0.5", "NAME=FRACTION"),
        ("a=0,b=1", "NAME=FRACTION"),
    ],
)
def test_bad_split_specs_are_refused(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_split_spec(text)


def test_a_split_with_no_sample_is_refused(tmp_path):
    make_tree(tmp_path / "src", {"a": 2})
    with pytest.raises(InputError, match="split val of .* would hold no samples"):
        convert_splits(
            tmp_path / "src",
            tmp_path / "out",
            ConvertConfig("npy", PRE),
            fractions=[("train", 0.9), ("val", 0.1)],
            workers=1,
        )
    assert not (tmp_path / "out").exists()


def test_readers_refuse_to_combine_outputs_with_other_class_maps(split_tree, tmp_path):
    convert_splits(split_tree, tmp_path / "good", ConvertConfig("npy", PRE), workers=1)
    CliRunner().invoke(
        cli, ["convert", str(split_tree / "val"), "-f", "npy", "-o", str(tmp_path / "alone"), "--size", "12", "-q"]
    )
    train, alone = open_dataset(tmp_path / "good" / "train"), open_dataset(tmp_path / "alone")
    assert alone.classes == ["a", "c"]  # the bug of separate conversions: c is 1 here, 2 in train
    with pytest.raises(ValueError, match="different class maps .*only the first has 'b'"):
        train + alone
    with pytest.raises(ValueError, match="different class maps"):
        concat([train, open_dataset(tmp_path / "good" / "val"), alone])
    assert len(train + open_dataset(tmp_path / "good" / "val")) == 12
    info = CliRunner().invoke(cli, ["info", str(tmp_path / "good" / "train"), str(tmp_path / "alone")])
    assert "class maps DIFFER" in info.output and "only the first has 'b'" in info.output


def test_opening_the_splits_folder_names_its_splits(split_tree, tmp_path):
    convert_splits(split_tree, tmp_path / "out", ConvertConfig("npy", PRE), workers=1)
    with pytest.raises(ManifestError, match="holds the splits train, val .* open one of them"):
        open_dataset(tmp_path / "out")


def test_an_interrupted_set_is_refused_by_readers_and_resumed(split_tree, tmp_path, monkeypatch):
    out = tmp_path / "out"
    config = ConvertConfig("npy", PRE)
    interrupt_at_val(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        convert_splits(split_tree, out, config, workers=1)
    monkeypatch.undo()
    assert not read_splits(out).complete
    with pytest.raises(ManifestError, match="split of an unfinished conversion"):
        open_dataset(out / "train")  # complete on its own, but its set is not
    train_manifest = (out / "train" / "manifest.json").stat().st_ino
    result = convert_splits(split_tree, out, config, workers=1, resume=True)
    assert result.results["train"] is None  # kept, not written again
    assert (out / "train" / "manifest.json").stat().st_ino == train_manifest
    assert read_splits(out).complete and len(open_dataset(out / "val")) == 4


def test_a_split_replaced_on_its_own_is_refused(split_tree, tmp_path):
    out = tmp_path / "out"
    convert_splits(split_tree, out, ConvertConfig("npy", PRE), workers=1)
    result = CliRunner().invoke(
        cli,
        ["convert", str(split_tree / "val"), "-f", "npy", "-o", str(out / "val"), "--size", "12", "-q", "--overwrite"],
    )
    assert result.exit_code == 0, result.output
    with pytest.raises(ManifestError, match="was replaced after the splits"):
        open_dataset(out / "val")
    verify = CliRunner().invoke(cli, ["verify", "-q", str(out)])
    assert verify.exit_code == 1 and "split val was replaced" in verify.output
    assert "another class map" in verify.output


def test_overwrite_replaces_the_whole_set(split_tree, tmp_path):
    out = tmp_path / "out"
    convert_splits(split_tree, out, ConvertConfig("npy", PRE), workers=1)
    with pytest.raises(OutputError, match="pass --overwrite"):
        convert_splits(split_tree, out, ConvertConfig("npy", PRE), workers=1)
    convert_splits(split_tree, out, ConvertConfig("wds", PRE), workers=1, overwrite=True)
    assert open_dataset(out / "val").manifest.format == "wds"
    data = json.loads((out / SPLITS_NAME).read_text())
    assert data["complete"] and data["class_map_sha256"] == open_dataset(out / "val").class_map_sha256


def test_splits_never_go_into_a_single_output_or_a_foreign_folder(split_tree, tmp_path):
    CliRunner().invoke(
        cli, ["convert", str(split_tree / "train"), "-f", "npy", "-o", str(tmp_path / "single"), "--size", "12", "-q"]
    )
    with pytest.raises(OutputError, match="holds a single packer output"):
        convert_splits(split_tree, tmp_path / "single", ConvertConfig("npy", PRE), workers=1, overwrite=True)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(OutputError, match="holds no packer splits"):
        convert_splits(split_tree, tmp_path / "mine", ConvertConfig("npy", PRE), workers=1, overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_a_splits_output_inside_the_source_is_not_a_split_or_class(split_tree, tmp_path):
    out = split_tree / "packed"
    convert_splits(split_tree, out, ConvertConfig("npy", PRE), workers=1)
    assert split_folders(split_tree) == ["train", "val"]  # the output is not a third folder
    found = discover(split_tree)
    assert "packed" not in (found.classes or [])


def test_many_small_classes_still_give_each_split_its_share(tmp_path):
    src = tmp_path / "src"
    make_tree(src, {f"c{i:02d}": 5 for i in range(20)}, size=(8, 8))
    result = convert_splits(
        src, tmp_path / "out", ConvertConfig("npy", PRE), fractions=[("train", 0.9), ("val", 0.1)], workers=1
    )
    assert {n: e["samples"] for n, e in result.record.splits.items()} == {"train": 90, "val": 10}


def test_a_refused_overwrite_leaves_the_set_as_it_was(split_tree, tmp_path):
    out = tmp_path / "out"
    convert_splits(split_tree, out, ConvertConfig("npy", PRE), workers=1)
    before = (out / SPLITS_NAME).read_bytes()
    (out / "val" / "notes.txt").write_text("mine")  # val is no longer only a packer output
    with pytest.raises(OutputError, match="val is a non-empty folder"):
        convert_splits(split_tree, out, ConvertConfig("wds", PRE), workers=1, overwrite=True)
    assert (out / SPLITS_NAME).read_bytes() == before
    assert open_dataset(out / "train").manifest.format == "npy"  # untouched, still readable


def test_strict_refuses_before_any_split_is_written(split_tree, tmp_path):
    write_image(split_tree / "val" / "stray.png")  # not in a class folder: discovery skips it
    with pytest.raises(DecodeError, match="stray.png"):
        convert_splits(split_tree, tmp_path / "out", ConvertConfig("npy", PRE), workers=1, strict=True)
    assert not (tmp_path / "out").exists()
    (split_tree / "val" / "stray.png").unlink()
    (split_tree / "val" / "a" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)  # found decoding
    result = CliRunner().invoke(
        cli, ["convert", str(split_tree), "-f", "npy", "-o", str(tmp_path / "out"), "-q", "--strict"]
    )
    assert result.exit_code == 1 and "unfinished" in result.output and "nothing written" not in result.output
    with pytest.raises(ManifestError, match="unfinished"):
        open_dataset(tmp_path / "out" / "train")


def test_a_damaged_or_crafted_record_is_refused_and_deletes_nothing(split_tree, tmp_path):
    out = tmp_path / "out"
    convert_splits(split_tree, out, ConvertConfig("npy", PRE), workers=1)
    CliRunner().invoke(cli, ["convert", str(split_tree / "val"), "-f", "npy", "-o", str(tmp_path / "other"), "-q"])
    good = json.loads((out / SPLITS_NAME).read_text())
    for damage in (
        {"../other": {"samples": 1, "manifest_sha256": None}},
        {"train": None},
        {"/abs": {"samples": 1}},
        {"splits.json": {"samples": 1}},
    ):
        (out / SPLITS_NAME).write_text(json.dumps({**good, "complete": False, "splits": damage}))
        with pytest.raises(ManifestError, match="damaged"):
            read_splits(out)
        with pytest.raises((ManifestError, OutputError)):
            convert_splits(split_tree, out, ConvertConfig("npy", PRE), workers=1)
        assert (tmp_path / "other" / "manifest.json").is_file()
    (out / SPLITS_NAME).write_text(json.dumps({**good, "origin": {"kind": "random"}}))
    assert CliRunner().invoke(cli, ["info", str(out)]).exit_code == 1  # a message, not a KeyError


def test_the_split_check_follows_links_and_the_current_folder(split_tree, tmp_path, monkeypatch):
    out = tmp_path / "out"
    convert_splits(split_tree, out, ConvertConfig("npy", PRE), workers=1)
    data = json.loads((out / SPLITS_NAME).read_text())
    (out / SPLITS_NAME).write_text(json.dumps({**data, "complete": False}))
    (tmp_path / "link").symlink_to(out / "train")
    with pytest.raises(ManifestError, match="unfinished"):
        open_dataset(tmp_path / "link")
    monkeypatch.chdir(out / "train")
    with pytest.raises(ManifestError, match="unfinished"):
        open_dataset(".")


def test_chained_sums_and_concat_check_every_part(split_tree, tmp_path):
    convert_splits(split_tree, tmp_path / "good", ConvertConfig("npy", PRE), workers=1)
    CliRunner().invoke(cli, ["convert", str(split_tree / "val"), "-f", "npy", "-o", str(tmp_path / "alone"), "-q"])
    s, b = open_dataset(tmp_path / "good" / "train"), open_dataset(tmp_path / "alone")
    for attempt in (lambda: s + s + b, lambda: b + (s + s), lambda: concat([s + s, b])):
        with pytest.raises(ValueError, match="different class maps"):
            attempt()
    both = s + open_dataset(tmp_path / "good" / "val")
    assert len(both + s) == 20 and both.classes == ["a", "b", "c"]


def test_an_unlabelled_split_beside_labelled_ones(tmp_path):
    root = tmp_path / "ds"
    make_tree(root / "train", {"a": 2, "b": 2}, size=(20, 16))
    make_tree(root / "test" / "..", {"test": 3}, size=(20, 16))  # test/img_*.png: no class folders
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["convert", str(root), "-f", "npy", "-o", str(out), "--size", "12", "-q"])
    assert result.exit_code == 0, result.output
    assert "test: unlabelled" in result.output
    assert read_splits(out).unlabelled == ["test"] and open_dataset(out / "test").classes is None
    info = CliRunner().invoke(cli, ["info", str(out)])
    assert "DIFFER" not in info.output and "but test (unlabelled)" in info.output
    verify = CliRunner().invoke(cli, ["verify", "-q", str(out)])
    assert verify.exit_code == 0 and "(test unlabelled)" in verify.output


def test_equal_sources_give_equal_records(split_tree, tmp_path):
    import shutil

    shutil.copytree(split_tree, tmp_path / "copy")
    convert_splits(split_tree, tmp_path / "one", ConvertConfig("npy", PRE), workers=1)
    convert_splits(tmp_path / "copy", tmp_path / "two", ConvertConfig("npy", PRE), workers=1)
    assert (tmp_path / "one" / SPLITS_NAME).read_bytes() == (tmp_path / "two" / SPLITS_NAME).read_bytes()


def test_an_interrupted_cli_run_says_what_is_kept(split_tree, tmp_path, monkeypatch):
    interrupt_at_val(monkeypatch)
    result = CliRunner().invoke(cli, ["convert", str(split_tree), "-f", "npy", "-o", str(tmp_path / "out"), "-q"])
    assert result.exit_code == 130
    assert "finished: train" in result.output and "--resume" in result.output


def test_reserved_split_names_are_refused():
    for spec in ("splits.json=0.5,val=0.5", "manifest.json=0.5,val=0.5", "train=0.5,Train=0.5"):
        with pytest.raises(ConfigError):
            parse_split_spec(spec)


def test_an_output_under_a_file_is_a_message(split_tree, tmp_path):
    (tmp_path / "file").write_text("x")
    result = CliRunner().invoke(
        cli, ["convert", str(split_tree), "-f", "npy", "-o", str(tmp_path / "file" / "out"), "-q"]
    )
    assert result.exit_code == 1 and "is not a folder" in result.output and "Traceback" not in result.output


def test_images_beside_the_split_folders_are_reported(split_tree, tmp_path):
    """Files at the top of a source of split folders are in no split: reported with the first split's
    skipped files (they vanished from every report), as files outside any class folder are."""
    write_image(split_tree / "extra_0.png", (20, 16), seed=1)
    write_image(split_tree / "extra_1.jpg", (20, 16), seed=2)
    (split_tree / "notes.md").write_text("not a sample")
    result = convert_splits(split_tree, tmp_path / "out", ConvertConfig("npy", PRE), workers=1)
    reported = {s.path: s.reason for s in result.results["train"].skipped}
    assert set(reported) == {"extra_0.png", "extra_1.jpg"} and "beside the split folders" in reported["extra_0.png"]
    assert not result.results["val"].skipped


def test_a_container_source_cannot_be_split_and_says_so(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_image(tmp_path / "a.png", (20, 16), seed=1)
    image = {"bytes": (tmp_path / "a.png").read_bytes(), "path": "a.png"}
    pq.write_table(pa.table({"image": [image] * 4, "label": ["x", "y"] * 2}), tmp_path / "t.parquet")
    with pytest.raises(InputError, match="is a parquet source: --split and split folders apply to folders"):
        convert_splits(
            tmp_path / "t.parquet",
            tmp_path / "out",
            ConvertConfig("npy", PRE),
            fractions=parse_split_spec("train=0.5,val=0.5"),
        )
