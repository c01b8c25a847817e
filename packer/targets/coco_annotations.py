"""Reading a COCO instances JSON file into ``Annotations`` (see ``packer.targets.annotations``)."""

from __future__ import annotations

import json
import math
from pathlib import Path, PurePosixPath
from typing import Optional

from packer.records import Skipped
from packer.spec.errors import InputError
from packer.targets.annotation_records import Annotations, ImageBoxes, finite_number

MAX_ANNOTATION_BYTES = 4 * 1024**3  # a COCO file is read whole; beyond this it is refused, not swapped in


def _integer(value, least: int = 0) -> int:
    """``value`` when it is a whole JSON number of at least ``least`` (not a bool, not 1.5), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{value!r} is not a whole number of at least {least}")
    return value


_NUMBERS = (int, float)  # exact types: a bool is not a coordinate


def _where(file: str, n: int, a) -> str:
    """How a report names annotation ``n`` of ``file``: its position, and its id when it has one."""
    return f"{file}#annotations[{n}]" + (f" (id {a.get('id')})" if isinstance(a, dict) and "id" in a else "")


def read_coco(path: Path) -> Annotations:
    """A COCO instances file: ``images`` (id, file_name, width, height), ``categories`` (id, name) and
    ``annotations`` (image_id, category_id, bbox ``[x, y, w, h]``, iscrowd, area, segmentation).

    What makes the file unusable as a whole (no such lists, a bad or repeated category or image id) is
    an InputError; an annotation that cannot be used is reported, and its image marked so that it is
    skipped rather than stored with an object missing (``ImageBoxes.problem``)."""
    if not path.is_file():
        raise InputError(f"--annotations {path}: no such file")
    if path.stat().st_size > MAX_ANNOTATION_BYTES:
        raise InputError(f"--annotations {path} is larger than {MAX_ANNOTATION_BYTES:,} bytes")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InputError(f"--annotations {path} is not a COCO JSON file: {e}") from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("images"), list)
        or not isinstance(data.get("categories"), list)
        or not isinstance(data.get("annotations", []), list)
    ):
        raise InputError(
            f"--annotations {path} is not a COCO instances file: it needs 'images', 'categories' and "
            "'annotations' lists"
        )
    where, problems = path.name, []
    cats: dict[int, str] = {}
    for n, c in enumerate(data["categories"]):
        try:
            cid, name = _integer(c["id"]), c["name"]
            if not isinstance(name, str) or not name:
                raise ValueError("a category's name must be a text")
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(
                f"--annotations {path}: categories[{n}] needs an integer id and a name ({e}); every "
                "label depends on the categories, so the file is refused"
            ) from None
        if cid in cats:
            raise InputError(f"--annotations {path}: category id {cid} is given twice")
        cats[cid] = name
    if len(set(cats.values())) != len(cats):
        raise InputError(f"--annotations {path}: two categories share a name; packer labels boxes by category name")
    ids = sorted(cats)
    index = {cid: i for i, cid in enumerate(ids)}
    images: dict[int, dict] = {}
    names: set[str] = set()
    for n, img in enumerate(data["images"]):
        try:
            image_id, name = _integer(img["id"]), img["file_name"]
            if not isinstance(name, str) or not name:
                raise ValueError("file_name must be a path")
            size = (
                (_integer(img["width"], 1), _integer(img["height"], 1))
                if img.get("width") is not None and img.get("height") is not None
                else None
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InputError(
                f"--annotations {path}: images[{n}] needs an integer id, a file_name and whole positive "
                f"width and height ({e})"
            ) from None
        if image_id in images:
            raise InputError(
                f"--annotations {path}: image id {image_id} is given twice; its annotations could go to either image"
            )
        name = PurePosixPath(name.replace("\\", "/")).as_posix()
        if name in names:
            raise InputError(f"--annotations {path}: {name} is listed twice in 'images'")
        names.add(name)
        images[image_id] = {
            "name": name,
            "size": size,
            "boxes": [],
            "labels": [],
            "iscrowd": [],
            "area": [],
            "segmentation": [],
            "problem": None,
        }
    for n, a in enumerate(data.get("annotations", [])):
        image = None
        try:  # the common case checked in few steps: this loop runs once per box, before any worker starts
            if type(a) is not dict:
                raise ValueError("an annotation must be an object")
            key = a["image_id"]
            image = images.get(key) if type(key) is int else None
            if image is None:
                problems.append(
                    Skipped(_where(where, n, a), f"annotation of a missing image: image_id {key!r} is not in 'images'")
                )
                continue
            category = a["category_id"]
            if type(category) is not int or category not in index:
                raise ValueError(f"category_id {category!r} is not in 'categories'")
            bbox = a["bbox"]
            if type(bbox) is not list or len(bbox) != 4 or not all(type(v) in _NUMBERS for v in bbox):
                raise ValueError(f"bbox {bbox!r} is not [x, y, w, h] of numbers")
            x, y, w, h = bbox
            if not math.isfinite(x + y + w + h) or w <= 0 or h <= 0:
                raise ValueError(f"bbox {bbox} has no area or is not finite")
            crowd = a.get("iscrowd", 0)
            if type(crowd) is not int or crowd not in (0, 1):
                raise ValueError(f"iscrowd {crowd!r} is not 0 or 1")
            area = a.get("area", w * h)
            if type(area) not in _NUMBERS or not math.isfinite(area) or area < 0:
                raise ValueError(f"area {area!r} is not a finite number >= 0")
            segmentation = a.get("segmentation")
            if segmentation is not None:
                bad = _segmentation_problem(segmentation, image["size"])
                if bad:
                    raise ValueError(bad)
        except (KeyError, TypeError, ValueError) as e:
            label = _where(where, n, a)
            reason = f"bad annotation: {e}" if not isinstance(e, KeyError) else f"bad annotation: needs {e}"
            problems.append(Skipped(label, reason))
            if image is not None and image["problem"] is None:
                image["problem"] = f"{reason} ({label})"
            continue
        image["boxes"].append((float(x), float(y), float(x + w), float(y + h)))
        image["labels"].append(index[category])
        image["iscrowd"].append(crowd)
        image["segmentation"].append(segmentation)
        image["area"].append(float(area))
    outlined = any(s is not None for image in images.values() for s in image["segmentation"])
    records: dict[str, ImageBoxes] = {}
    for image in images.values():
        segmentation = None
        if outlined:  # the file has instance masks: every box must have its own
            if any(s is None for s in image["segmentation"]) and image["problem"] is None:
                image["problem"] = "bad annotation: a box has no segmentation while the file's other boxes have one"
                problems.append(Skipped(f"{where}#{image['name']}", image["problem"]))
            segmentation = tuple(image["segmentation"])
        records[image["name"]] = ImageBoxes(
            tuple(image["boxes"]),
            tuple(image["labels"]),
            where,
            image["size"],
            iscrowd=tuple(image["iscrowd"]),
            area=tuple(image["area"]),
            segmentation=segmentation,
            problem=image["problem"],
        )
    return Annotations("coco", [cats[i] for i in ids], ids, records, problems)


def _segmentation_problem(seg, size: Optional[tuple[int, int]]) -> Optional[str]:
    """Why a COCO ``segmentation`` cannot be used, or None: polygons are lists of at least 3 x, y pairs;
    an RLE is ``{"size": [h, w], "counts": ...}`` of the image's size."""
    if isinstance(seg, list):
        if not seg or not all(isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0 for p in seg):
            return "a polygon segmentation needs lists of at least 3 x, y pairs"
        try:
            for polygon in seg:
                for v in polygon:
                    finite_number(v)
        except ValueError as e:
            return f"segmentation: {e}"
        return None
    if isinstance(seg, dict) and "counts" in seg and isinstance(seg.get("size"), list) and len(seg["size"]) == 2:
        if size is not None and tuple(seg["size"]) != (size[1], size[0]):
            return f"an RLE segmentation of size {seg['size']} on an image of {size[0]}x{size[1]}"
        if not isinstance(seg["counts"], (str, list)):
            return "an RLE segmentation's counts must be a string or a list of run lengths"
        return None
    return "segmentation must be polygons or an RLE dict ({'size': [h, w], 'counts': ...})"
