"""Random and centre crops and horizontal flips, drawn per sample and applied as a reader decodes.

``open_dataset(root, crop=RandomResizedCrop(224), flip=True)`` gives images of one size from an
output stored in any size (``--resize max``, ``shorter``, ``none``), so batches are one tensor
again, with a new crop and flip of every image every epoch.

The parameters of a sample come from a counter-based generator keyed by ``(seed, epoch, index)``
(``index``: the sample's position in the output): the same crops for the same seed and epoch
whatever the number of DataLoader workers or ranks and whatever order the samples are read in, new
crops every epoch, and a resumed epoch draws what the uninterrupted one drew. They are drawn as
torchvision's ``RandomResizedCrop.get_params`` draws them (area and log aspect ratio uniform, ten
tries, then the centre-crop fallback); the crop is cut out and resized with antialiased bilinear
interpolation, as torchvision's ``resized_crop`` does (torch's uint8 kernel, which its tensor
transforms use; within a level of Pillow's, which it uses on PIL images).

This module draws the crops; ``readers.augment.render`` makes the pixels (JPEGs decode in full,
torchvision's pixels; with ``reduced_decode=True`` a JPEG whose crop is large next to the output size
is decoded at libjpeg-turbo's reduced M/8 scale, ``packer.pixels.jpeg``, less work for pixels further
from a full decode), ``readers.augment.placing`` moves detection targets, masks and an image's
geometry with them, and ``readers.augment.image_crops.ImageCrops`` is what a reader holds of it all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Sequence, Union

import numpy as np

Size = Union[int, Sequence[int]]

ATTEMPTS = 10
"""Tries at a crop of the drawn area and aspect ratio before the centre-crop fallback (torchvision's)."""

RANDOMS = 4 * ATTEMPTS + 1
"""Uniform numbers drawn per sample: area, aspect ratio, top and left for each try, then the flip."""

_FLIP = 4 * ATTEMPTS

_GOLDEN = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finalizer: a bijection of 64-bit integers whose output bits each depend on every input bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class Draws:
    """The uniform numbers in [0, 1) of one sample: ``draws(k)`` is a function of ``(seed, epoch,
    index, k)`` alone, the same on every machine and in every process, computed when asked for (a
    crop usually needs 4 of them, not all ``RANDOMS``)."""

    __slots__ = ("stream",)

    def __init__(self, seed: int, epoch: int, index: int) -> None:
        key = _mix(_mix((seed + _GOLDEN) & _M64) ^ (epoch & _M64))
        self.stream = _mix(key ^ _mix((index + _GOLDEN) & _M64))

    def __call__(self, k: int) -> float:
        return (_mix((self.stream + (k + 1) * _GOLDEN) & _M64) >> 11) * (1.0 / (1 << 53))


def uniforms(seed: int, epoch: int, indices: Sequence[int] | np.ndarray, count: int = RANDOMS) -> np.ndarray:
    """``(len(indices), count)`` float64: the first ``count`` numbers of each sample's ``Draws``."""
    rows = [Draws(seed, epoch, int(i)) for i in np.asarray(indices).reshape(-1).tolist()]
    return np.array([[d(k) for k in range(count)] for d in rows], dtype=np.float64).reshape(len(rows), count)


def _pair(size: Size, name: str) -> tuple[int, int]:
    """``(height, width)`` of a torchvision-style size: one int for a square, or (h, w)."""
    values = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
    if len(values) == 1:
        values = (values[0], values[0])
    if len(values) != 2 or any(int(v) != v or int(v) < 1 for v in values):
        raise ValueError(f"{name} takes a positive int or a (height, width) pair, not {size!r}")
    return int(values[0]), int(values[1])


class Placement(NamedTuple):
    """Where one output image comes from: ``box`` (left, top, right, bottom) in the stored image's
    pixels, resized to ``size`` (height, width), then mirrored left to right when ``flip``. With
    ``cut`` the box (whole pixels) is cut out before the resize, as torchvision's ``resized_crop``
    does, so the filter never reaches past it; otherwise it is resized where it lies, which is what
    resizing the whole image and then cropping gives. ``whole``: (height, width) the whole image is
    resized to first, the box then cut from that resized image at ``offset`` (top, left) (torchvision's
    ``Resize`` then ``CenterCrop``; ``box`` still says where it lies in the stored image). ``reduced``:
    a JPEG may be decoded at a reduced scale (see ``render``)."""

    box: tuple[float, float, float, float]
    size: tuple[int, int]
    flip: bool
    cut: bool
    reduced: bool = False
    whole: Optional[tuple[int, int]] = None
    offset: tuple[int, int] = (0, 0)


def mirrored(placement: Placement) -> Placement:
    """``placement`` mirrored left to right: the whole picture it makes is flipped."""
    return placement._replace(flip=True)


@dataclass(frozen=True)
class RandomResizedCrop:
    """A crop of random area (``scale``, a share of the image) and aspect ratio (``ratio``, width
    over height, drawn uniform in log space) resized to ``size``, as torchvision's
    ``RandomResizedCrop(size, scale, ratio)`` with bilinear antialiased resizing.

    ``reduced_decode=True`` decodes a JPEG at the smallest M/8 scale that keeps the crop at least
    ``size`` (much less work when the stored images are large next to the crop), at the cost of
    pixels further from a full decode than torchvision's tolerance (see ``docs/READERS.md``); off
    by default."""

    size: Size
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    reduced_decode: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "RandomResizedCrop size"))
        lo, hi = (float(v) for v in self.scale)
        rlo, rhi = (float(v) for v in self.ratio)
        if not 0 < lo <= hi or not 0 < rlo <= rhi:
            raise ValueError(
                f"RandomResizedCrop needs 0 < scale[0] <= scale[1] and 0 < ratio[0] <= ratio[1], "
                f"not scale={self.scale}, ratio={self.ratio}"
            )
        object.__setattr__(self, "scale", (lo, hi))
        object.__setattr__(self, "ratio", (rlo, rhi))

    @property
    def random(self) -> bool:
        """True: the crop changes with the seed, the epoch and the sample."""
        return True

    def box(self, height: int, width: int, u: Callable[[int], float]) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the crop of an image of ``height`` x ``width``, drawn from the
        sample's numbers ``u`` (``Draws``) as torchvision's ``get_params`` draws them: try ``k`` takes
        numbers ``k`` (area), ``ATTEMPTS + k`` (log aspect ratio), ``2 * ATTEMPTS + k`` (top) and
        ``3 * ATTEMPTS + k`` (left)."""
        area, (s0, s1) = height * width, self.scale
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for k in range(ATTEMPTS):
            target = area * (s0 + (s1 - s0) * u(k))
            aspect = math.exp(lo + (hi - lo) * u(ATTEMPTS + k))
            cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < cw <= width and 0 < ch <= height:
                top = int(u(2 * ATTEMPTS + k) * (height - ch + 1))
                left = int(u(3 * ATTEMPTS + k) * (width - cw + 1))
                return top, left, ch, cw
        return self._fallback(height, width)

    def boxes(self, heights: np.ndarray, widths: np.ndarray, u: np.ndarray) -> np.ndarray:
        """``(n, 4)`` int64 boxes (top, left, height, width), one per image, from rows of ``uniforms``."""
        out = [
            self.box(int(h), int(w), row.__getitem__)
            for h, w, row in zip(np.asarray(heights).reshape(-1), np.asarray(widths).reshape(-1), np.asarray(u))
        ]
        return np.array(out, dtype=np.int64).reshape(-1, 4)

    flipped = staticmethod(mirrored)
    """The Placement of a flipped sample (``Augment`` asks when a sample's flip is drawn)."""

    def _fallback(self, height: int, width: int) -> tuple[int, int, int, int]:
        """torchvision's centre crop of the nearest allowed ratio, at least a pixel on each side (its
        own can be 0 pixels high for a strip of extreme ratio, which would give a black image)."""
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            cw, ch = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            ch, cw = height, int(round(height * self.ratio[1]))
        else:
            cw, ch = width, height
        ch, cw = min(max(ch, 1), height), min(max(cw, 1), width)
        return (height - ch) // 2, (width - cw) // 2, ch, cw

    def placement(self, height: int, width: int, u: Callable[[int], float]) -> Placement:
        """The Placement of one image (without the flip, which ``Augment`` adds)."""
        y, x, ch, cw = self.box(height, width, u)
        return Placement(
            (float(x), float(y), float(x + cw), float(y + ch)), self.size, False, True, self.reduced_decode
        )


@dataclass(frozen=True)
class CenterCrop:
    """The centre ``size`` (height, width) of each image, as torchvision's ``CenterCrop`` (padded
    with zeros where the image is smaller); with ``resize=N`` the image's shorter side is first
    resized to N, as ``Resize(N)`` does: the evaluation recipe ``Resize(256)`` + ``CenterCrop(224)``
    is ``CenterCrop(224, resize=256)``. The same for every epoch and seed. ``reduced_decode`` as
    ``RandomResizedCrop``'s."""

    size: Size
    resize: Optional[int] = None
    reduced_decode: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "CenterCrop size"))
        if self.resize is not None:
            if int(self.resize) != self.resize or self.resize < max(self.size):
                raise ValueError(
                    f"CenterCrop(resize={self.resize!r}) must be an int at least the crop's size "
                    f"{max(self.size)}: a smaller image would have to be padded"
                )
            object.__setattr__(self, "resize", int(self.resize))

    @property
    def random(self) -> bool:
        """False: the same crop every epoch."""
        return False

    flipped = staticmethod(mirrored)
    """The Placement of a flipped sample (``Augment`` asks when a sample's flip is drawn)."""

    def placement(self, height: int, width: int, u: Optional[Callable[[int], float]] = None) -> Placement:
        """The Placement of one image of ``height`` x ``width`` (``u`` is not used)."""
        ch, cw = self.size
        if self.resize is None:
            top, left = _centre(height, ch), _centre(width, cw)
            return Placement(
                (float(left), float(top), float(left + cw), float(top + ch)),
                self.size,
                False,
                True,
                self.reduced_decode,
            )
        if width <= height:  # torchvision's Resize(N): the shorter side to N, the longer truncated
            new_w, new_h = self.resize, int(self.resize * height / width)
        else:
            new_h, new_w = self.resize, int(self.resize * width / height)
        top, left = int(round((new_h - ch) / 2.0)), int(round((new_w - cw) / 2.0))
        sx, sy = width / new_w, height / new_h
        return Placement(
            (left * sx, top * sy, (left + cw) * sx, (top + ch) * sy),
            self.size,
            False,
            False,
            self.reduced_decode,
            (new_h, new_w),
            (top, left),
        )


def _centre(length: int, crop: int) -> int:
    """torchvision's centre-crop offset along one side, padding included (negative where it pads)."""
    if crop <= length:
        return int(round((length - crop) / 2.0))
    before, after = (crop - length) // 2, (crop - length + 1) // 2
    return int(round((length + before + after - crop) / 2.0)) - before


Crop = Union[RandomResizedCrop, CenterCrop]


@dataclass(frozen=True)
class Augment:
    """What a reader does to each image: an optional ``crop`` and a random horizontal ``flip``
    (probability 1/2), drawn from ``seed`` for each (epoch, index)."""

    crop: Optional[Crop] = None
    flip: bool = False

    @property
    def random(self) -> bool:
        """True when the result depends on the epoch (a random crop, or the flip)."""
        return self.flip or (self.crop is not None and self.crop.random)

    @property
    def size(self) -> Optional[tuple[int, int]]:
        """(height, width) of every image out, or None without a crop (images keep their sizes)."""
        return self.crop.size if self.crop is not None else None

    def placements(
        self, seed: int, epoch: int, indices: Sequence[int], heights: Sequence[int], widths: Sequence[int]
    ) -> list[Placement]:
        """The Placement of each sample ``indices[i]``, stored as ``heights[i]`` x ``widths[i]``."""
        return [self.placement(seed, epoch, int(i), int(h), int(w)) for i, h, w in zip(indices, heights, widths)]

    def placement(self, seed: int, epoch: int, index: int, height: int, width: int) -> Placement:
        """The Placement of sample ``index``, stored as ``height`` x ``width``, in ``epoch``."""
        u = Draws(seed, epoch, index)
        if self.crop is None:
            out = Placement((0.0, 0.0, float(width), float(height)), (height, width), False, True)
        else:
            out = self.crop.placement(height, width, u)
        if not self.flip or u(_FLIP) >= 0.5:
            return out
        return mirrored(out) if self.crop is None else self.crop.flipped(out)


__all__ = ["RandomResizedCrop", "CenterCrop", "Augment", "Placement", "Draws", "uniforms", "RANDOMS"]
