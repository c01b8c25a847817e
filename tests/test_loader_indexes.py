"""Other loaders read packer's tar shards: DALI's wds2idx index per shard, wids' shard list, names no cache confuses."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import wids
from conftest import make_tree, write_image
from helpers import shard_file
from PIL import Image

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ImageCodec, ShardSize
from packer.output.verify import verify
from packer.spec.manifest import read_manifest

PRE = PreprocessConfig(size=(16, 12))


def tar_members(path: Path) -> list[tuple[str, int, int, str]]:
    """(extension after the first dot, data offset, size, name) of every file member, as tarfile finds them."""
    with tarfile.open(path) as tar:
        return [(m.name.partition(".")[2], m.offset_data, m.size, m.name) for m in tar if m.isfile()]


def dali_index(path: Path) -> tuple[str, list[list[tuple[str, int, int, str]]]]:
    """The header line and each sample's (ext, offset, size, name) components of a wds2idx index."""
    lines = path.read_text(encoding="ascii").splitlines()
    samples = []
    for line in lines[1:]:
        parts = line.split(" ")
        assert len(parts) % 4 == 0
        samples.append(
            [(parts[i], int(parts[i + 1]), int(parts[i + 2]), parts[i + 3]) for i in range(0, len(parts), 4)]
        )
    return lines[0], samples


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src") / "images"
    make_tree(src, {"ant": 4, "bee": 3, "cat": 5})
    return src


@pytest.mark.parametrize("codec", ["raw", "jpeg"])
def test_each_tar_has_the_index_dali_s_wds2idx_would_make(tree, tmp_path, codec):
    out = tmp_path / "wds"
    convert(tree, out, ConvertConfig("wds", PRE, ShardSize(samples=5), codec=ImageCodec(codec)), workers=1)
    m = read_manifest(out)
    assert m.format_version == 7
    for n, shard in enumerate(m.shards):
        header, samples = dali_index(shard_file(out, n, ".idx"))
        assert header == f"v1.2 {shard.samples}" and len(samples) == shard.samples
        members = tar_members(shard_file(out, n, ".tar"))
        assert [c for sample in samples for c in sample] == members
        assert {len({name.split(".")[0] for *_, name in sample}) for sample in samples} == {1}  # one key a line
        data = shard_file(out, n, ".tar").read_bytes()
        ext, offset, size, _ = samples[0][0]
        assert (
            ext == "cls"
            and data[offset : offset + size]
            == str(json.loads(data[samples[0][1][1] :][: samples[0][1][2]])["label"]).encode()
        )
    assert verify(out) == []


def test_wids_reads_every_sample_from_the_shard_list(tree, tmp_path):
    out = tmp_path / "wds"
    convert(tree, out, ConvertConfig("wds", PRE, ShardSize(samples=5), codec=ImageCodec("png")), workers=1)
    m = read_manifest(out)
    listed = json.loads((out / "shardindex.json").read_text())
    assert listed["wids_version"] == 1 and [s["nsamples"] for s in listed["shardlist"]] == [5, 5, 2]
    ds = wids.ShardListDataset(str(out / "shardindex.json"), cache_dir=str(tmp_path / "cache"), transformations=[])
    assert len(ds) == m.samples == 12
    keys = [json.loads(ds[i][".json"].read())["key"] for i in range(len(ds))]
    assert keys == sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*.png"))
    labels = [int(ds[i][".cls"].read()) for i in range(len(ds))]
    assert labels == [0] * 4 + [1] * 3 + [2] * 5
    first = np.asarray(Image.open(ds[0][".png"]))
    assert first.shape == (12, 16, 3)


def test_a_shared_cache_never_mixes_two_outputs(tmp_path):
    # wids with one cache_dir caches a shard by its file name: two outputs named alike came back as the first.
    outs = []
    for n in range(2):
        src = tmp_path / f"src{n}"
        for i in range(3):
            write_image(src / "a" / f"{i}.png", (20, 20), seed=10 * n + i)
        outs.append(tmp_path / f"out{n}")
        convert(src, outs[-1], ConvertConfig("wds", PRE), workers=1)
    names = [{s.name for s in read_manifest(o).shards} for o in outs]
    assert names[0].isdisjoint(names[1])
    cache = tmp_path / "cache"
    crcs = []
    for o in outs:
        ds = wids.ShardListDataset(str(o / "shardindex.json"), cache_dir=str(cache), transformations=[])
        crcs.append([json.loads(ds[i][".json"].read())["crc32"] for i in range(len(ds))])
    assert crcs[0] != crcs[1]


def test_equal_conversions_give_equal_names_and_bytes(tree, tmp_path):
    for name in ("a", "b"):
        convert(tree, tmp_path / name, ConvertConfig("wds", PRE, ShardSize(samples=5)), workers=2)
    a, b = (sorted(p.name for p in (tmp_path / n).iterdir()) for n in ("a", "b"))
    assert a == b
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in a)


def test_no_empty_tar_is_published(tmp_path):
    src = tmp_path / "src"
    write_image(src / "a" / "1.png", (20, 20))
    (src / "b").mkdir()
    (src / "b" / "2.png").write_bytes(b"")
    (src / "b" / "3.png").write_bytes(b"junk")
    write_image(src / "c" / "4.png", (20, 20), seed=2)
    out = tmp_path / "out"
    convert(src, out, ConvertConfig("wds", PRE, ShardSize(samples=1)), workers=1)
    m = read_manifest(out)
    assert [s.samples for s in m.shards] == [1, 1]
    assert [s.name.rsplit("-", 1)[0] for s in m.shards] == ["shard-00000", "shard-00001"]
    assert len(list(out.glob("*.tar"))) == 2 and len(m.skipped) == 2
    assert [s["nsamples"] for s in json.loads((out / "shardindex.json").read_text())["shardlist"]] == [1, 1]
    assert verify(out) == []


def test_verify_finds_a_shard_list_that_no_longer_matches(tree, tmp_path):
    out = tmp_path / "wds"
    convert(tree, out, ConvertConfig("wds", PRE, ShardSize(samples=5)), workers=1)
    listed = json.loads((out / "shardindex.json").read_text())
    listed["shardlist"][0]["nsamples"] = 4
    (out / "shardindex.json").write_text(json.dumps(listed))
    assert [str(p) for p in verify(out)] == [
        "output: shardindex.json does not match the manifest; it was changed since packer wrote it (other loaders "
        "would read the wrong shards or counts)"
    ]
    (out / "shardindex.json").unlink()
    assert "shardindex.json is missing" in str(verify(out)[0])
