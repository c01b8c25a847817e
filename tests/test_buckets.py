"""Aspect-ratio buckets (readers.augment.buckets, readers.loading.bucket_sampler, make_loader(buckets=)):
batches of one shape from images of many shapes, each image in the bucket nearest its aspect ratio,
every image once an epoch, equal batches per rank, exact resume, boxes following the pixels."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import DetectionConfig
from readers import AspectBuckets, CenterCrop, make_loader, open_dataset
from readers.augment.buckets import budget_resolutions
from readers.loading.bucket_sampler import AspectBucketSampler

BUCKETS = AspectBuckets(((32, 64), (40, 56), (48, 48), (56, 40), (64, 32)))
# (width, height) of the source images: every bucket gets some, some shapes between two buckets
SHAPES = [(96, 48), (80, 40), (70, 50), (66, 54), (60, 60), (50, 62), (44, 80), (40, 90), (100, 56)]
RED = (255, 0, 0)


def write_images(root: Path, copies: int = 3) -> list[dict]:
    """Grey images of SHAPES, each with a red rectangle in its middle third; their COCO entries."""
    root.mkdir(parents=True)
    entries = []
    for i, (w, h) in enumerate(SHAPES * copies):
        pixels = np.full((h, w, 3), 128, np.uint8)
        box = (w // 3, h // 3, 2 * w // 3, 2 * h // 3)
        pixels[box[1] : box[3], box[0] : box[2]] = RED
        Image.fromarray(pixels).save(root / f"img{i:02d}.png")
        entries.append({"name": f"img{i:02d}.png", "size": (w, h), "box": box})
    return entries


def write_coco(path: Path, entries: list[dict]) -> None:
    images = [
        {"id": i + 1, "file_name": e["name"], "width": e["size"][0], "height": e["size"][1]}
        for i, e in enumerate(entries)
    ]
    anns = [
        {"id": i + 1, "image_id": i + 1, "category_id": 1, "bbox": [x0, y0, x1 - x0, y1 - y0], "area": 1, "iscrowd": 0}
        for i, (x0, y0, x1, y1) in enumerate(e["box"] for e in entries)
    ]
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": 1, "name": "red"}]}))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("buckets")
    entries = write_images(root / "images")
    write_coco(root / "coco.json", entries)
    own = PreprocessConfig(size=None, resize="none")
    out = {}
    for name, config in {
        "npy": ConvertConfig("npy", own),
        "lmdb": ConvertConfig("lmdb", own),
        "wds": ConvertConfig("wds", own),
        "boxes": ConvertConfig("npy", own, detection=DetectionConfig(str(root / "coco.json"), coords="stored")),
        "fixed": ConvertConfig("npy", PreprocessConfig(size=(32, 32))),
    }.items():
        convert(root / "images", root / name, config, workers=1)
        out[name] = root / name
    return out


def test_budget_resolutions_are_steps_within_the_budget_and_the_ratio():
    found = budget_resolutions((1024, 1024), 64, 2.0)
    assert (1024, 1024) in found and (832, 1216) in found and (1216, 832) in found
    assert all(h % 64 == 0 and w % 64 == 0 and h * w <= 1024 * 1024 and 0.5 <= w / h <= 2 for h, w in found)
    assert [w / h for h, w in found] == sorted(w / h for h, w in found)
    assert AspectBuckets.budget(1024 * 1024, 64, 2.0).resolutions == found
    with pytest.raises(ValueError, match="pixel budget"):
        budget_resolutions(100, 64)


def test_each_image_goes_to_the_bucket_nearest_its_aspect_ratio_in_log_space():
    sizes = np.array([(48, 96), (50, 70), (60, 60), (80, 50), (90, 40), (54, 60)])  # (height, width)
    assert BUCKETS.bucket_ids(sizes).tolist() == [0, 1, 2, 3, 4, 2]
    # 2:1 and 1:2 are as far from 1:1: a 1.5 ratio is nearer 56/40 (1.4) than 64/32 (2)
    assert BUCKETS.bucket_of(40, 60) == 1 and BUCKETS.bucket_of(60, 40) == 3
    with pytest.raises(ValueError, match="distinct"):
        AspectBuckets(((32, 64), (32, 64)))


@pytest.mark.parametrize("fmt", ["npy", "lmdb"])
def test_batches_are_one_bucket_each_and_every_image_comes_once_an_epoch(outputs, fmt):
    ds = open_dataset(outputs[fmt], return_meta=True)
    sizes = ds.image_sizes
    loader = make_loader(ds, 4, buckets=BUCKETS, num_workers=0, seed=2)
    epochs = []
    for _ in range(2):
        seen = []
        for images, _, meta in loader:
            indices = meta["index"].tolist()
            shapes = {tuple(BUCKETS.resolutions[BUCKETS.bucket_of(*sizes[i])]) for i in indices}
            assert len(shapes) == 1 and tuple(images.shape[2:]) == shapes.pop()  # one bucket, its resolution
            seen.append(indices)
        assert sorted(i for b in seen for i in b) == list(range(len(ds)))
        epochs.append(seen)
    assert epochs[0] != epochs[1]  # the next epoch's order


def test_plain_batches_are_read_whole_into_one_tensor(outputs):
    ds = open_dataset(outputs["npy"])
    loader = make_loader(ds, 4, buckets=BUCKETS, num_workers=0, shuffle=False)
    reference = make_loader(
        open_dataset(outputs["npy"], return_meta=True), 4, buckets=BUCKETS, num_workers=0, shuffle=False
    )
    reader = loader.loader.dataset  # the loader's copy: a one-bucket batch is one PackedBatch, not samples
    assert type(reader.__getitems__(loader.sampler.batches(0)[0])).__name__ == "PackedBatch"
    for (images, labels), (ref_images, ref_labels, _) in zip(loader, reference, strict=True):
        assert images.dtype == torch.float32 and images.is_contiguous()
        assert torch.equal(images, ref_images) and torch.equal(labels, ref_labels)  # the same as sample by sample


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_get_equal_batch_counts_of_one_bucket_and_cover_the_epoch(world, drop_last):
    buckets = np.array([0] * 11 + [1] * 5 + [2] * 9 + [3])
    ranks = [
        AspectBucketSampler(buckets, 4, rank=r, world_size=world, seed=1, drop_last=drop_last) for r in range(world)
    ]
    per_rank = [s.batches(3) for s in ranks]
    assert {len(b) for b in per_rank} == {len(ranks[0])}
    assert all(len(set(buckets[x].tolist())) == 1 for b in per_rank for x in b)
    seen = [i for b in per_rank for x in b for i in x]
    assert len(seen) == len(set(seen))
    if drop_last:
        assert all(len(x) == 4 for b in per_rank for x in b)
    else:
        assert sorted(seen) == list(range(len(buckets)))


def test_a_bucketed_loader_resumes_exactly(outputs):
    ds = open_dataset(outputs["npy"], return_meta=True)
    whole = [meta["index"].tolist() for *_, meta in make_loader(ds, 3, buckets=BUCKETS, num_workers=0, seed=4)]
    first = make_loader(ds, 3, buckets=BUCKETS, num_workers=0, seed=4)
    got = [meta["index"].tolist() for *_, meta in itertools.islice(first, 4)]
    state = first.state_dict()
    again = make_loader(ds, 3, buckets=BUCKETS, num_workers=0, seed=4)
    again.load_state_dict(state)
    assert got + [meta["index"].tolist() for *_, meta in again] == whole
    other = make_loader(ds, 3, buckets=AspectBuckets(((48, 48), (32, 64))), num_workers=0, seed=4)
    with pytest.raises(ValueError, match="cannot resume"):
        other.load_state_dict(state)


def test_boxes_follow_each_image_into_its_bucket(outputs):
    ds = open_dataset(outputs["boxes"], normalize=False, flip=True)
    loader = make_loader(ds, 3, buckets=BUCKETS, num_workers=0, seed=5)
    checked = 0
    for images, targets in loader:
        for image, target in zip(images, targets):
            pixels = image.permute(1, 2, 0).numpy()
            red = (np.abs(pixels.astype(int) - np.array(RED)).max(axis=-1) <= 60).nonzero()
            box = target["boxes"].tolist()
            if not len(red[0]):
                assert box == []  # the crop cut the rectangle away, and its box with it
                continue
            found = (red[1].min(), red[0].min(), red[1].max() + 1, red[0].max() + 1)
            assert len(box) == 1 and np.allclose(box[0], found, atol=1.5), (box, found)
            checked += 1
    assert checked >= 20


def test_describe_says_what_each_bucket_got_and_what_the_crops_cut(outputs):
    ds = open_dataset(outputs["npy"])
    about = make_loader(ds, 4, buckets=BUCKETS, num_workers=0).describe()
    assert sum(b["images"] for b in about["buckets"]) == len(ds) and len(about["buckets"]) == 5
    assert 0 < about["cropped_share"] < about["square_crop_share"] < 1  # buckets keep more than squares
    assert about["batches"] == len(make_loader(ds, 4, buckets=BUCKETS, num_workers=0))


PADDED = AspectBuckets(BUCKETS.resolutions, fit="pad")


def test_padded_buckets_keep_the_whole_image_at_the_corner_and_boxes_follow(outputs):
    """fit="pad": each image resized whole to fit its bucket, zeros to its right and below, flipped or
    not (the flip mirrors the image, which stays at its corner), the red rectangle where its box says."""
    ds = open_dataset(outputs["boxes"], normalize=False, flip=True, return_meta=True)
    sizes = ds.image_sizes
    flips = set()
    for images, targets, meta in make_loader(ds, 3, buckets=PADDED, num_workers=0, seed=5):
        for image, target, about in zip(images, targets, meta):
            index, flip = about["index"], about["flip"]
            h, w = (int(v) for v in sizes[index])
            bucket = PADDED.bucket_of(h, w)
            fh, fw = PADDED.fitted(h, w, bucket)
            assert tuple(image.shape[1:]) == PADDED.resolutions[bucket]
            assert fh == image.shape[1] or fw == image.shape[2]  # as large as fits
            assert abs(fw / fh - w / h) <= max(1 / fh, 1 / fw) * w / h * 1.01  # its own ratio
            pixels = image.permute(1, 2, 0).numpy()
            rows, cols = pixels.max(axis=-1).nonzero()
            assert (rows.min(), rows.max() + 1, cols.min(), cols.max() + 1) == (0, fh, 0, fw)
            red = (np.abs(pixels.astype(int) - np.array(RED)).max(axis=-1) <= 60).nonzero()
            found = (red[1].min(), red[0].min(), red[1].max() + 1, red[0].max() + 1)
            assert np.allclose(target["boxes"].tolist()[0], found, atol=1.5), (target["boxes"], found)
            flips.add(bool(flip))
    assert flips == {False, True}


def test_padded_buckets_describe_their_padding_and_cut_nothing(outputs):
    ds = open_dataset(outputs["npy"])
    about = make_loader(ds, 4, buckets=PADDED, num_workers=0).describe()
    assert about["fit"] == "pad" and about["cropped_share"] == 0.0
    assert 0 < about["padded_share"] < about["square_pad_share"] < 1  # buckets pad less than squares
    sizes = ds.image_sizes
    fitted = [PADDED.fitted(h, w, PADDED.bucket_of(h, w)) for h, w in sizes]
    canvas = [np.prod(PADDED.resolutions[PADDED.bucket_of(h, w)]) for h, w in sizes]
    assert about["padded_share"] == pytest.approx(1 - sum(h * w for h, w in fitted) / sum(canvas))
    with pytest.raises(ValueError, match="fit takes one of crop, pad"):
        AspectBuckets(BUCKETS.resolutions, fit="stretch")


def test_a_padded_mask_takes_the_ignore_index_and_a_random_position_moves_the_image():
    from readers.augment.crops import Draws
    from readers.augment.placing import place_mask

    square = AspectBuckets(((48, 48),), fit="pad")
    mask = torch.arange(20 * 40, dtype=torch.uint8).reshape(20, 40) % 7  # (height, width): fitted to 24 x 48
    placed = place_mask(mask, square.placement(20, 40, Draws(0, 0, 0)), 255)
    assert tuple(placed.shape) == (48, 48) and (placed[24:] == 255).all() and (placed[:24] != 255).all()
    ys, xs = (((torch.arange(n) + 0.5) / 1.2).long() for n in (24, 48))
    assert torch.equal(placed[:24], mask[ys][:, xs])  # nearest neighbour at a 1.2 scale, at the corner
    tall = torch.arange(40 * 20, dtype=torch.uint8).reshape(40, 20) % 7  # fitted to 48 x 24, at the left
    upright = place_mask(tall, square.placement(40, 20, Draws(0, 0, 0)), 255)
    mirrored = place_mask(tall, square.flipped(square.placement(40, 20, Draws(0, 0, 0))), 255)
    assert (upright[:, 24:] == 255).all() and (mirrored[:, 24:] == 255).all()  # still at the left
    assert torch.equal(mirrored[:, :24], upright[:, :24].flip(-1))  # the image mirrored in its place
    moving = AspectBuckets(((48, 48),), fit="pad", random_position=True)
    tops = {moving.placement(20, 40, Draws(0, e, 0)).offset for e in range(8)}
    assert len(tops) > 1 and all(left == 0 and -24 <= top <= 0 for top, left in tops)


def test_a_jpeg_decoded_at_a_reduced_scale_is_padded_as_the_full_decode(tmp_path):
    from readers.augment.crops import Draws
    from readers.augment.render import render

    pixels = np.zeros((400, 800, 3), np.uint8)
    pixels[:, :, 0] = np.linspace(0, 255, 800, dtype=np.uint8)[None, :]
    pixels[:, :, 1] = np.linspace(0, 255, 400, dtype=np.uint8)[:, None]
    Image.fromarray(pixels).save(tmp_path / "wide.jpg", quality=95)
    data = (tmp_path / "wide.jpg").read_bytes()
    reduced = AspectBuckets(((48, 48),), fit="pad", reduced_decode=True).placement(400, 800, Draws(0, 0, 0))
    full = render(data, "jpeg", "RGB", reduced._replace(reduced=False))
    small = render(data, "jpeg", "RGB", reduced)
    assert full.shape == small.shape == (48, 48, 3)
    assert (small[24:] == 0).all() and (full[24:] == 0).all()
    assert np.abs(small[:24].astype(int) - full[:24].astype(int)).mean() < 4


def test_what_buckets_cannot_batch_is_refused_saying_what_to_do(outputs):
    with pytest.raises(ValueError, match="stored in one size: convert with --resize none"):
        make_loader(open_dataset(outputs["fixed"]), 4, buckets=BUCKETS)
    with pytest.raises(ValueError, match="tar shards are read in order"):
        make_loader(open_dataset(outputs["wds"]), 4, buckets=BUCKETS)
    with pytest.raises(ValueError, match="without crop="):
        make_loader(open_dataset(outputs["npy"], crop=CenterCrop(32)), 4, buckets=BUCKETS)
    with pytest.raises(ValueError, match="pass no bucket_by_length, sampler"):
        make_loader(open_dataset(outputs["npy"]), 4, buckets=BUCKETS, sampler=range(3))


@pytest.mark.parametrize("buckets", [BUCKETS, PADDED], ids=["crop", "pad"])
def test_workers_fill_reused_ring_slots_with_each_buckets_shape(outputs, buckets):
    """With workers, a bucket's batch is written into a reused shared slot (viewed in its own shape):
    the same batches as read in the main process."""
    ds = open_dataset(outputs["npy"], flip=True)
    here = [(x.clone(), y.clone()) for x, y in make_loader(ds, 4, buckets=buckets, num_workers=0, seed=6)]
    loader = make_loader(ds, 4, buckets=buckets, num_workers=2, seed=6)
    assert loader.ring is not None
    there = [(x.clone(), y.clone()) for x, y in loader]
    assert len({tuple(x.shape[2:]) for x, _ in there}) > 1  # several buckets' shapes through one ring
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(here, there, strict=True))
