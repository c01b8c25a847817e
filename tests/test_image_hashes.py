"""packer.output.image_hashes through real conversions: every stored image hashed into
``image_hashes.npy`` in sample order, near-duplicates reported, leakage between splits and between
outputs, and the hashes kept right by --resume and --append (or dropped where an operation cannot)."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FORMATS
from helpers import (
    EXPECTED_GROUPS,
    cropped,
    interrupted_after,
    jpeg,
    leaky_splits,
    photo_tree,
    save,
    textured,
)

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import ShardSize
from packer.ops.append import append
from packer.ops.combine import combine
from packer.ops.repack import repack
from packer.ops.splits import convert_splits
from packer.output.files import staging_dir
from packer.output.image_hashes import HASHES_NAME, leaks_between
from packer.output.near_duplicates import popcount
from packer.output.verify import verify
from packer.pixels.looks import FLAT, HASH_KIND, LOOKS, image_looks
from packer.records import ShardResult
from packer.spec.errors import ManifestError
from packer.spec.manifest import read_manifest
from readers import open_dataset

PRE = PreprocessConfig(size=(160, 120), resize="stretch")


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    return photo_tree(tmp_path / "photos")


def groups(out: Path) -> list[list[str]]:
    return sorted(sorted(g) for g in read_manifest(out).near_duplicates["groups"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_image_is_hashed_in_sample_order_and_copies_are_reported(photos, tmp_path, fmt):
    out = tmp_path / fmt
    convert(photos, out, ConvertConfig(fmt, PRE, ShardSize(samples=7)), workers=2)
    m = read_manifest(out)
    assert groups(out) == EXPECTED_GROUPS  # the identical copy is a duplicate, the flat ones nobody's
    assert m.duplicates == [["c0/img03.jpg", "c0/same_bytes.jpg"]]
    assert m.near_duplicates["distance"] == 4 and m.image_hashes["kind"] == HASH_KIND == "dct-area-trim5"
    table = np.load(out / HASHES_NAME, allow_pickle=False)  # stock numpy, no packer
    assert table.dtype == np.uint64 and table.shape == (m.samples, LOOKS) == (25, 6)
    ds = open_dataset(out, normalize=False, return_meta=True)
    stored = list(ds) if fmt == "wds" else [ds[i] for i in range(len(ds))]
    for row, (image, _, meta) in zip(table, stored):  # row i is sample i's: the hash of its stored pixels
        expected = [FLAT] * LOOKS if meta["key"].startswith("c1/flat") else image_looks(image.permute(1, 2, 0).numpy())
        assert row.tolist() == list(expected), meta["key"]
    assert verify(out) == []
    report = (out / "report.txt").read_text()
    assert "8 image(s) in 4 group(s) are near-duplicates" in report
    assert "c1/img04.jpg  ~  c2/copy_of_c1.jpg" in report


def test_a_changed_hashes_file_is_a_problem_and_hashes_can_be_left_out(photos, tmp_path):
    out = tmp_path / "out"
    convert(photos, out, ConvertConfig("npy", PRE), workers=1)
    table = np.load(out / HASHES_NAME)
    table[5, 0] ^= np.uint64(1)
    np.save(out / HASHES_NAME, table)
    assert any("image_hashes.npy is not the file the manifest lists" in p.message for p in verify(out))
    (out / HASHES_NAME).unlink()
    assert any("image_hashes.npy" in p.message for p in verify(out))
    plain = tmp_path / "plain"
    convert(photos, plain, ConvertConfig("npy", PRE, image_hashes=False), workers=1)
    m = read_manifest(plain)
    assert m.image_hashes is None and m.near_duplicates is None and not (plain / HASHES_NAME).exists()
    assert verify(plain) == []


def test_hashes_of_another_rule_are_not_compared_but_still_verified(photos, tmp_path):
    # an output hashed by an earlier packer's rule (a 64 x 64 thumbnail's): its numbers mean other
    # things, so leakage and --append refuse to compare them with this rule's; the file is intact
    old, new = tmp_path / "old", tmp_path / "new"
    for out in (old, new):
        convert(photos, out, ConvertConfig("npy", PRE), workers=1)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["image_hashes"]["kind"] = "dct64-trim5"
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"hashes of different kinds \('dct64-trim5', 'dct-area-trim5'\)"):
        leaks_between(old, new)
    assert verify(old) == []
    info = CliRunner().invoke(cli, ["info", str(new), str(old)])
    assert info.exit_code == 0, info.output
    assert f"not compared: {old} and {new} hold image hashes of different kinds" in info.output.replace("\n", " ")
    older = tmp_path / "older"  # two outputs of one earlier rule are still compared with each other
    shutil.copytree(old, older)
    assert len(leaks_between(older, old)) == 23  # every image but the two of one colour, which match nothing


def test_kept_source_files_are_hashed_from_their_checking_decode(photos, tmp_path):
    raw, kept = tmp_path / "raw", tmp_path / "kept"
    convert(photos, raw, ConvertConfig("npy", PreprocessConfig(resize="none")), workers=1)
    convert(photos, kept, ConvertConfig("npy", PreprocessConfig(resize="none"), codec=_source()), workers=1)
    assert sum(stop - start for s in read_manifest(kept).shards for start, stop in s.image_sources["kept"]) == 25
    assert groups(kept) == groups(raw) == EXPECTED_GROUPS
    a, b = np.load(raw / HASHES_NAME), np.load(kept / HASHES_NAME)
    close = [min(int(popcount(x[0] ^ y).min()), int(popcount(y[0] ^ x).min())) for x, y in zip(a, b)]  # numpy>=1.24
    assert max(close) <= 4  # the scaled decode (shorter side 64 or more) hashes like the full one
    auto = tmp_path / "auto"  # kept JPEGs decoded in full for the statistics: the same hashes
    pre = PreprocessConfig(resize="none", auto_normalize=True, mean=None, std=None)
    convert(photos, auto, ConvertConfig("npy", pre, codec=_source()), workers=1)
    assert np.array_equal(np.load(auto / HASHES_NAME), b)


def _source():
    from packer.spec.sample_layout import ImageCodec

    return ImageCodec("source")


def test_resume_keeps_each_shards_hashes(photos, tmp_path):
    config = ConvertConfig("npy", PRE, ShardSize(samples=5))
    whole = tmp_path / "whole"
    convert(photos, whole, config, workers=1)
    out = tmp_path / "out"
    interrupted_after(photos, out, config, 7)
    resumed = convert(photos, out, config, workers=1, resume=True)
    assert 0 < resumed.processed < 25
    assert np.array_equal(np.load(out / HASHES_NAME), np.load(whole / HASHES_NAME))
    assert groups(out) == EXPECTED_GROUPS and verify(out) == []


def test_resume_writes_again_a_shard_hashed_by_another_rule(photos, tmp_path, caplog):
    # an interrupted run of a packer with the thumbnail's rule, resumed by this one: its finished
    # shards' hashes are other numbers, so those shards are written again, never mixed into one file
    config = ConvertConfig("npy", PRE, ShardSize(samples=5))
    whole, out = tmp_path / "whole", tmp_path / "out"
    convert(photos, whole, config, workers=1)
    interrupted_after(photos, out, config, 7)
    records = sorted(staging_dir(out).glob("*.done.json"))
    assert records
    for record in records:
        d = json.loads(record.read_text())
        assert d["looks_kind"] == HASH_KIND
        d["looks_kind"] = "dct64-trim5"
        d["looks_u64"] = base64.b64encode(bytes(len(base64.b64decode(d["looks_u64"])))).decode()
        record.write_text(json.dumps(d))
    resumed = convert(photos, out, config, workers=1, resume=True)
    assert resumed.processed == 25  # every shard written again
    assert "hashed by another rule (dct64-trim5); writing it again" in caplog.text
    assert np.array_equal(np.load(out / HASHES_NAME), np.load(whole / HASHES_NAME))


def test_records_carry_the_hashes_and_older_records_none():
    looks = np.arange(12, dtype=np.uint64).reshape(2, 6) << np.uint64(40)
    result = ShardResult("shard-00000", 2, [], keys=["a", "b"], labels=[0, 1], digests=["00" * 16] * 2, looks=looks)
    again = ShardResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert np.array_equal(again.looks, looks) and again.looks.dtype == np.uint64
    older = result.to_dict()
    del older["looks_u64"], older["looks_per_sample"]
    assert ShardResult.from_dict(older).looks is None


def test_append_adds_the_new_images_hashes_and_searches_them_with_the_old(photos, tmp_path):
    out = tmp_path / "out"
    convert(photos, out, ConvertConfig("lmdb", PRE), workers=1)
    before = np.load(out / HASHES_NAME)
    save(photos / "c0" / "later_copy.jpg", jpeg(cropped(textured(6, 0), where="top-right"), 70))
    append(photos, out, ConvertConfig("lmdb", PRE), workers=1)
    m = read_manifest(out)
    tag = m.shards[-1].name.rsplit("-", 1)[1]  # each version's hashes a file of its own, named as its new shards
    assert m.image_hashes["path"] == f"image_hashes-{tag}.npy" and not (out / HASHES_NAME).exists()
    after = np.load(out / m.image_hashes["path"])
    assert after.shape == (26, LOOKS) and np.array_equal(after[:25], before)
    assert ["c0/img06.jpg", "c0/later_copy.jpg"] in groups(out)
    assert verify(out) == []


def test_repack_and_combine_leave_no_hashes_they_cannot_vouch_for(photos, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    convert(photos, first, ConvertConfig("npy", PRE), workers=1)
    shutil.copytree(photos / "c1", tmp_path / "more" / "c1")
    convert(tmp_path / "more", second, ConvertConfig("npy", PRE), workers=1)
    repack(first, tmp_path / "re", "wds", workers=1)
    combine([first, second], tmp_path / "both", workers=1)
    for out in (tmp_path / "re", tmp_path / "both"):
        assert read_manifest(out).image_hashes is None and not (out / HASHES_NAME).exists()
        assert verify(out) == []


def test_a_copy_across_splits_is_reported_as_leakage(photos, tmp_path):
    split = leaky_splits(tmp_path / "split")
    result = convert_splits(split, tmp_path / "out", ConvertConfig("npy", PRE), workers=1)
    assert result.leaks == {("val", "train"): [("c1/leaked.jpg", "c1/t05.jpg")]}
    assert leaks_between(tmp_path / "out" / "train", tmp_path / "out" / "val") == [("c1/t05.jpg", "c1/leaked.jpg")]

    runner = CliRunner()
    cli_out = tmp_path / "cli"
    ran = runner.invoke(cli, ["convert", str(split), "-f", "npy", "-o", str(cli_out), "--size", "160x120", "-q"])
    assert ran.exit_code == 0, ran.output
    assert "leakage: 1 image(s) of val nearly duplicate images of train" in ran.output
    assert "val/c1/leaked.jpg ~ train/c1/t05.jpg" in ran.output
    info = runner.invoke(cli, ["info", str(cli_out / "train"), str(cli_out / "val")])
    assert info.exit_code == 0, info.output
    assert "1 image(s) of " in info.output and "c1/leaked.jpg  ~  c1/t05.jpg" in info.output
    clean = runner.invoke(cli, ["info", str(cli_out / "train"), str(tmp_path / "out" / "train")])
    assert "nearly duplicate" in clean.output  # the same images: every one is a copy


def test_cli_reports_and_sets_the_distance(photos, tmp_path):
    runner = CliRunner()
    out = tmp_path / "out"
    ran = runner.invoke(cli, ["convert", str(photos), "-f", "wds", "-o", str(out), "--size", "160x120", "-q"])
    assert ran.exit_code == 0, ran.output
    assert "note: 8 images in 4 group(s) are near-duplicates" in ran.output
    assert "similar   8 images in 4 group(s)" in runner.invoke(cli, ["info", str(out)]).output
    strict = tmp_path / "strict"
    ran = runner.invoke(
        cli, ["convert", str(photos), "-f", "wds", "-o", str(strict), "--size", "160x120", "-q", "--dup-distance", "0"]
    )
    assert ran.exit_code == 0 and read_manifest(strict).near_duplicates["distance"] == 0
    assert all(g in EXPECTED_GROUPS for g in groups(strict))  # copies whose hash matched one of the original's exactly
    bad = runner.invoke(cli, ["convert", str(photos), "-f", "wds", "-o", str(tmp_path / "x"), "--dup-distance", "9"])
    assert bad.exit_code == 2 and "--dup-distance" in bad.output


@pytest.mark.parametrize("options", [["--no-image-hashes"], ["--dup-distance", "6"]])
def test_a_conversion_over_nodes_keeps_the_hash_options(photos, tmp_path, options):
    runner = CliRunner()
    out = tmp_path / "out"
    for rank in ("0", "1"):
        command = ["convert", str(photos), "-f", "npy", "-o", str(out), "--size", "64", "-q", *options]
        ran = runner.invoke(cli, [*command, "--num-nodes", "2", "--node-rank", rank])
        assert ran.exit_code == 0, ran.output
    assert runner.invoke(cli, ["merge", str(out)]).exit_code == 0
    m = read_manifest(out)
    if options == ["--no-image-hashes"]:
        assert m.image_hashes is None and not (out / HASHES_NAME).exists()
    else:
        assert m.near_duplicates["distance"] == 6 and np.load(out / HASHES_NAME).shape == (25, LOOKS)
    assert verify(out) == []


@pytest.mark.parametrize(
    "entry",
    [[], {"groups": 5, "distance": 4}, {"groups": [["a", 3]], "distance": 4}, {"groups": [], "distance": "4"}],
)
def test_a_malformed_near_duplicates_entry_is_a_clear_error(photos, tmp_path, entry):
    out = tmp_path / "out"
    convert(photos, out, ConvertConfig("npy", PRE), workers=1)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["near_duplicates"] = entry
    (out / "manifest.json").write_text(json.dumps(manifest))
    ran = CliRunner().invoke(cli, ["info", str(out)])
    assert ran.exit_code == 1 and "near_duplicates entry is not a distance in bits" in ran.output
    assert not isinstance(ran.exception, (AttributeError, TypeError, ValueError))


def test_an_output_of_texts_has_no_hashes_and_no_warning(tmp_path, caplog):
    texts = tmp_path / "texts"
    for n in range(4):
        (texts / "a").mkdir(parents=True, exist_ok=True)
        (texts / "a" / f"{n}.txt").write_text(f"text {n}")
    convert(texts, tmp_path / "out", ConvertConfig("npy"), workers=1)
    m = read_manifest(tmp_path / "out")
    assert m.image_hashes is None and m.near_duplicates is None
    assert not [r for r in caplog.records if "near-duplicates not searched" in r.getMessage()]
