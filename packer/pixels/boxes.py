"""Boxes carried through a scale and an offset and clipped, the one rule for the converter and the readers.

The converter maps each source image's boxes onto its stored image (``packer.pixels.geometry``); the
readers map a stored image's boxes onto the crop they cut from it (``readers.augment.crops``). Both keep a
box only where enough of it is left inside the picture: the same rule, so that a box is never kept
by one and dropped by the other for the same share of its area.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MappedBoxes:
    """Boxes after ``place_boxes``: XYXY float32 ``boxes`` (N, 4) of the ones kept, ``kept`` the
    indices into the input of the ones kept, and the share of each kept box's area left after the
    clip (``share``, to scale areas that were measured on the whole box)."""

    boxes: np.ndarray
    kept: np.ndarray
    share: np.ndarray


def place_boxes(
    boxes,
    scale: tuple[float, float],
    offset: tuple[float, float],
    content: tuple[float, float, float, float],
    min_visibility: float,
) -> MappedBoxes:
    """XYXY ``boxes`` moved to ``(x * scale[0] + offset[0], y * scale[1] + offset[1])`` and clipped to
    ``content`` (left, top, right, bottom: the part of the image that holds the picture). A box is
    dropped when nothing of it is left, or less than ``min_visibility`` of its area. (Plain Python:
    an image has a few boxes, for which numpy's per-call cost is most of the time.)"""
    (sx, sy), (ox, oy) = scale, offset
    left, top, right, bottom = content
    out, kept, shares = [], [], []
    for i, (x0, y0, x1, y1) in enumerate(np.asarray(boxes, np.float64).reshape(-1, 4).tolist()):
        x0, y0, x1, y1 = x0 * sx + ox, y0 * sy + oy, x1 * sx + ox, y1 * sy + oy
        x0, x1 = min(x0, x1), max(x0, x1)  # a negative scale (a mirror) swaps the edges
        y0, y1 = min(y0, y1), max(y0, y1)
        area = (x1 - x0) * (y1 - y0)
        cx0, cy0 = min(max(x0, left), right), min(max(y0, top), bottom)
        cx1, cy1 = min(max(x1, left), right), min(max(y1, top), bottom)
        share = min(1.0, (cx1 - cx0) * (cy1 - cy0) / area) if area > 0 else 0.0
        if share > 0 and share >= min_visibility:
            out.append((cx0, cy0, cx1, cy1))
            kept.append(i)
            shares.append(share)
    return MappedBoxes(np.array(out, np.float32).reshape(-1, 4), np.array(kept, np.int64), np.array(shares))
