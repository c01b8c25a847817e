"""Detection targets that follow the pixels: annotations matched to images, carried through each
image's geometry, stored as each sample's ``target`` field.

The parent matches the annotations (``packer.targets.annotations``) to the discovered images
(``match_targets``): an image the annotations do not list is skipped and reported (COCO, VOC) or
kept as a negative with no boxes (YOLO, where no label file means no object), and every
annotation that names no image found is reported. Each worker then decodes its images and maps
their boxes (``target_bytes``) through the same geometry as the pixels (``packer.pixels.geometry``): the
EXIF orientation, the resize, the crop or pad; boxes are clipped to the picture and dropped when
less than ``min_visibility`` of their area is left. The target is stored as UTF-8 JSON
(``{"boxes": [[x0, y0, x1, y1], ...], "labels": [...], ...}``, XYXY pixels of the stored image),
which json, h5py, lmdb and webdataset all read without packer.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import numpy as np
from PIL import Image

from packer.config import DEFAULT_MIN_VISIBILITY, DetectionConfig, PreprocessConfig
from packer.pixels.geometry import Geometry, GridError, carry_indices, grid_is_displayed, image_geometry, map_boxes
from packer.pixels.preprocess import Decoded
from packer.records import UNLABELLED, Skipped
from packer.sources.discover import Discovery
from packer.spec.errors import DecodeError, InputError
from packer.targets.annotation_records import Annotations, ImageBoxes, with_categories
from packer.targets.annotations import load_annotations

TARGET_FIELD = "target"


@dataclass(frozen=True)
class DetectionJob:
    """What a worker needs to write the targets of its shard: each item's record (by item index; None:
    an image with no boxes) and the crop rule."""

    targets: dict[int, Optional[ImageBoxes]]
    min_visibility: float = DEFAULT_MIN_VISIBILITY
    coords: str = "auto"


@dataclass
class Matched:
    """The outcome of ``match_targets``: the discovery without the images that cannot be used, each kept
    image's record, and counts for the manifest."""

    found: Discovery
    targets: dict[int, Optional[ImageBoxes]]
    annotations: Annotations
    summary: dict = field(default_factory=dict)
    ordered: bool = False
    """The categories were put in ``--classes``'s order (part of what ``--resume`` compares)."""


def match_targets(
    found: Discovery, config: DetectionConfig, categories: Optional[Sequence[str]] = None, add_categories: bool = False
) -> Matched:
    """Pair every discovered image with its annotations (see the module docstring); the items are
    numbered again in order, and every problem is in ``found.skipped`` with its reason.
    ``categories`` (``--classes``) orders the categories instead of the annotations' own order
    (``annotations.with_categories``; ``add_categories``: append those it lacks)."""
    annotations = load_annotations(config.path, config.format)
    if not annotations.categories:
        raise InputError(f"--annotations {config.path} names no category: nothing could be labelled")
    if categories is not None:
        annotations = with_categories(annotations, categories, add_categories, f"--annotations {config.path}")
    kept, skipped, targets, used = [], list(found.skipped), {}, set()
    skipped += annotations.problems
    records = [annotations.find(item.relpath) for item in found.items]
    owners: dict[int, list] = {}
    for item, record in zip(found.items, records):
        if record is not None:
            owners.setdefault(id(record), []).append(item.relpath)
    for item, record in zip(found.items, records):
        if record is None and not annotations.background:
            skipped.append(Skipped(item.relpath, f"not annotated: {annotations.source} does not list this image"))
            continue
        if record is not None and len(owners[id(record)]) > 1:
            others = [p for p in owners[id(record)] if p != item.relpath]
            skipped.append(
                Skipped(
                    item.relpath,
                    f"ambiguous annotation: {record.where} would fit {others[0]} too; rename one of the images",
                )
            )
            used.add(id(record))
            continue
        if record is not None and record.problem is not None:
            skipped.append(
                Skipped(
                    item.relpath, f"{record.problem}: the image is left out rather than stored with an object missing"
                )
            )
            used.add(id(record))
            continue
        index = len(kept)
        kept.append(replace(item, index=index, label=UNLABELLED))  # a detection sample's labels are its boxes
        targets[index] = record
        if record is not None:
            used.add(id(record))
    for name, record in annotations.images.items():
        if id(record) not in used and (record.boxes or not annotations.background):
            skipped.append(
                Skipped(
                    f"{record.where}#{name}" if record.where != name else name,
                    f"annotation of a missing image: no image {name} in the source",
                )
            )
    matched = replace(found, items=kept, skipped=skipped, classes=None)
    summary = {
        "format": annotations.format,
        "source": annotations.source,
        "categories": annotations.categories,
        "category_ids": annotations.category_ids,
        "min_visibility": config.min_visibility,
    }
    return Matched(matched, targets, annotations, summary, ordered=categories is not None)


def target_bytes(
    record: Optional[ImageBoxes],
    decoded: Decoded,
    cfg: PreprocessConfig,
    min_visibility: float,
    path: str,
    coords: str = "auto",
) -> tuple[bytes, int, int]:
    """``(stored JSON, boxes kept, boxes dropped)`` of one image's target; DecodeError when the size its
    annotation gives is neither the image's stored nor its displayed size, or when (``coords`` auto)
    nothing tells on which of the two the boxes are: they would land on the wrong pixels."""
    geometry = image_geometry(decoded.stored_size, decoded.orientation, cfg)
    if record is None or not record.boxes:  # the same keys as the images with boxes have, empty
        empty = (
            {}
            if record is None
            else {
                name: []
                for name, values in (
                    ("iscrowd", record.iscrowd),
                    ("area", record.area),
                    ("difficult", record.difficult),
                    ("masks", record.segmentation),
                )
                if values is not None
            }
        )
        return _encode(np.zeros((0, 4), np.float32), [], empty, geometry), 0, 0
    boxes = np.asarray(record.boxes, np.float64)
    displayed = _on_displayed(record, decoded, path, coords)
    w, h = decoded.original_size if displayed else decoded.stored_size
    if record.normalized:
        boxes = boxes * np.array([w, h, w, h])
    outside = np.flatnonzero((boxes[:, 2] <= 0) | (boxes[:, 3] <= 0) | (boxes[:, 0] >= w) | (boxes[:, 1] >= h))
    if len(outside):  # no crop put it there: the annotation is wrong (another image's, another grid)
        box = ", ".join(f"{v:g}" for v in boxes[outside[0]])
        raise DecodeError(
            path,
            f"bad annotation: {record.where}: box {int(outside[0])} ({box}) lies wholly outside "
            f"the {w}x{h} image; the image is left out rather than stored with a box of nothing",
        )
    mapped = map_boxes(boxes, geometry, displayed, min_visibility)
    kept = mapped.kept.tolist()
    optional = (("iscrowd", record.iscrowd), ("area", record.area), ("difficult", record.difficult))
    extra = {name: [values[i] for i in kept] for name, values in optional if values is not None}
    if "area" in extra:  # COCO's area is of the source's pixels: scaled with the box, cut as much as the box was
        sx, sy = geometry.scale
        scaled = np.asarray(extra["area"], np.float64) * (sx * sy) * mapped.share
        extra["area"] = scaled.astype(np.float32).tolist()
    if record.segmentation is not None:
        grid = decoded.original_size if displayed else decoded.stored_size
        extra["masks"] = [_instance_mask(record.segmentation[i], grid, decoded, displayed, cfg, path) for i in kept]
    if len(kept) and float(mapped.share.min()) < 1.0:
        # What the crop left of each annotated box: a reader's crop cuts further, and drops a box by the
        # share of the annotation left in all, not by the share of the stored box (packer.pixels.boxes).
        extra["visible"] = mapped.share.astype(np.float32).tolist()
    labels = [record.labels[i] for i in kept]
    return _encode(mapped.boxes, labels, extra, geometry), len(kept), len(record.boxes) - len(kept)


def _instance_mask(
    seg, grid: tuple[int, int], decoded: Decoded, displayed: bool, cfg: PreprocessConfig, path: str
) -> dict:
    """One COCO segmentation (polygons or RLE on the boxes' ``grid``) through the image's geometry, as
    the image's pixels went (nearest-neighbour), as a compressed RLE of the stored image (pycocotools)."""
    from pycocotools import mask as cocomask  # the reference COCO mask code, never our own

    w, h = grid
    try:
        if isinstance(seg, list):
            rle = cocomask.merge(cocomask.frPyObjects(seg, h, w))
        else:
            if list(seg["size"]) != [h, w]:
                raise ValueError(f"an RLE of size {seg['size']} (h, w) on an image of {w}x{h}")
            if isinstance(seg["counts"], list):
                if sum(seg["counts"]) != h * w:
                    raise ValueError(f"the RLE's runs add up to {sum(seg['counts'])} pixels, not {h * w}")
                rle = cocomask.frPyObjects(seg, h, w)  # an uncompressed RLE (crowds)
            else:
                rle = {"size": list(seg["size"]), "counts": seg["counts"].encode("ascii")}
        decoded_mask = cocomask.decode(rle)
        # pycocotools decodes any string: a damaged one gives values other than 0 and 1, or runs that do
        # not encode back to the same string. Only an RLE that round-trips is the mask it says.
        again = None if isinstance(seg, list) else cocomask.encode(np.asfortranarray(decoded_mask))["counts"]
        if decoded_mask.max(initial=0) > 1 or (again is not None and again != rle["counts"]):
            raise ValueError("its runs do not describe a mask of this size")
    except (ValueError, TypeError, UnicodeEncodeError) as e:
        raise DecodeError(path, f"bad annotation: its segmentation cannot be read ({e})") from None
    if decoded_mask.shape != (h, w) or not decoded_mask.any():
        raise DecodeError(
            path, "bad annotation: a segmentation covers no pixel of the image (its box would be kept without its mask)"
        )
    image = Image.fromarray(decoded_mask.astype(np.uint8), "L")
    out = carry_indices(image, decoded.orientation, displayed, cfg, decoded.original_size, 0, path)
    out = np.asfortranarray(np.asarray(out, np.uint8))
    encoded = cocomask.encode(out)
    return {"size": [int(v) for v in encoded["size"]], "counts": encoded["counts"].decode("ascii")}


def _on_displayed(record: ImageBoxes, decoded: Decoded, path: str, coords: str = "auto") -> bool:
    """Whether the record's boxes are on the displayed image (``packer.pixels.geometry.grid_is_displayed``);
    DecodeError naming the annotation when the sizes forbid placing them."""
    try:
        return grid_is_displayed(
            record.size, decoded.stored_size, decoded.original_size, decoded.orientation, coords, record.normalized
        )
    except GridError as e:
        what = {
            "mismatch": "annotation size mismatch",
            "contradicts": f"annotation size contradicts --box-coords {coords}",
            "ambiguous": "ambiguous box coordinates",
        }[e.kind]
        raise DecodeError(path, f"{what}: {record.where}: {e}; its boxes would land on the wrong pixels") from None


def _encode(boxes: np.ndarray, labels: list[int], extra: dict, geometry: Geometry) -> bytes:
    """The stored target, JSON. Boxes and areas are float32 values written with 9 significant digits,
    which read back to the same float32 exactly (and cost a fraction of the shortest-repr encoding)."""
    values = np.asarray(boxes, np.float32).reshape(-1, 4).tolist()
    parts = [
        '{"boxes":[' + ",".join("[%.9g,%.9g,%.9g,%.9g]" % tuple(b) for b in values) + "]",
        '"labels":' + json.dumps(labels),
    ]
    for name, value in extra.items():
        if name in ("area", "visible"):
            parts.append(f'"{name}":[' + ",".join("%.9g" % v for v in np.asarray(value, np.float32).tolist()) + "]")
        else:
            parts.append(f"{json.dumps(name)}:{json.dumps(value, separators=(',', ':'))}")
    parts.append('"geometry":' + json.dumps(geometry.to_dict(), separators=(",", ":")) + "}")
    return ",".join(parts).encode("utf-8")


def annotations_digest(matched: Matched, config: DetectionConfig) -> str:
    """What --resume compares of the annotations: their files (``Annotations.digest``), which record
    each image got, and the crop rule."""
    import hashlib

    h = hashlib.sha256(
        repr(
            (
                config.min_visibility,
                config.coords,
                os.path.basename(config.path),
                matched.annotations.format,
                matched.annotations.digest,
            )
        ).encode()
    )
    if matched.ordered:  # only then: the fingerprints of runs without --classes stay what they were
        h.update(repr(("categories", matched.annotations.categories)).encode())
    h.update(
        "".join(
            f"\0{i}\0{r.where if r is not None else ''}" for i, r in sorted(matched.targets.items(), key=lambda e: e[0])
        ).encode()
    )
    return h.hexdigest()
