"""The resize rule: where ``--resize`` puts a picture (``resize_plan``), and its pixels put there (``resize``).

``resize_plan`` is computed once per image, from its size and the options, and followed by the
pixels (``resize``, from a full or a scaled decode) and by the boxes and masks drawn on the source
(``packer.pixels.geometry``), so that they land on the same pixels. Resizing uses Pillow's
antialiased filters (the default, bilinear, matches torchvision's ``Resize`` with
``antialias=True``).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

from PIL import Image

from packer.config import PreprocessConfig
from packer.spec.errors import DecodeError

Area = tuple[float, float, float, float]
"""(left, top, right, bottom) of the picture within a decoded image, in its pixels."""

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}

TWO_STEP_LIMIT = 16
"""torchvision resizes the whole image, then crops: packer does the same (the same pixels) unless
the resized image would have more than this many times the pixels of what is kept (a 10 x 20000
strip: 224 x 448000), where it resizes the kept box in one step (within a level of the two steps)."""


class ResizePlan(NamedTuple):
    """Where ``--resize`` puts one picture (``resize_plan``), before ``--crop``.

    The picture's ``window`` (left, top, width, height, in the units of the size it was planned
    for; None: all of it) is resized to ``resized`` (width, height). Of that, ``crop`` (left, top;
    None: nothing) is cut off, torchvision's ``CenterCrop`` of ``size``; or it lies at ``at`` on a
    canvas of ``size`` filled with ``--fill`` (pad's letterbox). ``size`` is the resize's output.
    """

    size: tuple[int, int]
    resized: tuple[int, int]
    window: Optional[tuple[float, float, float, float]] = None
    crop: Optional[tuple[int, int]] = None
    at: tuple[int, int] = (0, 0)


def resize_plan(
    original: tuple[int, int], cfg: PreprocessConfig, extent: Optional[tuple[float, float]] = None
) -> ResizePlan:
    """Where ``cfg.resize`` puts a picture of ``original`` (width, height, as displayed).

    ``extent``: the picture's size in the pixels it is cut from, where a scaled decode made them
    fewer (``original`` times the scale, in float; None: ``original``). torchvision's integer sizes
    (``shorter-crop``, ``shorter``, ``max``) are computed on ``original``; the fractional window and
    pad's fitted size on ``extent``, the units of the window, as the pixels have always been cut.
    """
    if cfg.resize == "none" or cfg.size is None:
        return ResizePlan(original, original)
    (w, h), (tw, th) = extent or original, cfg.size
    if cfg.resize == "stretch":
        return ResizePlan((tw, th), (tw, th))
    if cfg.resize == "max":  # the longer side to N when it is longer, the aspect kept (FFCV's max_resolution)
        new = max_side(original, tw)
        return ResizePlan(new, new)
    if cfg.resize == "shorter":  # torchvision's Resize(N): the shorter side to N, the aspect kept
        resized, _ = torchvision_crop(original, cfg.size)
        return ResizePlan(resized, resized)
    if cfg.resize == "shorter-crop" and cfg.geometry == "torchvision":
        resized, crop = torchvision_crop(original, cfg.size)
        return ResizePlan((tw, th), resized, crop=crop)
    if cfg.resize == "shorter-crop":  # fractional: the largest centred box of the target's shape, in one step
        scale = _scale((w, h), (tw, th), cover=True)
        cw, ch = min(w, tw / scale), min(h, th / scale)
        return ResizePlan((tw, th), (tw, th), window=(max(0.0, (w - cw) / 2), max(0.0, (h - ch) / 2), cw, ch))
    # pad: fitted inside the target, centred on a canvas of the fill colour (letterbox)
    scale = _scale((w, h), (tw, th), cover=False)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    return ResizePlan((tw, th), (nw, nh), at=((tw - nw) // 2, (th - nh) // 2))


def _scale(size: tuple[float, float], target: tuple[int, int], cover: bool) -> float:
    """The factor that makes ``size`` ``cover`` ``target`` (both sides at least the target's), or fit
    inside it (both at most)."""
    (w, h), (tw, th) = size, target
    return max(tw / w, th / h) if cover else min(tw / w, th / h)


def draft_size(original: tuple[int, int], cfg: PreprocessConfig, swap: bool = False) -> tuple[int, int]:
    """The smallest decoded size (file orientation) from which the resize to ``cfg.size`` is still a
    reduction: what the JPEG decoder may scale an image down to while decoding (packer.pixels.jpeg).

    The exact scale of ``resize_plan``'s mode, rounded up: not the plan's sizes, which torchvision
    truncates (a decode a pixel short of the exact size would enlarge). No margin above the target:
    the decoder's DCT scaling is itself a good low-pass filter. The pixel difference to a full
    decode is measured by ``scripts/bench.py --draft-check``.
    """
    (w, h), (tw, th) = original, cfg.size  # type: ignore[misc]
    if cfg.resize == "stretch":
        need = (tw, th)
    else:
        scale = _scale((w, h), (tw, th), cover=cfg.resize in ("shorter-crop", "shorter"))
        need = (math.ceil(w * scale - 1e-6), math.ceil(h * scale - 1e-6))  # 1500 * (224 / 1500) is 224.00000001
    return (need[1], need[0]) if swap else need


def torchvision_crop(original: tuple[int, int], size: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((resized width, height), (left, top))``: the size torchvision's ``Resize`` gives an image of
    ``original`` (width, height) so that it covers ``size`` (width, height), and the offset at which
    ``CenterCrop`` then cuts ``size`` out of it.

    For a square ``size`` (N, N) it is ``Resize(N)``: the shorter side to N, the longer one to
    ``int(N * long / short)`` (truncated, as torchvision computes it); other sizes scale by the side
    that binds. The offsets are ``int(round((resized - size) / 2))``, Python's rounding (half to even)
    as in torchvision's ``center_crop``.
    """
    (w, h), (tw, th) = original, size
    if tw * h >= th * w:  # the width binds (the image is at least as tall as the target's shape)
        rw, rh = tw, max(th, int(tw * h / w))
    else:
        rw, rh = max(tw, int(th * w / h)), th
    return (rw, rh), (int(round((rw - tw) / 2.0)), int(round((rh - th) / 2.0)))


def max_side(original: tuple[int, int], side: int) -> tuple[int, int]:
    """The (width, height) of an image of ``original`` size with its longer side at most ``side``:
    unchanged when it already fits (never enlarged), else the longer side ``side`` and the shorter
    ``int(side * short / long)`` (truncated as torchvision's Resize truncates), at least 1."""
    w, h = original
    if max(w, h) <= side:
        return (w, h)
    return (side, max(1, int(side * h / w))) if w >= h else (max(1, int(side * w / h)), side)


def resize(
    img: Image.Image,
    cfg: PreprocessConfig,
    area: Optional[Area] = None,
    original: Optional[tuple[int, int]] = None,
    path: str = "<bytes>",
) -> Image.Image:
    """Apply ``cfg.resize`` to reach ``cfg.size`` (width, height), from the ``area`` of ``img`` that
    holds the picture (None: all of it), then ``cfg.crop``. ``original`` is the picture's size
    before any scaled decoding (None: the area's size), which torchvision's geometry is computed on.
    DecodeError (naming ``path``) when ``--resize shorter`` would make more than ``--max-pixels``."""
    if cfg.resize == "none":  # never decoded scaled: without a size there is nothing to scale to
        return img if cfg.crop is None else center_crop(img, cfg.crop, cfg.fill)
    box = area or (0.0, 0.0, *img.size)
    extent = (box[2] - box[0], box[3] - box[1])
    original = original or (round(extent[0]), round(extent[1]))
    plan = resize_plan(original, cfg, extent)
    resample = _RESAMPLE[cfg.interpolation]
    if cfg.resize == "shorter":
        (rw, rh), crop = plan.resized, cfg.crop
        if crop is not None and rw * rh > TWO_STEP_LIMIT * crop[0] * crop[1]:
            return _crop_in_one_step(img, box, (rw, rh), crop, resample, cfg.fill)
        if crop is None and rw * rh > cfg.max_pixels:
            raise DecodeError(
                path,
                f"too many pixels after the resize: {rw}x{rh} is more than --max-pixels "
                f"{cfg.max_pixels:,} (--crop keeps a part of it)",
            )
    resized = _planned(img, plan, box, area is None, original, resample, cfg.fill)
    return resized if cfg.crop is None else center_crop(resized, cfg.crop, cfg.fill)


def _planned(
    img: Image.Image,
    plan: ResizePlan,
    box: Area,
    whole: bool,
    original: tuple[int, int],
    resample: Image.Resampling,
    fill: tuple[int, ...],
) -> Image.Image:
    """``plan`` applied to the picture in ``box`` of ``img``; ``whole`` when that is all of ``img``
    (a full decode). Nothing is resized that already has its size."""
    if plan.window is not None:  # the fractional window, resized in one step
        if whole and img.size == plan.size:
            return img
        x0, y0 = box[0] + plan.window[0], box[1] + plan.window[1]
        return img.resize(plan.resized, resample, box=(x0, y0, x0 + plan.window[2], y0 + plan.window[3]))
    if plan.crop is not None:  # torchvision's Resize, then CenterCrop of plan.size
        if whole and img.size == plan.size:
            return img
        (rw, rh), (left, top), (tw, th) = plan.resized, plan.crop, plan.size
        if whole and img.size == original and rw * rh <= TWO_STEP_LIMIT * tw * th:
            # The whole picture at its own size (a full decode): torchvision's two steps, byte for byte.
            resized = img if (rw, rh) == original else img.resize((rw, rh), resample)
            return resized.crop((left, top, left + tw, top + th))
        # A scaled decode (or a long strip): the same crop, mapped into the decoded image, one resize.
        return _crop_in_one_step(img, box, (rw, rh), (tw, th), resample, fill)
    inner = img if whole and img.size == plan.resized else img.resize(plan.resized, resample, box=box)
    if plan.size == plan.resized:
        return inner
    canvas = Image.new(img.mode, plan.size, fill[0] if img.mode == "L" else rgb(fill))
    canvas.paste(inner, plan.at)
    return canvas


def _crop_in_one_step(
    img: Image.Image,
    box: Area,
    resized: tuple[int, int],
    crop: tuple[int, int],
    resample: Image.Resampling,
    fill: tuple[int, ...],
) -> Image.Image:
    """The centre ``crop`` of ``img``'s ``box`` resized to ``resized``, as one resize of the kept part
    of the box (torchvision's offsets; what lies outside the image is padded with ``fill`` after)."""
    (x0, y0, x1, y1), (rw, rh), (cw, ch) = box, resized, crop
    sx, sy = (x1 - x0) / rw, (y1 - y0) / rh
    kw, kh = min(cw, rw), min(ch, rh)
    left, top = int(round((rw - kw) / 2.0)), int(round((rh - kh) / 2.0))
    kept = img.resize(
        (kw, kh), resample, box=(x0 + left * sx, y0 + top * sy, x0 + (left + kw) * sx, y0 + (top + kh) * sy)
    )
    return center_crop(kept, (cw, ch), fill)


def center_crop(img: Image.Image, size: tuple[int, int], fill: tuple[int, ...]) -> Image.Image:
    """torchvision's ``CenterCrop`` of ``size`` (width, height): offsets ``int(round((side - size) /
    2))``; where the image is smaller, it is first padded (with ``fill``) as torchvision pads it,
    ``(size - side) // 2`` before and the rest after."""
    (w, h), (cw, ch) = img.size, size
    if (w, h) == (cw, ch):
        return img
    pad, (left, top) = crop_offsets((w, h), size)
    if cw > w or ch > h:
        canvas = Image.new(img.mode, (max(cw, w), max(ch, h)), fill[0] if img.mode == "L" else rgb(fill))
        canvas.paste(img, pad)
        img = canvas
    return img.crop((left, top, left + cw, top + ch))


def crop_offsets(size: tuple[int, int], crop: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((pad left, pad top), (cut left, cut top))`` of ``center_crop``'s ``crop`` (width, height) of an
    image of ``size``: a side smaller than the crop is padded, ``(crop - side) // 2`` before; the crop
    is cut at ``int(round((padded side - crop) / 2))``. The pixels and the geometry both take these."""
    (w, h), (cw, ch) = size, crop
    pad = ((cw - w) // 2 if cw > w else 0, (ch - h) // 2 if ch > h else 0)
    pw, ph = max(cw, w), max(ch, h)
    return pad, (int(round((pw - cw) / 2.0)), int(round((ph - ch) / 2.0)))


def rgb(color: tuple[int, ...]) -> tuple[int, int, int]:
    """A ``--fill`` or ``--background`` colour as RGB: one value is gray."""
    return tuple(color) * 3 if len(color) == 1 else tuple(color[:3])  # type: ignore[return-value]
