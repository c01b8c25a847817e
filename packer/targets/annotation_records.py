"""The plain records every annotation reader gives: ``ImageBoxes`` (one image's boxes) and
``Annotations`` (what one annotation source holds), putting them in another category order
(``with_categories``), and the checks the readers share (a finite number, a box with an area, the
first bad entry of an image)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

from packer.records import Skipped
from packer.spec.class_map import extend_class_map, quoted
from packer.spec.errors import InputError


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


def finite_number(value) -> float:
    """``value`` as a float when it is a finite number (not a bool), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return float(value)


def box_problem(x0: float, y0: float, x1: float, y1: float) -> Optional[str]:
    """Why the XYXY box cannot be used (it has no area), or None."""
    if x1 <= x0 or y1 <= y0:
        return f"box {[x0, y0, x1, y1]} has no area (XYXY)"
    return None


def mark_problem(problems: list[Skipped], first: Optional[str], place: str, reason: str) -> str:
    """Report one bad entry of an image's annotation (at ``place``); returns the image's problem, its
    first bad entry, which skips the image."""
    problems.append(Skipped(place, reason))
    return first or f"{reason} ({place})"
