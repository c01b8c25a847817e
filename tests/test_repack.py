"""Repacking: a packer output given as the source is converted from its own shards, never walked for files."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import FORMATS, make_tree, write_image
from helpers import shard_file

from packer import ConvertConfig, PreprocessConfig, convert, repack
from packer.cli import cli
from packer.config import ImageCodec, ShardSize
from packer.output.verify import verify
from packer.spec.errors import ConfigError, InputError, ManifestError
from packer.spec.manifest import read_manifest
from packer.spec.registry import FORMATS as SPECS
from packer.spec.sample_layout import SampleLayout
from readers import open_dataset

PRE = PreprocessConfig(size=(16, 12))
SIZES = PreprocessConfig(resize="none")


def samples(root: Path, **options) -> list:
    """Every sample of an output in dataset order, with its meta (the wds reader streams in order)."""
    ds = open_dataset(root, return_meta=True, normalize=False, **options)
    return list(ds) if type(ds).__name__ == "WdsDataset" else [ds[i] for i in range(len(ds))]


def same_samples(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x[-1]["key"] == y[-1]["key"]
        for u, v in zip(x[:-1], y[:-1]):
            if isinstance(u, torch.Tensor):
                assert torch.equal(u, v), x[-1]["key"]
            else:
                assert u == v, x[-1]["key"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src") / "images"
    make_tree(src, {"ant": 5, "bee": 4, "cat": 6})
    (src / "bee" / "bad.png").write_bytes(b"not an image")
    write_image(src / "ant" / "copy.png", (64, 48), seed=0)  # the same bytes as ant/img_000.png: a duplicate
    return src


@pytest.fixture(scope="module")
def original(tree, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("orig") / "npy"
    convert(tree, out, ConvertConfig("npy", PRE, ShardSize(samples=4)), workers=2)
    return out


def test_npy_to_wds_to_lmdb_to_hdf5_gives_the_same_tensors_and_records(original, tmp_path):
    want = samples(original)
    m0 = read_manifest(original)
    previous = original
    for n, fmt in enumerate(["wds", "lmdb", "hdf5", "npy"]):
        out = tmp_path / f"{n}-{fmt}"
        result = repack(previous, out, fmt, shard_size=ShardSize(samples=3 + n), workers=2)
        assert verify(out) == []
        same_samples(samples(out), want)
        m = read_manifest(out)
        assert m.format == fmt and m.samples == m0.samples == 16
        assert [s.samples for s in m.shards] == [3 + n] * (16 // (3 + n)) + ([16 % (3 + n)] if 16 % (3 + n) else [])
        for name in ("classes", "class_counts", "stats", "preprocess", "skipped", "duplicates", "source", "fields"):
            assert getattr(m, name) == getattr(m0, name), name
        assert m.sharding["shuffle_seed"] is None and m.sharding["shard_size"] == f"{3 + n} samples"
        assert [h["from"]["format"] for h in m.history] == ["npy", "wds", "lmdb", "hdf5"][: n + 1]
        assert m.history[-1]["action"] == "repack" and m.history[-1]["samples"] == 16
        assert result.manifest.to_dict() == m.to_dict()
        previous = out
    assert m0.duplicates == [["ant/copy.png", "ant/img_000.png"]] and m0.skipped[0]["path"] == "bee/bad.png"


def test_repacked_wds_keys_count_stored_samples_and_the_shards_hold_their_indexes(original, tmp_path):
    out = tmp_path / "wds"
    repack(original, out, "wds", shard_size=ShardSize(samples=5), workers=1)
    m = read_manifest(out)
    with tarfile.open(shard_file(out, 1, ".tar")) as tar:
        names = tar.getnames()
    assert names[:3] == ["000000005.cls", "000000005.json", "000000005.npy"]
    assert (out / "shardindex.json").is_file() and shard_file(out, 1, ".idx").is_file()
    assert json.loads((out / "shardindex.json").read_text())["shardlist"][1]["nsamples"] == m.shards[1].samples


@pytest.mark.parametrize("fmt", FORMATS)
def test_raw_to_png_is_lossless_and_to_jpeg_as_a_direct_conversion(tree, original, tmp_path, fmt):
    want = samples(original)
    png = tmp_path / "png"
    repack(original, png, fmt, codec="png", workers=1)
    assert read_manifest(png).fields["image"]["codec"] == "png"
    same_samples(samples(png), want)
    jpeg = tmp_path / "jpeg"
    repack(png, jpeg, "npy", codec="jpeg", quality=95, workers=1)
    m = read_manifest(jpeg)
    assert m.fields["image"] == {**read_manifest(original).fields["image"], "codec": "jpeg", "quality": 95}
    # Encoded once from the same pixels: the bytes a direct conversion to jpeg stores.
    direct = tmp_path / "direct"
    convert(tree, direct, ConvertConfig("npy", PRE, ShardSize(samples=4), codec=ImageCodec("jpeg", 95)), workers=1)
    layout = SampleLayout.from_manifest(m)
    got = [s.encoded for shard in m.shards for s in SPECS["npy"].scan(jpeg, shard, layout)]
    want = [s.encoded for shard in read_manifest(direct).shards for s in SPECS["npy"].scan(direct, shard, layout)]
    assert got == want


def test_the_same_codec_copies_the_stored_bytes(tree, tmp_path):
    jpeg = tmp_path / "jpeg"
    convert(tree, jpeg, ConvertConfig("lmdb", SIZES, codec=ImageCodec("jpeg", 80)), workers=1)
    out = tmp_path / "wds"
    repack(jpeg, out, "wds", workers=1)
    layout = SampleLayout.from_manifest(read_manifest(jpeg))
    before = [s.encoded for shard in read_manifest(jpeg).shards for s in SPECS["lmdb"].scan(jpeg, shard, layout)]
    after = [s.encoded for shard in read_manifest(out).shards for s in SPECS["wds"].scan(out, shard, layout)]
    assert before == after and len(after) == 16
    assert read_manifest(out).fields["image"]["quality"] == 80
    assert np.array_equal(open_dataset(out).image_sizes, open_dataset(jpeg).image_sizes)
    with pytest.raises(ConfigError, match="copied as they are \\(quality 80\\).*lose detail twice"):
        repack(jpeg, tmp_path / "q90", "npy", quality=90)


def test_source_bytes_and_their_record_survive_a_repack(tmp_path):
    src = tmp_path / "src"
    write_image(src / "a" / "small.jpg", (60, 40), seed=1, quality=90)
    write_image(src / "a" / "large.jpg", (600, 400), seed=2, quality=90)  # resized by --resize max: re-encoded
    write_image(src / "b" / "p.png", (30, 20), seed=3)
    first = tmp_path / "lmdb"
    convert(
        src,
        first,
        ConvertConfig("lmdb", PreprocessConfig(resize="max", size=(256, 256)), codec=ImageCodec("source")),
        workers=1,
    )
    out = tmp_path / "wds"
    repack(first, out, "wds", workers=1)
    m = read_manifest(out)
    assert [s.kept_sources() for s in m.shards] == [s.kept_sources() for s in read_manifest(first).shards]
    layout = SampleLayout.from_manifest(m)
    stored = {s.key: s.encoded for shard in m.shards for s in SPECS["wds"].scan(out, shard, layout)}
    assert stored["a/small.jpg"] == (src / "a" / "small.jpg").read_bytes()
    assert stored["b/p.png"] == (src / "b" / "p.png").read_bytes()
    assert stored["a/large.jpg"] != (src / "a" / "large.jpg").read_bytes()
    same_samples(samples(out), samples(first))
    raw = tmp_path / "raw"
    repack(out, raw, "npy", codec="raw", workers=1)  # decoded as the readers decode them
    same_samples(samples(raw), samples(first))
    with pytest.raises(ConfigError, match="--codec source keeps each source file's own bytes"):
        repack(raw, tmp_path / "again", "wds", codec="source")


def test_text_and_detection_fields_pass_through(tmp_path):
    src = tmp_path / "texts"
    for i in range(5):
        (src / "a").mkdir(parents=True, exist_ok=True)
        (src / "a" / f"{i}.txt").write_text(f"text number {i} " * (i + 1))
    first = tmp_path / "wds"
    convert(src, first, ConvertConfig("wds", PRE), workers=1)
    for fmt in ("npy", "lmdb", "hdf5"):
        out = tmp_path / fmt
        repack(first, out, fmt, workers=1)
        same_samples(samples(out), samples(first))
        assert read_manifest(out).fields == read_manifest(first).fields
    with pytest.raises(ConfigError, match="without images: --codec has nothing to encode"):
        repack(first, tmp_path / "x", "npy", codec="png")


def test_a_packer_output_is_never_packed_as_files(original, tmp_path):
    with pytest.raises(InputError, match="is a packer output, not a folder of source files: repack it"):
        convert(original, tmp_path / "x", ConvertConfig("wds", PRE))
    runner = CliRunner()
    refused = runner.invoke(
        cli, ["convert", str(original), "-f", "wds", "-o", str(tmp_path / "y"), "--size", "8", "--shuffle", "1"]
    )
    assert refused.exit_code == 2 and "--size, --shuffle cannot be given here" in refused.output
    assert not (tmp_path / "y").exists()
    done = runner.invoke(
        cli, ["convert", str(original), "-f", "wds", "-o", str(tmp_path / "z"), "-q", "--shard-size", "6"]
    )
    assert done.exit_code == 0, done.output
    assert read_manifest(tmp_path / "z").samples == 16 and verify(tmp_path / "z") == []


def test_normalized_float_outputs_take_no_image_codec(tree, tmp_path):
    floats = tmp_path / "f"
    convert(tree, floats, ConvertConfig("npy", PreprocessConfig(size=(16, 12), dtype="float16")), workers=1)
    with pytest.raises(ConfigError, match="stores 8-bit images, and .* holds float16 pixels"):
        repack(floats, tmp_path / "j", "wds", codec="jpeg")
    repack(floats, tmp_path / "w", "wds", workers=1)
    same_samples(samples(tmp_path / "w"), samples(floats))


@pytest.mark.parametrize("fmt", ["npy", "wds"])
def test_a_damaged_source_sample_stops_the_repack_and_nothing_is_published(original, tmp_path, fmt):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    if fmt == "wds":
        repack(original, tmp_path / "w", "wds", shard_size=ShardSize(samples=4), workers=1)
        shutil.rmtree(copy)
        shutil.copytree(tmp_path / "w", copy)
        path = shard_file(copy, 1, ".tar")
        data = bytearray(path.read_bytes())
        at = data.index(b"\x93NUMPY", 2048) + 200  # inside the first image of shard 1
    else:
        path = shard_file(copy, 1, ".images.npy")
        data = bytearray(path.read_bytes())
        at = len(data) - 10
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="does not match its CRC-32; the output is damaged"):
        repack(copy, tmp_path / "out", "lmdb", workers=1)
    assert not (tmp_path / "out").exists()


def test_an_output_cannot_be_repacked_into_itself_or_inside_itself(original, tmp_path):
    from packer.spec.errors import OutputError

    with pytest.raises(OutputError):
        repack(original, original, "npy", overwrite=True)
    with pytest.raises(OutputError, match="inside the output"):
        repack(original, original / "inner", "wds")
    assert verify(original) == []


def test_repacking_the_same_output_twice_gives_the_same_bytes(original, tmp_path):
    for name in ("a", "b"):
        repack(original, tmp_path / name, "wds", shard_size=ShardSize(samples=7), workers=2)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert [s[1] for s in samples(tmp_path / "a")] == [s[1] for s in samples(original)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_shard_is_read_from_any_sample_on_without_the_samples_before(tree, tmp_path, fmt):
    out = tmp_path / fmt
    convert(tree, out, ConvertConfig(fmt, SIZES, ShardSize(samples=8), codec=ImageCodec("png")), workers=1)
    m = read_manifest(out)
    layout = SampleLayout.from_manifest(m)
    whole = list(SPECS[fmt].scan(out, m.shards[0], layout))
    for start in (1, 5, 7):
        rest = list(SPECS[fmt].scan(out, m.shards[0], layout, start))
        assert [(s.local, s.key, s.crc32, s.encoded, s.shape) for s in rest] == [
            (s.local, s.key, s.crc32, s.encoded, s.shape) for s in whole[start:]
        ]
    if fmt == "wds":  # without its DALI index (older outputs) the tar is read from its start, the same samples
        entry = m.shards[0]
        older = type(entry)(entry.name, entry.samples, [f for f in entry.files if not f.path.endswith(".idx")])
        assert [s.key for s in SPECS[fmt].scan(out, older, layout, 5)] == [s.key for s in whole[5:]]


def test_repacking_into_small_shards_reads_each_source_sample_once(original, tmp_path, monkeypatch):
    import packer.sources.repack_shard as rs
    from packer.run.worker import write_shard

    reads: list[int] = []
    real = rs.get_format

    class Counting:
        def __init__(self, spec):
            self.spec = spec

        def scan(self, root, shard, layout, start=0):
            for s in self.spec.scan(root, shard, layout, start):
                reads.append(s.local)
                yield s

    class InProcess:  # the shards written here, where the counting scanner is
        workers = 1

        def run(self, jobs, *, progress=None, on_result=None, timeout=None):
            results = []
            for job in jobs:
                results.append(write_shard(job))
                if on_result is not None:
                    on_result(job, results[-1])
            return results

    monkeypatch.setattr(rs, "get_format", lambda name: Counting(real(name)))
    repack(original, tmp_path / "small", "npy", shard_size=ShardSize(samples=1), executor=InProcess())
    once = sorted(local for shard in read_manifest(original).shards for local in range(shard.samples))
    assert sorted(reads) == once  # each sample read once, not once per target shard before it
    assert verify(tmp_path / "small") == []
