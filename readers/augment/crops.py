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

JPEGs decode in full (torchvision's pixels); with ``reduced_decode=True`` a JPEG whose crop is large
next to the output size is decoded at libjpeg-turbo's reduced M/8 scale (``packer.pixels.jpeg``), less
work for pixels further from a full decode. Detection targets, masks and an image's geometry are
moved with the pixels (``place_target``, ``place_mask``, ``place_geometry``).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from packer.pixels import jpeg
from packer.pixels.source_codec import decode_stored

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
        return out._replace(flip=u(_FLIP) < 0.5) if self.flip else out


def upright_stored(stored, codec: str, mode: str) -> tuple:
    """``(stored, codec)`` to crop from: as given, except for ``--codec source`` images, which are JPEG
    or PNG by their bytes and may carry an EXIF orientation: a JPEG already upright stays bytes
    (``jpeg``, which ``reduced_decode`` may decode at a reduced scale), any other is decoded upright
    (``raw``)."""
    if codec != "source":
        return stored, codec
    from packer.pixels.decoding import _exif_orientation
    from packer.pixels.source_codec import decode_source

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


def render(stored, codec: str, mode: str, placement: Placement) -> np.ndarray:
    """The HxWxC uint8 image ``placement`` makes of one stored image: an HWC uint8 array (raw), or
    the bytes of a JPEG or PNG, in ``mode`` (RGB or L). A resized box comes back as an HWC view of
    channel-planar (CHW) memory, flipped or not, as torch's kernel writes it: normalizing it into a
    CHW batch then reads memory in order (a flipped view with negative strides read at half speed).

    Resizing is antialiased bilinear interpolation of uint8 images (``_resized``: torch's kernel, the
    one torchvision's tensor transforms use, or OpenCV's for enlarging; within a level of Pillow's
    pixels, and faster): of the box
    cut out (``cut``), or of the whole image before the box is cut (``whole``). A box that pads is
    cut by Pillow. With ``reduced``, a JPEG is decoded at the smallest M/8 scale that still gives the
    box at least the output's size, the box then resized where it lies on the scaled pixels."""
    (oh, ow), channels = placement.size, 1 if mode == "L" else 3
    if codec == "jpeg":
        data = bytes(stored)
        scaled = _reduced(data, mode, placement) if placement.reduced else None
        if scaled is not None:
            return scaled
        stored = decode_stored(data, codec, mode)
    elif codec != "raw":
        stored = decode_stored(stored, codec, mode)
    array = np.asarray(stored)
    if array.ndim != 3 or array.shape[2] != channels:
        raise ValueError(f"a stored image of shape {array.shape} in an output of {mode} images")
    if placement.whole is not None:
        array = _resized(array, placement.whole)
        (top, left), (ch, cw) = placement.offset, placement.size
        placement = placement._replace(box=(float(left), float(top), float(left + cw), float(top + ch)), whole=None)
    if placement.cut and _inside(placement.box, array.shape):
        x0, y0, x1, y1 = (int(v) for v in placement.box)
        out = _resized(array[y0:y1, x0:x1], (oh, ow))
        if not placement.flip:
            return out
        if out.strides[1] == out.shape[2]:  # pixels side by side (OpenCV's, or the stored image's own)
            return _opencv().flip(out, 1).reshape(out.shape)
        return torch.flip(torch.from_numpy(out), dims=[1]).numpy()  # torch's HWC view of planar memory
    image = Image.fromarray(np.ascontiguousarray(array[:, :, 0] if channels == 1 else array))
    image = image.crop(tuple(int(v) for v in placement.box))  # pads with zeros where the box lies outside
    if image.size != (ow, oh):
        image = image.resize((ow, oh), Image.Resampling.BILINEAR)
    return _finish(image, placement.flip)


def _resized(hwc: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An HxWxC uint8 image (any strides, read-only too) resized to ``size`` (height, width),
    antialiased bilinear, as HWC: the image itself when it has that size already.

    Enlarged (or kept) on both sides, there is no filter to widen and antialiased bilinear is plain
    bilinear with half-pixel centres: OpenCV's kernel, the same weights in 11-bit fixed point, within
    a level of torch's and faster (docs/BENCHMARKS.md; a C-contiguous HWC array), for outputs up to
    ``OPENCV_MAX_PIXELS``. Larger outputs, or shrunk on either side:
    torch's antialiased kernel, the one torchvision's tensor transforms use (an HWC view of planar
    memory, which a CHW batch then reads in order)."""
    h, w = size
    if hwc.shape[0] == h and hwc.shape[1] == w:
        return hwc
    if hwc.shape[0] <= h and hwc.shape[1] <= w and h * w <= OPENCV_MAX_PIXELS:
        cv2 = _opencv()
        return cv2.resize(hwc, (w, h), interpolation=cv2.INTER_LINEAR).reshape(h, w, hwc.shape[2])
    nchw = torch.from_numpy(np.array(hwc, order="C")).permute(2, 0, 1).unsqueeze(0)  # channels_last: fast uint8
    out = F.interpolate(nchw, size=size, mode="bilinear", antialias=True, align_corners=False)
    return out[0].permute(1, 2, 0).numpy()


OPENCV_MAX_PIXELS = 1 << 16
"""The largest output OpenCV resizes here: up to this many pixels its ``resize`` runs on the calling
thread (one stripe of its ``parallel_for_``), so DataLoader workers, which keep every core busy
already, never start its thread pool. Its ``setNumThreads`` is no way to ask for one thread: in a
worker forked after the parent used that pool, the call hangs."""


def _opencv():
    """OpenCV, imported when first needed (a reader that never enlarges a crop never loads it)."""
    import cv2

    return cv2


def _reduced(data: bytes, mode: str, placement: Placement) -> Optional[np.ndarray]:
    """``render`` of a JPEG decoded at a reduced scale, or None where it would not be smaller, the
    file is not one libjpeg-turbo decodes in ``mode``, or it has more pixels than Pillow's
    decompression-bomb limit (the full decode then refuses it)."""
    header = jpeg.plain_header(data)
    (oh, ow), (left, top, right, bottom) = placement.size, placement.box
    if header is None or header.gray != (mode == "L") or right <= left or bottom <= top:
        return None
    w, h = header.width, header.height
    if Image.MAX_IMAGE_PIXELS and w * h > Image.MAX_IMAGE_PIXELS:
        return None
    if placement.whole is not None:  # the box of the resized image, at the stored image's scale
        (nh, nw), (y0, x0) = placement.whole, placement.offset
        left, top, right, bottom = x0 * w / nw, y0 * h / nh, (x0 + ow) * w / nw, (y0 + oh) * h / nh
    need = (math.ceil(w * ow / (right - left)), math.ceil(h * oh / (bottom - top)))
    if jpeg.eighths_for((w, h), need) > jpeg.MAX_EIGHTHS:
        return None
    scaled = jpeg.decode_scaled(data, (w, h), need, header.gray)
    if scaled is None or scaled.eighths == 8:
        return None
    f = scaled.eighths / 8
    out = scaled.image.resize((ow, oh), Image.Resampling.BILINEAR, box=(left * f, top * f, right * f, bottom * f))
    return _finish(out, placement.flip)


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


def _inside(box: tuple[float, float, float, float], shape: tuple[int, ...]) -> bool:
    left, top, right, bottom = box
    return left >= 0 and top >= 0 and right <= shape[1] and bottom <= shape[0]


def _finish(image: Image.Image, flip: bool) -> np.ndarray:
    """An HxWxC uint8 array of a Pillow image, mirrored left to right when ``flip``."""
    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pixels = np.asarray(image)
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


__all__ = [
    "RandomResizedCrop",
    "CenterCrop",
    "Augment",
    "Placement",
    "Draws",
    "uniforms",
    "render",
    "stored_size",
    "upright_stored",
    "place_target",
    "place_mask",
    "place_geometry",
]
