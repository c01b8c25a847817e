"""packer verify: every damage is found and named by shard, file and sample."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import FORMATS, make_tree

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import ShardSize
from packer.errors import ManifestError
from packer.manifest import read_manifest
from packer.verify import verify


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    src = tmp_path_factory.mktemp("src") / "images"
    make_tree(src, {"a": 6, "b": 6})
    out = tmp_path_factory.mktemp("out")
    for fmt in FORMATS:
        convert(src, out / fmt, ConvertConfig(fmt, PreprocessConfig(size=(32, 24)), ShardSize(samples=6)), workers=2)
    return {fmt: out / fmt for fmt in FORMATS}


def damaged_copy(outputs, fmt, tmp_path) -> tuple[Path, Path]:
    copy = tmp_path / fmt
    shutil.copytree(outputs[fmt], copy)
    shard = read_manifest(copy).shards[1]
    biggest = max(shard.files, key=lambda f: f.bytes)
    return copy, copy / biggest.path


@pytest.mark.parametrize("fmt", FORMATS)
def test_intact_output_verifies(outputs, fmt):
    assert verify(outputs[fmt]) == []
    result = CliRunner().invoke(cli, ["verify", str(outputs[fmt]), "-q"])
    assert result.exit_code == 0 and "is intact: 12 samples in 2 shard(s)" in result.output


@pytest.mark.parametrize("fmt", FORMATS)
def test_flipped_byte_is_traced_to_its_sample(outputs, fmt, tmp_path):
    copy, path = damaged_copy(outputs, fmt, tmp_path)
    data = bytearray(path.read_bytes())
    data[int(len(data) * 0.6)] ^= 0x01
    path.write_bytes(bytes(data))
    problems = verify(copy)
    assert problems[0].shard == "shard-00001" and "SHA-256 does not match" in problems[0].message
    assert path.name in problems[0].message
    damaged = [p for p in problems if p.sample is not None]
    assert damaged and all(p.shard == "shard-00001" for p in damaged)
    assert damaged[0].key.startswith("b/") and "CRC-32" in damaged[0].message
    result = CliRunner().invoke(cli, ["verify", str(copy), "-q"])
    assert result.exit_code == 1 and f"shard-00001 sample {damaged[0].sample}" in result.output


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_shard_is_named_with_where_it_breaks(outputs, fmt, tmp_path):
    copy, path = damaged_copy(outputs, fmt, tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    problems = verify(copy)
    assert problems[0].shard == "shard-00001" and "truncated" in problems[0].message
    later = [p for p in problems[1:] if p.sample is not None]
    assert later and later[0].shard == "shard-00001"  # the first sample that could not be read back


@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_file_is_named(outputs, fmt, tmp_path):
    copy, path = damaged_copy(outputs, fmt, tmp_path)
    path.unlink()
    problems = verify(copy)
    assert problems[0].message == f"{path.name} is missing"


def test_verify_refuses_what_is_not_an_output(tmp_path):
    with pytest.raises(ManifestError):
        verify(tmp_path)
    result = CliRunner().invoke(cli, ["verify", str(tmp_path)])
    assert result.exit_code == 1 and "no manifest.json" in result.output
