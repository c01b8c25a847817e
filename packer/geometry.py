"""Where each source pixel lands in the stored image: the geometry of one image's preprocessing.

The preprocessing of ``packer.preprocess`` is, geometrically, the EXIF orientation (a turn or
mirror of the stored pixel grid) followed by an axis-aligned scale and offset: every resize mode,
the centre crop and the letterbox pad only scale each axis and shift it. ``image_geometry`` computes
that scale and offset from the displayed size and the options alone, exactly as ``resize`` places
the pixels (torchvision's integer sizes and rounded offsets included), so that boxes drawn on the
source land on the same pixels in the stored image (``map_boxes``). Coordinates are continuous
pixel-edge coordinates: ``(0, 0)`` is the top-left corner of the first pixel, ``(w, h)`` the
bottom-right corner of the last one, as COCO's and VOC's boxes are.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from packer.config import PreprocessConfig
from packer.preprocess import max_side, torchvision_crop


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
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def image_geometry(stored_size: tuple[int, int], orientation: int, cfg: PreprocessConfig) -> Geometry:
    """The geometry ``packer.preprocess`` applies to an image of ``stored_size`` with EXIF ``orientation``."""
    w, h = (stored_size[1], stored_size[0]) if orientation in (5, 6, 7, 8) else stored_size
    sx, sy, ox, oy, out = _resize(w, h, cfg)
    if cfg.crop is not None:
        (ow, oh), (cw, ch) = out, cfg.crop
        # center_crop: pad a smaller side ((crop - side) // 2 before), then cut at the rounded centre
        px, py = ((cw - ow) // 2 if cw > ow else 0), ((ch - oh) // 2 if ch > oh else 0)
        pw, ph = max(cw, ow), max(ch, oh)
        left, top = int(round((pw - cw) / 2.0)), int(round((ph - ch) / 2.0))
        ox, oy, out = ox + px - left, oy + py - top, (cw, ch)
    right, bottom = ox + w * sx, oy + h * sy
    content = (max(0.0, ox), max(0.0, oy), min(float(out[0]), right), min(float(out[1]), bottom))
    return Geometry(tuple(stored_size), orientation, (w, h), (sx, sy), (ox, oy), out, content)  # type: ignore[arg-type]


def _resize(w: int, h: int, cfg: PreprocessConfig) -> tuple[float, float, float, float, tuple[int, int]]:
    """``(scale x, scale y, offset x, offset y, output size)`` of ``cfg.resize`` alone, as ``preprocess`` does it."""
    if cfg.resize == "none" or cfg.size is None:
        return 1.0, 1.0, 0.0, 0.0, (w, h)
    tw, th = cfg.size
    if cfg.resize == "stretch":
        return tw / w, th / h, 0.0, 0.0, (tw, th)
    if cfg.resize == "max":
        nw, nh = max_side((w, h), tw)
        return nw / w, nh / h, 0.0, 0.0, (nw, nh)
    if cfg.resize == "shorter":
        (rw, rh), _ = torchvision_crop((w, h), cfg.size)
        return rw / w, rh / h, 0.0, 0.0, (rw, rh)
    if cfg.resize == "shorter-crop" and cfg.geometry == "torchvision":
        (rw, rh), (left, top) = torchvision_crop((w, h), cfg.size)
        return rw / w, rh / h, -float(left), -float(top), (tw, th)
    if cfg.resize == "shorter-crop":  # fractional: the largest centred box of the target's shape, in one step
        scale = max(tw / w, th / h)
        cw, ch = min(w, tw / scale), min(h, th / scale)
        left, top = max(0.0, (w - cw) / 2), max(0.0, (h - ch) / 2)
        sx, sy = tw / cw, th / ch
        return sx, sy, -left * sx, -top * sy, (tw, th)
    # pad: fitted inside, centred on the canvas
    scale = min(tw / w, th / h)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    return nw / w, nh / h, float((tw - nw) // 2), float((th - nh) // 2), (tw, th)


def orient_boxes(boxes: np.ndarray, stored_size: tuple[int, int], orientation: int) -> np.ndarray:
    """XYXY ``boxes`` on the stored pixel grid of ``stored_size`` (width, height), turned as the EXIF
    ``orientation`` turns the pixels (``packer.jpeg.upright``): boxes on the displayed image."""
    if orientation == 1 or len(boxes) == 0:
        return boxes
    w, h = stored_size
    x0, y0, x1, y1 = boxes.T
    xs, ys = _orient_points(np.stack([x0, x1, x0, x1]), np.stack([y0, y0, y1, y1]), w, h, orientation)
    return np.stack([xs.min(0), ys.min(0), xs.max(0), ys.max(0)], axis=1).astype(boxes.dtype)


def _orient_points(x: np.ndarray, y: np.ndarray, w: float, h: float, orientation: int) -> tuple[np.ndarray, np.ndarray]:
    """Where the stored points ``(x, y)`` of a ``w`` x ``h`` image are displayed under ``orientation``:
    2 mirrors left-right, 3 turns 180 degrees, 4 mirrors top-bottom, 5 transposes, 6 turns 90
    degrees clockwise, 7 transverses, 8 turns 90 degrees counter-clockwise (EXIF's meanings)."""
    return {
        2: (w - x, y), 3: (w - x, h - y), 4: (x, h - y), 5: (y, x),
        6: (h - y, x), 7: (h - y, w - x), 8: (y, w - x),
    }.get(orientation, (x, y))


@dataclass(frozen=True)
class MappedBoxes:
    """Boxes after the geometry: those kept (XYXY in output pixels, clipped to the picture), the
    indices into the input of the ones kept, and the share of each kept box's area left after the
    clipping; the others were cut away or kept too little of their area."""

    boxes: np.ndarray
    kept: np.ndarray
    share: np.ndarray


def map_boxes(boxes: np.ndarray, geometry: Geometry, displayed: bool, min_visibility: float) -> MappedBoxes:
    """XYXY ``boxes`` of one source image carried through its ``geometry``: turned by the orientation
    unless they are already on the ``displayed`` image, scaled and offset, clipped to the part of the
    output that holds the picture. A box is dropped when less than ``min_visibility`` of its area (in
    the output) is left, or nothing at all (a box with no area is kept only if it lies inside)."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    if not displayed:
        boxes = orient_boxes(boxes, geometry.stored_size, geometry.orientation)
    (sx, sy), (ox, oy) = geometry.scale, geometry.offset
    placed = boxes * np.array([sx, sy, sx, sy]) + np.array([ox, oy, ox, oy])
    left, top, right, bottom = geometry.content
    clipped = np.stack([np.clip(placed[:, 0], left, right), np.clip(placed[:, 1], top, bottom),
                        np.clip(placed[:, 2], left, right), np.clip(placed[:, 3], top, bottom)], axis=1)
    area = (placed[:, 2] - placed[:, 0]) * (placed[:, 3] - placed[:, 1])
    left_area = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1])
    inside = (placed[:, 0] >= left) & (placed[:, 1] >= top) & (placed[:, 2] <= right) & (placed[:, 3] <= bottom)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(area > 0, left_area / np.where(area > 0, area, 1), inside.astype(np.float64))
    keep = (share >= min_visibility) & (share > 0) if min_visibility > 0 else (share > 0) | inside
    kept = np.flatnonzero(keep)
    return MappedBoxes(clipped[kept].astype(np.float32), kept, np.minimum(share[kept], 1.0))

