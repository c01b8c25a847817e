"""Detection annotations as users have them: a COCO instances JSON, a YOLO labels folder, Pascal VOC XML.

Each reader turns its files into one plain record per image (``ImageBoxes``: boxes in XYXY source
pixels, or normalized for YOLO, with category indices) and a list of categories, and reports
every entry it cannot use (a malformed box, an unknown category, an image that is not there) with
the file and the reason instead of failing. Which pixels the boxes refer to (``coords``):

- COCO and VOC give each image's size: boxes are on the stored pixel grid (as Pillow, torchvision and
  pycocotools read the file, EXIF orientation not applied) unless that size is the *displayed* one
  of an image its EXIF turns by 90 degrees, which says the tool drew them on the turned image.
- YOLO's normalized boxes are on the displayed image (EXIF applied), as Ultralytics reads them.

The records are in ``packer.targets.annotation_records``; each format's reader in a module of its own
(``coco_annotations``, ``yolo_labels``, ``voc_annotations``); this module finds the format and the
digest. ``packer.targets.detection`` then carries the boxes through each image's geometry.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Optional

from packer.spec.errors import InputError
from packer.spec.file_stamp import FileStamp
from packer.targets.annotation_records import Annotations
from packer.targets.coco_annotations import read_coco
from packer.targets.voc_annotations import read_voc
from packer.targets.yolo_labels import read_yolo

ANNOTATION_FORMATS = ("coco", "yolo", "voc")


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
