"""Moving what is stored beside an image with its crop and flip: detection targets (``place_target``),
masks (``place_mask``) and the image's geometry (``place_geometry``), so they describe the returned
image as they described the stored one."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from readers.augment.crops import Placement

MIN_BOX = 1.0
"""Boxes a crop leaves narrower or lower than this many pixels of the returned image are dropped, as
torchvision's ``SanitizeBoundingBoxes(min_size=1)`` drops them after its crops: detection losses need
boxes of some size."""


def _affine(placement: Placement) -> tuple[tuple[float, float], tuple[float, float]]:
    """``(scale, offset)`` taking a point of the stored image to the returned one, the flip included."""
    (oh, ow), (left, top, right, bottom) = placement.size, placement.box
    kx, ky = ow / (right - left), oh / (bottom - top)
    if placement.flip:
        return (-kx, ky), (ow + left * kx, -top * ky)
    return (kx, ky), (-left * kx, -top * ky)


def place_target(target: dict, placement: Placement, min_visibility: float) -> dict:
    """A detection target (``packer.spec.field_kinds.Detection.read``, as tensors) of the stored image,
    moved onto the image
    ``placement`` makes: boxes scaled, offset, mirrored with the flip and clipped to the picture,
    dropped as the converter drops them (less than ``min_visibility`` of the annotated box's area left,
    counting what the conversion's crop cut: ``visible``; ``packer.pixels.boxes``) or narrower or lower than
    ``MIN_BOX`` pixels (torchvision's
    ``SanitizeBoundingBoxes``), the other per-box values kept for the boxes kept (``area`` scaled, and cut as
    much as its box), instance masks cut and resized as the pixels (nearest-neighbour), and the
    ``geometry`` composed with the crop (its x scale negative after a flip)."""
    from packer.pixels.boxes import place_boxes

    (sx, sy), (ox, oy) = _affine(placement)
    geometry = place_geometry(target.get("geometry"), placement)
    content = tuple(geometry["content"]) if geometry else (0.0, 0.0, float(placement.size[1]), float(placement.size[0]))
    mapped = place_boxes(target["boxes"].numpy(), (sx, sy), (ox, oy), content, 0.0)
    # The share left of each annotated box: the conversion's crop may have cut it already ("visible").
    visible = mapped.share * (target["visible"].numpy()[mapped.kept] if "visible" in target else 1.0)
    sized = (
        (mapped.boxes[:, 2] - mapped.boxes[:, 0] >= MIN_BOX)
        & (mapped.boxes[:, 3] - mapped.boxes[:, 1] >= MIN_BOX)
        & (visible >= min_visibility)
    )
    keep = torch.from_numpy(mapped.kept[sized])
    out = {"boxes": torch.from_numpy(mapped.boxes[sized]).reshape(-1, 4)}
    for name in ("labels", "iscrowd", "difficult"):
        if name in target:
            out[name] = target[name][keep]
    if "visible" in target:
        out["visible"] = torch.from_numpy(visible[sized].astype(np.float32))
    if "area" in target:
        share = torch.from_numpy(mapped.share[sized].astype(np.float32))
        out["area"] = target["area"][keep] * float(abs(sx * sy)) * share
    if "masks" in target:
        out["masks"] = place_mask(target["masks"][keep], placement, 0)
    out["geometry"] = geometry
    return out


def place_geometry(geometry: Optional[dict], placement: Placement) -> Optional[dict]:
    """An image's geometry (``packer.pixels.geometry.Geometry.to_dict``: source points to the stored image)
    composed with ``placement``: source points to the returned image, the x scale negative after a
    flip; ``content`` (the picture's part) cut to the returned image. None stays None."""
    if not geometry:
        return geometry
    (oh, ow) = placement.size
    (sx, sy), (ox, oy) = _affine(placement)
    out = dict(geometry)
    content = (0.0, 0.0, float(ow), float(oh))
    if geometry.get("content"):  # the picture's part of the stored image (the rest is --fill padding)
        c0, c1, c2, c3 = geometry["content"]
        xs, ys = sorted((c0 * sx + ox, c2 * sx + ox)), sorted((c1 * sy + oy, c3 * sy + oy))
        content = (max(0.0, xs[0]), max(0.0, ys[0]), min(float(ow), xs[1]), min(float(oh), ys[1]))
    gs, go = geometry.get("scale") or (1.0, 1.0), geometry.get("offset") or (0.0, 0.0)
    out.update(
        scale=[gs[0] * sx, gs[1] * sy], offset=[go[0] * sx + ox, go[1] * sy + oy], size=[ow, oh], content=list(content)
    )
    return out


def place_mask(mask: torch.Tensor, placement: Placement, fill: int) -> torch.Tensor:
    """A mask of the stored image (``(H, W)`` class indices, or ``(N, H, W)`` instance masks) on the
    image ``placement`` makes: each returned pixel takes the stored pixel under its centre
    (nearest-neighbour, as Pillow's ``NEAREST``), ``fill`` where that lies outside the stored image
    (a padded centre crop), mirrored with the flip."""
    (oh, ow), (left, top, right, bottom) = placement.size, placement.box
    h, w = mask.shape[-2:]
    ys = torch.floor(top + (torch.arange(oh, dtype=torch.float64) + 0.5) * (bottom - top) / oh).long()
    xs = torch.floor(left + (torch.arange(ow, dtype=torch.float64) + 0.5) * (right - left) / ow).long()
    if placement.flip:
        xs = xs.flip(0)
    inside = ((ys >= 0) & (ys < h))[:, None] & ((xs >= 0) & (xs < w))[None, :]
    out = mask[..., ys.clamp(0, h - 1)[:, None], xs.clamp(0, w - 1)[None, :]]
    if not bool(inside.all()):
        out = torch.where(inside, out, torch.tensor(fill, dtype=mask.dtype))
    return out


__all__ = ["place_target", "place_mask", "place_geometry", "MIN_BOX"]
