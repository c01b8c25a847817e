"""Decoding only the part of a stored JPEG that a crop needs.

A training crop (``RandomResizedCrop``) keeps on average about half of an image, yet a JPEG is
normally decoded whole: its entropy-coded data is one stream, each block's DC value coded as the
difference from the block before it. packer's JPEGs carry a restart marker after every MCU (the
unit of 8x8 blocks that covers 16x16 pixels in 4:2:0; ``packer.spec.codecs.encode_image``): each MCU
is then coded on its own, so the bytes of the MCUs that cover a box, put one after another behind
the file's own headers with a frame header of the smaller size, are a valid JPEG of just that part
of the picture. libjpeg-turbo (through simplejpeg) decodes it as it decodes any JPEG.

The pixels are exactly those of the whole image's decode: the inverse DCT works block by block,
and the one step that reads across blocks, the upsampling of the subsampled colour planes (libjpeg's
"fancy" upsampling, a triangle filter over the neighbouring chroma sample), needs one chroma sample
beyond the box, which the box widened by 2 pixels on each subsampled side provides
(``tests/test_jpeg_region.py`` checks equality on random boxes, sizes and subsamplings).

FFCV gets its crops from JPEGs similarly, by libjpeg-turbo's lossless crop of the MCUs (a
``tjTransform``), which decodes every coefficient of the file first; here the MCUs outside the box
are skipped unread but for a scan for their markers. TurboJPEG 3's ``tj3SetCroppingRegion`` does
this in the library, but no Python wheel bundles that API (PyTurboJPEG needs the system's
libturbojpeg), and simplejpeg, which every install has, decodes only whole files.

Any file the splice does not recognise (no restart marker after every MCU, progressive or
arithmetic coding, sampling factors other than 1 and 2, markers out of sequence or missing
anywhere in the file, not only among the MCUs kept, a box not inside the image) gives None, and the
caller decodes the whole file as before, which explains the error of a file so damaged. Damage
inside the coded data of MCUs outside the box that leaves every marker whole goes unseen here,
where a whole decode may report it (libjpeg-turbo's warning of a bad Huffman code) or decode it
into other pixels without a word; what finds any changed byte is the files' SHA-256
(``open_dataset(..., verify=True)``, ``packer verify``), as for every stored image.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import simplejpeg
from PIL import Image

from readers.compiled import jit


@jit
def _splice(
    data: np.ndarray,
    box: np.ndarray,
    channels: int,
    max_pixels: int,
    context: int,
    out: np.ndarray,
    corner: np.ndarray,
) -> int:
    """Write into ``out`` (at least ``len(data) + 2`` bytes) the JPEG of the MCUs of ``data`` that
    cover ``box`` (left, top, right, bottom, in pixels, within the image) widened by ``context``
    pixels on every side (or, when negative, by what libjpeg's upsampling reads: 2 pixels on a
    subsampled side), and its (top, left) in the image into ``corner``; return its length, or -1 when
    that is every MCU (nothing to cut), for a file this cannot splice (see the module), or one of
    other than ``channels`` components or more than ``max_pixels`` (when positive)."""
    n = data.shape[0]
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8 or data[n - 2] != 0xFF or data[n - 1] != 0xD9:
        return -1  # not a JPEG, or not one that ends with its EOI, which stops the scans below
    i, frame, interval, hmax, vmax, components = 2, -1, 0, 1, 1, 0
    while True:  # the segments before the scan
        if i + 4 > n or data[i] != 0xFF:
            return -1
        marker = data[i + 1]
        if marker == 0xFF:  # a fill byte
            i += 1
            continue
        length = (np.int64(data[i + 2]) << 8) | data[i + 3]
        if marker == 0xDA:
            break
        if length < 2 or i + 2 + length > n or (0xD0 <= marker <= 0xD9) or marker < 0xC0:
            return -1
        if marker == 0xC0 or marker == 0xC1:  # baseline or extended sequential, Huffman-coded
            if length < 8:
                return -1
            components = np.int64(data[i + 9])
            if frame >= 0 or data[i + 4] != 8 or components != channels or length != 8 + 3 * components:
                return -1
            frame = i + 5
            for c in range(components):
                h, v = np.int64(data[i + 11 + 3 * c]) >> 4, np.int64(data[i + 11 + 3 * c]) & 15
                if h < 1 or h > 2 or v < 1 or v > 2 or (c > 0 and (h != 1 or v != 1)):
                    return -1
                if c == 0 and components > 1:  # one component's scan has MCUs of one block whatever it says
                    hmax, vmax = h, v
        elif 0xC2 <= marker <= 0xCF and marker != 0xC4 and marker != 0xCC:
            return -1  # progressive, lossless, hierarchical or arithmetic-coded
        elif marker == 0xDD:
            if length != 4:
                return -1
            interval = (np.int64(data[i + 4]) << 8) | data[i + 5]
        i += 2 + length
    scan = i + 2 + length
    if frame < 0 or interval != 1 or length != 6 + 2 * components or scan > n - 2 or data[i + 4] != components:
        return -1  # one scan of every component, a restart after each MCU, the file's EOI after it
    height = (np.int64(data[frame]) << 8) | data[frame + 1]
    width = (np.int64(data[frame + 2]) << 8) | data[frame + 3]
    left, top, right, bottom = box[0], box[1], box[2], box[3]
    if (
        height == 0
        or width == 0
        or (max_pixels > 0 and height * width > max_pixels)
        or left < 0
        or top < 0
        or right > width
        or bottom > height
    ):
        return -1
    if right <= left or bottom <= top:
        return -1
    mcu_w, mcu_h = 8 * hmax, 8 * vmax
    cols, rows = (width + mcu_w - 1) // mcu_w, (height + mcu_h - 1) // mcu_h
    # a subsampled side's upsampling reads the chroma sample beyond: 2 pixels of context
    ex, ey = (2 * (hmax - 1), 2 * (vmax - 1)) if context < 0 else (context, context)
    c0, c1 = max(left - ex, 0) // mcu_w, min((right + ex + mcu_w - 1) // mcu_w, cols)
    r0, r1 = max(top - ey, 0) // mcu_h, min((bottom + ey + mcu_h - 1) // mcu_h, rows)
    if c0 == 0 and r0 == 0 and c1 == cols and r1 == rows:
        return -1  # every MCU: the file is decoded as it is
    out[:scan] = data[:scan]
    new_h, new_w = min(height, r1 * mcu_h) - r0 * mcu_h, min(width, c1 * mcu_w) - c0 * mcu_w
    out[frame], out[frame + 1] = new_h >> 8, new_h & 0xFF
    out[frame + 2], out[frame + 3] = new_w >> 8, new_w & 0xFF
    last = (r1 - 1) * cols + c1 - 1
    o, start, j, mcu, kept = scan, scan, scan, 0, 0
    # Each MCU's bytes end at the next marker: RSTn after each, EOI after the last. The scan goes on
    # to the EOI past the MCUs kept, so that a file with its markers damaged anywhere is decoded
    # whole, and refused there, whichever crop is drawn.
    while True:
        while data[j] != 0xFF:  # the EOI at the end stops it
            j += 1
        marker = data[j + 1]
        if marker == 0:  # a 0xFF data byte, stuffed
            j += 2
            continue
        final = mcu == rows * cols - 1
        if (marker == 0xD9) != final or (not final and (marker & 0xF8 != 0xD0 or marker & 7 != mcu & 7)):
            return -1
        row = mcu // cols
        col = mcu - row * cols
        if r0 <= row < r1 and c0 <= col < c1:
            size = j - start
            out[o : o + size] = data[start:j]
            o += size
            out[o] = 0xFF
            out[o + 1] = 0xD9 if mcu == last else 0xD0 + (kept & 7)
            o += 2
            kept += 1
        if final:
            break
        mcu += 1
        j += 2
        start = j
    corner[0], corner[1] = r0 * mcu_h, c0 * mcu_w
    return o


def splice(
    data: bytes, channels: int, box: tuple[int, int, int, int], context: int = -1
) -> Optional[tuple[np.ndarray, int, int]]:
    """The JPEG of the MCUs of ``data`` (a JPEG of ``channels`` components) that cover ``box`` (left,
    top, right, bottom, whole pixels within the image), with ``context`` pixels around it (by
    default what libjpeg-turbo's upsampling reads, so that its decode of the part equals the whole
    decode's under the box): ``(jpeg, top, left)``, the file's bytes (a uint8 array) and where its
    corner lies in the image. None where the file cannot be cut so (see the module), or where the
    box needs all of it."""
    source = np.frombuffer(data, np.uint8)
    limit = int(Image.MAX_IMAGE_PIXELS or 0)  # larger files go to Pillow's decode, which refuses them
    out = np.empty(len(data) + 2, np.uint8)
    corner = np.zeros(2, np.int64)
    size = _splice(source, np.asarray(box, np.int64), channels, limit, context, out, corner)
    if size < 0:
        return None
    return out[:size], int(corner[0]), int(corner[1])


def decode_region(data: bytes, mode: str, box: tuple[int, int, int, int]) -> Optional[tuple[np.ndarray, int, int]]:
    """The pixels of the JPEG ``data`` (``mode`` RGB or L) that cover ``box`` (left, top, right,
    bottom, whole pixels within the image), decoded alone: ``(pixels, top, left)``, an HxWxC uint8
    array of the part of the image whose corner lies at (``top``, ``left``), equal there to the
    whole image's decode. None where the file cannot be cut so (see the module), or where the box
    needs all of it: the caller decodes the whole file."""
    part = splice(data, 1 if mode == "L" else 3, box)
    if part is None:
        return None
    jpeg, top, left = part
    try:  # strict: a warning would mean a splice libjpeg-turbo reads otherwise; decode it whole then
        pixels = simplejpeg.decode_jpeg(jpeg, colorspace="GRAY" if mode == "L" else "RGB", strict=True)
    except (ValueError, RuntimeError):
        return None
    return pixels, top, left


__all__ = ["decode_region", "splice"]
