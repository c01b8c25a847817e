"""Damaged or replaced outputs on the read side: a clear packer error, in bounded time, never a bare
library error, a hang, or a short read that looks like the end (issue 25, first cases)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FORMATS, pack_every_format

from packer import PreprocessConfig
from packer.errors import ManifestError
from packer.manifest import read_manifest
from packer.verify import verify
from readers import open_dataset

ROOT = Path(__file__).resolve().parent.parent
PRE = PreprocessConfig(size=(16, 12))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """20 images in 2 shards of 10, in every format."""
    return pack_every_format(tmp_path_factory, {"ant": 10, "bee": 10}, PRE, 10)


def damaged_copy(outputs, fmt: str, tmp_path: Path) -> Path:
    copy = tmp_path / fmt
    shutil.copytree(outputs[fmt], copy, symlinks=True)
    return copy


def read_every_sample(root: Path) -> int:
    ds = open_dataset(root)
    return sum(1 for _ in ds)


def test_a_damaged_first_tar_header_names_the_shard(outputs, tmp_path):
    copy = damaged_copy(outputs, "wds", tmp_path)
    tar = copy / read_manifest(copy).shards[0].files[0].path
    data = bytearray(tar.read_bytes())
    data[148] ^= 0x01  # a digit of the first header's checksum field: tarfile.open fails on it
    tar.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"shard-00000\.tar is not a complete tar file"):
        read_every_sample(copy)


@pytest.mark.parametrize("fmt", ["npy", "hdf5", "lmdb"])
def test_a_shard_shorter_than_recorded_is_an_error_not_the_end(outputs, fmt, tmp_path):
    """The manifest says 12 and 8 samples where the files hold 10 and 10: iterating must not stop
    quietly after 10 samples (an IndexError ends a for loop)."""
    copy = damaged_copy(outputs, fmt, tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["shards"][0]["samples"], manifest["shards"][1]["samples"] = 12, 8
    (copy / "manifest.json").write_text(json.dumps(manifest))
    ds = open_dataset(copy)
    assert len(ds) == 20
    with pytest.raises(ManifestError, match=r"shard-00000\.\S+.*(the output|the shard) is damaged"):
        for _ in ds:
            pass
    with pytest.raises(ManifestError):
        ds[10]
    with pytest.raises(IndexError):  # beyond len(ds) is still the end of the dataset
        ds[20]


def _in_subprocess(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python with a time limit: a hang fails the test instead of the suite."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_shard_file_replaced_by_a_fifo_is_refused_at_once(outputs, fmt, tmp_path):
    copy = damaged_copy(outputs, fmt, tmp_path)
    shard = read_manifest(copy).shards[1]
    target = copy / max(shard.files, key=lambda f: f.bytes).path
    target.unlink()
    os.mkfifo(target)
    read = _in_subprocess(f"from readers import open_dataset\nds = open_dataset({str(copy)!r})\n"
                          "n = sum(1 for _ in ds)")
    assert read.returncode == 1 and "ManifestError" in read.stderr
    assert f"{target.name} is not a regular file" in read.stderr
    checked = _in_subprocess(f"from packer.verify import verify\nfor p in verify({str(copy)!r}): print(p)")
    assert checked.returncode == 0, checked.stderr
    assert f"shard-00001: {target.name} is not a regular file (a FIFO, device or folder)" in checked.stdout


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_shard_file_linked_to_a_copy_outside_the_output_is_refused(outputs, fmt, tmp_path):
    copy = damaged_copy(outputs, fmt, tmp_path)
    shard = read_manifest(copy).shards[0]
    target = copy / max(shard.files, key=lambda f: f.bytes).path
    outside = tmp_path / "elsewhere" / target.name
    outside.parent.mkdir()
    shutil.move(target, outside)
    target.symlink_to(outside)
    with pytest.raises(ManifestError, match="symbolic link to a file outside the output"):
        read_every_sample(copy)
    problems = [str(p) for p in verify(copy)]
    assert f"shard-00000: {target.name} is a symbolic link to a file outside the output" in problems


def test_a_link_that_stays_inside_the_output_is_read(outputs, tmp_path):
    copy = damaged_copy(outputs, "npy", tmp_path)
    shard = read_manifest(copy).shards[0]
    target = copy / shard.files[0].path
    inside = copy / "kept" / target.name
    inside.parent.mkdir()
    shutil.move(target, inside)
    target.symlink_to(inside)
    assert read_every_sample(copy) == 20
