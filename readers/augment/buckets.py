"""Aspect-ratio buckets: images kept near their own aspect ratio, in batches of one shape.

Detection and generative models train on images that keep (about) their aspect ratio; a batch must
still be one tensor. ``AspectBuckets`` holds a set of resolutions (height, width); each image goes
to the bucket whose aspect ratio is nearest its own (compared in log space: 2:1 is as far from 1:1
as 1:2), and is resized to cover that resolution and cropped to it: the crop keeps the whole of the
image's shorter extent for the bucket's ratio, its position along the other side drawn per
``(seed, epoch, index)`` (or centred). It is a crop like ``RandomResizedCrop``: boxes, masks and
geometry follow it, and the flip applies on top. With ``fit="pad"`` nothing is cut: the whole image
is resized to fit inside the bucket's resolution and the rest is padded with zeros (a segmentation
mask with its ignore index), the image at the top-left corner as torchvision's detection models
and mmdetection pad their batches (or at a position drawn per sample, ``random_position=True``);
the flip mirrors the image, which stays where its position says. ``make_loader(ds, n,
buckets=...)`` batches each bucket's images together (``readers.loading.bucket_sampler``); the
bucket of every image is known from the output's index of sizes, without reading an image.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from readers.augment.crops import Placement, mirrored

_TOP, _LEFT = 0, 1
"""The sample's uniform numbers (``Draws``) that place the crop: distinct from the flip's."""

FITS = ("crop", "pad")
"""How an image is made the shape of its bucket: its bucket's ratio cut out, or the whole image padded."""


def budget_resolutions(
    pixels: int | tuple[int, int] = (1024, 1024), step: int = 64, max_ratio: float = 4.0
) -> tuple[tuple[int, int], ...]:
    """Resolutions (height, width), each side a multiple of ``step``, of at most ``pixels`` pixels
    (an area, or a (height, width) whose area it is) and as close to it as the step allows, with
    aspect ratios from 1 : ``max_ratio`` to ``max_ratio`` : 1, sorted by aspect ratio (width over
    height): the buckets diffusion trainers use (1024 x 1024 with a step of 64 gives 832 x 1216, ...)."""
    area = int(pixels[0]) * int(pixels[1]) if isinstance(pixels, tuple) else int(pixels)
    if step < 1 or area < step * step or max_ratio < 1:
        raise ValueError(
            f"buckets need step >= 1, a pixel budget of at least step x step and max_ratio >= 1, "
            f"not pixels={pixels!r}, step={step!r}, max_ratio={max_ratio!r}"
        )
    found: set[tuple[int, int]] = set()
    width = step
    while width * step <= area:
        height = area // width // step * step
        if height >= step and 1 / max_ratio <= width / height <= max_ratio:
            found.add((height, width))
        width += step
    return tuple(sorted(found, key=lambda hw: (hw[1] / hw[0], hw[0])))


@dataclass(frozen=True)
class AspectBuckets:
    """Resolutions ``(height, width)`` to batch images by (see the module docstring): given, as torch
    sizes are, or made from a pixel budget (``AspectBuckets.budget(1024, step=64)``).
    ``fit``: ``"crop"`` cuts the bucket's aspect ratio out of each image, ``"pad"`` resizes the whole
    image into the bucket and pads the rest. ``random_position``: the crop's position along the
    side it cuts (or the padded image's within its bucket) is drawn per sample and epoch; default
    True for crops (False: centred, the same every epoch), False for padding (the image at the
    top-left corner). ``reduced_decode`` as ``RandomResizedCrop``'s."""

    resolutions: tuple[tuple[int, int], ...]
    random_position: Optional[bool] = None
    reduced_decode: bool = False
    fit: str = "crop"

    def __post_init__(self) -> None:
        pairs = tuple((int(h), int(w)) for h, w in self.resolutions)
        if not pairs or any(h < 1 or w < 1 for h, w in pairs) or len(set(pairs)) != len(pairs):
            raise ValueError(
                f"AspectBuckets needs distinct (height, width) pairs of positive sizes, got {self.resolutions!r}"
            )
        if self.fit not in FITS:
            raise ValueError(f"AspectBuckets fit takes one of {', '.join(FITS)}, not {self.fit!r}")
        object.__setattr__(self, "resolutions", pairs)
        if self.random_position is None:
            object.__setattr__(self, "random_position", self.fit == "crop")
        # Each bucket's log aspect ratio, once: every sample's placement compares its own with them.
        object.__setattr__(self, "_logs", np.log(np.array([w / h for h, w in pairs])))

    @classmethod
    def budget(
        cls, pixels: int | tuple[int, int] = (1024, 1024), step: int = 64, max_ratio: float = 4.0, **options
    ) -> AspectBuckets:
        """Buckets of about ``pixels`` pixels each (``budget_resolutions``)."""
        return cls(budget_resolutions(pixels, step, max_ratio), **options)

    @property
    def size(self) -> Optional[tuple[int, int]]:
        """None: the size out is the image's bucket's."""
        return None

    @property
    def random(self) -> bool:
        """True when the crop's position changes with the seed and epoch."""
        return bool(self.random_position)

    def bucket_ids(self, sizes: np.ndarray | Sequence[Sequence[int]]) -> np.ndarray:
        """The bucket of each image of ``sizes`` (rows of height, width): the index of the resolution
        whose aspect ratio is nearest (in log space; the first of equals)."""
        sizes = np.asarray(sizes, dtype=np.float64).reshape(-1, 2)
        ratios = np.log(sizes[:, 1] / sizes[:, 0])
        return np.abs(ratios[:, None] - self._logs[None, :]).argmin(axis=1).astype(np.int64)

    def bucket_of(self, height: int, width: int) -> int:
        """The bucket of one image of ``height`` x ``width``."""
        return int(np.abs(math.log(width / height) - self._logs).argmin())

    def cut(self, height: int, width: int, bucket: int) -> tuple[int, int]:
        """(height, width) of the part of an image of ``height`` x ``width`` that ``bucket`` keeps:
        its whole extent along one side, the bucket's aspect ratio along the other."""
        bh, bw = self.resolutions[bucket]
        if width * bh > height * bw:  # wider than the bucket: cut its width
            return height, max(1, min(width, round(height * bw / bh)))
        return max(1, min(height, round(width * bh / bw))), width

    def fitted(self, height: int, width: int, bucket: int) -> tuple[int, int]:
        """(height, width) an image of ``height`` x ``width`` is resized to when padded into
        ``bucket``: its own aspect ratio, as large as fits the bucket's resolution."""
        bh, bw = self.resolutions[bucket]
        if width * bh > height * bw:  # wider than the bucket: its width fills the bucket's
            return max(1, min(bh, round(height * bw / width))), bw
        return bh, max(1, min(bw, round(width * bh / height)))

    def placement(self, height: int, width: int, u: Callable[[int], float]) -> Placement:
        """The Placement of one image (without the flip, which ``Augment`` adds): the bucket's ratio
        cut from it and resized to the bucket's resolution, or (``fit="pad"``) the whole image
        resized to fit it and padded."""
        bucket = self.bucket_of(height, width)
        if self.fit == "pad":
            return self._padded(height, width, bucket, u)
        ch, cw = self.cut(height, width, bucket)
        if self.random_position:
            top, left = int(u(_TOP) * (height - ch + 1)), int(u(_LEFT) * (width - cw + 1))
        else:
            top, left = (height - ch) // 2, (width - cw) // 2
        return Placement(
            (float(left), float(top), float(left + cw), float(top + ch)),
            self.resolutions[bucket],
            False,
            True,
            self.reduced_decode,
        )

    def _padded(self, height: int, width: int, bucket: int, u: Callable[[int], float]) -> Placement:
        """The Placement of an image padded into ``bucket``: resized whole (``Placement.whole``) to
        ``fitted``, then the bucket's resolution cut from it at a negative offset (the padding)."""
        bh, bw = self.resolutions[bucket]
        fh, fw = self.fitted(height, width, bucket)
        top = int(u(_TOP) * (bh - fh + 1)) if self.random_position else 0
        left = int(u(_LEFT) * (bw - fw + 1)) if self.random_position else 0
        sy, sx = height / fh, width / fw  # the resized image's pixels, in the stored image's
        return Placement(
            (-left * sx, -top * sy, (bw - left) * sx, (bh - top) * sy),
            (bh, bw),
            False,
            False,
            self.reduced_decode,
            (fh, fw),
            (-top, -left),
        )

    def flipped(self, placement: Placement) -> Placement:
        """``placement`` mirrored left to right (``Augment`` asks when a sample's flip is drawn). A
        padded image is first placed at the mirrored position, so that after the whole picture is
        mirrored it sits where its position says (the top-left corner by default): the flip mirrors
        the image, not where the padding goes."""
        if self.fit != "pad" or placement.whole is None:
            return mirrored(placement)
        bw, fw, (top, left) = placement.size[1], placement.whole[1], placement.offset
        x0, y0, x1, y1 = placement.box
        sx = (x1 - x0) / bw  # stored pixels per output pixel
        left = -(bw - fw + left)  # offsets are negative where the picture is padded
        return placement._replace(box=(left * sx, y0, (bw + left) * sx, y1), offset=(top, left), flip=True)

    def describe(self, sizes: np.ndarray) -> dict:
        """What bucketing does to images of ``sizes`` (rows of height, width): each bucket's
        resolution and image count, the share of the images' pixels the crops cut away
        (``cropped_share``, next to a centred square crop's, what a fixed square crop keeps at best)
        and the share of the batches' pixels that is padding (``padded_share``, next to what padding
        each image into a square of its longer side would add)."""
        sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
        ids = self.bucket_ids(sizes)
        counts = np.bincount(ids, minlength=len(self.resolutions))
        h, w = sizes[:, 0], sizes[:, 1]
        bh, bw = (np.array(self.resolutions, dtype=np.int64)[ids, k] for k in (0, 1))
        wider = w * bh > h * bw  # as cut() and fitted(), for every image at once
        total = int(sizes.prod(axis=1).sum())
        longer = sizes.max(axis=1).astype(np.float64)
        about: dict = {
            "fit": self.fit,
            "buckets": [
                {"resolution": list(r), "images": int(c)} for r, c in zip(self.resolutions, counts.tolist()) if c
            ],
            "square_crop_share": 1 - int((sizes.min(axis=1) ** 2).sum()) / total if total else 0.0,
            "square_pad_share": 1 - float((h * w / longer**2).sum()) / len(sizes) if len(sizes) else 0.0,
        }
        if self.fit == "pad":
            fh = np.where(wider, np.clip(np.round(h * bw / w), 1, bh), bh)
            fw = np.where(wider, bw, np.clip(np.round(w * bh / h), 1, bw))
            canvas = int((bh * bw).sum())
            about.update(cropped_share=0.0, padded_share=1 - int((fh * fw).sum()) / canvas if canvas else 0.0)
        else:
            cw = np.where(wider, np.clip(np.round(h * bw / bh), 1, w), w)
            ch = np.where(wider, h, np.clip(np.round(w * bh / bw), 1, h))
            about.update(cropped_share=1 - int((ch * cw).sum()) / total if total else 0.0, padded_share=0.0)
        return about


__all__ = ["AspectBuckets", "budget_resolutions"]
