"""Readers: exact pixels back, the same sample from every format, DataLoader workers, pickling."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FORMATS
from helpers import shard_file
from torch.utils.data import ConcatDataset, DataLoader, IterableDataset

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ImageCodec, ShardSize
from packer.output.verify import verify
from packer.pixels.preprocess import load_image
from packer.sources.discover import discover
from packer.spec.errors import ManifestError
from packer.spec.listed_files import sha256_of
from packer.spec.manifest import read_manifest
from packer.spec.registry import get_format
from readers import NpyDataset, WdsDataset, open_dataset

PRE = PreprocessConfig(size=(40, 32))


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, Path]:
    """The conftest tree converted to every format, in 3 shards of at most 6 samples."""
    from conftest import make_tree

    root = tmp_path_factory.mktemp("src") / "images"
    make_tree(root, {"ant": 5, "bee": 4, "cat": 6})
    out = tmp_path_factory.mktemp("out")
    result = {"_src": root}
    for fmt in FORMATS:
        convert(root, out / fmt, ConvertConfig(fmt, PRE, ShardSize(samples=6)), workers=2)
        result[fmt] = out / fmt
    return result


def expected(src: Path) -> list[tuple[np.ndarray, int, str]]:
    """What every reader must give back: the preprocessed pixels, labels and keys in source order."""
    found = discover(src)
    return [(np.array(load_image(i.path, PRE)), i.label, i.relpath) for i in found.items]


def read_all(ds) -> list:
    return list(ds) if isinstance(ds, WdsDataset) else [ds[i] for i in range(len(ds))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_pixels_labels_and_keys_equal_preprocessed_source(packed, fmt):
    ds = open_dataset(packed[fmt], normalize=False, return_meta=True)
    assert type(ds) is get_format(fmt).reader_class()
    assert len(ds) == 15 and ds.classes == ["ant", "bee", "cat"]
    want = expected(packed["_src"])
    got = read_all(ds)
    assert len(got) == len(want)
    for i, ((image, label, meta), (pixels, wlabel, key)) in enumerate(zip(got, want)):
        assert image.dtype == torch.uint8 and image.shape == (3, 32, 40)
        assert torch.equal(image, torch.from_numpy(pixels).permute(2, 0, 1))
        assert label == wlabel and meta == {"index": i, "key": key, "label": wlabel}


def test_every_format_gives_the_same_normalized_tensor(packed):
    samples = {fmt: read_all(open_dataset(packed[fmt])) for fmt in FORMATS}
    for i in range(15):
        ref_image, ref_label = samples["npy"][i]
        assert ref_image.dtype == torch.float32
        for fmt in FORMATS[1:]:
            image, label = samples[fmt][i]
            assert torch.equal(image, ref_image) and label == ref_label


def test_normalization_uses_the_manifest_statistics(packed):
    raw = NpyDataset(packed["npy"], normalize=False)[3][0]
    norm = NpyDataset(packed["npy"])[3][0]
    mean = torch.tensor(PRE.mean).view(3, 1, 1)
    std = torch.tensor(PRE.std).view(3, 1, 1)
    torch.testing.assert_close(norm, (raw.float() / 255 - mean) / std)


def test_float_storage_returns_stored_normalized_values(tmp_path, packed):
    out = tmp_path / "f16"
    pre = PreprocessConfig(size=(40, 32), dtype="float16")
    convert(packed["_src"], out, ConvertConfig("npy", pre), workers=1)
    stored = open_dataset(out)[0][0]
    assert stored.dtype == torch.float32
    torch.testing.assert_close(stored, NpyDataset(packed["npy"])[0][0], atol=2e-3, rtol=1e-3)
    assert open_dataset(out, normalize=False)[0][0].dtype == torch.float16


@pytest.mark.parametrize("fmt", FORMATS)
def test_dataloader_with_two_workers_sees_every_sample_once(packed, fmt):
    options = {"shuffle": 4, "seed": 1} if fmt == "wds" else {}
    ds = open_dataset(packed[fmt], return_meta=True, **options)
    if fmt != "wds":
        ds[0]  # handles opened in the parent must not leak into the forked workers
    loader = DataLoader(ds, batch_size=4, shuffle=fmt != "wds", num_workers=2)
    seen, labels = [], []
    for images, label, meta in loader:
        assert images.shape[1:] == (3, 32, 40) and images.dtype == torch.float32
        seen += meta["index"].tolist()
        labels += label.tolist()
        assert label.tolist() == meta["label"].tolist()
    assert sorted(seen) == list(range(15))
    assert sorted(labels) == [0] * 5 + [1] * 4 + [2] * 6


@pytest.mark.parametrize("fmt", FORMATS)
def test_pickled_reader_is_small_and_holds_no_handles(packed, fmt):
    ds = open_dataset(packed[fmt])
    next(iter(ds)) if fmt == "wds" else ds[7]
    blob = pickle.dumps(ds)
    assert len(blob) < 20_000
    clone = pickle.loads(blob)
    first = next(iter(clone)) if fmt == "wds" else clone[7]
    again = next(iter(ds)) if fmt == "wds" else ds[7]
    assert torch.equal(first[0], again[0])


def test_transform_and_negative_index(packed):
    ds = NpyDataset(packed["npy"], transform=lambda t: t.flip(-1))
    plain = NpyDataset(packed["npy"])
    assert torch.equal(ds[-1][0], plain[14][0].flip(-1))
    with pytest.raises(IndexError):
        plain[15]


def test_wds_shuffle_depends_on_seed_and_epoch(packed):
    def order(epoch, seed=0):
        ds = WdsDataset(packed["wds"], shuffle=8, seed=seed, return_meta=True)
        ds.set_epoch(epoch)
        return [m["index"] for _, _, m in ds]

    assert sorted(order(0)) == list(range(15))
    assert order(0) == order(0)
    assert order(0) != order(1)
    assert order(0) != order(0, seed=5)
    assert [m["index"] for _, _, m in WdsDataset(packed["wds"], return_meta=True)] == list(range(15))


def test_missing_shard_file_is_named(tmp_path, packed):
    import shutil

    copy = tmp_path / "npy"
    shutil.copytree(packed["npy"], copy)
    missing = shard_file(copy, 1, ".images.npy")
    missing.unlink()
    ds = NpyDataset(copy)
    ds[0]
    with pytest.raises(ManifestError, match=re.escape(missing.name)):
        ds[7]


def test_reader_refuses_folder_without_manifest_and_wrong_format(tmp_path, packed):
    with pytest.raises(ManifestError, match="no manifest.json"):
        open_dataset(tmp_path)
    with pytest.raises(ManifestError, match="not npy"):
        NpyDataset(packed["lmdb"])


def test_wds_reader_refuses_unsafe_member_names(tmp_path, packed):
    import io
    import shutil

    copy = tmp_path / "wds"
    shutil.copytree(packed["wds"], copy)
    shard = shard_file(copy, 0, ".tar")
    with tarfile.open(shard, "w") as tar:
        info = tarfile.TarInfo("../evil.npy")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(ManifestError, match="unsafe"):
        list(WdsDataset(copy))


# ------------------------------------------------------------------------- review regressions


@pytest.mark.long
def test_spawned_workers_read_every_sample(packed):
    """The spawn start method (Windows, macOS, some clusters) pickles the dataset to each worker. The
    map-style readers travel together (one loader, whose spawned workers each import torch once),
    tar shards in a loader of their own."""
    readers = [open_dataset(packed[fmt], return_meta=True) for fmt in FORMATS]
    iterable = [ds for ds in readers if isinstance(ds, IterableDataset)]
    mapped = ConcatDataset([ds for ds in readers if not isinstance(ds, IterableDataset)])
    for ds, copies in ((mapped, len(mapped.datasets)), *((ds, 1) for ds in iterable)):
        loader = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context="spawn", collate_fn=list)
        seen = [int(meta["index"]) for batch in loader for *_, meta in batch]
        assert sorted(seen) == sorted(list(range(15)) * copies)


class RecordingNpy(NpyDataset):
    """Writes the pid of every process that opens a shard to a log file."""

    log: Path

    def open_shard(self, shard):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return super().open_shard(shard)


def test_forked_workers_open_their_own_handles(packed, tmp_path):
    ds = RecordingNpy(packed["npy"])
    ds.log = tmp_path / "opens.log"
    ds[0], ds[14]  # the parent opens two shards first
    list(DataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context="fork"))
    pids = [int(line) for line in ds.log.read_text().split()]
    assert pids[:2] == [os.getpid()] * 2
    assert len(set(pids[2:])) == 2 and os.getpid() not in pids[2:]  # each worker opened its own


def test_open_shards_are_bounded(packed):
    ds = open_dataset(packed["lmdb"], max_open_shards=1)
    first = [ds[i][0] for i in range(15)]
    assert len(ds.handles.open) == 1
    assert all(torch.equal(a, b) for a, b in zip(first, [open_dataset(packed["npy"])[i][0] for i in range(15)]))


@pytest.mark.long
def test_many_shards_under_a_low_open_file_limit(tmp_path):
    """80 shards (each format holds one file or more open a shard) read under ulimit -n 64, 8 open
    at a time: handles are closed as they are evicted (with all kept open, every format fails)."""
    script = tmp_path / "many.py"
    script.write_text(f"""
import resource, numpy as np
from PIL import Image
from pathlib import Path
from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ShardSize
from readers import open_dataset
src = Path({str(tmp_path)!r}) / "src"
for i in range(80):
    p = src / f"{{i:03d}}.png"; p.parent.mkdir(exist_ok=True)
    Image.fromarray(np.full((4, 4, 3), i % 256, np.uint8)).save(p)
for fmt in ("npy", "lmdb", "hdf5"):
    convert(src, Path({str(tmp_path)!r}) / fmt, ConvertConfig(fmt, PreprocessConfig(size=(4, 4)), ShardSize(samples=1)))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
for fmt in ("npy", "lmdb", "hdf5"):
    ds = open_dataset(Path({str(tmp_path)!r}) / fmt, normalize=False, max_open_shards=8)
    assert [int(ds[i][0][0, 0, 0]) for i in range(80)] == list(range(80)), fmt
print("ok")
""")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode,dtype", [("L", "uint8"), ("RGB", "uint8"), ("L", "float32"), ("RGB", "float16")])
def test_samples_are_writable_tensors(tmp_path, packed, fmt, mode, dtype):
    out = tmp_path / "o"
    convert(packed["_src"], out, ConvertConfig(fmt, PreprocessConfig(size=(8, 6), mode=mode, dtype=dtype)), workers=1)
    for normalize in (True, False):
        ds = open_dataset(out, normalize=normalize)
        image = next(iter(ds))[0] if fmt == "wds" else ds[0][0]
        image.add_(1)  # would crash the process on a read-only file map
        assert image.shape == ((1 if mode == "L" else 3), 6, 8)


def test_lmdb_output_converted_again_is_not_read_from_a_stale_map(tmp_path, packed):
    out = tmp_path / "lmdb"
    convert(packed["_src"], out, ConvertConfig("lmdb", PreprocessConfig(size=(8, 8))), workers=1)
    old = open_dataset(out)
    assert old[0][0].shape == (3, 8, 8)
    convert(packed["_src"], out, ConvertConfig("lmdb", PreprocessConfig(size=(16, 16))), workers=1, overwrite=True)
    assert open_dataset(out)[0][0].shape == (3, 16, 16)


def test_two_lmdb_datasets_share_an_output(packed):
    a, b = open_dataset(packed["lmdb"]), open_dataset(packed["lmdb"])
    assert torch.equal(a[3][0], b[3][0])
    a.close()
    assert torch.equal(b[3][0], NpyDataset(packed["npy"])[3][0])


def test_batch_normalizer_equals_per_sample_normalization(packed):
    raw = open_dataset(packed["hdf5"], normalize=False)
    batch = torch.stack([raw[i][0] for i in range(4)])
    assert batch.dtype == torch.uint8
    normalized = raw.batch_normalizer()(batch)
    assert torch.equal(normalized, torch.stack([open_dataset(packed["hdf5"])[i][0] for i in range(4)]))


def test_wds_reshuffles_with_persistent_workers(packed):
    ds = WdsDataset(packed["wds"], shuffle=8, seed=3, return_meta=True)
    loader = DataLoader(ds, batch_size=15, num_workers=1, persistent_workers=True)
    orders = [next(iter(loader))[2]["index"].tolist() for _ in range(3)]
    assert all(sorted(o) == list(range(15)) for o in orders)
    assert len({tuple(o) for o in orders}) == 3


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "wds"])
def test_labels_counts_and_balancing_weights_without_reading_images(packed, fmt):
    ds = open_dataset(packed[fmt])
    assert ds.labels.tolist() == [0] * 5 + [1] * 4 + [2] * 6
    assert ds.class_counts == [5, 4, 6]
    weights = ds.sample_weights()
    assert weights.dtype == torch.float64
    assert torch.allclose(weights, torch.tensor([1 / 5] * 5 + [1 / 4] * 4 + [1 / 6] * 6, dtype=torch.float64))
    generator = torch.Generator().manual_seed(0)
    sampler = torch.utils.data.WeightedRandomSampler(weights, num_samples=3000, generator=generator)
    drawn = np.bincount(ds.labels[list(sampler)], minlength=3)
    assert all(abs(n - 1000) < 120 for n in drawn)  # each class about a third of the draws
    assert open_dataset(packed["wds"]).class_counts == [5, 4, 6]


def test_stats_from_the_manifest_or_none_for_older_outputs(tmp_path, packed):
    import json
    import shutil

    ds = open_dataset(packed["npy"])
    assert ds.stats == ds.manifest.stats and ds.stats["pixels"]["count"] == 15 * 40 * 32
    old = tmp_path / "old"
    shutil.copytree(packed["npy"], old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["stats"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    assert open_dataset(old).stats is None


# ------------------------------------------------------------------------- encoded images (jpeg, png)

ENC_PRE = PreprocessConfig(size=(64, 48))


@pytest.fixture(scope="module")
def encoded(tmp_path_factory, packed) -> dict:
    """The same tree in every format with png and jpeg images, and as raw npy for reference."""
    out = tmp_path_factory.mktemp("encoded")
    result = {}
    for fmt in FORMATS:
        for codec in ("png", "jpeg"):
            config = ConvertConfig(fmt, ENC_PRE, ShardSize(samples=6), codec=ImageCodec(codec))
            convert(packed["_src"], out / f"{fmt}-{codec}", config, workers=2)
            result[fmt, codec] = out / f"{fmt}-{codec}"
    convert(packed["_src"], out / "raw", ConvertConfig("npy", ENC_PRE, ShardSize(samples=6)), workers=2)
    result["raw"] = out / "raw"
    return result


@pytest.mark.parametrize("codec", ["png", "jpeg"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_encoded_images_read_back_as_raw_pixels(encoded, fmt, codec):
    raw = read_all(open_dataset(encoded["raw"], normalize=False, return_meta=True))
    ds = open_dataset(encoded[fmt, codec], normalize=False, return_meta=True)
    got = read_all(ds)
    assert len(got) == len(raw) == 15
    for (image, label, meta), (want, wlabel, wmeta) in zip(got, raw):
        assert (label, meta) == (wlabel, wmeta)
        assert image.dtype == torch.uint8 and image.shape == want.shape == (3, 48, 64)
        if codec == "png":
            assert torch.equal(image, want)
        else:  # the test images are saturated random colours, JPEG's worst case
            assert (image.int() - want.int()).abs().float().mean() < 4
    normalized = read_all(open_dataset(encoded[fmt, codec]))
    assert torch.equal(normalized[3][0], ds.batch_normalizer()(got[3][0]))


@pytest.mark.parametrize("fmt", ["npy", "hdf5"])
def test_encoded_shards_in_dataloader_workers(encoded, fmt):
    ds = open_dataset(encoded[fmt, "png"], return_meta=True)
    ds[0]  # handles opened in the parent must not leak into the forked workers
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)
    assert sorted(i for _, _, meta in loader for i in meta["index"].tolist()) == list(range(15))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("codec", ["png", "jpeg"])
def test_grayscale_encoded_images(tmp_path, packed, fmt, codec):
    pre = PreprocessConfig(size=(16, 12), mode="L")
    out = tmp_path / "o"
    convert(packed["_src"], out, ConvertConfig(fmt, pre, codec=ImageCodec(codec)), workers=1)
    image = read_all(open_dataset(out, normalize=False))[0][0]
    want = torch.from_numpy(np.array(load_image(discover(packed["_src"]).items[0].path, pre))).permute(2, 0, 1)
    assert image.shape == want.shape == (1, 12, 16)
    assert (image.int() - want.int()).abs().float().mean() < (0.5 if codec == "png" else 3)
    image.add_(1)  # a writable tensor, never a view of Pillow's buffer


def test_jpeg_of_the_sample_photographs_is_close(tmp_path):
    src = Path(__file__).resolve().parent.parent / "sample_data" / "images"
    pre = PreprocessConfig(size=(224, 224))
    convert(src, tmp_path / "o", ConvertConfig("lmdb", pre, codec=ImageCodec("jpeg", 90)), workers=2)
    ds = open_dataset(tmp_path / "o", normalize=False, return_meta=True)
    diffs = []
    for image, _, meta in read_all(ds):
        want = torch.from_numpy(np.array(load_image(src / meta["key"], pre))).permute(2, 0, 1)
        diffs.append((image.int() - want.int()).abs().float().mean().item())
    assert len(diffs) == 40 and np.mean(diffs) < 3 and max(diffs) < 6


def test_reader_refuses_an_unknown_codec(tmp_path, encoded):
    import json
    import shutil

    copy = tmp_path / "o"
    shutil.copytree(encoded["npy", "png"], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["fields"]["image"]["codec"] = "webp"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="codec 'webp' is unknown.*Upgrade packer"):
        open_dataset(copy)


def test_damaged_jpg_member_is_named_by_the_wds_reader(tmp_path, encoded):
    import shutil

    copy = tmp_path / "o"
    shutil.copytree(encoded["wds", "jpeg"], copy)
    path = shard_file(copy, 0, ".tar")
    data = bytearray(path.read_bytes())
    at = data.find(b"\xff\xd8\xff")  # the first JPEG
    data[at : at + 64] = bytes(64)
    path.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=re.escape(path.name) + ": sample 000000000 is damaged.*packer verify"):
        list(WdsDataset(copy))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", ["uint8", "float16"])
def test_images_of_their_own_size_round_trip(tmp_path, fmt, dtype):
    from conftest import write_image

    from packer.output.verify import verify

    src = tmp_path / "src"
    for i in range(5):
        write_image(src / "a" / f"{i}.png", (10 + i, 7 + 2 * i), seed=i)
    pre = PreprocessConfig(resize="none", dtype=dtype)
    result = convert(src, tmp_path / "out", ConvertConfig(fmt, pre, ShardSize(samples=2)), workers=2)
    # lmdb: sizes indexed (6); wds: every output at 7 (other loaders' indexes)
    assert result.manifest.format_version == {"npy": 3, "hdf5": 4, "wds": 7}.get(fmt, 6)
    ds = open_dataset(result.output, normalize=False, return_meta=True)
    got = list(ds) if fmt == "wds" else [ds[i] for i in range(len(ds))]
    assert len(got) == 5
    for image, _, meta in got:
        expected = np.array(load_image(src / meta["key"], pre))
        assert torch.equal(image, torch.from_numpy(expected).permute(2, 0, 1))
    if hasattr(ds, "close"):
        ds.close()
    assert verify(result.output) == []


@pytest.mark.parametrize("codec", ["raw", "jpeg", "source"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_image_sizes_come_from_the_index_without_reading_an_image(tmp_path, fmt, codec):
    from conftest import make_tree

    from packer.spec.shard_names import NPY_IMAGE_SHAPES

    src = tmp_path / "src"
    make_tree(src, {"a": 3, "b": 2}, size=(90, 60))
    pre = PreprocessConfig(resize="max", size=(80, 80))
    convert(src, tmp_path / "out", ConvertConfig(fmt, pre, ShardSize(samples=2), codec=ImageCodec(codec)), workers=1)
    ds = open_dataset(tmp_path / "out")
    want = [tuple(image.shape[1:]) for image, *_ in (list(ds) if fmt == "wds" else [ds[i] for i in range(len(ds))])]

    def no_image(*args, **kwargs):
        raise AssertionError("an image was read")

    ds = open_dataset(tmp_path / "out")
    ds.read_image = ds.read_stored = ds.iter_shard_raw = no_image
    sizes = ds.image_sizes
    assert sizes.dtype == np.int64 and [tuple(s) for s in sizes.tolist()] == want
    assert read_manifest(tmp_path / "out").format_version == (
        7 if fmt == "wds" else 6 if fmt == "lmdb" or codec != "raw" else {"npy": 3, "hdf5": 4}[fmt]
    )
    if fmt in ("npy", "wds"):  # a size index that lies is found by verify
        shard = read_manifest(tmp_path / "out").shards[0]
        path = tmp_path / "out" / shard.file(NPY_IMAGE_SHAPES)
        shapes = np.load(path)
        shapes[0, 0] += 1
        np.save(path, shapes)
        manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
        for f in manifest["shards"][0]["files"]:
            if f["path"] == shard.file(NPY_IMAGE_SHAPES):
                f["sha256"], f["bytes"] = sha256_of(path), path.stat().st_size
        (tmp_path / "out" / "manifest.json").write_text(json.dumps(manifest))
        problems = verify(tmp_path / "out")
        # raw npy images are rebuilt from the index (a wrong size cannot be read); others are checked against it
        assert problems and (codec == "raw" and fmt == "npy" or any("index of sizes" in p.message for p in problems))


def test_an_output_of_one_size_has_sizes_too(packed):
    assert open_dataset(packed["npy"]).image_sizes.tolist() == [[32, 40]] * 15


ONE_PROCESS = pytest.mark.xdist_group("many_labels")
"""The tests of ``many_labels``, in one test process: its six conversions of 3,000 files are the
slowest setup of the suite, and each process that ran one of its tests made them again."""


@pytest.fixture(scope="module")
def many_labels(tmp_path_factory) -> dict[str, Path]:
    """3,000 tiny images in 3 classes, in 6 shards of 500, as npy, lmdb and hdf5 (``FMT-300``: in
    shards of 300)."""
    from conftest import make_tree

    root = tmp_path_factory.mktemp("src") / "images"
    make_tree(root, {"a": 1000, "b": 1000, "c": 1000}, size=(4, 4), vary=False)
    out = tmp_path_factory.mktemp("many")
    cfg = {f: ConvertConfig(f, PreprocessConfig(size=(4, 4)), ShardSize(samples=500)) for f in ("npy", "lmdb", "hdf5")}
    cfg.update(
        {
            f"{f}-300": ConvertConfig(f, PreprocessConfig(size=(4, 4)), ShardSize(samples=300))
            for f in ("npy", "lmdb", "hdf5")
        }
    )
    for fmt, c in cfg.items():
        convert(root, out / fmt, c, workers=2)
    return {fmt: out / fmt for fmt in cfg}


@ONE_PROCESS
@pytest.mark.parametrize("fmt", ["npy", "lmdb", "hdf5"])
def test_labels_are_views_of_the_files_not_copies(many_labels, fmt):
    """Every worker used to copy every shard's labels (8 B a sample each): they are now views of the
    mapped files, which the page cache shares between processes."""
    ds = open_dataset(many_labels[fmt])
    labels = ds.handles.labels_of(1, ds)
    assert labels.tolist() == [0] * 500 and not labels.flags.owndata and not labels.flags.writeable
    base = labels
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    import mmap

    assert isinstance(base, (mmap.mmap, memoryview)), type(base)
    assert ds.labels.tolist() == [0] * 1000 + [1] * 1000 + [2] * 1000


@ONE_PROCESS
@pytest.mark.parametrize("fmt", ["npy", "lmdb", "hdf5"])
def test_a_workers_labels_take_no_memory_per_sample(many_labels, fmt):
    """One sample of each of the 6 shards, read in a batch: what reading their labels leaves
    allocated in this process is a few objects per shard, not 8 bytes per sample (4,000 per shard,
    the copies every worker made before)."""
    import gc
    import inspect
    import tracemalloc

    ds = open_dataset(many_labels[fmt])
    code = type(ds).read_labels.__code__
    lines = range(code.co_firstlineno, code.co_firstlineno + len(inspect.getsource(type(ds).read_labels).splitlines()))
    tracemalloc.start(30)
    try:
        batch = ds.__getitems__(list(range(0, 3000, 500)))
        gc.collect()
        traces = tracemalloc.take_snapshot().traces
    finally:
        tracemalloc.stop()
    assert [int(sample[1]) for sample in batch] == [0, 0, 1, 1, 2, 2]
    kept = [t.size for t in traces if any(f.filename == code.co_filename and f.lineno in lines for f in t.traceback)]
    # A copy of a shard's labels is one block of 4,000 bytes, one per shard read; what else h5py keeps
    # is small blocks, and now and then one larger block where one of its registries grows (a 9 KB
    # table seen once in a full run of the suite). npy: nothing at all, the labels were mapped with
    # the shard.
    copies = [size for size in kept if size >= 8 * 500]
    assert len(copies) <= 1 and sum(kept) - sum(copies) < 6 * 8 * 500, kept


@ONE_PROCESS
@pytest.mark.parametrize("fmt", ["npy", "lmdb", "hdf5"])
def test_labels_are_dropped_with_their_shard(many_labels, fmt):
    """A view of a closed LMDB map would read freed memory, and npy's and hdf5's maps hold their
    files open: the views leave the cache with their shard."""
    ds = open_dataset(many_labels[fmt], max_open_shards=2)
    assert [int(s[1]) for s in ds.__getitems__([0, 500, 1000])] == [0, 0, 1]
    assert sorted(ds.handles.labels) == sorted(ds.handles.open) == [1, 2]
    assert ds.labels.tolist() == [0] * 1000 + [1] * 1000 + [2] * 1000
    assert len(ds.handles.labels) <= 2


def test_a_tar_shard_reader_holds_nothing_per_sample_read(tmp_path):
    """Reading a 1,200-sample tar shard: the memory held after 1,000 samples is what it was after
    200 (tarfile kept every member's header, three per sample: about 1 MB more for those 800). The
    stream path (remote shards, through tarfile) drops them as it goes too."""
    import io
    import itertools
    import tracemalloc

    from packer.spec.tario import iter_tar_samples

    src = tmp_path / "src"
    from conftest import make_tree

    make_tree(src, {"a": 1200}, size=(4, 4), vary=False)
    out = tmp_path / "wds"
    convert(src, out, ConvertConfig("wds", PreprocessConfig(size=(4, 4)), ShardSize(samples=1200)), workers=1)
    tar = next(f.path for f in read_manifest(out).shards[0].files if f.path.endswith(".tar"))

    def held_after(samples, counts) -> list[int]:
        tracemalloc.start()
        try:
            got, done = [], 0
            for n in counts:
                for _ in itertools.islice(samples, n - done):
                    pass
                done = n
                got.append(tracemalloc.get_traced_memory()[0])
            return got
        finally:
            tracemalloc.stop()

    # one pass first: the member names are then interned already (Python's table of interned strings
    # grows in steps of megabytes, which would be counted against the pass measured)
    for _ in iter_tar_samples(io.BytesIO((out / tar).read_bytes()), name=tar):
        pass
    first, later = held_after(iter(open_dataset(out)), [200, 1000])
    assert later - first < 20_000, (first, later)
    stream = io.BytesIO((out / tar).read_bytes())
    first, later = held_after(iter_tar_samples(stream, name=tar), [200, 1000])
    assert later - first < 20_000, (first, later)


@ONE_PROCESS
@pytest.mark.parametrize("fmt", ["npy", "lmdb", "hdf5"])
def test_label_views_do_not_cross_a_fork(many_labels, fmt):
    """Two datasets read in a parent, then in a forked child (DataLoader workers, a mixture's parts):
    the child's first open closes the environments LMDB inherited, so views cached by the parent
    would read unmapped memory (a segfault) or another file's labels. The child drops them first."""
    import multiprocessing as mp

    a, b = open_dataset(many_labels[fmt]), open_dataset(many_labels[f"{fmt}-300"])  # other files, other maps
    want = [int(s[1]) for s in a.__getitems__([0, 600, 1200, 1800, 2400])]
    assert want == [0, 0, 1, 1, 2] and [int(s[1]) for s in b.__getitems__([0, 600, 1200, 1800, 2400])] == want
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child() -> None:
        got = [[int(s[1]) for s in ds.__getitems__([2400, 1800, 1200, 600, 0])] for ds in (a, b)]
        send.send(got)

    proc = ctx.Process(target=child)
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0, f"the forked reader died (exit code {proc.exitcode})"
    assert recv.recv() == [want[::-1]] * 2
