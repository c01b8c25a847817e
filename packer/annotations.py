"""Detection annotations as users have them: a COCO instances JSON, a YOLO labels folder, Pascal VOC XML.

Each reader turns its files into one plain record per image (``ImageBoxes``: boxes in XYXY source
pixels, or normalized for YOLO, with category indices) and a list of categories, and reports
every entry it cannot use (a malformed box, an unknown category, an image that is not there) with
the file and the reason instead of failing. Which pixels the boxes refer to (``coords``):

- COCO and VOC give each image's size: boxes are on the stored pixel grid (as Pillow, torchvision and
  pycocotools read the file, EXIF orientation not applied) unless that size is the *displayed* one
  of an image its EXIF turns by 90 degrees, which says the tool drew them on the turned image.
- YOLO's normalized boxes are on the displayed image (EXIF applied), as Ultralytics reads them.

``packer.detection`` then carries the boxes through each image's geometry.
"""

from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Optional

from packer.errors import InputError
from packer.records import Skipped

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

    def find(self, relpath: str) -> Optional[ImageBoxes]:
        """The record of the image at ``relpath`` (relative to the converted folder), matched by its path,
        then by its path without the extension, then by its file name alone when that is unique."""
        return (self.images.get(relpath) or self.images.get(_stem(relpath))
                or self._by_name().get(PurePosixPath(relpath).name)
                or self._by_name().get(PurePosixPath(_stem(relpath)).name))

    def _by_name(self) -> dict[str, ImageBoxes]:
        if not hasattr(self, "_names"):
            counts: dict[str, int] = {}
            for name in self.images:
                counts[PurePosixPath(name).name] = counts.get(PurePosixPath(name).name, 0) + 1
            self._names = {PurePosixPath(n).name: r for n, r in self.images.items()
                           if counts[PurePosixPath(n).name] == 1}
        return self._names


def _stem(relpath: str) -> str:
    return os.path.splitext(relpath)[0]


def detect_format(path: Path) -> str:
    """``coco`` for a JSON file, ``voc`` for a folder of ``.xml`` files, ``yolo`` for one of ``.txt`` files."""
    if path.is_file():
        if path.suffix.lower() == ".json":
            return "coco"
        raise InputError(f"--annotations {path}: a file must be a COCO instances .json; give a folder for YOLO "
                         "(.txt label files) or Pascal VOC (.xml files)")
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
    return found


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return float(value)


def _box_problem(x0: float, y0: float, x1: float, y1: float) -> Optional[str]:
    if x1 <= x0 or y1 <= y0:
        return f"box {[x0, y0, x1, y1]} has no area (XYXY)"
    return None


def read_coco(path: Path) -> Annotations:
    """A COCO instances file: ``images`` (id, file_name, width, height), ``categories`` (id, name) and
    ``annotations`` (image_id, category_id, bbox ``[x, y, w, h]``, iscrowd, area)."""
    if not path.is_file():
        raise InputError(f"--annotations {path}: no such file")
    if path.stat().st_size > MAX_ANNOTATION_BYTES:
        raise InputError(f"--annotations {path} is larger than {MAX_ANNOTATION_BYTES:,} bytes")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError(f"--annotations {path} is not a COCO JSON file: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) or not isinstance(
            data.get("categories"), list):
        raise InputError(f"--annotations {path} is not a COCO instances file: it needs 'images' and 'categories' "
                         "lists (and 'annotations')")
    where, problems = path.name, []
    cats: dict[int, str] = {}
    for n, c in enumerate(data["categories"]):
        if not isinstance(c, dict) or not isinstance(c.get("id"), int) or not isinstance(c.get("name"), str):
            problems.append(Skipped(f"{where}#categories[{n}]", f"bad annotation: a category needs an integer id and a "
                                                                 f"name, got {str(c)[:80]}"))
            continue
        if c["id"] in cats:
            raise InputError(f"--annotations {path}: category id {c['id']} is given twice")
        cats[c["id"]] = c["name"]
    if len(set(cats.values())) != len(cats):
        raise InputError(f"--annotations {path}: two categories share a name; packer labels boxes by category name")
    ids = sorted(cats)
    index = {cid: i for i, cid in enumerate(ids)}
    images: dict[int, dict] = {}
    for n, img in enumerate(data["images"]):
        try:
            image_id, name = img["id"], img["file_name"]
            if not isinstance(name, str) or not name:
                raise ValueError("file_name must be a path")
            size = (int(img["width"]), int(img["height"])) if "width" in img and "height" in img else None
        except (KeyError, TypeError, ValueError) as e:
            problems.append(Skipped(f"{where}#images[{n}]", f"bad annotation: an image needs id and file_name ({e})"))
            continue
        images[image_id] = {"name": PurePosixPath(name.replace("\\", "/")).as_posix(), "size": size, "boxes": [],
                            "labels": [], "iscrowd": [], "area": [], "segmentation": []}
    for n, a in enumerate(data.get("annotations", [])):
        label = f"{where}#annotations[{n}]" + (f" (id {a.get('id')})" if isinstance(a, dict) and "id" in a else "")
        try:
            image = images.get(a["image_id"])
            if image is None:
                problems.append(Skipped(label, f"annotation of a missing image: image_id {a['image_id']} is not in "
                                               "'images'"))
                continue
            if a["category_id"] not in index:
                problems.append(Skipped(label, f"bad annotation: category_id {a['category_id']} is not in "
                                               "'categories'"))
                continue
            x, y, w, h = (_number(v) for v in a["bbox"])
            bad = _box_problem(x, y, x + w, y + h) if w > 0 and h > 0 else f"bbox {a['bbox']} has no area"
            bad = bad or (_segmentation_problem(a["segmentation"], image["size"]) if "segmentation" in a else None)
            if bad:
                problems.append(Skipped(label, f"bad annotation: {bad}"))
                continue
        except (KeyError, TypeError, ValueError) as e:
            problems.append(Skipped(label, f"bad annotation: needs image_id, category_id and bbox [x, y, w, h] ({e})"))
            continue
        image["boxes"].append((x, y, x + w, y + h))
        image["labels"].append(index[a["category_id"]])
        image["iscrowd"].append(int(bool(a.get("iscrowd", 0))))
        image["segmentation"].append(a.get("segmentation"))
        area = a.get("area")
        image["area"].append(float(area) if isinstance(area, (int, float)) and not isinstance(area, bool) else w * h)
    outlined = any(s is not None for image in images.values() for s in image["segmentation"])
    records: dict[str, ImageBoxes] = {}
    for image in images.values():
        if image["name"] in records:
            problems.append(Skipped(f"{where}#{image['name']}", "bad annotation: the file is listed twice in 'images'"))
            continue
        segmentation = None
        if outlined:  # the file has instance masks: every box must have its own, or it is left out
            keep = [i for i, s in enumerate(image["segmentation"]) if s is not None]
            for i in sorted(set(range(len(image["boxes"]))) - set(keep)):
                problems.append(Skipped(f"{where}#{image['name']}", f"bad annotation: box {i} of this image has no "
                                        "segmentation while the file's other annotations have one"))
            for key in ("boxes", "labels", "iscrowd", "area", "segmentation"):
                image[key] = [image[key][i] for i in keep]
            segmentation = tuple(image["segmentation"])
        records[image["name"]] = ImageBoxes(tuple(image["boxes"]), tuple(image["labels"]), where, image["size"],
                                            iscrowd=tuple(image["iscrowd"]), area=tuple(image["area"]),
                                            segmentation=segmentation)
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


def read_yolo(path: Path) -> Annotations:
    """A YOLO labels folder: ``REL/NAME.txt`` per image ``REL/NAME.*``, a row ``class cx cy w h`` per box
    (fractions of the image), class names from ``classes.txt`` or the ``names`` of a ``data.yaml`` in
    the folder or the one above."""
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
            try:
                text = file.read_text(encoding="utf-8-sig")
            except (OSError, UnicodeDecodeError) as e:
                problems.append(Skipped(f"{path.name}/{rel}.txt", f"bad annotation: cannot read it ({e})"))
                continue
            boxes, labels = [], []
            for lineno, line in enumerate(text.splitlines(), start=1):
                parts = line.split()
                if not parts:
                    continue
                where = f"{path.name}/{rel}.txt:{lineno}"
                try:
                    if len(parts) != 5:
                        raise ValueError(f"expected 'class cx cy w h', got {len(parts)} values"
                                         + (" (a segment: packer reads boxes)" if len(parts) > 5 else ""))
                    cls = int(parts[0])
                    cx, cy, w, h = (_number(float(v)) for v in parts[1:])
                except ValueError as e:
                    problems.append(Skipped(where, f"bad annotation: {e}"))
                    continue
                if cls < 0 or (names is not None and cls >= len(names)):
                    problems.append(Skipped(where, f"bad annotation: class {cls} is not in the class names "
                                                   f"({len(names or [])} of them)"))
                    continue
                box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
                bad = _box_problem(*box) or (None if all(-1e-6 <= v <= 1 + 1e-6 for v in (cx, cy, w, h)) else
                                             "values must be fractions of the image, 0..1")
                if bad:
                    problems.append(Skipped(where, f"bad annotation: {bad}"))
                    continue
                highest = max(highest, cls)
                boxes.append(box)
                labels.append(cls)
            records[rel] = ImageBoxes(tuple(boxes), tuple(labels), f"{path.name}/{rel}.txt", normalized=True)
    categories = names if names is not None else [str(i) for i in range(highest + 1)]
    return Annotations("yolo", categories, list(range(len(categories))), records, problems, background=True)


def _yolo_names(path: Path) -> Optional[list[str]]:
    """The class names of a YOLO labels folder, or None when it has none (classes are then numbered)."""
    for folder in (path, path.parent):
        classes = folder / "classes.txt"
        if classes.is_file():
            from packer.class_map import read_class_file

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
        if sorted(names) != list(range(len(names))):
            raise InputError(f"{path}: 'names' must number the classes 0..{len(names) - 1}")
        names = [names[i] for i in range(len(names))]
    if not isinstance(names, list) or not all(isinstance(n, (str, int)) for n in names):
        raise InputError(f"{path}: 'names' must be a list of class names")
    return [str(n) for n in names]


def read_voc(path: Path) -> Annotations:
    """A Pascal VOC ``Annotations`` folder: one ``.xml`` per image with its ``filename``, ``size`` and
    ``object``s (``name``, ``bndbox`` of 1-based inclusive pixel indices, ``difficult``). Categories
    are the names found, sorted."""
    problems: list[Skipped] = []
    raw: dict[str, dict] = {}
    for folder, _, files in sorted(os.walk(path)):
        for name in sorted(files):
            if not name.lower().endswith(".xml"):
                continue
            file = Path(folder) / name
            where = f"{path.name}/{file.relative_to(path).as_posix()}"
            try:
                root = ElementTree.parse(file).getroot()
            except (ElementTree.ParseError, OSError) as e:
                problems.append(Skipped(where, f"bad annotation: not readable XML ({e})"))
                continue
            size = None
            w, h = root.findtext("size/width"), root.findtext("size/height")
            if w and h and w.strip().isdigit() and h.strip().isdigit() and int(w) > 0 and int(h) > 0:
                size = (int(w), int(h))
            objects = []
            for n, obj in enumerate(root.iter("object")):
                label = obj.findtext("name")
                try:
                    box = tuple(_number(float(obj.findtext(f"bndbox/{k}") or "x")) for k in ("xmin", "ymin", "xmax",
                                                                                              "ymax"))
                except ValueError:
                    problems.append(Skipped(f"{where}#object[{n}]", "bad annotation: bndbox needs numeric xmin, ymin, "
                                                                    "xmax, ymax"))
                    continue
                # VOC counts pixels from 1, both ends included: pixel edges are xmin - 1 .. xmax
                x0, y0, x1, y1 = box[0] - 1, box[1] - 1, box[2], box[3]
                bad = None if label and label.strip() else "an object needs a name"
                bad = bad or _box_problem(x0, y0, x1, y1)
                if bad:
                    problems.append(Skipped(f"{where}#object[{n}]", f"bad annotation: {bad}"))
                    continue
                difficult = int((obj.findtext("difficult") or "0").strip() == "1")
                objects.append((label.strip(), (x0, y0, x1, y1), difficult))
            filename = (root.findtext("filename") or "").strip()
            key = file.relative_to(path).with_suffix("").as_posix()
            raw[key] = {"objects": objects, "size": size, "where": where, "filename": filename}
    names = sorted({o[0] for r in raw.values() for o in r["objects"]})
    index = {n: i for i, n in enumerate(names)}
    records: dict[str, ImageBoxes] = {}
    for key, r in raw.items():
        record = ImageBoxes(tuple(o[1] for o in r["objects"]), tuple(index[o[0]] for o in r["objects"]), r["where"],
                            r["size"], difficult=tuple(o[2] for o in r["objects"]))
        records[key] = record
        if r["filename"] and r["filename"] != PurePosixPath(key).name and r["filename"] not in records:
            records[r["filename"]] = record  # matched by the file name it gives, too
    return Annotations("voc", names, list(names), records, problems)
