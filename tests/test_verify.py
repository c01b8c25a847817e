"""packer verify: every damage is found and named by shard, file and sample."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import lmdb
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FORMATS, make_tree, pack_every_format
from helpers import FakeClock, wait_for

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import ImageCodec, ShardSize
from packer.output.verify import Problem, verify
from packer.spec.codecs import encode_npy
from packer.spec.errors import ManifestError
from packer.spec.manifest import read_manifest
from packer.spec.registry import get_format
from packer.spec.sample_layout import SampleLayout


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    return pack_every_format(tmp_path_factory, {"a": 6, "b": 6}, PreprocessConfig(size=(32, 24)), 6)


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
    result = CliRunner().invoke(cli, ["verify", str(outputs[fmt]), "-q", "-j", "1"])
    assert result.exit_code == 0 and "is intact: 12 samples in 2 shard(s)" in result.output


@pytest.mark.parametrize("every", [0.0, 60.0])
def test_progress_counts_every_sample_once_however_often_it_is_sent(outputs, monkeypatch, every):
    """A shard's checking process sends its count every PROGRESS_SECONDS (a message a sample cost more
    than the check): the counts still add up to the samples, the last ones sent with the shard's end."""
    import packer.output.verify as v

    monkeypatch.setattr(v, "PROGRESS_SECONDS", every)
    told: list[int] = []
    assert verify(outputs["npy"], progress=told.append) == []
    assert sum(told) == 12 and len(told) == (12 if every == 0 else 2)


@pytest.mark.parametrize("workers", [2, 1])
def test_shards_are_checked_side_by_side_and_reported_in_shard_order(outputs, tmp_path, monkeypatch, workers):
    """Up to ``workers`` shards have their samples checked at once, each in its own process; the
    problems still come shard by shard in the manifest's order, whichever shard finishes first."""
    import packer.output.verify as v

    names = [s.name for s in read_manifest(outputs["npy"]).shards]
    wait = 30.0 if workers == 2 else 1.0  # one at a time: the first shard waits for the second in vain

    def meet(root, manifest, shard, progress=None, labels=None, intact=False):
        (tmp_path / shard.name).touch()
        other = tmp_path / names[1 - names.index(shard.name)]
        deadline = time.monotonic() + wait
        while not other.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        if shard.name == names[0]:
            time.sleep(0.3)  # the first shard finishes last
        return [Problem(shard.name, "met" if other.exists() else "alone")]

    monkeypatch.setattr(v, "check_samples", meet)
    found = [(p.shard, p.message) for p in verify(outputs["npy"], workers=workers)]
    first = "met" if workers == 2 else "alone"
    assert found[:2] == [(names[0], first), (names[1], "met")]


def test_an_interrupted_verify_leaves_no_checking_process(outputs, monkeypatch):
    import multiprocessing as mp
    import multiprocessing.context
    import signal

    import packer.output.verify as v

    def stuck(root, manifest, shard, progress=None, labels=None, intact=False):
        progress(1)
        time.sleep(600)

    def interrupt(n: int) -> None:
        raise KeyboardInterrupt

    started = []
    start = mp.context.ForkProcess.start

    def recorded(self) -> None:
        start(self)
        started.append(self)

    monkeypatch.setattr(mp.context.ForkProcess, "start", recorded)
    monkeypatch.setattr(v, "PROGRESS_SECONDS", 0.0)
    monkeypatch.setattr(v, "check_samples", stuck)
    with pytest.raises(KeyboardInterrupt):
        verify(outputs["npy"], progress=interrupt, workers=2)
    # Killed, not waited for: a checking process let run would end with 0 after its 600 s.
    assert started and [p.exitcode for p in started] == [-signal.SIGKILL] * len(started)
    assert not mp.active_children()


@pytest.mark.parametrize("workers", [1, 4])
def test_an_interrupted_verify_leaves_no_padded_copy(outputs, tmp_path, monkeypatch, workers):
    """Truncated LMDB shards are scanned from padded copies in temporary folders: an interrupt, even
    while verify waits for a free child, removes them at once, not when the exception is collected."""
    import tempfile

    copy = tmp_path / "lmdb"
    shutil.copytree(outputs["lmdb"], copy)
    for shard in read_manifest(copy).shards:
        path = copy / shard.files[0].path
        path.write_bytes(path.read_bytes()[:-1])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def interrupt(n: int) -> None:
        raise KeyboardInterrupt

    try:
        verify(copy, progress=interrupt, workers=workers)
    except KeyboardInterrupt:
        assert list(scratch.iterdir()) == []
    else:
        raise AssertionError("the progress callback's interrupt was lost")


def test_a_busy_parent_does_not_take_a_childs_queued_word_for_a_stall(outputs, tmp_path, monkeypatch):
    """A progress callback that blocks longer than STALL_SECONDS once (a paused terminal): the other
    shard's reports wait in its pipe, and it is read, not killed as stalled (the review's finding).
    Verify runs on a fake clock that only the callback moves: a child that a busy machine keeps
    waiting is never taken for stalled, and the callback's block is the event it waits for."""
    import packer
    import packer.output.verify as v

    clock = FakeClock()
    monkeypatch.setattr(v, "time", SimpleNamespace(monotonic=clock))  # verify's clock, its children's too
    monkeypatch.setattr(v, "STALL_SECONDS", 1.0)
    monkeypatch.setattr(v, "PROGRESS_SECONDS", 0.0)
    names = [s.name for s in read_manifest(outputs["npy"]).shards]
    check = v.check_samples

    def checked(root, manifest, shard, progress=None, labels=None, intact=False):
        found = check(root, manifest, shard, progress, labels, intact=intact)
        (tmp_path / shard.name).touch()  # its reports are in its pipe
        return found

    blocked = []

    def busy(n: int) -> None:
        if not blocked:
            blocked.append(n)
            wait_for(lambda: all((tmp_path / name).exists() for name in names), "the shards were never checked")
            clock.advance(1.5)  # longer than STALL_SECONDS, every child's reports waiting in its pipe

    monkeypatch.setattr(v, "check_samples", checked)
    assert verify(outputs["npy"], progress=busy, workers=2) == []
    assert blocked and len(names) == 2
    assert packer.verify(outputs["npy"], workers=1) == []  # the module called as the function takes workers too


def test_verify_in_a_process_that_reads_the_same_lmdb_output(outputs):
    # py-lmdb refuses to open a file twice in one process, and verify's forked children inherit the
    # reader's record of it: verify used to fail there on an intact output.
    from readers import open_dataset

    ds = open_dataset(outputs["lmdb"])
    assert ds[0][0].shape == (3, 24, 32) and ds[11][1] == 1  # every shard opened by the reader
    assert verify(outputs["lmdb"]) == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_flipped_byte_is_traced_to_its_sample(outputs, fmt, tmp_path):
    copy, path = damaged_copy(outputs, fmt, tmp_path)
    data = bytearray(path.read_bytes())
    data[int(len(data) * 0.6)] ^= 0x01
    path.write_bytes(bytes(data))
    second = read_manifest(copy).shards[1].name  # published as shard-00001-TAG
    problems = verify(copy)
    assert problems[0].shard == second and "SHA-256 does not match" in problems[0].message
    assert path.name in problems[0].message
    damaged = [p for p in problems if p.sample is not None]
    assert damaged and all(p.shard == second for p in damaged)
    assert damaged[0].key.startswith("b/") and "CRC-32" in damaged[0].message
    result = CliRunner().invoke(cli, ["verify", str(copy), "-q"])
    assert result.exit_code == 1 and f"{second} sample {damaged[0].sample}" in result.output


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_shard_is_named_with_where_it_breaks(outputs, fmt, tmp_path):
    copy, path = damaged_copy(outputs, fmt, tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    second = read_manifest(copy).shards[1].name
    problems = verify(copy)
    assert problems[0].shard == second and "truncated" in problems[0].message
    later = [p for p in problems[1:] if p.sample is not None]
    assert later and later[0].shard == second  # the first sample that could not be read back


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


# --------------------------------------------------------------------------- encoded images (jpeg, png)

ENCODED = [(fmt, codec) for fmt in FORMATS for codec in ("jpeg", "png")]


@pytest.fixture(scope="module")
def encoded_outputs(tmp_path_factory) -> dict[tuple[str, str], Path]:
    src = tmp_path_factory.mktemp("src") / "images"
    make_tree(src, {"a": 6, "b": 6})
    out = tmp_path_factory.mktemp("encoded")
    for fmt, codec in ENCODED:
        config = ConvertConfig(fmt, PreprocessConfig(size=(32, 24)), ShardSize(samples=6), codec=ImageCodec(codec))
        convert(src, out / f"{fmt}-{codec}", config, workers=2)
    return {(fmt, codec): out / f"{fmt}-{codec}" for fmt, codec in ENCODED}


@pytest.mark.parametrize("fmt,codec", ENCODED)
def test_intact_encoded_output_verifies(encoded_outputs, fmt, codec):
    assert verify(encoded_outputs[fmt, codec]) == []


@pytest.mark.parametrize("fmt,codec", ENCODED)
def test_flipped_byte_inside_an_encoded_image_is_traced_to_its_sample(encoded_outputs, fmt, codec, tmp_path):
    copy = tmp_path / fmt
    shutil.copytree(encoded_outputs[fmt, codec], copy)
    manifest = read_manifest(copy)
    shard, layout = manifest.shards[1], SampleLayout.from_manifest(manifest)
    target = [s for s in get_format(fmt).scan(copy, shard, layout) if s.local == 2][0]
    path = copy / max(shard.files, key=lambda f: f.bytes).path
    data = bytearray(path.read_bytes())
    at = data.find(target.encoded)
    assert at >= 0 and data.find(target.encoded, at + 1) < 0  # the image's bytes lie in the file once, whole
    data[at + len(target.encoded) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    problems = verify(copy)
    assert "SHA-256 does not match" in problems[0].message
    damaged = [p for p in problems if p.sample is not None]
    assert [(p.shard, p.sample, p.key) for p in damaged] == [(shard.name, 2, target.key)]
    assert damaged[0].message == f"{codec} image bytes do not match their stored CRC-32 (damaged)"
    result = CliRunner().invoke(cli, ["verify", str(copy), "-q"])
    assert result.exit_code == 1 and f"{shard.name} sample 2 ({target.key})" in result.output


@pytest.mark.parametrize("fmt", FORMATS)
def test_shard_cut_inside_an_encoded_image_is_named_with_where_it_breaks(encoded_outputs, fmt, tmp_path):
    copy = tmp_path / fmt
    shutil.copytree(encoded_outputs[fmt, "png"], copy)
    manifest = read_manifest(copy)
    shard, layout = manifest.shards[1], SampleLayout.from_manifest(manifest)
    target = [s for s in get_format(fmt).scan(copy, shard, layout) if s.local == 3][0]
    path = copy / max(shard.files, key=lambda f: f.bytes).path
    data = path.read_bytes()
    path.write_bytes(data[: data.find(target.encoded) + len(target.encoded) // 2])
    problems = verify(copy)
    assert problems[0].shard == shard.name and "truncated" in problems[0].message
    later = [p for p in problems[1:] if p.sample is not None]
    # LMDB writes its B-tree pages after the values: a cut file loses the index of every sample.
    assert later and later[0].shard == shard.name and later[0].sample == (0 if fmt == "lmdb" else 3)


def test_encoded_image_with_a_matching_crc_that_does_not_decode_is_named(encoded_outputs, tmp_path):
    """A writer bug, not disk damage: bytes that are not a PNG but carry their own CRC-32."""
    copy = tmp_path / "lmdb"
    shutil.copytree(encoded_outputs["lmdb", "png"], copy)
    shard = read_manifest(copy).shards[0]
    env = lmdb.open(str(copy / shard.files[0].path), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        crcs = np.load(io.BytesIO(txn.get(b"crc32")))
        crcs[1] = zlib.crc32(b"not a png")
        txn.put(b"00000001.image", b"not a png")
        txn.put(b"crc32", encode_npy(crcs))
    env.close()
    found = [p for p in verify(copy) if p.sample is not None]
    assert [(p.sample, p.message.split(":")[0]) for p in found] == [(1, "image does not decode as png")]


def test_an_lmdb_lock_file_left_by_stock_tools_is_not_a_problem_but_other_files_are(outputs, tmp_path):
    copy = tmp_path / "lmdb"
    shutil.copytree(outputs["lmdb"], copy)
    first = copy / read_manifest(copy).shards[0].files[0].path
    env = lmdb.open(str(first), subdir=False, readonly=True)  # LMDB's defaults: it makes NAME.lmdb-lock
    with env.begin() as txn:
        assert txn.get(b"length") is not None
    env.close()
    assert (copy / f"{first.name}-lock").is_file()
    assert verify(copy) == []
    (copy / "stray.bin").write_bytes(b"x")
    assert [p.message for p in verify(copy)] == ["stray.bin is not listed in the manifest"]


@pytest.mark.parametrize("first", ["import packer.output.verify", "from packer import verify"])
def test_packer_verify_is_callable_whichever_way_it_was_imported_first(first, tmp_path):
    """``from packer import verify`` names the module once ``packer.verify`` was imported (Python binds
    a submodule to its package): it must verify all the same, and the module keep its names."""
    code = (
        f"{first}\nfrom packer import verify\nimport packer.output.verify as v\n"
        "from packer.spec.errors import ManifestError\n"
        f"try:\n    verify({str(tmp_path / 'none')!r})\n"
        "except ManifestError as e:\n    print('not a folder' in str(e))\n"
        "print(callable(v.verify), v.STALL_SECONDS > 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True"]
