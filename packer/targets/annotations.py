"""Detection annotations as users have them: a COCO instances JSON, a YOLO labels folder, Pascal VOC XML.

Each reader turns its files into one plain record per image (``ImageBoxes``: boxes in XYXY source
pixels, or normalized for YOLO, with category indices) and a list of categories, and reports
every entry it cannot use (a malformed box, an unknown category, an image that is not there) with
the file and the reason instead of failing. Which pixels the boxes refer to (``coords``):

- COCO and VOC give each image's size: boxes are on the stored pixel grid (as Pillow, torchvision and
  pycocotools read the file, EXIF orientation not applied) unless that size is the *displayed* one
  of an image its EXIF turns by 90 degrees, which says the tool drew them on the turned image.
- YOLO's normalized boxes are on the displayed image (EXIF applied), as Ultralytics reads them.

``packer.targets.detection`` then carries the boxes through each image's geometry.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Optional, Sequence

from packer.records import Skipped
from packer.spec.class_map import extend_class_map, quoted
from packer.spec.errors import InputError
from packer.spec.file_stamp import FileStamp

ANNOTATION_FORMATS = ("coco", "yolo", "voc")
MAX_ANNOTATION_BYTES = 4 * 1024**3  # a COCO file is read whole; beyond this it is refused, not swapped in


@dataclass(frozen=True)
class ImageBoxes:
    """The annotations of one image: ``boxes`` XYXY, ``labels`` indices into the categories, ``iscrowd``
    and ``area`` where COCO gives them, ``difficult`` where VOC does. ``normalized``: boxes are
    fractions of the displayed image (YOLO); else pixels, on the stored grid unless ``size`` (the
    size the annotation gives, if any) says otherwise (see the module docstring). ``where`` names
    the annotation file, for reports."""

    boxes: tuple[tuple[float, float, float, float], ...]
    labels: tuple[int, ...]
    where: str
    size: Optional[tuple[int, int]] = None
    normalized: bool = False
    iscrowd: Optional[tuple[int, ...]] = None
    area: Optional[tuple[float, ...]] = None
    difficult: Optional[tuple[int, ...]] = None
    segmentation: Optional[tuple] = None
    """COCO's instance outlines, one per box: polygons (lists of x, y) or RLE dicts, on the boxes' grid."""
    problem: Optional[str] = None
    """Why this image's annotations cannot all be used (the image is then skipped, never stored with an
    object missing), or None."""


@dataclass
class Annotations:
    """What one annotation source holds: ``categories`` (names, in label order) with the source's own
    ids (``category_ids``: COCO ids, YOLO class numbers, VOC names), the records of the images by
    name (``images``: their paths relative to the image folder, or stems for YOLO and VOC), and what
    could not be used (``problems``). ``background``: images the source does not mention are
    negatives (YOLO: no label file means no object) rather than unannotated (COCO, VOC)."""

    format: str
    categories: list[str]
    category_ids: list
    images: dict[str, ImageBoxes]
    problems: list[Skipped] = field(default_factory=list)
    background: bool = False
    source: str = ""
    digest: str = ""
    """SHA-256 of the annotation file's bytes, or of a folder's files' paths, sizes and times (what
    ``--resume`` compares)."""

    def find(self, relpath: str) -> Optional[ImageBoxes]:
        """The record of the image at ``relpath`` (relative to the converted folder): by its whole path
        (COCO's ``file_name``), or by that path without its extension (YOLO's and VOC's files). Never by
        the file name alone: ``cat/a.png`` and ``dog/a.png`` are two images."""
        return self.images.get(relpath) or self.images.get(_stem(relpath))


def with_categories(annotations: Annotations, names: Sequence[str], add: bool, where: str) -> Annotations:
    """``annotations`` with ``names`` (``--classes``: another output's categories, or a file's) as
    their categories, in that order: every box's label moved to its category's index there, so that
    outputs converted separately (a VOC ``val`` that lacks a category, whose sorted names would
    shift) label alike. A category ``names`` lacks is refused, or appended with ``add``
    (``extend_class_map``); a given name the source lacks keeps no source id (None)."""
    own = annotations.categories
    doubled = sorted({n for n in own if own.count(n) > 1})
    if doubled:
        raise InputError(
            f"{where} names the categories {quoted(doubled)} more than once: their boxes cannot be put "
            "in --classes's order by name; give each category a name of its own"
        )
    order = extend_class_map(names, own, add, where)
    moved = [order.index(n) for n in own]
    ids = dict(zip(own, annotations.category_ids))
    images = {
        key: replace(record, labels=tuple(moved[label] for label in record.labels))
        for key, record in annotations.images.items()
    }
    return replace(annotations, categories=list(order), category_ids=[ids.get(n) for n in order], images=images)


def _stem(relpath: str) -> str:
    return os.path.splitext(relpath)[0]


def detect_format(path: Path) -> str:
    """``coco`` for a JSON file, ``voc`` for a folder of ``.xml`` files, ``yolo`` for one of ``.txt`` files."""
    if path.is_file():
        if path.suffix.lower() == ".json":
            return "coco"
        raise InputError(
            f"--annotations {path}: a file must be a COCO instances .json; give a folder for YOLO "
            "(.txt label files) or Pascal VOC (.xml files)"
        )
    if not path.is_dir():
        raise InputError(f"--annotations {path}: no such file or folder")
    kinds = {"xml": 0, "txt": 0}
    for _, _, files in os.walk(path):
        for name in files:
            ext = name.rsplit(".", 1)[-1].lower()
            if ext in kinds and name.lower() != "classes.txt":
                kinds[ext] += 1
    if kinds["xml"] and kinds["xml"] >= kinds["txt"]:
        return "voc"
    if kinds["txt"]:
        return "yolo"
    raise InputError(f"--annotations {path} holds no .xml (Pascal VOC) or .txt (YOLO) label files")


def load_annotations(path: str | os.PathLike, fmt: Optional[str] = None) -> Annotations:
    """Read the annotations at ``path`` (``fmt`` as ``detect_format`` finds it, unless given)."""
    path = Path(path)
    fmt = fmt or detect_format(path)
    if fmt not in ANNOTATION_FORMATS:
        raise InputError(f"--annotation-format must be one of {', '.join(ANNOTATION_FORMATS)}, not {fmt!r}")
    found = {"coco": read_coco, "yolo": read_yolo, "voc": read_voc}[fmt](path)
    found.source = path.name
    found.digest = _digest(path)
    return found


def _digest(path: Path) -> str:
    """See ``Annotations.digest``."""
    h = hashlib.sha256()
    if path.is_file():
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    for folder, _, files in sorted(os.walk(path)):
        for name in sorted(files):
            file = os.path.join(folder, name)
            h.update(FileStamp.at(file).as_annotations_line(os.path.relpath(file, path)))
    return h.hexdigest()


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return float(value)


def _box_problem(x0: float, y0: float, x1: float, y1: float) -> Optional[str]:
    if x1 <= x0 or y1 <= y0:
        return f"box {[x0, y0, x1, y1]} has no area (XYXY)"
    return None


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
                    _number(v)
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


YOLO_CLASS = re.compile(r"[0-9]+")


def _mark(problems: list[Skipped], first: Optional[str], place: str, reason: str) -> str:
    """Report one bad entry of an image's annotation (at ``place``); returns the image's problem, its
    first bad entry, which skips the image."""
    problems.append(Skipped(place, reason))
    return first or f"{reason} ({place})"


def read_yolo(path: Path) -> Annotations:
    """A YOLO labels folder: ``REL/NAME.txt`` per image ``REL/NAME.*``, a row ``class cx cy w h`` per box
    (fractions of the image), class names from ``classes.txt`` or the ``names`` of a ``data.yaml`` in
    the folder or the one above. An image's label file with a row that cannot be used marks the image
    (``ImageBoxes.problem``): it is skipped, never stored with an object missing."""
    names = _yolo_names(path)
    problems: list[Skipped] = []
    records: dict[str, ImageBoxes] = {}
    highest = -1
    for folder, _, files in sorted(os.walk(path)):
        for name in sorted(files):
            if not name.lower().endswith(".txt") or name.lower() == "classes.txt":
                continue
            file = Path(folder) / name
            rel = file.relative_to(path).with_suffix("").as_posix()
            where = f"{path.name}/{rel}.txt"
            try:
                text = file.read_text(encoding="utf-8-sig")
            except (OSError, UnicodeDecodeError) as e:
                problem = f"bad annotation: cannot read {where} ({e})"
                problems.append(Skipped(where, problem))
                records[rel] = ImageBoxes((), (), where, normalized=True, problem=problem)
                continue
            boxes, labels, problem = [], [], None
            for lineno, line in enumerate(text.splitlines(), start=1):
                parts = line.split()
                if not parts:
                    continue
                try:
                    if len(parts) != 5:
                        raise ValueError(
                            f"expected 'class cx cy w h', got {len(parts)} values"
                            + (" (a segment: packer reads boxes)" if len(parts) > 5 else "")
                        )
                    if not YOLO_CLASS.fullmatch(parts[0]):
                        raise ValueError(f"class {parts[0]!r} is not a class number")
                    cls = int(parts[0])
                    cx, cy, w, h = (_number(float(v)) for v in parts[1:])
                    if names is not None and cls >= len(names):
                        raise ValueError(f"class {cls} is not in the class names ({len(names)} of them)")
                    box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
                    bad = _box_problem(*box) or (
                        None
                        if all(-1e-6 <= v <= 1 + 1e-6 for v in (cx, cy, w, h))
                        else "values must be fractions of the image, 0..1"
                    )
                    if bad:
                        raise ValueError(bad)
                except ValueError as e:
                    problem = _mark(problems, problem, f"{where}:{lineno}", f"bad annotation: {e}")
                    continue
                highest = max(highest, cls)
                boxes.append(box)
                labels.append(cls)
            records[rel] = ImageBoxes(tuple(boxes), tuple(labels), where, normalized=True, problem=problem)
    categories = names if names is not None else [str(i) for i in range(highest + 1)]
    return Annotations("yolo", categories, list(range(len(categories))), records, problems, background=True)


def _yolo_names(path: Path) -> Optional[list[str]]:
    """The class names of a YOLO labels folder, or None when it has none (classes are then numbered)."""
    for folder in (path, path.parent):
        classes = folder / "classes.txt"
        if classes.is_file():
            from packer.spec.class_map import read_class_file

            return read_class_file(classes)
        for yaml_name in ("data.yaml", "dataset.yaml"):
            if (folder / yaml_name).is_file():
                return _yaml_names(folder / yaml_name)
    return None


def _yaml_names(path: Path) -> list[str]:
    import yaml  # PyYAML: Ultralytics' data.yaml is YAML, never parsed by hand

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8-sig"))
        names = data["names"]
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError) as e:
        raise InputError(f"{path}: cannot read its class names ('names: [...]'): {e}") from None
    if isinstance(names, dict):
        numbered = {int(k) if isinstance(k, str) and YOLO_CLASS.fullmatch(k) else k: v for k, v in names.items()}
        if sorted(numbered, key=str) != sorted(range(len(numbered)), key=str):
            raise InputError(f"{path}: 'names' must number the classes 0..{len(names) - 1}")
        names = [numbered[i] for i in range(len(numbered))]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise InputError(
            f"{path}: 'names' must be a list of class names as text (quote names such as yes, no, "
            "1.0 that YAML reads as other values)"
        )
    if len(set(names)) != len(names):
        raise InputError(f"{path}: two classes share a name in 'names'")
    return list(names)


def read_voc(path: Path) -> Annotations:
    """A Pascal VOC ``Annotations`` folder: one ``REL/NAME.xml`` per image ``REL/NAME.*`` with its ``size``
    and ``object``s (``name``, ``bndbox`` of 1-based inclusive pixel indices, ``difficult``). Categories
    are the names found, sorted. A file or object that cannot be used marks its image (skipped)."""
    problems: list[Skipped] = []
    raw: dict[str, dict] = {}
    for folder, _, files in sorted(os.walk(path)):
        for name in sorted(files):
            if not name.lower().endswith(".xml"):
                continue
            file = Path(folder) / name
            key = file.relative_to(path).with_suffix("").as_posix()
            where = f"{path.name}/{file.relative_to(path).as_posix()}"
            try:
                root = ElementTree.parse(file).getroot()
            except (ElementTree.ParseError, OSError, RecursionError) as e:
                problem = f"bad annotation: {where} is not readable XML ({e})"
                problems.append(Skipped(where, problem))
                raw[key] = {"objects": [], "size": None, "where": where, "problem": problem}
                continue
            size, problem = None, None
            w, h = root.findtext("size/width"), root.findtext("size/height")
            try:
                if w and h and w.strip() and h.strip():
                    fw, fh = float(w), float(h)
                    if not (fw.is_integer() and fh.is_integer() and fw > 0 and fh > 0):
                        raise ValueError
                    size = (int(fw), int(fh))
            except ValueError:
                problem = f"bad annotation: size {w!r} x {h!r} is not a whole positive width and height ({where})"
                problems.append(Skipped(where, problem))
            objects = []
            for n, obj in enumerate(root.iter("object")):
                label = obj.findtext("name")
                try:
                    box = tuple(
                        _number(float(obj.findtext(f"bndbox/{k}") or "x")) for k in ("xmin", "ymin", "xmax", "ymax")
                    )
                    # VOC counts pixels from 1, both ends included: pixel edges are xmin - 1 .. xmax
                    x0, y0, x1, y1 = box[0] - 1, box[1] - 1, box[2], box[3]
                    bad = None if label and label.strip() else "an object needs a name"
                    bad = bad or _box_problem(x0, y0, x1, y1)
                    if bad:
                        raise ValueError(bad)
                except ValueError as e:
                    reason = f"bad annotation: {e or 'bndbox needs numeric xmin, ymin, xmax, ymax'}"
                    problem = _mark(problems, problem, f"{where}#object[{n}]", reason)
                    continue
                difficult = int((obj.findtext("difficult") or "0").strip() == "1")
                objects.append((label.strip(), (x0, y0, x1, y1), difficult))
            raw[key] = {"objects": objects, "size": size, "where": where, "problem": problem}
    names = sorted({o[0] for r in raw.values() for o in r["objects"]})
    index = {n: i for i, n in enumerate(names)}
    records = {
        key: ImageBoxes(
            tuple(o[1] for o in r["objects"]),
            tuple(index[o[0]] for o in r["objects"]),
            r["where"],
            r["size"],
            difficult=tuple(o[2] for o in r["objects"]),
            problem=r["problem"],
        )
        for key, r in raw.items()
    }
    return Annotations("voc", names, list(names), records, problems)
