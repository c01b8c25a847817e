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

Only the pixels the crop needs are decoded where the decoder allows it: a JPEG whose crop is
large next to the output size is decoded at libjpeg-turbo's reduced M/8 scale (``packer.jpeg``).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from packer import jpeg
from packer.source_codec import decode_stored

Size = Union[int, Sequence[int]]

ATTEMPTS = 10
"""Tries at a crop of the drawn area and aspect ratio before the centre-crop fallback (torchvision's)."""

RANDOMS = 4 * ATTEMPTS + 1
"""Uniform numbers drawn per sample: area, aspect ratio, top and left for each try, then the flip."""

_FLIP = 4 * ATTEMPTS

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 whose output bits each depend on every input bit."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniforms(seed: int, epoch: int, indices: Sequence[int] | np.ndarray, count: int = RANDOMS) -> np.ndarray:
    """``(len(indices), count)`` float64 numbers uniform in [0, 1), a function of ``(seed, epoch,
    index, column)`` alone: the same on every machine and in every process (numpy's uint64
    arithmetic wraps, as splitmix64 wants)."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) + _GOLDEN)
        key = _mix(key ^ np.uint64(epoch & 0xFFFFFFFFFFFFFFFF))
        index = np.asarray(indices, dtype=np.int64).astype(np.uint64).reshape(-1, 1)
        stream = _mix(key ^ _mix(index + _GOLDEN))
        column = np.arange(1, count + 1, dtype=np.uint64) * _GOLDEN
        bits = _mix(stream + column)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


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
    resizing the whole image and then cropping gives (``CenterCrop(resize=...)``). ``reduced``: a
    JPEG may be decoded at a reduced scale (see ``render``)."""

    box: tuple[float, float, float, float]
    size: tuple[int, int]
    flip: bool
    cut: bool
    reduced: bool = True


@dataclass(frozen=True)
class RandomResizedCrop:
    """A crop of random area (``scale``, a share of the image) and aspect ratio (``ratio``, width
    over height, drawn uniform in log space) resized to ``size``, as torchvision's
    ``RandomResizedCrop(size, scale, ratio)`` with bilinear antialiased resizing.

    JPEGs are decoded at the smallest M/8 scale that keeps the crop at least ``size`` (much less
    work for large images; on photographs the pixels differ from a full decode by a fraction of a
    level on average, see ``docs/READERS.md``); ``full_decode=True`` always decodes them in full."""

    size: Size
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    full_decode: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "RandomResizedCrop size"))
        lo, hi = (float(v) for v in self.scale)
        rlo, rhi = (float(v) for v in self.ratio)
        if not 0 < lo <= hi or not 0 < rlo <= rhi:
            raise ValueError(f"RandomResizedCrop needs 0 < scale[0] <= scale[1] and 0 < ratio[0] <= ratio[1], "
                             f"not scale={self.scale}, ratio={self.ratio}")
        object.__setattr__(self, "scale", (lo, hi))
        object.__setattr__(self, "ratio", (rlo, rhi))

    @property
    def random(self) -> bool:
        """True: the crop changes with the seed, the epoch and the sample."""
        return True

    def boxes(self, heights: np.ndarray, widths: np.ndarray, u: np.ndarray) -> np.ndarray:
        """``(n, 4)`` int64 boxes (top, left, height, width) for images of ``heights`` x ``widths``,
        from the uniform numbers ``u`` (one row per image, see ``uniforms``), as torchvision's
        ``get_params`` draws them."""
        h = np.asarray(heights, dtype=np.int64).reshape(-1, 1)
        w = np.asarray(widths, dtype=np.int64).reshape(-1, 1)
        n = ATTEMPTS
        area = (h * w).astype(np.float64)
        target = area * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, 0:n])
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = np.exp(lo + (hi - lo) * u[:, n:2 * n])
        cw = np.rint(np.sqrt(target * aspect)).astype(np.int64)  # rint: half to even, as Python's round
        ch = np.rint(np.sqrt(target / aspect)).astype(np.int64)
        fits = (cw > 0) & (cw <= w) & (ch > 0) & (ch <= h)
        first = np.argmax(fits, axis=1)
        rows = np.arange(len(first))
        ch, cw = ch[rows, first], cw[rows, first]
        top = np.floor(u[rows, 2 * n + first] * (h[:, 0] - ch + 1)).astype(np.int64)
        left = np.floor(u[rows, 3 * n + first] * (w[:, 0] - cw + 1)).astype(np.int64)
        out = np.stack([top, left, ch, cw], axis=1)
        for row in np.flatnonzero(~fits.any(axis=1)):  # torchvision's fallback: a centre crop
            out[row] = self._fallback(int(h[row, 0]), int(w[row, 0]))
        return out

    def _fallback(self, height: int, width: int) -> tuple[int, int, int, int]:
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            cw, ch = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            ch, cw = height, int(round(height * self.ratio[1]))
        else:
            cw, ch = width, height
        return (height - ch) // 2, (width - cw) // 2, ch, cw

    def placements(self, heights: np.ndarray, widths: np.ndarray, u: np.ndarray) -> list[Placement]:
        """Each image's Placement (without the flip, which ``Augment`` adds)."""
        return [Placement((float(x), float(y), float(x + cw), float(y + ch)), self.size, False, True,
                          not self.full_decode) for y, x, ch, cw in self.boxes(heights, widths, u).tolist()]


@dataclass(frozen=True)
class CenterCrop:
    """The centre ``size`` (height, width) of each image, as torchvision's ``CenterCrop`` (padded
    with zeros where the image is smaller); with ``resize=N`` the image's shorter side is first
    resized to N, as ``Resize(N)`` does: the evaluation recipe ``Resize(256)`` + ``CenterCrop(224)``
    is ``CenterCrop(224, resize=256)``. The same for every epoch and seed. JPEGs are decoded at a
    reduced scale where that still covers the crop, unless ``full_decode`` (as ``RandomResizedCrop``)."""

    size: Size
    resize: Optional[int] = None
    full_decode: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "CenterCrop size"))
        if self.resize is not None:
            if int(self.resize) != self.resize or self.resize < max(self.size):
                raise ValueError(f"CenterCrop(resize={self.resize!r}) must be an int at least the crop's size "
                                 f"{max(self.size)}: a smaller image would have to be padded")
            object.__setattr__(self, "resize", int(self.resize))

    @property
    def random(self) -> bool:
        """False: the same crop every epoch."""
        return False

    def placements(self, heights: np.ndarray, widths: np.ndarray, u: np.ndarray) -> list[Placement]:
        """Each image's Placement (``u`` is not used)."""
        return [self.placement(int(h), int(w)) for h, w in zip(np.asarray(heights).tolist(),
                                                               np.asarray(widths).tolist())]

    def placement(self, height: int, width: int) -> Placement:
        """The Placement of one image of ``height`` x ``width``."""
        ch, cw = self.size
        if self.resize is None:
            top, left = _centre(height, ch), _centre(width, cw)
            return Placement((float(left), float(top), float(left + cw), float(top + ch)), self.size, False, True,
                             not self.full_decode)
        if width <= height:  # torchvision's Resize(N): the shorter side to N, the longer truncated
            new_w, new_h = self.resize, int(self.resize * height / width)
        else:
            new_h, new_w = self.resize, int(self.resize * width / height)
        top, left = int(round((new_h - ch) / 2.0)), int(round((new_w - cw) / 2.0))
        sx, sy = width / new_w, height / new_h
        return Placement((left * sx, top * sy, (left + cw) * sx, (top + ch) * sy), self.size, False, False,
                         not self.full_decode)


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

    def placements(self, seed: int, epoch: int, indices: Sequence[int], heights: Sequence[int],
                   widths: Sequence[int]) -> list[Placement]:
        """The Placement of each sample ``indices[i]``, stored as ``heights[i]`` x ``widths[i]``."""
        u = uniforms(seed, epoch, indices) if self.random else np.zeros((len(indices), RANDOMS))
        h, w = np.asarray(heights, dtype=np.int64), np.asarray(widths, dtype=np.int64)
        if self.crop is None:
            out = [Placement((0.0, 0.0, float(x), float(y)), (y, x), False, True)
                   for y, x in zip(h.tolist(), w.tolist())]
        else:
            out = self.crop.placements(h, w, u)
        if self.flip:
            out = [p._replace(flip=bool(f < 0.5)) for p, f in zip(out, u[:, _FLIP].tolist())]
        return out


def upright_stored(stored, codec: str, mode: str) -> tuple:
    """``(stored, codec)`` to crop from: as given, except for ``--codec source`` images, which are JPEG
    or PNG by their bytes and may carry an EXIF orientation: a JPEG already upright stays bytes
    (``jpeg``, decoded at a reduced scale where that pays), any other is decoded upright (``raw``)."""
    if codec != "source":
        return stored, codec
    from packer.preprocess import _exif_orientation
    from packer.source_codec import decode_source

    data = bytes(stored)
    header = jpeg.plain_header(data)
    if header is not None and (header.exif is None or _exif_orientation(header.exif) == 1):
        return data, "jpeg"
    return decode_source(data, mode), "raw"


def stored_size(stored, codec: str) -> tuple[int, int]:
    """(height, width) of a stored image: an array's shape, or read from an encoded image's header."""
    if isinstance(stored, np.ndarray) and codec == "raw":
        return int(stored.shape[0]), int(stored.shape[1])
    data = bytes(stored)
    if codec == "jpeg":
        header = jpeg.plain_header(data)
        if header is not None:
            return header.height, header.width
    with Image.open(io.BytesIO(data)) as img:  # reads the header only
        return img.height, img.width


def render(stored, codec: str, mode: str, placement: Placement, flip_view: bool = False) -> np.ndarray:
    """The HxWxC uint8 image ``placement`` makes of one stored image: an HWC uint8 array (raw), or
    the bytes of a JPEG or PNG. ``flip_view``: a flipped image may be a view with negative strides,
    for a caller that reads it once (normalizing costs no more so; copying one does).

    A box cut out of the image (``cut``, inside it) is resized by torch's antialiased bilinear
    interpolation of uint8 images, the kernel torchvision's tensor transforms use (several times
    Pillow's speed, within a level of its pixels); a box resized where it lies, or one that pads,
    by Pillow. JPEGs are decoded at the smallest M/8 scale that still gives the box at least the
    output's size, the box then resized where it lies on the scaled pixels."""
    (oh, ow), (left, top, right, bottom) = placement.size, placement.box
    if codec == "jpeg":
        data = bytes(stored)
        header = jpeg.plain_header(data)
        if header is not None and placement.reduced and right > left and bottom > top:
            w, h = header.width, header.height
            need = (math.ceil(w * ow / (right - left)), math.ceil(h * oh / (bottom - top)))
            if jpeg.eighths_for((w, h), need) <= jpeg.MAX_EIGHTHS:
                scaled = jpeg.decode_scaled(data, (w, h), need, header.gray)
                if scaled is not None and scaled.eighths < 8:
                    f = scaled.eighths / 8
                    out = scaled.image.resize((ow, oh), Image.Resampling.BILINEAR,
                                              box=(left * f, top * f, right * f, bottom * f))
                    return _finish(out, placement.flip)
        stored = decode_stored(data, codec, mode)
    elif codec != "raw":
        stored = decode_stored(stored, codec, mode)
    array = np.asarray(stored)
    if placement.cut and _inside(placement.box, array.shape):
        x0, y0, x1, y1 = (int(v) for v in placement.box)
        out = torch.from_numpy(np.array(array[y0:y1, x0:x1], order="C"))  # a copy: the stored view is read-only
        if out.shape[:2] != (oh, ow):
            nchw = out.permute(2, 0, 1).unsqueeze(0)  # channels_last: the fast uint8 kernel
            out = F.interpolate(nchw, size=(oh, ow), mode="bilinear", antialias=True, align_corners=False)[0]
            out = out.permute(1, 2, 0)
        if placement.flip and flip_view:
            return out.numpy()[:, ::-1]
        return (torch.flip(out, dims=[1]) if placement.flip else out).numpy()
    image = Image.fromarray(np.ascontiguousarray(array[:, :, 0] if array.shape[2] == 1 else array))
    box = placement.box
    if placement.cut:
        image = image.crop(tuple(int(v) for v in box))  # pads with zeros where the box lies outside
        box = (0.0, 0.0, float(image.width), float(image.height))
    if image.size != (ow, oh) or box != (0.0, 0.0, float(ow), float(oh)):
        image = image.resize((ow, oh), Image.Resampling.BILINEAR, box=box)
    return _finish(image, placement.flip)


def _inside(box: tuple[float, float, float, float], shape: tuple[int, ...]) -> bool:
    left, top, right, bottom = box
    return left >= 0 and top >= 0 and right <= shape[1] and bottom <= shape[0]


def _finish(image: Image.Image, flip: bool) -> np.ndarray:
    """An HxWxC uint8 array of a Pillow image, mirrored left to right when ``flip``."""
    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pixels = np.asarray(image)
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


__all__ = ["RandomResizedCrop", "CenterCrop", "Augment", "Placement", "uniforms", "render", "stored_size"]
