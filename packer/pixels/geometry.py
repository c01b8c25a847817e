"""Where each source pixel lands in the stored image: the geometry of one image's preprocessing.

The preprocessing of ``packer.pixels.preprocess`` is, geometrically, the EXIF orientation (a turn or
mirror of the stored pixel grid) followed by an axis-aligned scale and offset: every resize mode,
the centre crop and the letterbox pad only scale each axis and shift it. ``image_geometry`` computes
that scale and offset from the displayed size and the options alone, from the plan the pixels are
resized by (``packer.pixels.resize.resize_plan``: torchvision's integer sizes and rounded offsets
included), so that boxes drawn on the source land on the same pixels in the stored image
(``map_boxes``). Coordinates are continuous
pixel-edge coordinates: ``(0, 0)`` is the top-left corner of the first pixel, ``(w, h)`` the
bottom-right corner of the last one, as COCO's and VOC's boxes are.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
from PIL import Image

from packer.config import PreprocessConfig
from packer.pixels.boxes import MappedBoxes, place_boxes
from packer.pixels.jpeg import upright
from packer.pixels.resize import crop_offsets, resize, resize_plan


@dataclass(frozen=True)
class Geometry:
    """How one image went from its source to its stored form.

    ``stored_size`` is the source's (width, height) as stored in the file, ``orientation`` its EXIF
    orientation (1..8), ``original_size`` its size as displayed (after the orientation). A point
    ``(x, y)`` of the displayed image lands at ``(x * scale[0] + offset[0], y * scale[1] +
    offset[1])`` in the output of ``size``; ``content`` is the part of the output that holds pixels
    of the source (the rest is ``--fill`` padding), as (left, top, right, bottom).
    """

    stored_size: tuple[int, int]
    orientation: int
    original_size: tuple[int, int]
    scale: tuple[float, float]
    offset: tuple[float, float]
    size: tuple[int, int]
    content: tuple[float, float, float, float]

    def to_dict(self) -> dict:
        """JSON-ready form (what readers return as a sample's geometry)."""
        return {
            "stored_size": list(self.stored_size),
            "orientation": self.orientation,
            "original_size": list(self.original_size),
            "scale": list(self.scale),
            "offset": list(self.offset),
            "size": list(self.size),
            "content": list(self.content),
        }


def image_geometry(stored_size: tuple[int, int], orientation: int, cfg: PreprocessConfig) -> Geometry:
    """The geometry ``packer.pixels.preprocess`` applies to an image of ``stored_size`` with EXIF ``orientation``."""
    w, h = (stored_size[1], stored_size[0]) if orientation in (5, 6, 7, 8) else stored_size
    sx, sy, ox, oy, out = _resize(w, h, cfg)
    # The picture's part of the resize's output: the image as placed, inside that output (shorter-crop
    # keeps its window only; pad leaves the letterbox around it).
    content = _within((ox, oy, ox + w * sx, oy + h * sy), out)
    if cfg.crop is not None:
        (px, py), (left, top) = crop_offsets(out, cfg.crop)
        dx, dy = px - left, py - top
        ox, oy, out = ox + dx, oy + dy, cfg.crop
        content = _within((content[0] + dx, content[1] + dy, content[2] + dx, content[3] + dy), out)
    return Geometry(tuple(stored_size), orientation, (w, h), (sx, sy), (ox, oy), out, content)  # type: ignore[arg-type]


def _within(box: tuple[float, float, float, float], size: tuple[int, int]) -> tuple[float, float, float, float]:
    """``box`` cut to an image of ``size`` (empty boxes keep left <= right)."""
    x0, y0 = min(max(box[0], 0.0), float(size[0])), min(max(box[1], 0.0), float(size[1]))
    return (x0, y0, max(x0, min(box[2], float(size[0]))), max(y0, min(box[3], float(size[1]))))


def _resize(w: int, h: int, cfg: PreprocessConfig) -> tuple[float, float, float, float, tuple[int, int]]:
    """``(scale x, scale y, offset x, offset y, output size)`` of ``cfg.resize`` alone: its ``resize_plan``."""
    plan = resize_plan((w, h), cfg)
    ww, wh = (w, h) if plan.window is None else plan.window[2:]
    sx, sy = plan.resized[0] / ww, plan.resized[1] / wh
    if plan.window is None and plan.crop is None:  # the picture whole, at the origin or pad's letterbox
        return sx, sy, float(plan.at[0]), float(plan.at[1]), plan.size
    # A part cut off: of the resized picture (torchvision's crop) or of the picture (the fractional
    # window). Negated last, so an axis with nothing cut has the offset -0.0 stored geometries hold.
    (cx, cy), (wx, wy) = plan.crop or (0, 0), (plan.window or (0.0, 0.0))[:2]
    return sx, sy, -(cx + wx * sx), -(cy + wy * sy), plan.size


def orient_boxes(boxes: np.ndarray, stored_size: tuple[int, int], orientation: int) -> np.ndarray:
    """XYXY ``boxes`` on the stored pixel grid of ``stored_size`` (width, height), turned as the EXIF
    ``orientation`` turns the pixels (``packer.pixels.jpeg.upright``): boxes on the displayed image."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    return np.array([orient_box(tuple(b), stored_size, orientation) for b in boxes.tolist()], np.float64).reshape(-1, 4)


def orient_box(
    box: tuple[float, float, float, float], stored_size: tuple[int, int], orientation: int
) -> tuple[float, float, float, float]:
    """One XYXY box of the stored grid on the displayed image (see ``orient_boxes``): 2 mirrors
    left-right, 3 turns 180 degrees, 4 mirrors top-bottom, 5 transposes, 6 turns 90 degrees
    clockwise, 7 transverses, 8 turns 90 degrees counter-clockwise (EXIF's meanings)."""
    (x0, y0, x1, y1), (w, h) = box, stored_size
    if orientation == 2:
        return (w - x1, y0, w - x0, y1)
    if orientation == 3:
        return (w - x1, h - y1, w - x0, h - y0)
    if orientation == 4:
        return (x0, h - y1, x1, h - y0)
    if orientation == 5:
        return (y0, x0, y1, x1)
    if orientation == 6:
        return (h - y1, x0, h - y0, x1)
    if orientation == 7:
        return (h - y1, w - x1, h - y0, w - x0)
    if orientation == 8:
        return (y0, w - x1, y1, w - x0)
    return (x0, y0, x1, y1)


def map_boxes(boxes, geometry: Geometry, displayed: bool, min_visibility: float) -> MappedBoxes:
    """XYXY ``boxes`` of one source image (each of positive area) carried through its ``geometry``: turned
    by the orientation unless they are already on the ``displayed`` image, scaled and offset, clipped
    to the part of the output that holds the picture (``packer.pixels.boxes.place_boxes``: a box is dropped
    when nothing of it is left, or less than ``min_visibility`` of its area)."""
    rows = np.asarray(boxes, np.float64).reshape(-1, 4).tolist()
    if not displayed:
        rows = [orient_box(tuple(box), geometry.stored_size, geometry.orientation) for box in rows]
    return place_boxes(
        np.array(rows, np.float64).reshape(-1, 4), geometry.scale, geometry.offset, geometry.content, min_visibility
    )


class GridError(ValueError):
    """``grid_is_displayed`` cannot tell, or is told something the sizes contradict; ``kind`` is
    ``mismatch`` (the size fits neither grid), ``contradicts`` (a forced grid the size disproves) or
    ``ambiguous`` (an EXIF-turned image that nothing decides)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def grid_is_displayed(
    size: Optional[tuple[int, int]],
    stored: tuple[int, int],
    shown: tuple[int, int],
    orientation: int,
    coords: str,
    normalized: bool = False,
) -> bool:
    """Whether coordinates drawn for an image (boxes, a mask; ``size`` the image size they give, None
    when unknown) are on its displayed grid (EXIF applied) rather than its stored one.

    ``coords`` ``stored`` or ``displayed`` says which, unless the size proves it wrong; ``auto``:
    ``normalized`` ones (YOLO's) are on the displayed image, as Ultralytics reads them; an unturned
    image has one grid; a 90-degree turn of a non-square image is told by the size; anything else
    is a GridError, never a guess: the coordinates would land on the wrong pixels.
    """
    if size is not None and size not in (stored, shown):
        raise GridError("mismatch", f"{size[0]}x{size[1]}, the image {stored[0]}x{stored[1]}")
    if coords != "auto":
        named = shown if coords == "displayed" else stored
        if size is not None and stored != shown and size != named:
            raise GridError("contradicts", f"{size[0]}x{size[1]}, the {coords} image {named[0]}x{named[1]}")
        return coords == "displayed"
    if normalized or orientation == 1:
        return normalized
    if size is not None and stored != shown:
        return size == shown
    raise GridError(
        "ambiguous",
        f"EXIF orientation {orientation} turns this image, and nothing says whether they "
        "are on the stored or the turned image; pass --box-coords stored or --box-coords "
        "displayed",
    )


def carry_indices(
    image: Image.Image,
    orientation: int,
    displayed: bool,
    cfg: PreprocessConfig,
    shown: tuple[int, int],
    fill: int,
    path: str,
) -> Image.Image:
    """An 8-bit image of indices drawn for a source image (a class mask, an instance mask) through that
    image's steps: turned by its EXIF ``orientation`` unless already ``displayed``, then its resize,
    crop and pad with nearest-neighbour resampling and ``fill`` as padding, so no index appears that
    was not in it (but ``fill``). ``shown`` is the source's displayed size."""
    if not displayed:
        image = upright(image, orientation)
    nearest = replace(cfg, interpolation="nearest", mode="L", fill=(fill,), reduced_decode=False)
    return resize(image, nearest, None, shown, path)
