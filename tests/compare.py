"""Reading an output's samples back with the stock libraries, checking its files against its manifest, and
comparing two outputs as the converter promises them equal (shared by the pipeline, split and executor tests)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import h5py
import lmdb
import numpy as np
from PIL import Image

from packer.output.report import REPORT_NAME
from packer.spec.manifest import MANIFEST_NAME, Manifest, read_manifest
from packer.spec.shard_names import DALI_INDEX, WIDS_INDEX

Row = tuple[str, int, np.ndarray]
"""One stored sample: (key, label, image)."""


def stored(out: Path, manifest: Manifest) -> list[Row]:
    """(key, label, image) of every stored sample, in dataset order, read with the stock libraries
    (and PIL for jpeg and png images)."""
    codec, mode = manifest.image_codec, manifest.preprocess["mode"]

    def image(data):  # one stored image: .npy bytes, or JPEG/PNG bytes
        if codec == "raw":
            return np.load(io.BytesIO(data))
        pixels = np.asarray(Image.open(io.BytesIO(data)).convert(mode))
        return pixels[:, :, None] if pixels.ndim == 2 else pixels

    rows = []
    for shard in manifest.shards:
        if manifest.format == "npy":
            labels = np.load(out / shard.file(".labels.npy"))
            keys = np.load(out / shard.file(".keys.npy"))
            if codec == "raw" and manifest.fields["image"]["shape"] is None:  # sizes vary: bytes, offsets, shapes
                flat = np.load(out / shard.file(".images.bytes.npy"), mmap_mode="r")
                offsets = np.load(out / shard.file(".images.offsets.npy"))
                shapes = np.load(out / shard.file(".images.shapes.npy"))
                dtype = manifest.fields["image"]["dtype"]
                images = [flat[a:b].view(dtype).reshape(shape) for a, b, shape in zip(offsets, offsets[1:], shapes)]
            elif codec == "raw":
                images = np.load(out / shard.file(".images.npy"), mmap_mode="r")
            else:
                flat = np.load(out / shard.file(".images.bytes.npy"), mmap_mode="r")
                offsets = np.load(out / shard.file(".images.offsets.npy"))
                images = [image(flat[a:b].tobytes()) for a, b in zip(offsets[:-1], offsets[1:])]
            part = [(str(k), int(lab), np.array(im)) for k, lab, im in zip(keys, labels, images)]
        elif manifest.format == "hdf5":
            with h5py.File(out / shard.file(".h5"), "r") as f:
                if "keys_bytes" in f:  # format version 4 on: UTF-8 bytes and offsets
                    o, flat = f["keys_offsets"][:], f["keys_bytes"][:]
                    keys = [flat[a:b].tobytes().decode("utf-8") for a, b in zip(o, o[1:])]
                else:
                    keys = list(f["keys"].asstr()[:]) if len(f["keys"]) else []
                if codec == "raw" and "images_shapes" in f:  # sizes vary: bytes, offsets, shapes
                    o, flat, shapes = f["images_offsets"][:], f["images_bytes"][:], f["images_shapes"][:]
                    dtype = manifest.fields["image"]["dtype"]
                    images = [flat[a:b].view(dtype).reshape(shape) for a, b, shape in zip(o, o[1:], shapes)]
                elif codec == "raw":
                    images = f["images"][:]
                else:
                    offsets = f["images_offsets"][:]
                    images = [image(f["images_bytes"][a:b].tobytes()) for a, b in zip(offsets[:-1], offsets[1:])]
                part = [(k, int(lab), im) for k, lab, im in zip(keys, f["labels"][:], images)]
        elif manifest.format == "lmdb":
            env = lmdb.open(str(out / shard.file(".lmdb")), subdir=False, readonly=True, lock=False)
            with env.begin() as txn:
                n = int(txn.get(b"length"))
                labels = np.load(io.BytesIO(txn.get(b"labels")))
                part = [
                    (txn.get(b"%08d.key" % i).decode(), int(labels[i]), image(txn.get(b"%08d.image" % i)))
                    for i in range(n)
                ]
            env.close()
        else:
            ext = {"raw": "npy", "jpeg": "jpg", "png": "png"}[codec]
            with tarfile.open(out / shard.file(".tar")) as tar:
                members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
            keys = sorted({name.split(".")[0] for name in members})
            part = []
            for k in keys:
                meta = json.loads(members[f"{k}.json"])
                part.append((meta["key"], int(members[f"{k}.cls"]), image(members[f"{k}.{ext}"])))
        assert len(part) == shard.samples
        rows.extend(part)
    return rows


def assert_rows_equal(got: list[Row], want: list[Row]) -> None:
    """The same keys and labels in the same order, and each image of the same dtype and pixels."""
    assert [(k, lab) for k, lab, _ in got] == [(k, lab) for k, lab, _ in want]
    for (k, _, a), (_, _, b) in zip(got, want):
        assert a.dtype == b.dtype and np.array_equal(a, b), k


def check_files(out: Path, manifest: Manifest) -> None:
    """Every file in the manifest exists with its size and SHA-256; a wds output also has each shard's
    DALI index and the wids shard list (format version 7); an output of images, its image hashes;
    nothing else is in the folder."""
    listed = set()
    for shard in manifest.shards:
        assert shard.files
        for f in shard.files:
            data = (out / f.path).read_bytes()
            assert f.bytes == len(data)
            assert f.sha256 == hashlib.sha256(data).hexdigest()
            assert f.path.startswith(shard.name)
            listed.add(f.path)
    of_output = set()
    if manifest.format == "wds":
        assert manifest.format_version == 7
        for shard in manifest.shards:
            lines = (out / shard.file(DALI_INDEX)).read_text(encoding="ascii").splitlines()
            assert lines[0] == f"v1.2 {shard.samples}" and len(lines) == 1 + shard.samples
        index = json.loads((out / WIDS_INDEX).read_text(encoding="utf-8"))
        assert index["__kind__"] == "wids-shard-index-v1" and index["shardlist"] == [
            {"url": s.file(".tar"), "nsamples": s.samples, "filesize": (out / s.file(".tar")).stat().st_size}
            for s in manifest.shards
        ]
        of_output = {WIDS_INDEX}
    if manifest.image_hashes is not None:
        data = (out / manifest.image_hashes["path"]).read_bytes()
        assert manifest.image_hashes["bytes"] == len(data)
        assert manifest.image_hashes["sha256"] == hashlib.sha256(data).hexdigest()
        listed.add(manifest.image_hashes["path"])
    on_disk = {p.name for p in out.iterdir()}
    assert on_disk == listed | of_output | {MANIFEST_NAME, REPORT_NAME}


def files_of(out: Path) -> dict[str, bytes]:
    """Every file of an output folder, by name."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def assert_same_output(a: Path, b: Path) -> None:
    """Byte for byte for npy, hdf5 and wds; for lmdb (whose files may differ in free pages) the
    same samples and the same manifest but for the files' checksums."""
    ma, mb = read_manifest(a), read_manifest(b)
    if ma.format != "lmdb":
        assert files_of(a) == files_of(b)
        return
    assert_rows_equal(stored(b, mb), stored(a, ma))
    assert ma.to_dict() | {"shards": [(s.name, s.samples) for s in ma.shards]} == mb.to_dict() | {
        "shards": [(s.name, s.samples) for s in mb.shards]
    }
