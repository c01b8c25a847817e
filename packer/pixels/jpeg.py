"""JPEG decoding at reduced scale: libjpeg-turbo's DCT scaling by M/8, through simplejpeg.

A JPEG stores 8x8 blocks of DCT coefficients; the decoder can turn each block into MxM pixels
instead of 8x8 (M = 1..8), skipping most of the inverse DCT, colour conversion and, above all,
the resize work on pixels that would only be averaged away. Pillow exposes this only for M = 1,
2 and 4 (``Image.draft``: 1/8, 1/4, 1/2), which misses the common case of a photograph 1.6-2x
larger than the target (500x375 to 224: M = 5). simplejpeg (libjpeg-turbo's TurboJPEG API)
takes any M.

``plain_header`` recognizes the JPEGs that need nothing from Pillow but perhaps its EXIF parser
(no XMP, YCbCr, RGB or gray): for those ``preprocess.decode`` skips ``Image.open``, whose parsing
of every marker in Python is a noticeable part of a whole decode (more with an EXIF block), and
much of a small image's whole conversion. They are decoded here whether scaled or in full
(M = 8): libjpeg-turbo's full decode gives the pixels Pillow's does (Pillow's wheels bundle
libjpeg-turbo too, another version, decoding with the same settings: accurate integer IDCT, fancy
upsampling; checked on 595 files of all sizes, qualities, subsamplings, progressive and gray, and
guarded by tests/test_jpeg.py).

Pixel (i, j) of an image scaled by M/8 covers exactly the source area [8i/M, 8(i+1)/M) x
[8j/M, 8(j+1)/M); the last row and column are partial when the size is not a multiple of 8/M.
``ScaledJpeg.area`` says where the whole picture lies, so that the resize that follows places
its box on the same source pixels as a full decode would. ``upright`` and ``upright_area`` turn
any decoded image (Pillow's too) by its EXIF orientation.
"""

from __future__ import annotations

import functools
import threading
from typing import NamedTuple, Optional

import numpy as np
import simplejpeg
from PIL import Image

MAX_EIGHTHS = 5
"""Largest M used. Decoding at 6/8 or 7/8 is slower than at full size in libjpeg-turbo, and the
smaller resize after it hardly makes up for that: those JPEGs are decoded in full."""

SCALING = f"libjpeg-turbo M/8, M <= {MAX_EIGHTHS}"
"""How ``reduced_decode`` scales JPEGs; manifests and resume fingerprints record it (outputs
without it that have ``reduced_decode`` used Pillow's draft: 1/2, 1/4, 1/8)."""

_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
"""EXIF orientation -> the transposition that shows the image upright (as ``ImageOps.exif_transpose``)."""

_ORIGIN_AT_RIGHT = {2, 3, 6, 7}  # orientations that move the file's top-left corner to the right ...
_ORIGIN_AT_BOTTOM = {3, 4, 7, 8}  # ... or to the bottom of the upright image


class ScaledJpeg(NamedTuple):
    """A JPEG decoded at ``eighths``/8 of its size (8: in full) and turned upright.

    ``area`` is (left, top, right, bottom) of the picture in ``image``: the image's own size less
    the part of a partial last row or column that lies beyond the source's edge; None when the
    JPEG was decoded in full (the whole image is the picture).
    """

    image: Image.Image
    area: Optional[tuple[float, float, float, float]]
    eighths: int
    pixels: Optional[np.ndarray] = None
    """libjpeg-turbo's own output, HxWx4 RGBX or HxWx1 gray, as stored (before the orientation)."""


SCRATCH_MAX_BYTES = 16 * 1024**2
"""Largest decoded image (bytes, 4 per colour pixel) that ``decode_scaled(scratch=True)`` writes
into its thread's reused buffer; a larger one gets a buffer of its own, freed with the image, so
that what a worker keeps between images stays small whatever the dataset holds."""


class _Scratch(threading.local):
    """The buffer each thread decodes into when asked to (see ``decode_scaled``)."""

    def __init__(self) -> None:
        self.buffer = bytearray()


_SCRATCH = _Scratch()


SOI = b"\xff\xd8\xff"
"""How every JPEG file begins (start of image, then the first marker)."""

_RESTARTS = frozenset(range(0xD0, 0xD8))  # RSTn: markers without a length


EXIF = b"Exif\x00\x00"
"""How the APP1 segment that holds EXIF begins."""


class PlainHeader(NamedTuple):
    """What ``plain_header`` reads: the size and colours of a JPEG, and its EXIF block if any."""

    width: int
    height: int
    gray: bool
    exif: Optional[bytes] = None


def plain_header(data: bytes) -> Optional[PlainHeader]:
    """The header of a JPEG that can be decoded without Pillow: 8-bit YCbCr, RGB or gray pixels (3
    or 1 components), and no APP1 segment before the scan but at most one holding EXIF (where
    Pillow finds the orientation; ``preprocess`` reads it with Pillow's EXIF parser). None for
    anything else (CMYK, XMP, other or several APP1 segments, not a JPEG, a damaged header):
    Pillow opens those, and explains their errors. libjpeg-turbo decoding the file checks the
    rest; if it refuses, Pillow gets the file (see ``decode_scaled``)."""
    if not data.startswith(SOI):
        return None
    headers = _headers(data)
    if headers is None:
        return None
    app1, frame = headers
    if frame is None or len(app1) > 1 or (app1 and not app1[0].startswith(EXIF)):
        return None
    precision, height, width, components = frame
    if precision != 8 or not height or not width or components not in (1, 3):
        return None
    return PlainHeader(width, height, components == 1, app1[0] if app1 else None)


_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # SOFn; not DHT, JPG, DAC


def _headers(data: bytes) -> Optional[tuple[list[bytes], Optional[tuple[int, int, int, int]]]]:
    """The payloads of the APP1 segments before the JPEG's first scan, and its frame header
    (precision, height, width, components; None without one). None when its segments up to the
    scan are not well formed or hold two frame headers. Read here rather than by libjpeg-turbo's
    header call: in a worker's loop, between decodes, that call takes many times what it takes in
    isolation."""
    found: list[bytes] = []
    frame = None
    i, end = 2, len(data) - 4
    while i <= end:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker == 0xDA:  # start of scan: the headers are over
            return found, frame
        elif marker < 0xC0:  # TEM and reserved markers: libjpeg skips them, Pillow refuses the file
            return None
        elif marker in _RESTARTS:
            i += 2
        else:
            length = (data[i + 2] << 8) | data[i + 3]
            if marker == 0xE1:
                found.append(data[i + 4 : i + 2 + length])
            elif marker in _FRAMES:
                if frame is not None or length < 8 or i + 10 > len(data):
                    return None
                frame = (data[i + 4], (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8], data[i + 9])
            i += 2 + length
    return None


def eighths_for(size: tuple[int, int], need: tuple[int, int]) -> int:
    """The smallest M (1..8) for which ``size`` (width, height) scaled by M/8 is still at least
    ``need`` on both sides."""
    (w, h), (nw, nh) = size, need
    return max(1, min(8, max(-(-8 * nw // w), -(-8 * nh // h))))


def decode_scaled(
    data: bytes,
    size: tuple[int, int],
    need: Optional[tuple[int, int]],
    gray: bool,
    orientation: int = 1,
    scratch: bool = False,
) -> Optional[ScaledJpeg]:
    """Decode the JPEG ``data`` of ``size`` (width, height, as stored) at the smallest M/8 that keeps
    at least ``need`` (as stored), upright for the EXIF ``orientation``; ``gray`` for a one-channel
    JPEG. In full (M = 8) when ``need`` is None or scaling would not pay (M above MAX_EIGHTHS).
    None when libjpeg-turbo refuses the file (corrupt, truncated): the caller decodes it with
    Pillow, which explains any error; and for an image under 8 pixels on a side that could be
    scaled, where two scales can give the same size: Pillow's draft scales it.

    The image uses libjpeg-turbo's output without a copy (unless turned by its EXIF orientation, or
    where this Pillow needs one: see ``as_image``). With ``scratch`` that output is this thread's
    reused buffer, which the next ``scratch`` decode in the thread overwrites: the caller must be
    done with the image (or have made a new one from it: resize, transpose, convert, ``tobytes``)
    by then. Decoding into memory that is already mapped and cached, and resizing
    from it without a copy, saves a measurable share of a converter worker's time: a copy pushes
    the decoded pixels out of the cache the resize reads them from.
    """
    w, h = size
    m = 8 if need is None else eighths_for(size, need)
    if m > MAX_EIGHTHS:
        m = 8
    elif min(w, h) < 8:
        return None
    out_w, out_h = -(-w * m // 8), -(-h * m // 8)  # libjpeg rounds partial blocks up
    try:
        # strict: a warning (corrupt data libjpeg can skip over) is an error here; Pillow gets the file
        # RGBX: four bytes a pixel, as Pillow keeps RGB images, so the image can use them as they are
        extra = {} if m == 8 else {"min_width": out_w, "min_height": out_h}
        if scratch and (buffer := _scratch(out_w * out_h * (1 if gray else 4))) is not None:
            extra["buffer"] = buffer
        pixels = simplejpeg.decode_jpeg(data, colorspace="GRAY" if gray else "RGBX", strict=True, **extra)
    except (ValueError, RuntimeError):
        return None
    if pixels.shape[:2] != (out_h, out_w):  # another factor than asked for: not worth guessing
        return None
    out = (out_w, out_h)
    image = upright(as_image(pixels), orientation)
    area = None if m == 8 else upright_area(out, (w * m / 8, h * m / 8), orientation)
    return ScaledJpeg(image, area, m, pixels)


def _scratch(nbytes: int) -> Optional[bytearray]:
    """This thread's reused decoding buffer, at least ``nbytes`` long; None above SCRATCH_MAX_BYTES."""
    if nbytes > SCRATCH_MAX_BYTES:
        return None
    if len(_SCRATCH.buffer) < nbytes:
        _SCRATCH.buffer = bytearray(nbytes)  # a new one: an image may still map the old
    return _SCRATCH.buffer


def as_image(pixels: np.ndarray) -> Image.Image:
    """A read-only Pillow image on libjpeg-turbo's HxWx4 RGBX or HxWx1 gray ``pixels``, sharing
    their memory; a copy (writable) where this Pillow does not keep RGB as 4 bytes a pixel."""
    height, width, channels = pixels.shape
    if channels == 1:
        return Image.frombuffer("L", (width, height), pixels, "raw", "L", 0, 1)
    if _maps_rgbx():
        return _mapped_rgb(pixels, (width, height))
    return Image.frombytes("RGB", (width, height), pixels, "raw", "RGBX")


def _mapped_rgb(pixels: np.ndarray, size: tuple[int, int]) -> Image.Image:
    # Image.frombuffer maps RGBX bytes only as an RGBX image, whose resize computes the padding
    # byte too (slower); an RGB image is laid out the same, so map the bytes as one, as
    # frombuffer itself does for the modes it maps.
    image = Image.Image()._new(Image.core.map_buffer(pixels, size, "raw", 0, ("RGB", 4 * size[0], 1)))
    image.readonly = 1
    return image


@functools.cache
def _maps_rgbx() -> bool:
    """Whether ``_mapped_rgb`` works with this Pillow: it keeps an RGB pixel in 4 bytes, the fourth
    unused, and maps a buffer as an RGB image. Checked once, on a 2x1 image."""
    probe = np.array([[[1, 2, 3, 0], [4, 5, 6, 0]]], np.uint8)
    try:
        return _mapped_rgb(probe, (2, 1)).tobytes() == bytes([1, 2, 3, 4, 5, 6])
    except Exception:  # noqa: BLE001 - any failure of a private call: copy instead
        return False


def upright(image: Image.Image, orientation: int) -> Image.Image:
    """``image`` turned as its EXIF ``orientation`` says (itself for 1 or an unknown value)."""
    return image.transpose(_TRANSPOSE[orientation]) if orientation in _TRANSPOSE else image


def upright_area(
    size: tuple[int, int], exact: tuple[float, float], orientation: int
) -> tuple[float, float, float, float]:
    """Where the picture lies in an image decoded at a reduced scale, once turned upright.

    ``size`` is the decoded (width, height) and ``exact`` the picture's (width, height) in it (a
    partial last column and row lie beyond the source's edge), both as stored; the partial edge
    ends up on the side opposite to where the EXIF ``orientation`` moves the stored top-left corner.
    """
    (out_w, out_h), (exact_w, exact_h) = size, exact
    if orientation in (5, 6, 7, 8):  # turned by 90 degrees
        out_w, out_h, exact_w, exact_h = out_h, out_w, exact_h, exact_w
    left = out_w - exact_w if orientation in _ORIGIN_AT_RIGHT else 0.0
    top = out_h - exact_h if orientation in _ORIGIN_AT_BOTTOM else 0.0
    return (left, top, left + exact_w, top + exact_h)
