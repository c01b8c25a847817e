"""torchvision ImageFolder's names on the readers (class_to_idx, targets, samples, imgs),
target_transform on every path of every reader, and torchvision's image extensions packed."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FORMATS, make_tree, write_image
from helpers import shard_names
from PIL import Image

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ImageCodec, ShardSize
from packer.sources.discover import discover
from packer.spec.errors import ManifestError
from packer.spec.source_kinds import IMAGE_EXTENSIONS
from readers import WdsDataset, make_loader, open_dataset
from readers.loading.collate import PackedBatch

PRE = PreprocessConfig(size=(24, 16))
MAP_STYLE = [f for f in FORMATS if f != "wds"]
TORCHVISION_IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""torchvision.datasets.folder.IMG_EXTENSIONS, copied (torchvision is not installed beside this torch)."""


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict:
    """13 images in 3 class folders (one capitalised, which sorts first), 4 shards, every format."""
    src = tmp_path_factory.mktemp("src") / "images"
    make_tree(src, {"Zebra": 3, "ant": 5, "bee": 5})
    out = tmp_path_factory.mktemp("out")
    result: dict = {"_src": src}
    for fmt in FORMATS:
        convert(src, out / fmt, ConvertConfig(fmt, PRE, ShardSize(samples=4)), workers=2)
        result[fmt] = out / fmt
    return result


def imagefolder_listing(root: Path) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """What torchvision's ImageFolder lists, emulated after its ``find_classes`` and
    ``make_dataset``: class folders by sorted name, then ``sorted(os.walk)`` and sorted file names
    per class; paths made relative to ``root``."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    class_to_idx = {c: i for i, c in enumerate(classes)}
    samples = []
    for name in sorted(class_to_idx):
        for folder, _, names in sorted(os.walk(root / name, followlinks=True)):
            for fname in sorted(names):
                if fname.lower().endswith(TORCHVISION_IMG_EXTENSIONS):
                    rel = os.path.relpath(os.path.join(folder, fname), root).replace(os.sep, "/")
                    samples.append((rel, class_to_idx[name]))
    return class_to_idx, samples


def read_all(ds) -> list:
    return list(ds) if isinstance(ds, WdsDataset) else [ds[i] for i in range(len(ds))]


def plus_ten(label: int) -> int:
    return label + 10


def one_hot(label) -> torch.Tensor:
    """A torchvision-style target_transform that returns a tensor (picklable: module level); also
    takes a tensor of labels, for the expected values."""
    return torch.nn.functional.one_hot(torch.as_tensor(label), 3).float()


def close(ds) -> None:
    if hasattr(ds, "close"):
        ds.close()


# class_to_idx, targets, samples, imgs --------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_class_to_idx_is_imagefolders(packed, fmt):
    ds = open_dataset(packed[fmt])
    want, _ = imagefolder_listing(packed["_src"])
    assert ds.class_to_idx == want == {"Zebra": 0, "ant": 1, "bee": 2}
    assert [ds.classes[i] for i in ds.class_to_idx.values()] == list(ds.class_to_idx)
    close(ds)


@pytest.mark.parametrize("fmt", MAP_STYLE)
def test_targets_samples_and_imgs_are_imagefolders_without_reading_an_image(packed, fmt):
    ds = open_dataset(packed[fmt])

    def no_image(*args, **kwargs):
        raise AssertionError("an image was read")

    ds.read_image = ds.read_stored = no_image
    _, want = imagefolder_listing(packed["_src"])
    assert len(want) == len(ds) == 13
    assert ds.samples == want
    assert ds.samples[:2] == [("Zebra/img_000.png", 0), ("Zebra/img_001.png", 0)]
    assert ds.imgs == ds.samples
    assert ds.targets == [label for _, label in want] == ds.labels.tolist()
    assert all(type(t) is int for t in ds.targets)
    assert ds.targets.count(1) == 5 and ds.class_counts == [3, 5, 5]
    with pytest.raises(AttributeError):
        ds.targets = []  # read from the shards: subset with torch.utils.data.Subset instead
    close(ds)


@pytest.mark.parametrize("fmt", MAP_STYLE)
def test_samples_agree_with_what_each_sample_reads_back(packed, fmt):
    ds = open_dataset(packed[fmt], return_meta=True, normalize=False)
    assert [(meta["key"], label) for _, label, meta in read_all(ds)] == ds.samples
    close(ds)


def test_nested_folders_give_imagefolders_samples_in_sorted_key_order(tmp_path):
    src = tmp_path / "src"
    for rel in ("bee/img_0.png", "bee/deeper/n.png", "bee/zz.png", "bee2/a.png"):
        write_image(src / rel, (20, 14))
    convert(src, tmp_path / "o", ConvertConfig("npy", PRE), workers=1)
    ds = open_dataset(tmp_path / "o")
    class_to_idx, want = imagefolder_listing(src)
    assert ds.class_to_idx == class_to_idx and sorted(ds.samples) == sorted(want)
    # ImageFolder lists a folder's own files before its subfolders'; packer stores by the sorted key
    assert want[:3] == [("bee/img_0.png", 0), ("bee/zz.png", 0), ("bee/deeper/n.png", 0)]
    assert ds.samples[:3] == [("bee/deeper/n.png", 0), ("bee/img_0.png", 0), ("bee/zz.png", 0)]
    close(ds)


@pytest.mark.parametrize("fmt", MAP_STYLE)
def test_samples_with_one_shard_open_at_a_time_and_not_pickled(packed, fmt):
    ds = open_dataset(packed[fmt], max_open_shards=1)
    _, want = imagefolder_listing(packed["_src"])
    assert ds.samples == want and len(ds.handles.open) == 1
    data = pickle.dumps(ds)
    assert b"img_004" not in data  # the kept keys stay in this process, as open handles do
    copy = pickle.loads(data)
    assert copy.samples == want
    ds.close()
    assert ds.samples == want  # read again after close
    close(copy)
    close(ds)


def test_a_shard_short_of_keys_is_named(packed):
    ds = open_dataset(packed["npy"])
    ds.read_keys = lambda handle, count: ["only-one"]
    first = re.escape(shard_names(packed["npy"])[0])
    with pytest.raises(ManifestError, match=first + ": 1 keys where the manifest says 4 samples.*packer verify"):
        ds.samples
    close(ds)


@pytest.mark.parametrize("fmt", FORMATS)
def test_unlabelled_output_has_an_empty_class_to_idx(tmp_path, fmt):
    src = tmp_path / "flat"
    for i in range(3):
        write_image(src / f"{i}.png", (20, 14), seed=i)
    convert(src, tmp_path / "o", ConvertConfig(fmt, PRE), workers=1)
    ds = open_dataset(tmp_path / "o")
    assert ds.classes is None and ds.class_to_idx == {}
    if fmt != "wds":
        assert ds.targets == [-1, -1, -1]
        assert ds.samples == ds.imgs == [("0.png", -1), ("1.png", -1), ("2.png", -1)]
    close(ds)


def test_wds_reader_has_class_to_idx_but_no_targets_or_samples(packed):
    ds = open_dataset(packed["wds"])
    assert isinstance(ds, WdsDataset) and ds.class_to_idx == {"Zebra": 0, "ant": 1, "bee": 2}
    for name in ("targets", "samples", "imgs"):
        assert not hasattr(ds, name)  # a stream: these would mean reading every tar (see READERS.md)


# target_transform -------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_open_dataset_takes_target_transform(packed, fmt):
    plain = read_all(open_dataset(packed[fmt], normalize=False))
    ds = open_dataset(packed[fmt], normalize=False, target_transform=plus_ten, return_meta=True)
    got = read_all(ds)
    assert [label for _, label, _ in got] == [label + 10 for _, label in plain]
    assert [meta["label"] for _, _, meta in got] == [label for _, label in plain]  # meta keeps the stored label
    assert all(torch.equal(a[0], b[0]) for a, b in zip(got, plain))
    hot = read_all(open_dataset(packed[fmt], target_transform=one_hot))
    assert torch.equal(torch.stack([t for _, t in hot]), one_hot(torch.tensor([lb for _, lb in plain])))
    close(ds)


@pytest.mark.parametrize("fmt", MAP_STYLE)
def test_whole_batch_reads_apply_target_transform_per_sample(packed, fmt):
    ds = open_dataset(packed[fmt], normalize=False, target_transform=plus_ten)
    batch = ds.__getitems__([5, 0, 12, 3])
    assert not isinstance(batch, PackedBatch)  # the whole-batch path would write the stored labels
    assert [label for _, label in batch] == [ds.targets[i] + 10 for i in (5, 0, 12, 3)]
    assert isinstance(open_dataset(packed[fmt]).__getitems__([0, 1]), PackedBatch)  # without one: still whole
    close(ds)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", FORMATS)
def test_make_loader_batches_carry_transformed_targets(packed, fmt, workers):
    plain = make_loader(open_dataset(packed[fmt]), 4, shuffle=False, num_workers=workers)
    hot = make_loader(open_dataset(packed[fmt], target_transform=one_hot), 4, shuffle=False, num_workers=workers)
    want_images, want_labels = zip(*[(x.clone(), y.clone()) for x, y in plain])
    got = [(x.clone(), y.clone()) for x, y in hot]
    assert len(got) == len(want_images) == 4
    for (images, targets), ref_images, ref_labels in zip(got, want_images, want_labels):
        assert torch.equal(images, ref_images)
        assert targets.shape == (len(ref_labels), 3) and torch.equal(targets, one_hot(ref_labels))


@pytest.mark.parametrize("fmt", ["npy", "wds"])
def test_target_transform_on_text_outputs(tmp_path, fmt):
    src = tmp_path / "src"
    for c, cls in enumerate(("neg", "pos")):
        for i in range(3):
            (src / cls).mkdir(parents=True, exist_ok=True)
            (src / cls / f"{i}.txt").write_text(f"{cls} {i}", encoding="utf-8")
    convert(src, tmp_path / "o", ConvertConfig(fmt, shard_size=ShardSize(samples=2)), workers=1)
    ds = open_dataset(tmp_path / "o", target_transform=plus_ten)
    assert [label for _, label in read_all(ds)] == [10, 10, 10, 11, 11, 11]
    if fmt == "npy":
        assert [label for _, label in ds.__getitems__([4, 1])] == [11, 10]
    batches = list(make_loader(ds, 3, shuffle=False, num_workers=0))
    assert [b["labels"].tolist() for b in batches] == [[10, 10, 10], [11, 11, 11]]
    assert batches[0]["texts"] == ["neg 0", "neg 1", "neg 2"]
    close(ds)


# Extensions ------------------------------------------------------------------------------------------
PIL_FORMAT = {
    ".jpg": "JPEG",
    ".jpeg": "JPEG",
    ".png": "PNG",
    ".ppm": "PPM",
    ".bmp": "BMP",
    ".pgm": "PPM",
    ".tif": "TIFF",
    ".tiff": "TIFF",
    ".webp": "WEBP",
}


def test_every_torchvision_extension_is_packed(tmp_path):
    assert set(TORCHVISION_IMG_EXTENSIONS) <= IMAGE_EXTENSIONS
    src = tmp_path / "src"
    for i, ext in enumerate(TORCHVISION_IMG_EXTENSIONS):
        write_image(
            src / "a" / f"{i}{ext.upper() if i % 2 else ext}",
            (16, 12),
            mode="L" if ext == ".pgm" else "RGB",
            seed=i,
            format=PIL_FORMAT[ext],
        )
    found = discover(src)
    assert len(found.items) == 9 and found.ignored == {} and found.skipped == []
    result = convert(src, tmp_path / "o", ConvertConfig("npy", PreprocessConfig(size=(8, 6))), workers=1)
    assert result.manifest.samples == 9


def _netpbm_tree(root: Path, ext: str) -> dict[str, np.ndarray]:
    """Two classes of Pillow-written netpbm files of odd sizes; returns Pillow's own decode of each."""
    mode = "L" if ext == ".pgm" else "RGB"
    want = {}
    for c, cls in enumerate(("x", "y")):
        for i in range(2):
            path = write_image(root / cls / f"{i}{ext}", (13 + 4 * i, 9 + c), mode=mode, seed=10 * c + i)
            with Image.open(path) as img:
                assert img.format == "PPM" and img.mode == mode  # Pillow reads it natively
                pixels = np.array(img)
            want[f"{cls}/{i}{ext}"] = pixels.reshape(*pixels.shape[:2], -1)
    return want


@pytest.mark.parametrize("codec", ["raw", "png"])
@pytest.mark.parametrize("ext", [".ppm", ".pgm"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_netpbm_files_read_back_as_pillow_decodes_them(tmp_path, fmt, ext, codec):
    want = _netpbm_tree(tmp_path / "src", ext)
    assert (tmp_path / "src" / "x" / f"0{ext}").read_bytes()[:2] == (b"P5" if ext == ".pgm" else b"P6")
    mode = "L" if ext == ".pgm" else "RGB"
    pre = PreprocessConfig(resize="none", mode=mode)
    result = convert(
        tmp_path / "src",
        tmp_path / "o",
        ConvertConfig(fmt, pre, ShardSize(samples=3), codec=ImageCodec(codec)),
        workers=1,
    )
    assert result.manifest.samples == 4
    ds = open_dataset(result.output, normalize=False, return_meta=True)
    got = read_all(ds)
    assert sorted(meta["key"] for _, _, meta in got) == sorted(want)
    for image, label, meta in got:
        assert image.dtype == torch.uint8 and label == (meta["key"][0] == "y")
        assert torch.equal(image, torch.from_numpy(want[meta["key"]]).permute(2, 0, 1))
    close(ds)


def test_plain_text_netpbm_is_packed_exactly(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "gray.pgm").write_bytes(b"P2\n# a comment\n3 2\n255\n0 128 255\n7 64 200\n")
    (src / "colour.ppm").write_bytes(b"P3\n2 1\n255\n255 0 0  1 2 3\n")
    convert(src, tmp_path / "g", ConvertConfig("npy", PreprocessConfig(resize="none", mode="L")), workers=1)
    ds = open_dataset(tmp_path / "g", normalize=False, return_meta=True)
    by_key = {meta["key"]: image for image, _, meta in read_all(ds)}
    assert by_key["gray.pgm"].tolist() == [[[0, 128, 255], [7, 64, 200]]]
    rgb = np.array(Image.open(src / "colour.ppm").convert("L")).reshape(1, 1, 2)
    assert torch.equal(by_key["colour.ppm"], torch.from_numpy(rgb))
    close(ds)
