"""packer combine: outputs of one format and preprocessing as one, labels by class name, nothing decoded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import FORMATS, write_image

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import ImageCodec, ShardSize
from packer.ops.combine import combine, merged_stats
from packer.output.verify import verify
from packer.spec.errors import InputError
from packer.spec.manifest import read_manifest
from readers import open_dataset

PRE = PreprocessConfig(size=(16, 12))


def tree(root: Path, classes: dict[str, list[int]]) -> Path:
    """Class folders of images, each seeded by its number (equal numbers: equal files)."""
    for name, seeds in classes.items():
        for seed in seeds:
            write_image(root / name / f"{name}-{seed}.png", (20, 16), seed=seed)
    return root


def samples(root: Path) -> list:
    ds = open_dataset(root, return_meta=True, normalize=False)
    items = list(ds) if type(ds).__name__ == "WdsDataset" else [ds[i] for i in range(len(ds))]
    return [(meta["key"], label, image) for image, label, meta in items]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("combine")
    a = tree(base / "a", {"cat": [1, 2, 3], "dog": [4, 5]})
    b = tree(base / "b", {"cat": [6, 7], "emu": [8, 9, 1]})  # emu-1.png has cat-1.png's bytes
    found = {}
    for fmt in FORMATS:
        for name, src in (("a", a), ("b", b)):
            out = base / f"{name}-{fmt}"
            convert(src, out, ConvertConfig(fmt, PRE, ShardSize(samples=2)), workers=1)
            found[name, fmt] = out
    return found


@pytest.mark.parametrize("fmt", FORMATS)
def test_labels_follow_class_names_and_every_sample_is_kept(outputs, tmp_path, fmt):
    a, b = outputs["a", fmt], outputs["b", fmt]
    out = tmp_path / "c"
    result = combine([a, b], out, workers=1)
    m = read_manifest(out)
    assert m.classes == ["cat", "dog", "emu"] and m.class_counts == [5, 2, 3] and m.samples == 10
    assert verify(out) == []
    got = samples(out)
    want_a = samples(a)
    new_label = {"cat": 0, "emu": 2}  # b's emu was 1; the combined map has dog at 1
    want_b = [(key, new_label[key.split("/")[0]], image) for key, _, image in samples(b)]
    assert [g[:2] for g in got] == [w[:2] for w in want_a + want_b]
    assert all(torch.equal(g[2], w[2]) for g, w in zip(got, want_a + want_b))
    assert [g[1] for g in got if g[0].startswith("emu/")] == [2, 2, 2]
    assert result.processed == 5  # b's shards were written again (its labels changed); a's were linked
    assert m.history[0]["action"] == "combine" and [i["samples"] for i in m.history[0]["inputs"]] == [5, 5]
    assert [s.name.rsplit("-", 1)[0] for s in m.shards] == [f"shard-{i:05d}" for i in range(len(m.shards))]


def test_shards_are_hard_linked_where_labels_stay(outputs, tmp_path):
    a = outputs["a", "npy"]
    again = tmp_path / "a2"
    convert(tree(tmp_path / "src", {"cat": [11], "dog": [12]}), again, ConvertConfig("npy", PRE), workers=1)
    out = tmp_path / "c"
    combine([a, again], out)
    m, ma = read_manifest(out), read_manifest(a)
    first = out / m.shards[0].file(".images.npy")
    assert os.stat(first).st_ino == os.stat(a / ma.shards[0].file(".images.npy")).st_ino
    assert m.shards[0].files[0].sha256 == ma.shards[0].files[0].sha256
    copied = tmp_path / "copied"
    combine([a, again], copied, link=False)
    assert os.stat(copied / read_manifest(copied).shards[0].file(".images.npy")).st_nlink == 1
    assert verify(copied) == [] and samples(copied)[0][0] == samples(out)[0][0]


@pytest.mark.parametrize("fmt", ["npy", "wds"])
def test_samples_in_two_inputs_are_reported(outputs, tmp_path, fmt):
    out = tmp_path / "c"
    combine([outputs["a", fmt], outputs["b", fmt]], out, workers=1)
    m = read_manifest(out)
    a, b = outputs["a", fmt].name, outputs["b", fmt].name
    assert m.duplicates == [[f"{a}:cat/cat-1.png", f"{b}:emu/emu-1.png"]]


def test_statistics_are_merged_from_the_inputs(outputs, tmp_path):
    out = tmp_path / "c"
    combine([outputs["a", "npy"], outputs["b", "npy"]], out)
    m = read_manifest(out)
    pixels = [samples(outputs[n, "npy"]) for n in ("a", "b")]
    every = torch.cat([image.reshape(3, -1).double() / 255 for part in pixels for _, _, image in part], dim=1)
    assert m.stats["pixels"]["count"] == every.shape[1]
    assert m.stats["pixels"]["mean"] == pytest.approx(every.mean(dim=1).tolist(), abs=1e-12)
    assert m.stats["pixels"]["std"] == pytest.approx(every.std(dim=1, unbiased=False).tolist(), abs=1e-9)
    sizes = m.stats["original_sizes"]["width"]
    assert sum(sizes["counts"]) == 10 and sizes["min"] == sizes["max"] == 20 and sizes["median"] is None
    alone = read_manifest(outputs["a", "npy"]).stats["pixels"]
    merged = merged_stats([read_manifest(outputs["a", "npy"])])["pixels"]
    assert merged["count"] == alone["count"] and merged["mean"] == pytest.approx(alone["mean"], abs=1e-15)
    assert merged["std"] == pytest.approx(alone["std"], abs=1e-12)


def test_auto_normalization_is_recomputed_for_the_combined_data(tmp_path):
    auto = PreprocessConfig(size=(16, 12), auto_normalize=True)
    outs = []
    for n, seeds in enumerate(([1, 2], [30, 31, 32])):
        outs.append(tmp_path / f"o{n}")
        convert(tree(tmp_path / f"s{n}", {"cat": seeds}), outs[-1], ConvertConfig("npy", auto), workers=1)
    out = tmp_path / "c"
    combine(outs, out)
    m = read_manifest(out)
    assert m.preprocess["normalize"]["mean"] == pytest.approx(m.stats["pixels"]["mean"])
    assert m.preprocess["normalize"]["mean"] != read_manifest(outs[0]).preprocess["normalize"]["mean"]


def test_outputs_that_are_not_alike_are_refused(outputs, tmp_path):
    with pytest.raises(InputError, match="is a wds output and .* a npy one: repack it first"):
        combine([outputs["a", "npy"], outputs["b", "wds"]], tmp_path / "x")
    other = tmp_path / "other"
    convert(tree(tmp_path / "src", {"cat": [1]}), other, ConvertConfig("npy", PreprocessConfig(size=(8, 8))), workers=1)
    with pytest.raises(InputError, match="store other fields|preprocessed differently"):
        combine([outputs["a", "npy"], other], tmp_path / "y")
    jpeg = tmp_path / "jpeg"
    convert(tmp_path / "src", jpeg, ConvertConfig("npy", PRE, codec=ImageCodec("jpeg")), workers=1)
    with pytest.raises(InputError, match="store other fields"):
        combine([outputs["a", "npy"], jpeg], tmp_path / "z")
    flat = tmp_path / "flat"
    write_image(tmp_path / "flatsrc" / "1.png", (20, 16))
    convert(tmp_path / "flatsrc", flat, ConvertConfig("npy", PRE), workers=1)
    with pytest.raises(InputError, match="is unlabelled and .* is labelled"):
        combine([flat, outputs["a", "npy"]], tmp_path / "w")
    with pytest.raises(InputError, match="given twice"):
        combine([outputs["a", "npy"], outputs["a", "npy"]], tmp_path / "v")
    assert not any((tmp_path / n).exists() for n in "xyzwv")


def test_the_command_combines_and_reports(outputs, tmp_path):
    out = tmp_path / "c"
    result = CliRunner().invoke(
        cli, ["combine", str(outputs["a", "lmdb"]), str(outputs["b", "lmdb"]), "-o", str(out), "-q"]
    )
    assert result.exit_code == 0, result.output
    assert "wrote 10 samples" in result.output and "1 group(s) have identical bytes" in result.output
    again = CliRunner().invoke(cli, ["combine", str(outputs["a", "lmdb"]), str(outputs["b", "lmdb"]), "-o", str(out)])
    assert again.exit_code == 1 and "--overwrite" in again.output


def test_inputs_of_one_folder_name_are_told_apart_by_their_position(outputs, tmp_path):
    import shutil

    a, b = tmp_path / "x" / "npy", tmp_path / "y" / "npy"
    shutil.copytree(outputs["a", "npy"], a)
    shutil.copytree(outputs["b", "npy"], b)
    out = tmp_path / "c"
    combine([a, b], out)
    m = read_manifest(out)
    assert m.duplicates == [["npy#1:cat/cat-1.png", "npy#2:emu/emu-1.png"]]
    assert [i["name"] for i in m.history[0]["inputs"]] == ["npy#1", "npy#2"]


def test_inputs_shuffled_with_one_seed_combine_into_no_seed_order(tmp_path):
    """Two outputs shuffled with seed 3, one after the other, are no seed-3 permutation of their union:
    the combined manifest records no seed."""
    a = tree(tmp_path / "a", {"cat": [1, 2, 3], "dog": [4, 5]})
    b = tree(tmp_path / "b", {"cat": [6, 7], "dog": [8]})
    for name, src in (("A", a), ("B", b)):
        convert(src, tmp_path / name, ConvertConfig("npy", PRE, ShardSize(samples=2), shuffle=3), workers=1)
    assert read_manifest(tmp_path / "A").sharding["shuffle_seed"] == 3
    combine([tmp_path / "A", tmp_path / "B"], tmp_path / "C", workers=1)
    assert read_manifest(tmp_path / "C").sharding["shuffle_seed"] is None
