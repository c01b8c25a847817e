"""packer.ops.dedupe (--drop-duplicates): one image of each group of near-duplicates kept, the others
listed as skipped with the image they repeat, and the output exactly that of the images kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import EXPECTED_GROUPS, interrupted_after, leaky_splits, photo_tree

import packer.run.early_start
from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import ShardSize
from packer.ops.splits import convert_splits
from packer.output.image_hashes import HASHES_NAME
from packer.output.verify import verify
from packer.spec.errors import ConfigError, InputError
from packer.spec.manifest import read_manifest
from readers import open_dataset

PRE = PreprocessConfig(size=(160, 120), resize="stretch")
DROPPED = {  # the later key of each group (and the byte-identical copy), with the key it repeats
    "c0/img00.jpg": "c0/copy_resized.jpg",
    "c1/img01.jpg": "c1/copy_q60.jpg",
    "c2/copy_of_c1.jpg": "c1/img04.jpg",
    "c2/img02.jpg": "c2/copy_bright_crop.png",
    "c0/same_bytes.jpg": "c0/img03.jpg",
}


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    return photo_tree(tmp_path / "photos")


def stored(out: Path) -> dict[str, np.ndarray]:
    ds = open_dataset(out, normalize=False, return_meta=True)
    items = list(ds) if read_manifest(out).format == "wds" else [ds[i] for i in range(len(ds))]
    return {meta["key"]: image.numpy() for image, _, meta in items}


@pytest.mark.parametrize("fmt", ["npy", "wds"])
def test_the_later_of_each_group_is_left_out_and_listed(photos, tmp_path, fmt):
    out = tmp_path / "out"
    config = ConvertConfig(fmt, PRE, ShardSize(samples=6), drop_duplicates=True)
    result = convert(photos, out, config, workers=2)
    m = read_manifest(out)
    assert sum(len(g) for g in EXPECTED_GROUPS) == 8 and m.samples == 25 - len(DROPPED)
    assert {s["path"]: s["reason"] for s in m.skipped} == {
        key: f"near-duplicate: of {kept} (image hashes within 4 bits; --drop-duplicates)"
        for key, kept in DROPPED.items()
    }
    assert m.near_duplicates["groups"] == [] and m.duplicates == []
    assert len(result.skipped) == len(DROPPED)
    assert verify(out) == []  # the class counts and every checksum are of what is stored
    assert np.load(out / HASHES_NAME).shape == (20, 6)
    # the same samples, pixels and statistics as a conversion of the folder without those files
    pruned = tmp_path / "pruned"
    shutil.copytree(photos, pruned)
    for key in DROPPED:
        (pruned / key).unlink()
    plain = tmp_path / "plain"
    convert(pruned, plain, ConvertConfig(fmt, PRE, ShardSize(samples=6)), workers=2)
    ours, theirs = stored(out), stored(plain)
    assert sorted(ours) == sorted(theirs)
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
    assert m.stats == read_manifest(plain).stats and m.class_counts == read_manifest(plain).class_counts


def test_shards_started_during_the_walk_drop_the_same(photos, tmp_path, monkeypatch):
    config = ConvertConfig("npy", PRE, ShardSize(samples=4), drop_duplicates=True)
    planned = tmp_path / "planned"
    convert(photos, planned, config, workers=2)
    monkeypatch.setattr(packer.run.early_start, "EARLY_AFTER", 0.0)
    monkeypatch.setattr(packer.run.early_start, "CHECK_EVERY", 0.0)
    finished = []
    real = packer.run.early_start.EarlyStart.finish

    def finish(self, *args, **kwargs):
        finished.append(True)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(packer.run.early_start.EarlyStart, "finish", finish)
    early = tmp_path / "early"
    convert(photos, early, config, workers=2)
    assert finished  # the shards did start during the walk
    assert read_manifest(early).to_dict() == read_manifest(planned).to_dict()


def test_resume_drops_as_an_uninterrupted_run(photos, tmp_path):
    config = ConvertConfig("npy", PRE, ShardSize(samples=5), drop_duplicates=True)
    whole = tmp_path / "whole"
    convert(photos, whole, config, workers=1)
    out = tmp_path / "out"
    interrupted_after(photos, out, config, 7)
    convert(photos, out, config, workers=1, resume=True)
    assert read_manifest(out).to_dict() == read_manifest(whole).to_dict()
    assert verify(out) == []


def test_a_later_split_loses_its_copies_of_an_earlier_split(tmp_path):
    split = leaky_splits(tmp_path / "split", train=10)
    config = ConvertConfig("npy", PRE, drop_duplicates=True)
    result = convert_splits(split, tmp_path / "out", config, workers=1)
    assert result.leaks == {}
    val = read_manifest(tmp_path / "out" / "val")
    assert val.samples == 4
    assert val.skipped == [
        {
            "path": "c1/leaked.jpg",
            "reason": "near-duplicate: of train/c1/t05.jpg, in an earlier split (--drop-duplicates)",
        }
    ]
    assert read_manifest(tmp_path / "out" / "train").samples == 10


def test_what_it_does_not_go_with(photos, tmp_path):
    with pytest.raises(ConfigError, match="--no-image-hashes"):
        ConvertConfig("npy", PRE, image_hashes=False, drop_duplicates=True)
    texts = tmp_path / "texts"
    for n in range(3):
        (texts / "a").mkdir(parents=True, exist_ok=True)
        (texts / "a" / f"{n}.txt").write_text(f"text {n}")
    with pytest.raises(InputError, match="compares images"):
        convert(texts, tmp_path / "t", ConvertConfig("npy", drop_duplicates=True), workers=1)
    runner = CliRunner()
    out = tmp_path / "out"
    assert runner.invoke(cli, ["convert", str(photos), "-f", "npy", "-o", str(out), "-q"]).exit_code == 0
    again = runner.invoke(cli, ["convert", str(photos), "-f", "npy", "-o", str(out), "--append", "--drop-duplicates"])
    assert again.exit_code == 2 and "--drop-duplicates with --append is not built yet" in again.output
    nodes = runner.invoke(
        cli,
        ["convert", str(photos), "-f", "npy", "-o", str(tmp_path / "n"), "--num-nodes", "2", "--node-rank", "0"]
        + ["--drop-duplicates"],
    )
    assert nodes.exit_code == 2 and "--num-nodes" in nodes.output
    ran = runner.invoke(
        cli, ["convert", str(photos), "-f", "npy", "-o", str(tmp_path / "cli"), "--drop-duplicates", "--size", "64"]
    )
    assert ran.exit_code == 0, ran.output
    assert "5 x near-duplicate" in ran.output


@pytest.mark.parametrize("fmt", ["npy", "wds"])
def test_dropped_in_a_bucket_as_in_a_folder(s3_server, photos, tmp_path, fmt):
    """Into a bucket, the shards holding a near-duplicate go up a second time, replacing the first
    upload: the output is byte for byte the local one."""
    import json

    fs, url = s3_server, f"s3://data/dedupe-{fmt}"
    common = ["-f", fmt, "--size", "160x120", "--resize", "stretch", "--shard-size", "6", "-j", "2", "-q"]
    for out in (url, str(tmp_path / "local")):
        r = CliRunner().invoke(cli, ["convert", str(photos), "-o", out, "--drop-duplicates", *common])
        assert r.exit_code == 0, r.output
    local = tmp_path / "local"
    fs.invalidate_cache()
    objects = {p.split("/", 2)[2]: fs.cat_file(p) for p in fs.find(url[5:])}
    files = {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*") if p.is_file()}
    remote, mine = json.loads(objects.pop("manifest.json")), json.loads(files.pop("manifest.json"))
    assert objects == files and remote["shards"] == mine["shards"] and remote["skipped"] == mine["skipped"]
    assert {s["path"] for s in remote["skipped"]} == set(DROPPED)
    assert CliRunner().invoke(cli, ["verify", url, "-q"]).exit_code == 0


def test_a_split_set_in_a_bucket_is_searched_for_leaks_and_loses_them(s3_server, tmp_path):
    import json

    split = leaky_splits(tmp_path / "split", train=10)
    common = ["-f", "npy", "--size", "64", "--shard-size", "4", "-q"]
    r = CliRunner().invoke(cli, ["convert", str(split), "-o", "s3://data/leaky", *common])
    assert r.exit_code == 0 and "leakage: 1 image(s) of val nearly duplicate images of train" in r.output
    assert "val/c1/leaked.jpg ~ train/c1/t05.jpg" in r.output and "packer-upload-" not in r.output
    r = CliRunner().invoke(cli, ["convert", str(split), "-o", "s3://data/leak-dropped", "--drop-duplicates", *common])
    assert r.exit_code == 0, r.output
    skipped = json.loads(s3_server.cat_file("data/leak-dropped/val/manifest.json"))["skipped"]
    assert [s["reason"] for s in skipped] == [
        "near-duplicate: of train/c1/t05.jpg, in an earlier split (--drop-duplicates)"
    ]
    assert CliRunner().invoke(cli, ["verify", "s3://data/leak-dropped", "-q"]).exit_code == 0
