"""Detection targets that follow the pixels: COCO, YOLO and VOC boxes through every resize mode, crop,
pad and EXIF orientation, in every format, checked against where the rectangles really are."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import FORMATS
from PIL import Image, ImageOps

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import DetectionConfig, ShardSize
from packer.output.verify import verify
from packer.spec.errors import ConfigError
from packer.spec.manifest import read_manifest
from readers import CenterCrop, RandomResizedCrop, make_loader, open_dataset

# Stored (file) size and EXIF orientation of each image, and its rectangles: (x0, y0, x1, y1) on the
# stored pixel grid, each in a colour of its own. Wide and tall images, so that the centre crop cuts
# some rectangles (the ones near the long sides' ends) and removes others entirely.
COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (255, 0, 255), (0, 255, 255)]
IMAGES = [
    ((120, 80), 1, [(10, 10, 40, 50), (50, 20, 110, 70), (2, 60, 12, 78)]),
    ((160, 60), 3, [(0, 5, 12, 55), (60, 10, 100, 50), (140, 20, 158, 40)]),
    ((90, 150), 6, [(20, 30, 70, 80), (5, 2, 30, 14), (40, 120, 85, 148)]),
    ((140, 100), 8, [(30, 20, 110, 80), (118, 4, 138, 30)]),
    ((100, 100), 1, []),  # an image without boxes: a negative, kept with an empty target
]
CATEGORIES = ["circle", "square", "star"]


def write_images(root: Path) -> list[dict]:
    """The images as PNGs (lossless: the colours are exact) with their EXIF orientation; returns, per
    image, its name, stored size, orientation, rectangles and where they are on the displayed image
    (found in the pixels Pillow turns upright, not computed)."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for i, ((w, h), orientation, rects) in enumerate(IMAGES):
        pixels = np.zeros((h, w, 3), np.uint8)
        for n, (x0, y0, x1, y1) in enumerate(rects):
            pixels[y0:y1, x0:x1] = COLOURS[n]
        exif = Image.Exif()
        exif[0x0112] = orientation
        name = f"img{i}.png"
        Image.fromarray(pixels).save(root / name, exif=exif)
        shown = np.asarray(ImageOps.exif_transpose(Image.open(root / name)))
        displayed = [region(shown, COLOURS[n]) for n in range(len(rects))]
        out.append(
            {
                "name": name,
                "size": (w, h),
                "orientation": orientation,
                "rects": rects,
                "displayed": displayed,
                "shown_size": (shown.shape[1], shown.shape[0]),
            }
        )
    return out


def region(pixels: np.ndarray, colour: tuple, tolerance: int = 60) -> tuple[float, ...] | None:
    """The box (pixel edges) of the pixels within ``tolerance`` of ``colour`` (None when there are none)."""
    near = np.abs(pixels[..., :3].astype(int) - np.array(colour)).max(axis=-1) <= tolerance
    ys, xs = np.nonzero(near)
    if len(xs) == 0:
        return None
    return (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))


def write_coco(path: Path, images: list[dict], displayed_sizes: bool = False) -> None:
    """COCO boxes on the stored grid (sizes the files'), or with ``displayed_sizes`` on the turned image."""
    entries, anns = [], []
    for i, img in enumerate(images):
        size = img["shown_size"] if displayed_sizes else img["size"]
        entries.append({"id": i + 1, "file_name": img["name"], "width": size[0], "height": size[1]})
        boxes = img["displayed"] if displayed_sizes else img["rects"]
        for n, (x0, y0, x1, y1) in enumerate(boxes):
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": i + 1,
                    "category_id": 10 + n % 3,
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "area": (x1 - x0) * (y1 - y0),
                    "iscrowd": 0,
                }
            )
    cats = [{"id": 10 + k, "name": name} for k, name in enumerate(CATEGORIES)]
    path.write_text(json.dumps({"images": entries, "annotations": anns, "categories": cats}))


def write_yolo(folder: Path, images: list[dict]) -> None:
    """YOLO rows on the displayed image (as Ultralytics reads them), names in classes.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "classes.txt").write_text("\n".join(CATEGORIES) + "\n")
    for img in images:
        w, h = img["shown_size"]
        rows = [
            f"{n % 3} {(x0 + x1) / 2 / w:.6f} {(y0 + y1) / 2 / h:.6f} {(x1 - x0) / w:.6f} {(y1 - y0) / h:.6f}"
            for n, (x0, y0, x1, y1) in enumerate(img["displayed"])
        ]
        if rows:  # an image without a label file is a negative
            (folder / (Path(img["name"]).stem + ".txt")).write_text("\n".join(rows) + "\n")


def write_voc(folder: Path, images: list[dict]) -> None:
    """VOC objects on the stored grid, 1-based inclusive pixel indices."""
    folder.mkdir(parents=True, exist_ok=True)
    for img in images:
        root = ElementTree.Element("annotation")
        ElementTree.SubElement(root, "filename").text = img["name"]
        size = ElementTree.SubElement(root, "size")
        ElementTree.SubElement(size, "width").text = str(img["size"][0])
        ElementTree.SubElement(size, "height").text = str(img["size"][1])
        for n, (x0, y0, x1, y1) in enumerate(img["rects"]):
            obj = ElementTree.SubElement(root, "object")
            ElementTree.SubElement(obj, "name").text = CATEGORIES[n % 3]
            box = ElementTree.SubElement(obj, "bndbox")
            for key, value in zip(("xmin", "ymin", "xmax", "ymax"), (x0 + 1, y0 + 1, x1, y1)):
                ElementTree.SubElement(box, key).text = str(value)
        ElementTree.ElementTree(root).write(folder / (Path(img["name"]).stem + ".xml"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("det")
    images = write_images(root / "images")
    write_coco(root / "coco.json", images)
    write_yolo(root / "labels", images)
    write_voc(root / "voc", images)
    return root, images


def check_boxes_on_pixels(
    out: Path, images: list[dict], tolerance: float = 1.5, epoch: int = 0, **options
) -> tuple[int, int]:
    """Every returned box is where its rectangle's colour is in the returned image (within
    ``tolerance`` pixels, the blur of resampling at the edges), every rectangle still visible has its
    box, and labels name the right category. Returns (boxes seen, rectangles gone). ``options`` go to
    the reader (``crop=``, ``flip=``), read in ``epoch``."""
    ds = open_dataset(out, normalize=False, return_meta=True, **options)
    ds.set_epoch(epoch)
    by_name = {img["name"]: img for img in images}
    seen = gone = 0
    assert ds.categories == CATEGORIES
    for image, target, meta in ds:
        img = by_name[meta["key"]]
        pixels = image.permute(1, 2, 0).numpy()
        boxes, labels = target["boxes"], target["labels"]
        assert boxes.dtype == torch.float32 and boxes.shape == (len(labels), 4) and labels.dtype == torch.int64
        found = {}
        for n in range(len(img["rects"])):
            where = region(pixels, COLOURS[n], tolerance=40)
            if where is not None and (where[2] - where[0]) * (where[3] - where[1]) >= 4:
                found[n] = where
        matched = set()
        for box, label in zip(boxes.tolist(), labels.tolist()):
            candidates = [
                n
                for n in found
                if n % 3 == label and n not in matched and max(abs(a - b) for a, b in zip(box, found[n])) <= tolerance
            ]
            assert candidates, f"{meta['key']}: box {box} (label {label}) is on no rectangle; rectangles {found}"
            matched.add(candidates[0])
            seen += 1
        # a rectangle still clearly in the image has its box (the crop may drop a sliver of one)
        for n, where in found.items():
            if (where[2] - where[0]) >= 4 and (where[3] - where[1]) >= 4 and n not in matched:
                area = (where[2] - where[0]) * (where[3] - where[1])
                assert area < 0.3 * image.shape[1] * image.shape[2], f"{meta['key']}: rectangle {n} lost its box"
        gone += len(img["rects"]) - len(matched)
    return seen, gone


MODES = {
    "shorter-crop": PreprocessConfig(size=(64, 64)),
    "fractional": PreprocessConfig(size=(64, 48), geometry="fractional"),
    "shorter": PreprocessConfig(size=(50, 50), resize="shorter"),
    "shorter+crop": PreprocessConfig(size=(72, 72), resize="shorter", crop=(56, 64)),
    "max": PreprocessConfig(size=(100, 100), resize="max"),
    "stretch": PreprocessConfig(size=(96, 40), resize="stretch"),
    "pad": PreprocessConfig(size=(64, 64), resize="pad"),
    "none": PreprocessConfig(size=None, resize="none"),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_coco_boxes_follow_every_resize_mode(dataset, tmp_path, mode):
    root, images = dataset
    config = ConvertConfig("npy", MODES[mode], detection=DetectionConfig(str(root / "coco.json"), coords="stored"))
    convert(root / "images", tmp_path / "out", config, workers=1)
    seen, gone = check_boxes_on_pixels(tmp_path / "out", images)
    a = read_manifest(tmp_path / "out").annotations
    assert a["boxes"] == seen and a["boxes_dropped"] == gone
    assert a["categories"] == CATEGORIES and a["category_ids"] == [10, 11, 12] and a["format"] == "coco"
    if mode in ("stretch", "pad", "none", "max", "shorter"):
        assert gone == 0  # nothing is cut away
    if mode == "shorter-crop":
        assert gone > 0  # the crop cut away at least one rectangle, which is counted


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_stores_the_targets(dataset, tmp_path, fmt):
    root, images = dataset
    config = ConvertConfig(
        fmt,
        MODES["shorter-crop"],
        ShardSize(samples=2),
        detection=DetectionConfig(str(root / "coco.json"), coords="stored"),
    )
    convert(root / "images", tmp_path / "out", config, workers=2)
    assert verify(tmp_path / "out") == []
    check_boxes_on_pixels(tmp_path / "out", images)
    targets = [t for _, t in open_dataset(tmp_path / "out")]
    target = next(t for t in targets if len(t["labels"]))
    assert set(target) - {"visible"} == {"boxes", "labels", "iscrowd", "area", "geometry"}
    assert target["geometry"]["size"] == [64, 64]
    cut = [t for t in targets if "visible" in t]  # where the crop cut a box: the share it left of each box
    assert cut
    for t in cut:
        shares = t["visible"].tolist()
        assert len(shares) == len(t["labels"]) and all(0 < v <= 1 for v in shares) and min(shares) < 1


@pytest.mark.parametrize("kind, path", [("yolo", "labels"), ("voc", "voc")])
@pytest.mark.parametrize("mode", ["shorter-crop", "pad"])
def test_yolo_and_voc_boxes_land_on_the_same_pixels(dataset, tmp_path, kind, path, mode):
    root, images = dataset
    coords = "stored" if kind == "voc" else "auto"  # YOLO's rows are on the turned image, as Ultralytics reads them
    config = ConvertConfig("lmdb", MODES[mode], detection=DetectionConfig(str(root / path), coords=coords))
    result = convert(root / "images", tmp_path / "out", config, workers=1)
    check_boxes_on_pixels(tmp_path / "out", images)
    a = result.manifest.annotations
    assert a["format"] == kind and a["categories"] == CATEGORIES
    assert result.manifest.samples == len(IMAGES)  # the negative is kept (YOLO: no label file; VOC: no object)
    assert a["images_without_boxes"] >= 1


@pytest.mark.parametrize("turned", [False, True])
def test_auto_box_coords_follow_the_sizes_and_refuse_what_nothing_decides(dataset, tmp_path, turned):
    """COCO sizes say on which image the boxes are where EXIF turns one by 90 degrees (6, 8); for a
    half turn (3) the sizes are the same either way: that image is skipped, and --box-coords decides."""
    root, images = dataset
    write_coco(tmp_path / "coco.json", images, displayed_sizes=turned)
    config = ConvertConfig("npy", MODES["pad"], detection=DetectionConfig(str(tmp_path / "coco.json")))
    result = convert(root / "images", tmp_path / "auto", config, workers=1)
    assert [s.path for s in result.skipped] == ["img1.png"]  # orientation 3
    assert "ambiguous box coordinates" in result.skipped[0].reason and "--box-coords" in result.skipped[0].reason
    check_boxes_on_pixels(tmp_path / "auto", images)
    told = DetectionConfig(str(tmp_path / "coco.json"), coords="displayed" if turned else "stored")
    convert(root / "images", tmp_path / "told", ConvertConfig("npy", MODES["pad"], detection=told), workers=1)
    seen, gone = check_boxes_on_pixels(tmp_path / "told", images)
    assert seen == sum(len(r) for _, _, r in IMAGES) and gone == 0


def test_make_loader_batches_images_and_a_list_of_targets(dataset, tmp_path):
    root, images = dataset
    detection = DetectionConfig(str(root / "coco.json"), coords="stored")
    config = ConvertConfig("npy", MODES["shorter-crop"], detection=detection)
    convert(root / "images", tmp_path / "out", config, workers=1)
    loader = make_loader(open_dataset(tmp_path / "out"), 2, shuffle=False, num_workers=0)
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(2, 3, 64, 64), (2, 3, 64, 64), (1, 3, 64, 64)]
    assert all(isinstance(b[1], list) and all("boxes" in t for t in b[1]) for b in batches)
    assert batches[0][0].dtype == torch.float32  # normalized as the output says
    config = ConvertConfig("npy", MODES["max"], detection=DetectionConfig(str(root / "coco.json"), coords="stored"))
    convert(root / "images", tmp_path / "own-sizes", config, workers=1)
    images_of_own_size, targets = next(
        iter(make_loader(open_dataset(tmp_path / "own-sizes"), 3, shuffle=False, num_workers=0))
    )
    assert isinstance(images_of_own_size, list) and len(targets) == 3  # the models take a list


def test_bad_annotations_are_reported_and_never_crash(tmp_path):
    images = write_images(tmp_path / "images")
    write_coco(tmp_path / "coco.json", images)
    data = json.loads((tmp_path / "coco.json").read_text())
    data["annotations"] += [
        {"id": 900, "image_id": 1, "category_id": 99, "bbox": [1, 1, 5, 5]},  # no such category
        {"id": 901, "image_id": 77, "category_id": 10, "bbox": [1, 1, 5, 5]},  # no such image
        {"id": 902, "image_id": 1, "category_id": 10, "bbox": [1, 1, -5, 5]},  # no area
        {"id": 903, "image_id": 1, "category_id": 10, "bbox": "oops"},  # malformed
    ]
    data["images"].append({"id": 50, "file_name": "gone.png", "width": 10, "height": 10})
    data["annotations"].append({"id": 904, "image_id": 50, "category_id": 10, "bbox": [1, 1, 5, 5]})
    data["images"] = [e for e in data["images"] if e["file_name"] != "img4.png"]  # an image the file misses
    (tmp_path / "coco.json").write_text(json.dumps(data))
    result = CliRunner().invoke(
        cli,
        [
            "convert",
            str(tmp_path / "images"),
            "-f",
            "npy",
            "-o",
            str(tmp_path / "out"),
            "--size",
            "64",
            "-q",
            "--annotations",
            str(tmp_path / "coco.json"),
            "--box-coords",
            "stored",
        ],
    )
    assert result.exit_code == 0, result.output
    reasons = {s["path"]: s["reason"] for s in read_manifest(tmp_path / "out").skipped}
    assert "category_id 99 is not in 'categories'" in reasons["coco.json#annotations[11] (id 900)"]
    assert "image_id 77" in reasons["coco.json#annotations[12] (id 901)"]
    assert "no area" in reasons["coco.json#annotations[13] (id 902)"]
    assert "bbox" in reasons["coco.json#annotations[14] (id 903)"]
    assert "no image gone.png" in reasons["coco.json#gone.png"]
    assert reasons["img4.png"].startswith("not annotated")
    # img0's other boxes are fine, but an object of it would be missing: left out, not stored as a partial truth
    assert reasons["img0.png"].startswith("bad annotation") and "left out" in reasons["img0.png"]
    assert "bad annotation" in result.output and "Traceback" not in result.output
    assert read_manifest(tmp_path / "out").samples == 3


def test_an_annotation_of_another_size_skips_its_image(tmp_path):
    images = write_images(tmp_path / "images")
    write_coco(tmp_path / "coco.json", images)
    data = json.loads((tmp_path / "coco.json").read_text())
    data["images"][0]["width"] = 999
    (tmp_path / "coco.json").write_text(json.dumps(data))
    config = ConvertConfig("npy", MODES["pad"], detection=DetectionConfig(str(tmp_path / "coco.json"), coords="stored"))
    result = convert(tmp_path / "images", tmp_path / "out", config, workers=1)
    assert [s.path for s in result.skipped] == ["img0.png"]
    assert "annotation size mismatch" in result.skipped[0].reason


def test_the_stored_targets_open_without_packer(dataset, tmp_path):
    root, images = dataset
    detection = DetectionConfig(str(root / "coco.json"), coords="stored")
    config = ConvertConfig("wds", MODES["shorter-crop"], detection=detection)
    convert(root / "images", tmp_path / "out", config, workers=1)
    import tarfile

    with tarfile.open(next((tmp_path / "out").glob("*.tar"))) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".target.json")}
    target = json.loads(next(iter(members.values())))
    assert set(target) >= {"boxes", "labels", "geometry"}
    ours = {meta["index"]: t for _, t, meta in open_dataset(tmp_path / "out", return_meta=True)}
    assert len(members) == len(ours) == len(IMAGES)
    for name, raw in members.items():  # members are KEY.target.json, KEY the sample's index in sorted order
        stored = json.loads(raw)
        assert np.array_equal(
            np.asarray(stored["boxes"], np.float32).reshape(-1, 4), ours[int(name.split(".")[0])]["boxes"].numpy()
        )


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("crop", [None, "flip"])
def test_a_paired_json_is_stored_as_it_is_with_the_image_geometry(dataset, tmp_path, fmt, crop):
    """Other json beside an image is not touched (packer cannot know its coordinates), but the image's
    geometry is stored with it, so the user's own coordinates can be mapped: the meta dict has it."""
    root, images = dataset
    src = tmp_path / "paired"
    src.mkdir()
    for img in images:
        (src / img["name"]).write_bytes((root / "images" / img["name"]).read_bytes())
        x0, y0, x1, y1 = img["displayed"][0] if img["displayed"] else (0, 0, 1, 1)
        (src / (Path(img["name"]).stem + ".json")).write_text(json.dumps({"my_box": [x0, y0, x1, y1]}))
    convert(src, tmp_path / "out", ConvertConfig(fmt, MODES["shorter-crop"]), workers=1)
    # the readers' crop and flip compose the geometry with them: it maps onto the returned image
    options = {"crop": RandomResizedCrop(64, scale=(0.5, 1.0)), "flip": True} if crop else {}
    ds = open_dataset(tmp_path / "out", normalize=False, return_meta=True, **options)
    by_name = {img["name"]: img for img in images}
    checked = 0
    for image, stored_json, label, meta in ds:
        img = by_name[meta["key"] + ".png"]
        g = meta["geometry"]
        assert g["stored_size"] == list(img["size"]) and g["orientation"] == img["orientation"]
        assert g["size"] == [64, 64]
        if not img["rects"]:
            continue
        x0, y0, x1, y1 = stored_json["my_box"]  # as written: packer does not touch a json it cannot read
        (sx, sy), (ox, oy) = g["scale"], g["offset"]
        xs, ys = sorted((x0 * sx + ox, x1 * sx + ox)), sorted((y0 * sy + oy, y1 * sy + oy))
        mapped = [xs[0], ys[0], xs[1], ys[1]]
        if crop:  # the random crop cuts most rectangles: compare what is left of them
            mapped = [min(max(v, 0.0), 64.0) for v in mapped]
            if (mapped[2] - mapped[0]) * (mapped[3] - mapped[1]) < 16:
                continue
        where = region(image.permute(1, 2, 0).numpy(), COLOURS[0], tolerance=40)
        if where is not None and mapped[0] >= 0 and mapped[1] >= 0 and mapped[2] <= 64 and mapped[3] <= 64:
            assert max(abs(a - b) for a, b in zip(mapped, where)) <= 1.5
            checked += 1
    assert checked >= (1 if crop else 2)  # boxes the crop kept whole, mapped by the geometry onto their pixels
    assert len(next(iter(open_dataset(tmp_path / "out")))) == 3  # (image, json, label): geometry in meta only


@pytest.mark.parametrize("mode", ["shorter-crop", "pad", "stretch", "shorter+crop"])
def test_coco_instance_masks_follow_the_pixels(dataset, tmp_path, mode):
    """Polygon and RLE segmentations (pycocotools) go through the same geometry: each returned mask
    covers its rectangle's colour in the returned image, one mask per kept box."""
    from pycocotools import mask as cocomask

    root, images = dataset
    write_coco(tmp_path / "coco.json", images)
    data = json.loads((tmp_path / "coco.json").read_text())
    sizes = {e["id"]: (e["width"], e["height"]) for e in data["images"]}
    for n, a in enumerate(data["annotations"]):
        x, y, w, h = a["bbox"]
        if n % 2:  # a polygon: the rectangle's outline
            a["segmentation"] = [[x, y, x + w, y, x + w, y + h, x, y + h]]
        else:  # a compressed RLE of the rectangle
            W, H = sizes[a["image_id"]]
            m = np.zeros((H, W), np.uint8)
            m[int(y) : int(y + h), int(x) : int(x + w)] = 1
            rle = cocomask.encode(np.asfortranarray(m))
            a["segmentation"] = {"size": [H, W], "counts": rle["counts"].decode("ascii")}
    (tmp_path / "coco.json").write_text(json.dumps(data))
    config = ConvertConfig("lmdb", MODES[mode], detection=DetectionConfig(str(tmp_path / "coco.json"), coords="stored"))
    convert(root / "images", tmp_path / "out", config, workers=1)
    seen = 0
    for image, target, meta in open_dataset(tmp_path / "out", normalize=False, return_meta=True):
        masks = target["masks"]
        assert masks.dtype == torch.uint8 and masks.shape == (len(target["boxes"]), *image.shape[1:])
        pixels = image.permute(1, 2, 0).numpy().astype(int)
        for mask, box, label in zip(masks.numpy(), target["boxes"].tolist(), target["labels"].tolist()):
            ys, xs = np.nonzero(mask)
            assert len(xs) > 0
            assert xs.min() >= box[0] - 1 and xs.max() + 1 <= box[2] + 1  # the mask lies in its box
            assert ys.min() >= box[1] - 1 and ys.max() + 1 <= box[3] + 1
            colours = {tuple(c) for c in pixels[_inner(mask.astype(bool))].tolist()}
            assert len(colours) <= 1 and (not colours or list(colours)[0] in COLOURS)  # one rectangle's colour
            seen += 1
    assert seen == read_manifest(tmp_path / "out").annotations["boxes"]


def _inner(region: np.ndarray) -> np.ndarray:
    """``region`` without its border pixels (where resampling blends colours)."""
    padded = np.pad(region, 1)
    out = region.copy()
    for dy, dx in ((0, 1), (2, 1), (1, 0), (1, 2)):
        out &= padded[dy : dy + region.shape[0], dx : dx + region.shape[1]]
    return out


def test_images_are_matched_by_path_never_by_a_shared_file_name(tmp_path):
    from packer.spec.errors import InputError  # noqa: F401 - documents what the refusals are

    for folder in ("cat", "dog"):
        (tmp_path / "src" / folder).mkdir(parents=True)
        Image.fromarray(np.zeros((30, 30, 3), np.uint8)).save(tmp_path / "src" / folder / "a.png")
    coco = {
        "images": [{"id": 1, "file_name": "cat/a.png", "width": 30, "height": 30}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [5, 5, 20, 20]}],
        "categories": [{"id": 1, "name": "thing"}],
    }
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    config = ConvertConfig("npy", MODES["none"], detection=DetectionConfig(str(tmp_path / "coco.json")))
    result = convert(tmp_path / "src", tmp_path / "out", config, workers=1)
    assert [s.path for s in result.skipped] == ["dog/a.png"] and result.manifest.annotations["boxes"] == 1
    # YOLO: a label file for train/a, none for val/a (a negative, not train's boxes)
    (tmp_path / "labels" / "cat").mkdir(parents=True)
    (tmp_path / "labels" / "classes.txt").write_text("thing\n")
    (tmp_path / "labels" / "cat" / "a.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    config = ConvertConfig("npy", MODES["none"], detection=DetectionConfig(str(tmp_path / "labels")))
    convert(tmp_path / "src", tmp_path / "yolo", config, workers=1)
    boxes = {m["key"]: len(t["boxes"]) for _, t, m in open_dataset(tmp_path / "yolo", return_meta=True)}
    assert boxes == {"cat/a.png": 1, "dog/a.png": 0}


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["images"].append(dict(d["images"][0], file_name="other.png")), "image id 1 is given twice"),
        (lambda d: d["images"][0].update(id=[1]), "images\\[0\\] needs an integer id"),
        (lambda d: d["images"][0].update(width=float("inf")), "whole positive"),
        (lambda d: d.update(annotations=None), "'annotations' lists"),
        (lambda d: d["categories"][0].update(id="10"), "categories\\[0\\] needs an integer id"),
    ],
)
def test_coco_files_that_cannot_be_trusted_are_refused_with_a_message(tmp_path, change, message):
    from packer.spec.errors import InputError

    images = write_images(tmp_path / "images")
    write_coco(tmp_path / "coco.json", images)
    data = json.loads((tmp_path / "coco.json").read_text())
    change(data)
    (tmp_path / "coco.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=message):
        convert(
            tmp_path / "images",
            tmp_path / "out",
            ConvertConfig("npy", MODES["pad"], detection=DetectionConfig(str(tmp_path / "coco.json"))),
            workers=1,
        )


@pytest.mark.parametrize("bad", [{"area": float("nan")}, {"iscrowd": "0"}, {"area": -3}])
def test_bad_values_mark_their_image_instead_of_being_stored(tmp_path, bad):
    images = write_images(tmp_path / "images")
    write_coco(tmp_path / "coco.json", images)
    data = json.loads((tmp_path / "coco.json").read_text())
    data["annotations"][0].update(bad)  # an annotation of img0
    (tmp_path / "coco.json").write_text(json.dumps(data))
    config = ConvertConfig("npy", MODES["pad"], detection=DetectionConfig(str(tmp_path / "coco.json"), coords="stored"))
    result = convert(tmp_path / "images", tmp_path / "out", config, workers=1)
    assert "img0.png" in {s.path for s in result.skipped}
    assert "NaN" not in "".join(p.read_text(errors="ignore") for p in (tmp_path / "out").glob("*.json"))


@pytest.mark.parametrize("bbox", [[400, 300, 20, 20], [-30, 10, 30, 20], [120, 0, 10, 10]])
def test_a_box_wholly_outside_its_image_skips_the_image_with_its_reason(tmp_path, bbox):
    """img0 is 120x80: no crop put these boxes there, so the annotation is wrong (another image's,
    another grid) and is reported, not dropped as a crop's casualty."""
    images = write_images(tmp_path / "images")
    write_coco(tmp_path / "coco.json", images)
    data = json.loads((tmp_path / "coco.json").read_text())
    data["annotations"][0]["bbox"] = bbox  # an annotation of img0
    (tmp_path / "coco.json").write_text(json.dumps(data))
    pre = PreprocessConfig(size=None, resize="none")
    config = ConvertConfig("npy", pre, detection=DetectionConfig(str(tmp_path / "coco.json"), coords="stored"))
    result = convert(tmp_path / "images", tmp_path / "out", config, workers=1)
    reasons = {s.path: s.reason for s in result.skipped}
    assert "lies wholly outside the 120x80 image" in reasons["img0.png"] and "box 0" in reasons["img0.png"]
    assert result.manifest.samples == len(IMAGES) - 1 and result.manifest.annotations["boxes_dropped"] == 0


@pytest.mark.parametrize(
    "rle, reason",
    [
        ({"counts": [10, 5000000, 10]}, "cannot be read"),  # runs beyond the image
        ({"counts": [10, 50, 10]}, "cannot be read"),  # runs that do not fill it
        ({"counts": "garbage!!~~"}, "cannot be read"),
        ({"counts": "P1"}, "cannot be read"),  # decodes to values other than 0 and 1
        ({"counts": [120 * 80]}, "covers no pixel"),  # a valid RLE of nothing: the box would have no mask
    ],
)
def test_an_unreadable_or_empty_rle_skips_its_image_never_crashes(tmp_path, rle, reason):
    images = write_images(tmp_path / "images")
    write_coco(tmp_path / "coco.json", images)
    data = json.loads((tmp_path / "coco.json").read_text())
    w, h = images[0]["size"]
    for a in data["annotations"]:
        x, y, bw, bh = a["bbox"]
        a["segmentation"] = [[x, y, x + bw, y, x + bw, y + bh, x, y + bh]]
    data["annotations"][0]["segmentation"] = {"size": [h, w], **rle}
    (tmp_path / "coco.json").write_text(json.dumps(data))
    config = ConvertConfig("npy", MODES["pad"], detection=DetectionConfig(str(tmp_path / "coco.json"), coords="stored"))
    result = convert(tmp_path / "images", tmp_path / "out", config, workers=1)
    reasons = {s.path: s.reason for s in result.skipped}
    assert reason in reasons["img0.png"] and result.manifest.samples == len(IMAGES) - 1


READER_CROPS = {
    "random": {"crop": RandomResizedCrop(48, scale=(0.25, 1.0)), "flip": True},
    "centre": {"crop": CenterCrop(40, resize=56)},
    "padded centre": {"crop": CenterCrop(120)},
    "flip": {"flip": True},
}
CROPPED_SIZES = {"random": (48, 48), "centre": (40, 40), "padded centre": (120, 120)}
"""(height, width) of what READER_CROPS returns; a flip alone keeps each image's own size."""


def clipped(box: tuple[float, ...], w: float, h: float) -> tuple[float, ...]:
    """``box`` (x0, y0, x1, y1) cut to an image of ``w`` x ``h``."""
    return tuple(min(max(v, 0.0), side) for v, side in zip(box, (w, h, w, h)))


@pytest.mark.parametrize("fmt", ["npy", "wds"])
@pytest.mark.parametrize("name", list(READER_CROPS))
def test_boxes_follow_the_readers_crops_and_flips(dataset, tmp_path, name, fmt):
    root, images = dataset
    config = ConvertConfig(fmt, MODES["max"], detection=DetectionConfig(str(root / "coco.json")))
    convert(root / "images", tmp_path / "out", config, workers=1)
    seen = 0
    for epoch in range(4):
        seen += check_boxes_on_pixels(tmp_path / "out", images, 2.0, epoch, **READER_CROPS[name])[0]
    assert seen > 0
    # the geometry still maps the source's displayed rectangles onto the returned boxes (cut where the crop cuts)
    ds = open_dataset(tmp_path / "out", return_meta=True, **READER_CROPS[name])
    by_name = {img["name"]: img for img in images}
    checked = 0
    for image, target, meta in ds:
        g = target["geometry"]
        (sx, sy), (ox, oy), (w, h) = g["scale"], g["offset"], g["size"]
        assert [h, w] == list(image.shape[1:]) == list(CROPPED_SIZES.get(name, image.shape[1:]))
        mapped = []
        for x0, y0, x1, y1 in by_name[meta["key"]]["displayed"]:
            xs, ys = sorted((x0 * sx + ox, x1 * sx + ox)), sorted((y0 * sy + oy, y1 * sy + oy))
            mapped.append((xs[0], ys[0], xs[1], ys[1]))
        for box in target["boxes"].tolist():  # each the rectangle the geometry maps, cut by the image's edges
            assert min(max(abs(a - b) for a, b in zip(box, clipped(m, w, h))) for m in mapped) < 1e-3, (box, mapped)
            checked += 1
    assert checked > 0


def test_instance_masks_and_a_loader_follow_the_readers_crops(dataset, tmp_path):
    from pycocotools import mask as cocomask

    root, images = dataset
    data = json.loads((root / "coco.json").read_text())
    sizes = {e["id"]: (e["width"], e["height"]) for e in data["images"]}
    for a in data["annotations"]:
        x, y, w, h = a["bbox"]
        W, H = sizes[a["image_id"]]
        m = np.zeros((H, W), np.uint8)
        m[int(y) : int(y + h), int(x) : int(x + w)] = 1
        a["segmentation"] = {"size": [H, W], "counts": cocomask.encode(np.asfortranarray(m))["counts"].decode()}
    (tmp_path / "coco.json").write_text(json.dumps(data))
    detection = DetectionConfig(str(tmp_path / "coco.json"), coords="stored")
    convert(root / "images", tmp_path / "out", ConvertConfig("hdf5", MODES["max"], detection=detection), workers=1)
    crop = {"crop": RandomResizedCrop(48, scale=(0.3, 1.0)), "flip": True}
    ds = open_dataset(tmp_path / "out", normalize=False, return_meta=True, **crop)
    seen = 0
    for epoch in range(3):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            image, target, meta = ds[i]
            masks = target["masks"]
            assert masks.shape == (len(target["boxes"]), 48, 48) and "area" in target
            pixels = image.permute(1, 2, 0).numpy().astype(int)
            for mask, box in zip(masks.numpy(), target["boxes"].tolist()):
                ys, xs = np.nonzero(mask)
                if not len(xs):
                    continue
                # in its box, within the stored mask's pixel (nearest-neighbour) scaled by the crop
                assert xs.min() >= box[0] - 2 and xs.max() + 1 <= box[2] + 2
                assert ys.min() >= box[1] - 2 and ys.max() + 1 <= box[3] + 2
                inner = pixels[_inner(_inner(mask.astype(bool)))]  # two pixels in: a downscale blurs 1.5
                if len(inner):  # one rectangle's colour (within the blur of upsampling its edge)
                    near = [c for c in COLOURS if np.abs(inner - np.array(c)).max() <= 8]
                    assert len(near) == 1, (meta, {tuple(c) for c in inner.tolist()})
                seen += 1
    assert seen > 10
    images_batch, targets = next(iter(make_loader(open_dataset(tmp_path / "out", **crop), 4, num_workers=2)))
    assert images_batch.shape == (4, 3, 48, 48) and len(targets) == 4 and targets[0]["masks"].shape[1:] == (48, 48)


def test_outputs_converted_apart_share_one_category_order_with_classes(dataset, tmp_path):
    """A VOC set that lacks a category sorts the names it has ("circle", "star": star is 1 there, 2 in
    the full set). Read or combined with the full set's output it is refused, never mislabelled;
    converted with --classes FULL_OUTPUT it takes that order, and then combines."""
    from packer.ops.splits import read_class_map

    root, _ = dataset
    val_voc = tmp_path / "val_voc"
    val_voc.mkdir()
    for xml in sorted((root / "voc").glob("*.xml")):
        tree = ElementTree.parse(xml)
        for obj in list(tree.getroot().iter("object")):
            if obj.findtext("name") == "square":
                tree.getroot().remove(obj)
        tree.write(val_voc / xml.name)
    pre = PreprocessConfig(size=None, resize="none")

    def voc(folder: Path) -> ConvertConfig:
        return ConvertConfig("npy", pre, detection=DetectionConfig(str(folder), coords="stored"))

    convert(root / "images", tmp_path / "train", voc(root / "voc"), workers=1)
    convert(root / "images", tmp_path / "val", voc(val_voc), workers=1)
    train, val = open_dataset(tmp_path / "train"), open_dataset(tmp_path / "val")
    assert val.categories == ["circle", "star"]
    with pytest.raises(ValueError, match="different detection categories .*only the first has 'square'"):
        train + val
    refused = CliRunner().invoke(
        cli, ["combine", str(tmp_path / "train"), str(tmp_path / "val"), "-o", str(tmp_path / "both")]
    )
    assert refused.exit_code == 1 and "other categories" in refused.output

    assert read_class_map(tmp_path / "train") == CATEGORIES  # a detection output's --classes: its categories
    made = CliRunner().invoke(
        cli,
        [
            "convert",
            str(root / "images"),
            "-f",
            "npy",
            "-o",
            str(tmp_path / "val2"),
            "--resize",
            "none",
            "--annotations",
            str(val_voc),
            "--box-coords",
            "stored",
            "--classes",
            str(tmp_path / "train"),
            "-q",
        ],
    )
    assert made.exit_code == 0, made.output
    val2 = open_dataset(tmp_path / "val2")
    assert val2.categories == CATEGORIES and len(train + val2) == 2 * len(IMAGES)
    for i in range(len(val2)):
        (_, target), (_, plain) = val2[i], val[i]
        assert [CATEGORIES[k] for k in target["labels"].tolist()] == [val.categories[k] for k in plain["labels"]]
    assert read_manifest(tmp_path / "val2").annotations["category_ids"] == ["circle", None, "star"]

    (tmp_path / "names.txt").write_text("circle\nsquare\n")  # lacks "star": refused, or appended
    args = [
        "convert",
        str(root / "images"),
        "-f",
        "npy",
        "--resize",
        "none",
        "--annotations",
        str(val_voc),
        "--box-coords",
        "stored",
        "--classes",
        str(tmp_path / "names.txt"),
        "-q",
    ]
    lacking = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "val3")])
    assert lacking.exit_code == 1 and "'star'" in lacking.output and "--add-classes" in lacking.output
    added = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "val4"), "--add-classes"])
    assert added.exit_code == 0 and open_dataset(tmp_path / "val4").categories == ["circle", "square", "star"]


@pytest.mark.parametrize("fmt", ["npy", "wds"])
def test_label_offset_moves_every_box_label_for_torchvision_detectors(dataset, tmp_path, fmt):
    """torchvision's detectors keep label 0 for the background: ``label_offset=1`` gives them the
    categories from 1, in samples and in make_loader's batches, with crops, the stored bytes unchanged."""
    root, _ = dataset
    config = ConvertConfig(
        fmt, MODES["shorter-crop"], detection=DetectionConfig(str(root / "coco.json"), coords="stored")
    )
    out = tmp_path / "out"
    convert(root / "images", out, config, workers=1)
    stored = [t["labels"] for _, t in open_dataset(out)]
    assert any(len(labels) and int(labels.min()) == 0 for labels in stored)  # the stored numbering starts at 0
    moved = [t["labels"] for _, t in open_dataset(out, label_offset=1)]
    assert [m.tolist() for m in moved] == [(s + 1).tolist() for s in stored]
    batches = make_loader(open_dataset(out, label_offset=1, crop=CenterCrop(48)), 2, shuffle=False, num_workers=0)
    cropped = make_loader(open_dataset(out, crop=CenterCrop(48)), 2, shuffle=False, num_workers=0)
    for (_, targets), (_, plain) in zip(batches, cropped, strict=True):
        assert [t["labels"].tolist() for t in targets] == [(p["labels"] + 1).tolist() for p in plain]


def test_label_offset_is_refused_where_there_are_no_box_labels(dataset, tmp_path):
    root, _ = dataset
    convert(root / "images", tmp_path / "plain", ConvertConfig("npy", MODES["shorter-crop"]), workers=1)
    with pytest.raises(ConfigError, match="target_transform=lambda label: label \\+ 1"):
        open_dataset(tmp_path / "plain", label_offset=1)
    with pytest.raises(ConfigError, match="whole number"):
        open_dataset(tmp_path / "plain", label_offset=True)
    assert open_dataset(tmp_path / "plain", label_offset=0).label_offset == 0
