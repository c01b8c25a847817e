"""Making the pixels of one stored image as a ``Placement`` says: a ``--codec source`` image turned
upright (``upright_stored``), its size read from its header (``stored_size``), then cut, resized and
flipped (``render``); JPEGs optionally decoded at libjpeg-turbo's reduced M/8 scale."""

from __future__ import annotations

import io
import math
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from packer.pixels import jpeg
from packer.pixels.source_codec import decode_stored
from readers.augment.crops import Placement


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
    pixels, and faster): of the box cut out (``cut``), or of the whole image before the box is cut
    (``whole``). A box of the output's size is cut out as it is, zeros where it reaches past the
    image (``window``: a padded centre crop, an image padded into its bucket); any other box that
    pads is cut by Pillow. A box within a JPEG written with restart markers is decoded alone
    (``jpeg_region``: the same pixels, only the MCUs under the box decoded). With ``reduced``, a
    JPEG is decoded at the smallest M/8 scale that still gives the box at least the output's size,
    the box then resized where it lies on the scaled pixels (or the whole image resized and padded)."""
    (oh, ow), channels = placement.size, 1 if mode == "L" else 3
    if codec == "jpeg":
        data = bytes(stored)
        scaled = _reduced(data, mode, placement) if placement.reduced else None
        if scaled is not None:
            return scaled
        region = _region(data, mode, placement)
        if region is not None:
            stored, placement = region
        else:
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
    if placement.cut and box_inside(placement.box, array.shape):
        x0, y0, x1, y1 = (int(v) for v in placement.box)
        return _mirrored(_resized(array[y0:y1, x0:x1], (oh, ow)), placement.flip)
    x0, y0, x1, y1 = placement.box
    if (x1 - x0, y1 - y0) == (ow, oh) and float(x0).is_integer() and float(y0).is_integer():
        return _mirrored(window(array, int(y0), int(x0), (oh, ow)), placement.flip)  # no resize: cut or pad
    image = Image.fromarray(np.ascontiguousarray(array[:, :, 0] if channels == 1 else array))
    image = image.crop(tuple(int(v) for v in placement.box))  # pads with zeros where the box lies outside
    if image.size != (ow, oh):
        image = image.resize((ow, oh), Image.Resampling.BILINEAR)
    return _finish(image, placement.flip)


def window(hwc: np.ndarray, top: int, left: int, size: tuple[int, int]) -> np.ndarray:
    """The ``size`` (height, width) part of an HxWxC image whose corner lies at (``top``, ``left``),
    zeros where it reaches past the image (a negative corner pads before it, as Pillow's ``crop``):
    a view when it lies within the image, else a copy in the image's memory layout (HWC, or an HWC
    view of planar memory), so that normalizing it reads memory in order."""
    (oh, ow), (h, w), c = size, hwc.shape[:2], hwc.shape[2]
    if top >= 0 and left >= 0 and top + oh <= h and left + ow <= w:
        return hwc[top : top + oh, left : left + ow]
    if c > 1 and hwc.strides[2] != 1:  # an HWC view of planar memory (torch's resize): stay planar
        out = np.zeros((c, oh, ow), np.uint8).transpose(1, 2, 0)
    else:
        out = np.zeros((oh, ow, c), np.uint8)
    y0, x0, y1, x1 = max(top, 0), max(left, 0), min(top + oh, h), min(left + ow, w)
    if y1 > y0 and x1 > x0:
        out[y0 - top : y1 - top, x0 - left : x1 - left] = hwc[y0:y1, x0:x1]
    return out


def _mirrored(hwc: np.ndarray, flip: bool) -> np.ndarray:
    """An HxWxC uint8 image mirrored left to right when ``flip``, copied in the layout it has."""
    if not flip:
        return hwc
    if hwc.strides[1] == hwc.shape[2]:  # pixels side by side (OpenCV's, or the stored image's own)
        return _opencv().flip(hwc, 1).reshape(hwc.shape)
    return torch.flip(torch.from_numpy(hwc), dims=[1]).numpy()  # torch's HWC view of planar memory


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
    pads = False
    if placement.whole is not None:  # the box of the resized image, at the stored image's scale
        (nh, nw), (y0, x0) = placement.whole, placement.offset
        pads = y0 < 0 or x0 < 0 or y0 + oh > nh or x0 + ow > nw
        left, top, right, bottom = x0 * w / nw, y0 * h / nh, (x0 + ow) * w / nw, (y0 + oh) * h / nh
    need = (math.ceil(w * ow / (right - left)), math.ceil(h * oh / (bottom - top)))
    if jpeg.eighths_for((w, h), need) > jpeg.MAX_EIGHTHS:
        return None
    scaled = jpeg.decode_scaled(data, (w, h), need, header.gray)
    if scaled is None or scaled.eighths == 8:
        return None
    if pads:  # the whole image resized, then placed in the zeros around it
        whole = _finish(scaled.image.resize((nw, nh), Image.Resampling.BILINEAR), False)
        return _mirrored(window(whole, y0, x0, (oh, ow)), placement.flip)
    f = scaled.eighths / 8
    out = scaled.image.resize((ow, oh), Image.Resampling.BILINEAR, box=(left * f, top * f, right * f, bottom * f))
    return _finish(out, placement.flip)


def _region(data: bytes, mode: str, placement: Placement) -> Optional[tuple[np.ndarray, Placement]]:
    """The part of a JPEG that ``placement``'s box (within the image) needs, decoded alone
    (``jpeg_region``), and the placement moved onto it; None where the whole image is decoded: a
    box that pads or a resize of the whole image, a file that cannot be cut, a box that needs it all."""
    left, top, right, bottom = placement.box
    if placement.whole is not None or left < 0 or top < 0:
        return None
    from readers.augment import jpeg_region  # imports numba: only once a JPEG is cropped

    region = jpeg_region.decode_region(data, mode, (int(left), int(top), math.ceil(right), math.ceil(bottom)))
    if region is None:
        return None
    pixels, y, x = region
    # whole-pixel shifts: int() of each moved corner is the old one's less the shift, as render cuts it
    return pixels, placement._replace(box=(left - x, top - y, right - x, bottom - y))


def box_inside(box: tuple[float, float, float, float], shape: tuple[int, ...]) -> bool:
    """Whether ``box`` (left, top, right, bottom) lies within an image of ``shape`` (H, W, ...)."""
    left, top, right, bottom = box
    return left >= 0 and top >= 0 and right <= shape[1] and bottom <= shape[0]


def _finish(image: Image.Image, flip: bool) -> np.ndarray:
    """An HxWxC uint8 array of a Pillow image, mirrored left to right when ``flip``."""
    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pixels = np.asarray(image)
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


__all__ = ["render", "stored_size", "upright_stored", "box_inside", "window", "OPENCV_MAX_PIXELS"]
