"""Random and centre crops, flips: torchvision's distribution, Pillow's pixels, the same batches
whatever the workers, new crops each epoch, exact resume."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FORMATS, write_image
from PIL import Image
from torch.utils.data import DataLoader

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ImageCodec, ShardSize
from packer.spec.errors import ConfigError
from readers import CenterCrop, RandomResizedCrop, make_loader, open_dataset
from readers.augment.crops import RANDOMS, Augment, uniforms

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from bench_train import get_params as torchvision_get_params  # noqa: E402  (torchvision's, written out)

MAX = PreprocessConfig(resize="max", size=(72, 72))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict:
    """Images of several sizes and aspect ratios, stored at their own sizes (``--resize max 72``),
    raw in every format and as JPEG in npy and wds."""
    src = tmp_path_factory.mktemp("src") / "images"
    sizes = [(120, 80), (60, 90), (200, 50), (72, 72), (40, 30), (90, 160)]
    for i in range(18):
        write_image(src / f"c{i % 3}" / f"{i:02d}.png", sizes[i % len(sizes)], seed=i)
    out = tmp_path_factory.mktemp("out")
    found = {"_src": src}
    for fmt in FORMATS:
        convert(src, out / fmt, ConvertConfig(fmt, MAX, ShardSize(samples=7)), workers=1)
        found[fmt] = out / fmt
    for fmt in ("npy", "wds"):
        convert(
            src, out / f"{fmt}-jpeg", ConvertConfig(fmt, MAX, ShardSize(samples=7), codec=ImageCodec("jpeg")), workers=1
        )
        found[f"{fmt}-jpeg"] = out / f"{fmt}-jpeg"
    return found


def summary(boxes: np.ndarray, height: int, width: int, fallback_box) -> dict:
    top, left, h, w = boxes.T.astype(np.float64)
    q = [0.1, 0.25, 0.5, 0.75, 0.9]
    return {
        "area": np.quantile(h * w / (height * width), q),
        "log_ratio": np.quantile(np.log(w / h), q),
        "top": np.mean(top / max(1, height - h.min())),
        "fallback": np.mean(np.all(boxes == np.asarray(fallback_box), axis=1)),
    }


@pytest.mark.parametrize("height,width", [(256, 192), (300, 40)])
def test_crop_parameters_follow_torchvision_over_ten_thousand_samples(height, width):
    crop = RandomResizedCrop(224)
    n = 10_000
    ours = crop.boxes(np.full(n, height), np.full(n, width), uniforms(7, 0, np.arange(n)))
    g = torch.Generator().manual_seed(0)
    theirs = np.array([torchvision_get_params(height, width, g, crop.scale, crop.ratio) for _ in range(n)])
    fallback = crop._fallback(height, width)
    a, b = summary(ours, height, width, fallback), summary(theirs, height, width, fallback)
    assert np.abs(a["area"] - b["area"]).max() < 0.02
    assert np.abs(a["log_ratio"] - b["log_ratio"]).max() < 0.03
    assert abs(a["fallback"] - b["fallback"]) < 0.025
    if width == 40:  # a strip: most tries do not fit, so the fallback is common
        assert b["fallback"] > 0.3
    assert (ours[:, 2] <= height).all() and (ours[:, 3] <= width).all() and (ours[:, :2] >= 0).all()
    assert (ours[:, 0] + ours[:, 2] <= height).all() and (ours[:, 1] + ours[:, 3] <= width).all()


def test_uniforms_depend_on_seed_epoch_and_index_alone():
    u = uniforms(3, 1, [5, 9, 5])
    assert u.shape == (3, RANDOMS) and (u >= 0).all() and (u < 1).all()
    assert np.array_equal(u[0], u[2]) and not np.array_equal(u[0], u[1])
    assert np.array_equal(uniforms(3, 1, [9])[0], u[1])  # not the position in the batch
    assert not np.array_equal(uniforms(3, 2, [5]), uniforms(3, 1, [5]))
    assert not np.array_equal(uniforms(4, 1, [5]), uniforms(3, 1, [5]))
    big = uniforms(0, 0, np.arange(20_000))
    assert abs(big.mean() - 0.5) < 0.005 and abs(np.corrcoef(big[:, 0], big[:, 1])[0, 1]) < 0.03
    flips = Augment(None, True).placements(0, 0, list(range(4000)), [10] * 4000, [10] * 4000)
    assert 0.47 < np.mean([p.flip for p in flips]) < 0.53


def reference(stored: np.ndarray, meta: dict, size) -> np.ndarray:
    """Pillow cutting the box out of the stored image and resizing it (torchvision's resized_crop on PIL)."""
    img = Image.fromarray(stored[:, :, 0] if stored.shape[2] == 1 else stored)
    left, top, right, bottom = meta["crop"]
    out = img.crop((int(left), int(top), int(right), int(bottom))).resize(size[::-1], Image.Resampling.BILINEAR)
    if meta["flip"]:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pixels = np.asarray(out)
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


def samples(ds) -> list:
    return (
        list(ds)
        if not hasattr(ds, "__getitem__") or type(ds).__name__ == "WdsDataset"
        else [ds[i] for i in range(len(ds))]
    )


@pytest.mark.parametrize("name", [*FORMATS, "npy-jpeg", "wds-jpeg"])
def test_crop_pixels_are_pillow_cutting_and_resizing_the_stored_image(outputs, name):
    plain = {
        m["index"]: img.permute(1, 2, 0).numpy()
        for img, _, m in samples(open_dataset(outputs[name], normalize=False, return_meta=True))
    }
    crop = RandomResizedCrop((24, 32))
    ds = open_dataset(outputs[name], normalize=False, return_meta=True, crop=crop, flip=True, seed=5)
    got = samples(ds)
    assert len(got) == 18 and {tuple(img.shape) for img, _, _ in got} == {(3, 24, 32)}
    flips = 0
    for img, label, meta in got:
        want = reference(plain[meta["index"]], meta, (24, 32))
        diff = np.abs(img.permute(1, 2, 0).numpy().astype(int) - want.astype(int))
        assert diff.max() <= 2, (meta, diff.max())
        assert label == meta["label"]
        flips += meta["flip"]
    assert 0 < flips < 18


@pytest.mark.parametrize("channels", [1, 3])
def test_enlarged_crops_are_within_a_level_of_torchs_kernel_and_two_of_pillows(channels):
    """Crops enlarged on both sides take OpenCV's bilinear kernel (readers.augment.render._resized): the same
    weights as torch's antialiased kernel in fixed point. Against both, on sharp random pixels."""
    import torch.nn.functional as F

    from readers.augment.render import _resized

    rng = np.random.default_rng(3)
    for _ in range(60):
        h, w = (int(v) for v in rng.integers(2, 120, size=2))
        size = (int(rng.integers(h, 160)), int(rng.integers(w, 160)))
        image = rng.integers(0, 256, size=(h + 7, w + 5, channels), dtype=np.uint8)
        cut = image[3 : 3 + h, 2 : 2 + w]  # a view, as crops are cut
        out = _resized(cut, size)
        assert out.shape == (*size, channels)
        nchw = torch.from_numpy(np.ascontiguousarray(cut)).permute(2, 0, 1)[None]
        torchs = F.interpolate(nchw, size=size, mode="bilinear", antialias=True, align_corners=False)[0]
        assert np.abs(out.astype(int) - torchs.permute(1, 2, 0).numpy().astype(int)).max() <= 1
        pil = Image.fromarray(np.ascontiguousarray(cut[:, :, 0] if channels == 1 else cut))
        pillows = np.asarray(pil.resize(size[::-1], Image.Resampling.BILINEAR)).reshape(*size, channels)
        assert np.abs(out.astype(int) - pillows.astype(int)).max() <= 2


_AFTER_OPENCV_THREADS = """
import sys
import cv2
import numpy as np
from readers import RandomResizedCrop, make_loader, open_dataset
big = np.zeros((2000, 2000, 3), np.uint8)
cv2.resize(big, (3000, 3000))  # the parent's OpenCV thread pool starts
ds = open_dataset(sys.argv[1], crop=RandomResizedCrop(96), flip=True)
ds[0]
print(sum(len(labels) for _, labels in make_loader(ds, 4, num_workers=2)))
"""


def test_workers_forked_after_the_parent_used_opencvs_threads_finish(outputs):
    """Workers enlarge crops with OpenCV after a parent that started its thread pool: they must not
    touch that pool (asking OpenCV for one thread there hung the worker)."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", _AFTER_OPENCV_THREADS, str(outputs["npy"])], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.split()[-1] == "18", done.stderr[-2000:]


def test_center_crop_with_resize_is_torchvisions_evaluation_recipe(outputs):
    ds = open_dataset(outputs["npy"], normalize=False, crop=CenterCrop(32, resize=40))
    plain = open_dataset(outputs["npy"], normalize=False)
    for i in range(len(ds)):
        stored = plain[i][0].permute(1, 2, 0).numpy()
        h, w = stored.shape[:2]
        # torchvision: Resize(40) (shorter side to 40, longer truncated), then CenterCrop(32)
        nw, nh = (40, int(40 * h / w)) if w <= h else (int(40 * w / h), 40)
        resized = np.asarray(Image.fromarray(stored).resize((nw, nh), Image.Resampling.BILINEAR))
        top, left = int(round((nh - 32) / 2.0)), int(round((nw - 32) / 2.0))
        want = resized[top : top + 32, left : left + 32]
        got = ds[i][0].permute(1, 2, 0).numpy()
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1  # torch's resize kernel against Pillow's


def test_center_crop_without_resize_pads_small_images_as_torchvision(outputs):
    ds = open_dataset(outputs["lmdb"], normalize=False, return_meta=True, crop=CenterCrop(64))
    plain = open_dataset(outputs["lmdb"], normalize=False)
    for i in range(len(ds)):
        stored = plain[i][0].permute(1, 2, 0).numpy()
        h, w = stored.shape[:2]
        padded = np.zeros((max(h, 64) + 2, max(w, 64) + 2, 3), np.uint8)  # torchvision pads, then crops
        pt, pl = max(0, (64 - h) // 2), max(0, (64 - w) // 2)
        padded[pt : pt + h, pl : pl + w] = stored
        ph, pw = h + max(0, 64 - h), w + max(0, 64 - w)
        top, left = int(round((ph - 64) / 2.0)), int(round((pw - 64) / 2.0))
        assert np.array_equal(ds[i][0].permute(1, 2, 0).numpy(), padded[top : top + 64, left : left + 64])


def epoch_batches(ds, epochs=(0,), **options) -> list[torch.Tensor]:
    loader = make_loader(ds, 4, seed=11, **options)
    out = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        out += [images.clone() for images, _ in loader]
    return out


@pytest.mark.parametrize("fmt", ["npy", "hdf5", "npy-jpeg"])
def test_same_batches_with_0_1_and_2_workers_and_new_crops_each_epoch(outputs, fmt):
    ds = open_dataset(outputs[fmt], crop=RandomResizedCrop(24), flip=True)
    runs = [epoch_batches(ds, (0, 1), num_workers=w) for w in (0, 1, 2)]
    assert len(runs[0]) == 10 and all(b.shape[1:] == (3, 24, 24) for b in runs[0])
    for other in runs[1:]:
        assert len(other) == len(runs[0]) and all(torch.equal(a, b) for a, b in zip(runs[0], other))
    unshuffled = [make_loader(ds, 18, shuffle=False, num_workers=0) for _ in range(2)]
    unshuffled[1].set_epoch(1)
    e0, e1 = (next(iter(loader))[0] for loader in unshuffled)
    assert not torch.equal(e0, e1)  # the same samples, other crops
    centre = open_dataset(outputs[fmt], crop=CenterCrop(24))
    c0, c1 = epoch_batches(centre, (0,), shuffle=False), epoch_batches(centre, (1,), shuffle=False)
    # a centre crop is the same every epoch
    assert len(c0) == len(c1) == 5 and all(torch.equal(a, b) for a, b in zip(c0, c1))


def test_tar_shards_give_each_sample_the_same_crop_whatever_the_workers(outputs):
    def by_index(workers: int) -> dict:
        ds = open_dataset(outputs["wds-jpeg"], crop=RandomResizedCrop(24), flip=True, return_meta=True, seed=2)
        loader = DataLoader(ds, batch_size=None, num_workers=workers)
        return {meta["index"]: img for img, _, meta in loader}

    first = by_index(0)
    assert sorted(first) == list(range(18))
    for workers in (1, 2):
        got = by_index(workers)
        assert sorted(got) == list(range(18)) and all(torch.equal(first[i], img) for i, img in got.items())
    batches = [
        torch.cat(
            epoch_batches(
                open_dataset(outputs["wds"], crop=RandomResizedCrop(24)), (0, 1), num_workers=w, shuffle=False
            )
        )
        for w in (0, 2)
    ]
    assert batches[0].shape == (36, 3, 24, 24)


def test_resume_mid_epoch_gives_the_batches_of_the_uninterrupted_run(outputs):
    ds = open_dataset(outputs["lmdb"], crop=RandomResizedCrop(24), flip=True)
    whole = epoch_batches(ds, (0, 1, 2), num_workers=2)
    loader = make_loader(ds, 4, seed=11, num_workers=2)
    taken = [images.clone() for images, _ in loader]  # epoch 0
    for n, (images, _) in enumerate(loader):  # epoch 1, stopped after 2 batches
        taken.append(images.clone())
        if n == 1:
            break
    state = loader.state_dict()
    again = make_loader(open_dataset(outputs["lmdb"], crop=RandomResizedCrop(24), flip=True), 4, seed=11, num_workers=2)
    again.load_state_dict(state)
    taken += [images.clone() for images, _ in again]  # the rest of epoch 1
    taken += [images.clone() for images, _ in again]  # epoch 2
    assert len(taken) == len(whole) == 15
    assert all(torch.equal(a, b) for a, b in zip(whole, taken))


def test_a_plain_dataloader_follows_set_epoch_in_persistent_workers(outputs):
    ds = open_dataset(outputs["npy"], crop=RandomResizedCrop(24), normalize=False)
    loader = DataLoader(ds, batch_size=6, num_workers=2, persistent_workers=True)

    def epoch(e: int) -> torch.Tensor:
        ds.set_epoch(e)
        return torch.cat([images for images, _ in loader])

    e0, e1, e0_again = epoch(0), epoch(1), epoch(0)
    assert e0.shape == (18, 3, 24, 24) and not torch.equal(e0, e1) and torch.equal(e0, e0_again)
    assert torch.equal(e0, torch.stack([ds[i][0] for i in range(18)]))  # dataset[i] in this process follows it too
    ds.set_epoch(1)
    assert torch.equal(e1, torch.stack([ds[i][0] for i in range(18)]))


def test_flip_alone_mirrors_about_half_the_stored_images(outputs):
    plain = open_dataset(outputs["npy"], normalize=False)
    ds = open_dataset(outputs["npy"], normalize=False, flip=True, return_meta=True)
    flipped = 0
    for i in range(len(ds)):
        img, _, meta = ds[i]
        want = plain[i][0].flip(-1) if meta["flip"] else plain[i][0]
        assert torch.equal(img, want)
        flipped += meta["flip"]
    assert 0 < flipped < len(ds)


def test_gray_images_are_cropped_in_one_channel(tmp_path):
    src = tmp_path / "src"
    for i in range(4):
        write_image(src / "a" / f"{i}.png", (50 + 10 * i, 40), mode="L", seed=i)
    convert(src, tmp_path / "out", ConvertConfig("hdf5", PreprocessConfig(resize="none", mode="L")), workers=1)
    ds = open_dataset(tmp_path / "out", normalize=False, crop=RandomResizedCrop(16), return_meta=True)
    img, _, meta = ds[2]
    assert img.shape == (1, 16, 16) and img.dtype == torch.uint8
    stored = open_dataset(tmp_path / "out", normalize=False)[2][0].permute(1, 2, 0).numpy()
    assert np.abs(img.permute(1, 2, 0).numpy().astype(int) - reference(stored, meta, (16, 16)).astype(int)).max() <= 2
    ds.return_meta = False
    images, labels = next(iter(make_loader(ds, 4, num_workers=0)))
    assert images.shape == (4, 1, 16, 16)


def test_reduced_decode_of_large_jpegs_is_opt_in_and_close_to_a_full_decode(tmp_path):
    src = tmp_path / "src"
    photos = sorted((Path(__file__).parents[1] / "sample_data" / "images").glob("*/*"))[:4]
    for i, photo in enumerate(photos):  # photographs: what the reduced decode is for
        (src / "a").mkdir(parents=True, exist_ok=True)
        Image.open(photo).convert("RGB").resize((1000, 750), Image.Resampling.BICUBIC).save(
            src / "a" / f"{i}.jpg", quality=90
        )
    convert(
        src,
        tmp_path / "out",
        ConvertConfig("npy", PreprocessConfig(resize="none"), codec=ImageCodec("jpeg")),
        workers=1,
    )
    plain = open_dataset(tmp_path / "out", normalize=False)
    diffs, reduced = [], 0
    for epoch in range(3):
        for opt_in in (False, True):
            ds = open_dataset(
                tmp_path / "out", normalize=False, return_meta=True, crop=RandomResizedCrop(224, reduced_decode=opt_in)
            )
            ds.set_epoch(epoch)
            for i in range(len(ds)):
                img, _, meta = ds[i]
                want = reference(plain[i][0].permute(1, 2, 0).numpy(), meta, (224, 224)).astype(int)
                diff = np.abs(img.permute(1, 2, 0).numpy().astype(int) - want)
                if not opt_in:
                    assert diff.max() <= 2  # the default: a full decode, torchvision's pixels
                else:
                    diffs.append(diff)
                    reduced += meta["crop"][2] - meta["crop"][0] >= 224 * 8 / 5  # large enough to decode at 5/8
    assert reduced >= 3
    diff = np.concatenate([d.ravel() for d in diffs])
    # DCT scaling filters otherwise than an antialiased resize: close on average, beyond 2 levels at edges
    assert diff.mean() < 1.0 and np.percentile(diff, 99) <= 3


def test_crops_are_refused_where_they_cannot_be_right(tmp_path, outputs):
    with pytest.raises(ConfigError, match="RandomResizedCrop"):
        open_dataset(outputs["npy"], crop="224")
    src = tmp_path / "src"
    write_image(src / "a" / "0.png", (20, 20))
    convert(src, tmp_path / "f32", ConvertConfig("npy", PreprocessConfig(size=(8, 8), dtype="float32")), workers=1)
    with pytest.raises(ConfigError, match="8-bit"):
        open_dataset(tmp_path / "f32", crop=RandomResizedCrop(4))
    with pytest.raises(ValueError, match="positive int"):
        RandomResizedCrop(0)
    with pytest.raises(ValueError, match="padded"):
        CenterCrop(224, resize=200)
    with pytest.raises(ValueError, match="different sizes"):
        make_loader(open_dataset(outputs["npy"]), 4)
    with pytest.raises(ValueError, match="different sizes"):
        make_loader(open_dataset(outputs["npy"], flip=True), 4)  # a flip alone keeps the sizes


def test_in_memory_images_are_cropped_like_the_files(outputs, tmp_path):
    src = outputs["_src"]
    convert(src, tmp_path / "fixed", ConvertConfig("npy", PreprocessConfig(size=(48, 40))), workers=1)
    a = open_dataset(tmp_path / "fixed", crop=RandomResizedCrop(24), flip=True, in_memory=True)
    b = open_dataset(tmp_path / "fixed", crop=RandomResizedCrop(24), flip=True)
    in_memory, from_files = epoch_batches(a, num_workers=0), epoch_batches(b, num_workers=0)
    assert len(in_memory) == len(from_files) == 5 and all(torch.equal(x, y) for x, y in zip(in_memory, from_files))


def test_tar_shards_follow_set_epoch_in_persistent_workers_and_count_passes_in_fresh_ones(outputs):
    def crops(epochs, workers, persistent, set_epoch=True):
        ds = open_dataset(outputs["wds"], crop=RandomResizedCrop(24), flip=True, return_meta=True)
        loader = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=persistent)
        out = []
        for epoch in epochs:
            if set_epoch:
                ds.set_epoch(epoch)
            out.append({meta["index"]: img for img, _, meta in loader})
        return out

    want = crops([0, 1, 2, 5], 0, False)
    assert [sorted(w) for w in want] == [list(range(18))] * 4
    for got in (crops([0, 1, 2, 5], 2, True), crops([0, 1, 2, 5], 2, False)):
        assert [sorted(g) for g in got] == [list(range(18))] * 4
        assert all(torch.equal(w[i], g[i]) for w, g in zip(want, got) for i in w)
    passes = crops([0, 1, 2], 2, False, set_epoch=False)  # no set_epoch: each pass moves to the next epoch
    assert [sorted(p) for p in passes] == [list(range(18))] * 3
    assert all(torch.equal(want[e][i], passes[e][i]) for e in range(3) for i in want[e])


def test_map_style_readers_in_workers_without_set_epoch_warn_that_crops_repeat(outputs, recwarn):
    import readers.datasets.mapstyle

    readers.datasets.mapstyle._WARNED.clear()
    ds = open_dataset(outputs["npy"], crop=RandomResizedCrop(24))
    list(DataLoader(ds, batch_size=6, num_workers=0))  # in this process: epoch 0, no warning
    assert not [w for w in recwarn if "set_epoch" in str(w.message)]
    readers.datasets.mapstyle._WARNED.clear()
    import torch.utils.data

    original = torch.utils.data.get_worker_info
    readers.datasets.mapstyle.get_worker_info = lambda: object()  # as inside a DataLoader worker
    try:
        with pytest.warns(UserWarning, match="set_epoch"):
            ds[0]
    finally:
        readers.datasets.mapstyle.get_worker_info = original
    ds.set_epoch(0)
    readers.datasets.mapstyle._WARNED.clear()
    readers.datasets.mapstyle.get_worker_info = lambda: object()
    try:
        ds[0]  # set: no warning
    finally:
        readers.datasets.mapstyle.get_worker_info = original
    assert not [w for w in recwarn if "set_epoch" in str(w.message)]


def test_a_state_saved_with_other_crops_or_seed_is_refused(outputs):
    ds = open_dataset(outputs["npy"], crop=RandomResizedCrop(24), flip=True)
    state = make_loader(ds, 4, seed=1, num_workers=0).state_dict()
    with pytest.raises(ValueError, match="augment"):
        make_loader(
            open_dataset(outputs["npy"], crop=RandomResizedCrop(28), flip=True), 4, seed=1, num_workers=0
        ).load_state_dict(state)
    sampler = torch.utils.data.SequentialSampler(range(18))
    saved = make_loader(ds, 4, seed=1, sampler=sampler, num_workers=0).state_dict()
    with pytest.raises(ValueError, match="seed"):  # the seed draws the crops, even with the caller's sampler
        make_loader(ds, 4, seed=2, sampler=sampler, num_workers=0).load_state_dict(saved)


def test_a_box_the_conversion_cut_is_dropped_by_the_share_of_its_annotation_left(tmp_path):
    """min_visibility is a share of the annotated box, whatever cut it: a box the conversion's crop
    left 11.8% of, which a reader's crop cuts to 1 of its 4 stored pixels (2.9% of the annotation),
    is dropped; the reader dropped it by the 25% of the stored box left."""
    import json

    from packer.config import DetectionConfig

    px = np.zeros((40, 100, 3), np.uint8)
    px[5:35, 66:100] = (255, 0, 0)
    (tmp_path / "img").mkdir()
    Image.fromarray(px).save(tmp_path / "img" / "a.png")
    (tmp_path / "coco.json").write_text(
        json.dumps(
            {
                "images": [{"id": 1, "file_name": "a.png", "width": 100, "height": 40}],
                "annotations": [
                    {"id": 1, "image_id": 1, "category_id": 1, "bbox": [66, 5, 34, 30], "area": 1020, "iscrowd": 0}
                ],
                "categories": [{"id": 1, "name": "obj"}],
            }
        )
    )
    convert(
        tmp_path / "img",
        tmp_path / "out",
        ConvertConfig(
            "npy",
            PreprocessConfig(size=(40, 40)),
            detection=DetectionConfig(str(tmp_path / "coco.json"), coords="stored", min_visibility=0.1),
        ),
        workers=1,
    )
    _, stored = open_dataset(tmp_path / "out")[0]
    assert stored["boxes"].tolist() == [[36.0, 5.0, 40.0, 35.0]]
    assert stored["visible"].tolist() == pytest.approx([4 / 34])
    _, cut = open_dataset(tmp_path / "out", crop=CenterCrop((40, 34)))[0]
    assert cut["boxes"].shape == (0, 4) and cut["visible"].shape == (0,)
    _, whole = open_dataset(tmp_path / "out", crop=CenterCrop((40, 40)))[0]  # nothing more cut: kept as stored
    assert whole["boxes"].tolist() == [[36.0, 5.0, 40.0, 35.0]] and whole["visible"].tolist() == pytest.approx([4 / 34])
