"""Damaged or replaced outputs on the read side: a clear packer error, in bounded time, never a bare
library error, a hang, a crash, or a short read that looks like the end (issue 25)."""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import FORMATS, make_tree, pack_every_format
from helpers import run_python, shard_names

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ShardSize
from packer.output.verify import verify
from packer.spec.errors import ConfigError, ManifestError
from packer.spec.listed_files import sha256_of
from packer.spec.lmdb_pages import structure_crc32
from packer.spec.manifest import read_manifest
from readers import WdsDataset, open_dataset

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
    assert re.fullmatch(r"shard-00000-[0-9a-f]{12}\.tar", tar.name)
    with pytest.raises(
        ManifestError, match=re.escape(f"{tar.name}: the tar header at byte 0 is damaged (its checksum does not match)")
    ):
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
    first = re.escape(manifest["shards"][0]["name"])
    with pytest.raises(ManifestError, match=first + r"\.\S+.*(the output|the shard) is damaged"):
        for _ in ds:
            pass
    with pytest.raises(ManifestError):
        ds[10]
    with pytest.raises(IndexError):  # beyond len(ds) is still the end of the dataset
        ds[20]


def _in_subprocess(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python with a time limit: a hang fails the test instead of the suite."""
    return run_python(code, ROOT, timeout)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_shard_file_replaced_by_a_fifo_is_refused_at_once(outputs, fmt, tmp_path):
    copy = damaged_copy(outputs, fmt, tmp_path)
    shard = read_manifest(copy).shards[1]
    target = copy / max(shard.files, key=lambda f: f.bytes).path
    target.unlink()
    os.mkfifo(target)
    read = _in_subprocess(f"from readers import open_dataset\nds = open_dataset({str(copy)!r})\nn = sum(1 for _ in ds)")
    assert read.returncode == 1 and "ManifestError" in read.stderr
    assert f"{target.name} is not a regular file" in read.stderr
    checked = _in_subprocess(f"from packer.output.verify import verify\nfor p in verify({str(copy)!r}): print(p)")
    assert checked.returncode == 0, checked.stderr
    assert f"{shard.name}: {target.name} is not a regular file (a FIFO, device or folder)" in checked.stdout


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
    assert f"{shard.name}: {target.name} is a symbolic link to a file outside the output" in problems


def test_a_link_that_stays_inside_the_output_is_read(outputs, tmp_path):
    copy = damaged_copy(outputs, "npy", tmp_path)
    shard = read_manifest(copy).shards[0]
    target = copy / shard.files[0].path
    inside = copy / "kept" / target.name
    inside.parent.mkdir()
    shutil.move(target, inside)
    target.symlink_to(inside)
    assert read_every_sample(copy) == 20


# --------------------------------------------------------------------------- HDF5's global heap (case 1)


def as_hdf5_version_1(root: Path) -> None:
    """Rewrite an hdf5 output as packers before format version 4 wrote it: keys as HDF5 strings
    (kept in HDF5's global heap), sizes and SHA-256s in the manifest updated."""
    manifest = json.loads((root / "manifest.json").read_text())
    for shard in manifest["shards"]:
        for entry in shard["files"]:
            path, tmp = root / entry["path"], root / "rewritten.h5"
            with h5py.File(path, "r") as old, h5py.File(tmp, "w", track_order=False) as new:
                for name in old:
                    if not name.startswith("keys_"):
                        old.copy(name, new)
                keys = [bytes(old["keys_bytes"][a:b]).decode() for a, b in itertools.pairwise(old["keys_offsets"][:])]
                new.create_dataset(
                    "keys", data=np.asarray(keys, dtype=object), dtype=h5py.string_dtype("utf-8"), track_times=False
                )
            os.replace(tmp, path)
            entry["bytes"], entry["sha256"] = path.stat().st_size, sha256_of(path)
            entry.pop("structure_crc32", None)  # packers of format version 1 recorded no checksum of the index
    manifest["format_version"] = 1
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_hdf5_shards_keep_their_keys_out_of_the_global_heap(outputs):
    manifest = read_manifest(outputs["hdf5"])
    assert manifest.format_version == 4
    for shard in manifest.shards:
        assert b"GCOL" not in (outputs["hdf5"] / shard.files[0].path).read_bytes()  # no global heap collection
    keys = [meta["key"] for *_, meta in open_dataset(outputs["hdf5"], return_meta=True)]
    assert keys == [f"{c}/img_{i:03d}.png" for c in ("ant", "bee") for i in range(10)]


def test_an_old_hdf5_output_is_read_and_its_damaged_heap_never_hangs(outputs, tmp_path):
    copy = damaged_copy(outputs, "hdf5", tmp_path)
    as_hdf5_version_1(copy)
    keys = [meta["key"] for *_, meta in open_dataset(copy, return_meta=True)]
    assert keys == [f"{c}/img_{i:03d}.png" for c in ("ant", "bee") for i in range(10)] and verify(copy) == []
    first = read_manifest(copy).shards[0].name
    shard = copy / read_manifest(copy).shards[0].files[0].path
    data = bytearray(shard.read_bytes())
    heap = data.index(b"GCOL")  # header 16 bytes; each object: index 2, refs 2, reserved 4, size 8, data to 8s
    third = heap + 16 + 2 * (16 + 16)  # the keys are 15 bytes each: objects of 32 bytes
    assert int.from_bytes(data[third : third + 2], "little") == 3 and data[third + 8] == 15
    data[third + 8] = 0xFF  # a key's length 15 -> 255: libhdf5 loops forever reading the keys
    shard.write_bytes(bytes(data))
    # Verify's clock stands still until the intact shard's result is in its pipe, then moves past the
    # stall: however long a busy machine takes, only the looping shard can be found stalled.
    checked = _in_subprocess(
        f"import os, types, packer.output.verify as v\nv.STALL_SECONDS = 2\ndone = {str(tmp_path / 'intact')!r}\n"
        "check_in_child = v._check_in_child\n"
        "def checked(root, manifest, shard, *args):\n    check_in_child(root, manifest, shard, *args)\n"
        f"    if shard.name != {first!r}:\n        open(done, 'w').close()\n"
        "v._check_in_child = checked\nv.time = types.SimpleNamespace(monotonic=lambda: 100.0 * os.path.exists(done))\n"
        f"for p in v.verify({str(copy)!r}, workers=2): print(p)",
        timeout=120,
    )
    assert checked.returncode == 0, checked.stderr
    assert f"{first}: {first}.h5 has changed" in checked.stdout
    assert f"{first} sample 0: unreadable: the hdf5 library made no progress for 2 s" in checked.stdout
    assert "shard-00001" not in checked.stdout
    # verify=True: the file's SHA-256 is checked before h5py reads anything of it
    read = _in_subprocess(
        f"from readers import open_dataset\nds = open_dataset({str(copy)!r}, return_meta=True, "
        "verify=True)\nn = sum(1 for _ in ds)"
    )
    assert read.returncode == 1 and "its SHA-256 does not match the manifest" in read.stderr


def test_a_stuck_scanner_is_stopped_and_its_shard_reported(outputs):
    """Whatever makes a library loop, verify stops its child and goes on with the next shard."""
    code = (
        "import multiprocessing as mp, time, packer.output.verify as v\nv.STALL_SECONDS = 1\n"
        "v.check_samples = lambda *a, **k: time.sleep(600)\n"
        f"for p in v.verify({str(outputs['npy'])!r}): print(p)\n"
        "print('children left', len(mp.active_children()))"
    )
    checked = _in_subprocess(code, timeout=120)  # a safety net: a child waited for would take 600 s
    assert checked.returncode == 0, checked.stderr
    lines = checked.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == [f"{name} sample 0" for name in shard_names(outputs["npy"])]
    assert "made no progress for 1 s after sample 0 (stopped)" in lines[0]
    assert lines[-1] == "children left 0"  # each stuck child was ended, not left running


def test_a_scanner_stuck_after_some_samples_is_reported_at_the_sample_it_reached(outputs, tmp_path):
    """The child reports its samples every PROGRESS_SECONDS: the stall message still names the sample
    it stopped at, and the progress bar gets every sample finished, not the last report's count."""
    # Verify's clock stands still until every scanner is stuck, then moves a second (the stall) at each
    # reading: however long a busy machine takes to run a scanner up to its samples, none is found
    # stalled before, and a report that reaches verify after the jump is overtaken at the next reading.
    code = (
        f"import itertools, os, time, types, packer.output.verify as v\nv.STALL_SECONDS = 1\n"
        f"stuck_at = {str(tmp_path)!r}\nticks = itertools.count(100)\n"
        "def stuck(root, manifest, shard, progress=None, labels=None, **kwargs):\n"
        "    for _ in range(3):\n        progress(1)\n"
        "    open(os.path.join(stuck_at, shard.name), 'w').close()\n    time.sleep(600)\n"
        f"v.check_samples = stuck\nshards = {len(shard_names(outputs['npy']))}\n"
        "v.time = types.SimpleNamespace(monotonic=lambda: float(next(ticks)) * (len(os.listdir(stuck_at)) == shards))\n"
        f"told = []\nfor p in v.verify({str(outputs['npy'])!r}, progress=told.append, workers=shards): print(p)\n"
        "print('told', sum(told))"
    )
    checked = _in_subprocess(code, timeout=120)  # a safety net for a hang
    assert checked.returncode == 0, checked.stderr
    lines = checked.stdout.splitlines()
    assert "made no progress for 1 s after sample 3 (stopped)" in lines[0], lines
    assert lines[-1] == f"told {3 * len(shard_names(outputs['npy']))}"


# --------------------------------------------------------------------------- LMDB's structure (case 4)


@pytest.fixture(scope="module")
def lmdb_output(tmp_path_factory) -> Path:
    """LMDB shards of 48 x 48 images: each value spans overflow pages, as real images do."""
    return pack_every_format(tmp_path_factory, {"ant": 6, "bee": 6}, PreprocessConfig(size=(48, 48)), 6)["lmdb"]


def page_bytes(path: Path) -> list[int]:
    """Offsets of every byte of the file's meta, branch and leaf pages, found by their headers
    (flags at byte 10: 0x01 branch, 0x02 leaf, 0x08 meta; 0x04 starts a run of overflow pages,
    whose length is at byte 12), tree pages and free ones alike."""
    data = path.read_bytes()
    size = int.from_bytes(data[40:44], "little")
    covered, page = [], 0
    while page * size < len(data):
        at = page * size
        if int.from_bytes(data[at + 10 : at + 12], "little") & 0x04:
            page += int.from_bytes(data[at + 12 : at + 16], "little")
        else:
            covered += range(at, at + size)
            page += 1
    return covered


def test_lmdb_files_record_the_checksum_of_their_structure(lmdb_output, outputs):
    manifest = read_manifest(lmdb_output)
    for shard in manifest.shards:
        (entry,) = shard.files
        assert entry.structure_crc32 == structure_crc32(lmdb_output / entry.path)
    npy = read_manifest(outputs["npy"])
    assert all(f.structure_crc32 is None for s in npy.shards for f in s.files)
    assert "structure_crc32" not in (outputs["npy"] / "manifest.json").read_text()


def test_damaged_lmdb_structure_is_refused_before_lmdb_can_crash_on_it(lmdb_output, tmp_path):
    """Bytes of the pages LMDB follows to find a record, flipped at fixed seeds: each copy is
    either refused with a ManifestError at its shard's open, or read exactly as the intact one (a
    flip in a free page left by an earlier transaction, which no reader touches), in a process
    that must survive them all. A flipped byte of an image's own pixels is left to verify, and to
    the sample CRC-32 it checks."""
    entry = read_manifest(lmdb_output).shards[1].files[0]
    original = (lmdb_output / entry.path).read_bytes()
    covered = page_bytes(lmdb_output / entry.path)
    assert len(covered) < len(original) / 2  # the images' own bytes lie in overflow pages
    rng = random.Random(25)
    copies = []
    for n in range(24):
        copy = tmp_path / f"copy{n}"
        shutil.copytree(lmdb_output, copy)
        data = bytearray(original)
        data[rng.choice(covered)] ^= rng.randrange(1, 256)
        (copy / entry.path).write_bytes(bytes(data))
        copies.append(str(copy))
    code = (
        "import torch\nfrom packer.spec.errors import ManifestError\nfrom readers import open_dataset\n"
        f"intact = open_dataset({str(lmdb_output)!r})\n"
        f"for root in {copies!r}:\n"
        "    ds = open_dataset(root)\n"
        "    assert ds[5][1] == 0\n"  # shard 0 is intact and read
        "    try:\n"
        "        same = all(torch.equal(ds[i][0], intact[i][0]) and ds[i][1] == intact[i][1]\n"
        "                   for i in range(6, 12))\n"
        "        print('same' if same else 'DIFFERENT')\n"
        "    except ManifestError as e:\n        print('refused' if 'structure checksum' in str(e) else e)\n"
    )
    read = _in_subprocess(code, timeout=120)
    assert read.returncode == 0, read.stderr  # a SIGBUS would be -7
    outcomes = read.stdout.split()
    assert set(outcomes) <= {"refused", "same"} and len(outcomes) == len(copies), read.stdout
    assert outcomes.count("refused") >= len(copies) // 2, outcomes
    pixels = bytearray(original)
    outside = next(i for i in range(len(original)) if i not in set(covered))
    pixels[outside] ^= 0x01
    (tmp_path / "pixels.lmdb").write_bytes(bytes(pixels))
    assert structure_crc32(tmp_path / "pixels.lmdb") == entry.structure_crc32


def point_first_value_past_the_end(path: Path) -> None:
    """Damage an LMDB file as flipped bytes can: both meta pages claim 64 pages more than the file
    has (``mm_last_pg``, at byte 136 of a meta page), and the first leaf node whose value lies in
    overflow pages (F_BIGDATA) points at one of them."""
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[40:44], "little")
    pages = len(data) // size
    for meta in (0, size):
        data[meta + 136 : meta + 144] = (pages + 64).to_bytes(8, "little")
    for at in range(0, len(data), size):
        if not int.from_bytes(data[at + 10 : at + 12], "little") & 0x02:  # P_LEAF
            continue
        lower = int.from_bytes(data[at + 12 : at + 14], "little")
        for ptr in range(at + 16, at + lower, 2):
            node = at + int.from_bytes(data[ptr : ptr + 2], "little")
            flags, key_size = (int.from_bytes(data[node + k : node + k + 2], "little") for k in (4, 6))
            if flags & 0x01:  # F_BIGDATA: the value is the page number of its overflow run
                data[node + 8 + key_size : node + 16 + key_size] = (pages + 32).to_bytes(8, "little")
                path.write_bytes(bytes(data))
                return
    raise AssertionError(f"{path} has no value in overflow pages")


def test_an_lmdb_page_number_past_the_file_is_refused_not_a_sigbus(lmdb_output, tmp_path):
    """The issue's crash, reproduced: without the structure check, LMDB reads the page past the end
    of its file and the process dies of SIGBUS; with it, the shard is refused and the process lives."""
    copy = tmp_path / "copy"
    shutil.copytree(lmdb_output, copy)
    damaged = copy / read_manifest(copy).shards[1].files[0].path
    point_first_value_past_the_end(damaged)
    read = f"from readers import open_dataset\nds = open_dataset({str(copy)!r})\nprint(ds[5][1], flush=True)\nds[6]"
    unchecked = _in_subprocess(
        "import readers.datasets.output_files\nreaders.datasets.output_files.check_file = lambda *a: None\n" + read
    )
    assert unchecked.returncode == -signal.SIGBUS and unchecked.stdout.split() == ["0"]
    checked = _in_subprocess(read)
    assert checked.returncode == 1 and checked.stdout.split() == ["0"]
    assert re.fullmatch(r"shard-00001-[0-9a-f]{12}\.lmdb", damaged.name)
    assert f"{damaged.name} is damaged where its library looks up records" in checked.stderr
    assert "ManifestError" in checked.stderr and "Traceback" in checked.stderr  # raised, not a crash


# --------------------------------------------------------------------------- verify=True


def test_verify_true_checks_every_file_before_its_first_read(outputs, tmp_path):
    copy = damaged_copy(outputs, "npy", tmp_path)
    images = copy / read_manifest(copy).shards[1].file(".images.npy")
    data = bytearray(images.read_bytes())
    data[-1] ^= 0x01  # the last pixel byte: a plain read returns the damaged pixel
    images.write_bytes(bytes(data))
    assert read_every_sample(copy) == 20
    ds = open_dataset(copy, verify=True)
    assert ds[9][1] == 0  # shard 0 is intact
    with pytest.raises(ManifestError, match=re.escape(f"{images.name} has changed: its SHA-256 does not match")):
        ds[10]
    for fmt in FORMATS:  # intact outputs read the same with it, twice (checked once per process)
        plain = [label for _, label in open_dataset(outputs[fmt])]
        checked = open_dataset(outputs[fmt], verify=True)
        assert [label for _, label in checked] == [label for _, label in checked] == plain
    with pytest.raises(ConfigError, match="streamed shards are always checked"):
        WdsDataset("http://127.0.0.1:9/out", verify=True)  # refused before anything is fetched


# --------------------------------------------------------------------------- a replaced output (case 7)


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_output_replaced_under_a_reader_is_an_error_not_a_mix(fmt, tmp_path):
    """A reader keeps the shards it has open, of the output it opened, and refuses to open a shard
    of the output that ``--overwrite`` put in its place (same layout, other pixels and labels); a
    dataset opened after it reads the new output, beside the old one."""
    first, second = tmp_path / "first", tmp_path / "second"
    make_tree(first, {"ant": 10, "bee": 10})
    make_tree(second, {"ant": 15, "bee": 5}, size=(80, 40))  # shard 1: five ants, then five bees
    out = tmp_path / "out"
    config = ConvertConfig(fmt, PRE, ShardSize(samples=10))
    convert(first, out, config, workers=1)
    ds = open_dataset(out)
    if fmt == "wds":
        stream = iter(ds)
        before = [next(stream) for _ in range(10)]  # shard 0, still open
        assert [label for _, label in before] == [0] * 10
        convert(second, out, config, workers=1, overwrite=True)
        with pytest.raises(ManifestError, match="was replaced or removed after this dataset was opened"):
            list(stream)
        return
    old = ds[0][0].clone()
    ds.handles.get(1, ds)  # shard 1 opened (as lengths() opens shards), none of it read yet
    convert(second, out, config, workers=1, overwrite=True)
    new = open_dataset(out)
    assert [new[i][1] for i in range(10, 20)] == [0] * 5 + [1] * 5 and not torch.equal(new[0][0], old)
    assert torch.equal(ds[0][0], old)  # the shards open stay the opened output's, after another dataset
    assert [ds[i][1] for i in range(10, 20)] == [1] * 10  # opened the new one: labels too
    ds.close()
    with pytest.raises(ManifestError, match="was replaced or removed after this dataset was opened"):
        ds[10]


def test_a_manifest_with_a_new_inode_but_the_same_bytes_is_not_a_replacement(outputs, tmp_path):
    """A remount (NFS, FUSE) can give the manifest a new inode or time without any change to the
    output: the reader compares its bytes before calling the output replaced."""
    copy = damaged_copy(outputs, "npy", tmp_path)
    ds = open_dataset(copy)
    assert ds[0][1] == 0
    manifest = copy / "manifest.json"
    shutil.copy(manifest, tmp_path / "same.json")
    os.replace(tmp_path / "same.json", manifest)  # a new inode, the same bytes
    os.utime(manifest, ns=(1, 1))
    assert ds[15][1] == 1
    manifest.write_text(manifest.read_text().replace('"ant"', '"aunt"'))  # other bytes: replaced
    with pytest.raises(ManifestError, match="was replaced or removed"):
        ds.close()
        ds[15]


def test_the_lmdb_structure_walk_stays_bounded_on_a_crafted_tree(tmp_path, monkeypatch):
    """A crafted file whose every page is a branch pointing at 500 others: a walk that queued each
    reference would take pages x nodes steps and as much memory; it stops at the first page met
    twice, or once more references than pages were queued."""
    import packer.spec.lmdb_pages as lmdb_pages

    page, pages, nodes = 4096, 512, 500
    data = bytearray(page * pages)
    for meta in (0, 1):
        at = meta * page
        data[at + 10 : at + 12] = (0x08).to_bytes(2, "little")  # P_META
        data[at + 40 : at + 44] = page.to_bytes(4, "little")
        data[at + 128 : at + 136] = (2).to_bytes(8, "little")  # the main tree's root: page 2
    for number in range(2, pages):
        at = number * page
        data[at + 10 : at + 12] = (0x01).to_bytes(2, "little")  # P_BRANCH
        data[at + 12 : at + 14] = (16 + 2 * nodes).to_bytes(2, "little")
        for i in range(nodes):
            node = 16 + 2 * nodes + 6 * i
            data[at + 16 + 2 * i : at + 18 + 2 * i] = node.to_bytes(2, "little")
            data[at + node : at + node + 2] = (2 + (number + i) % (pages - 2)).to_bytes(2, "little")
    path = tmp_path / "crafted.lmdb"
    path.write_bytes(bytes(data))
    queued = []
    children = lmdb_pages._children
    monkeypatch.setattr(lmdb_pages, "_children", lambda *a: queued.append(len(found := children(*a))) or found)
    structure_crc32(path)
    assert queued[0] == nodes and sum(queued) <= pages + nodes  # not (pages - 2) * nodes


def test_an_encoded_image_of_another_size_is_refused_by_every_read_path(tmp_path):
    """A JPEG of the wrong size in a fixed-size output (same byte length, so no size check sees it)."""
    import io

    from PIL import Image

    from packer.config import ImageCodec
    from packer.spec.shard_names import npy_varlen_suffixes

    src = tmp_path / "src"
    make_tree(src, {"a": 3})
    out = tmp_path / "out"
    convert(
        src,
        out,
        ConvertConfig("npy", PreprocessConfig(size=(40, 32)), ShardSize(samples=3), codec=ImageCodec("jpeg")),
        workers=1,
    )
    data_name, offsets_name = npy_varlen_suffixes("images")
    shard = read_manifest(out).shards[0]
    flat = np.load(out / shard.file(data_name))
    offsets = np.load(out / shard.file(offsets_name))
    buf = io.BytesIO()
    Image.new("RGB", (12, 10), (200, 10, 10)).save(buf, "JPEG", quality=50)
    small = buf.getvalue()
    length = int(offsets[2] - offsets[1])
    assert len(small) <= length
    flat[offsets[1] : offsets[2]] = np.frombuffer(small + bytes(length - len(small)), np.uint8)
    np.save(out / shard.file(data_name), flat)
    manifest = json.loads((out / "manifest.json").read_text())
    for f in manifest["shards"][0]["files"]:  # make the shard's checksums match, as an attacker would
        if f["path"].endswith(data_name):
            f["sha256"] = sha256_of(out / f["path"])
    (out / "manifest.json").write_text(json.dumps(manifest))
    ds = open_dataset(out)
    with pytest.raises(ManifestError, match="stored image"):
        ds[1]
    with pytest.raises(ManifestError, match="stored image"):
        ds.__getitems__([0, 1])
    ds.return_meta = True
    with pytest.raises(ManifestError, match="stored image"):
        ds[1]
