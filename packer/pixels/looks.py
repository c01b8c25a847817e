"""What an image looks like, in 64-bit perceptual hashes: near-duplicates are images whose hashes
differ in a few bits (``packer.output.near_duplicates`` finds them).

The hash is a DCT hash ("pHash"): the image in gray, reduced to a 64 x 64 thumbnail, projected on
the 8 x 8 lowest cosine frequencies; each of the 64 coefficients gives one bit, set when it is above
the median of the 63 that are not the mean. Resizing, re-encoding and a change of brightness move
few bits. A crop moves many: the low frequencies shift with the frame (5% off one corner flips 12
bits of 64 on average in photographs, as many as separate two unrelated images at times). So each
image also gets the hashes of five windows of its thumbnail, trimmed by ``TRIM`` (5%) at each
corner and around the centre: a copy cropped by about that much hashes (as a whole) like
one of its original's windows. ``LOOKS`` hashes an image: its own first, then its windows'.

The bits are the coefficients in row-major order (vertical frequency, then horizontal), the first
in the hash's highest bit.
"""

from __future__ import annotations

import cv2
import numpy as np

HASH_KIND = "dct64-trim5"
"""How ``image_looks`` hashes, as the manifest records it: a change of the rule is a new name."""
THUMB = 64
"""The side of the gray thumbnail the hashes are taken from."""
TRIM = 0.05
"""The share of each side the five windows leave out: all of it at one corner's two sides, half of
it at every side for the centre window."""
LOOKS = 6
"""Hashes an image has: its own, then those of its four corner windows and its centre window."""
FLAT = 0
"""The hashes of an image of one colour (every real hash has 32 bits set): never a near-duplicate."""
_FREQUENCIES = 8


def _window_basis(start: float, stop: float) -> np.ndarray:
    """The 8 lowest DCT-II cosines of the span [start, stop) of a thumbnail side (8 x THUMB, float32):
    each pixel weighted by how much of it the span covers, the cosine taken at the middle of that part,
    so a window's coefficients are those of the window resampled, without resampling."""
    left = np.arange(THUMB, dtype=np.float64)
    lo, hi = np.maximum(left, start), np.minimum(left + 1, stop)
    weight = np.clip(hi - lo, 0, None)
    middle = (lo + hi) / 2 - start
    u = np.arange(_FREQUENCIES, dtype=np.float64)[:, None]
    return (np.cos(np.pi * u * middle[None, :] / (stop - start)) * weight[None, :]).astype(np.float32)


def _bases() -> tuple[np.ndarray, np.ndarray]:
    """The row and column bases (LOOKS x 8 x THUMB) of the whole thumbnail and its five windows."""
    t = TRIM * THUMB
    whole, low, high, middle = (0.0, THUMB), (0.0, THUMB - t), (t, float(THUMB)), (t / 2, THUMB - t / 2)
    spans = [(whole, whole), (low, low), (low, high), (high, low), (high, high), (middle, middle)]  # (rows, columns)
    rows = np.stack([_window_basis(*r) for r, _ in spans])
    columns = np.stack([_window_basis(*c) for _, c in spans])
    return rows, columns.transpose(0, 2, 1).copy()


_ROWS, _COLUMNS = _bases()


def thumbnail(pixels: np.ndarray) -> np.ndarray:
    """``pixels`` (H x W, H x W x 1, 3 as RGB, or 4 as RGBA; uint8, uint16 or float) as a 64 x 64
    float32 gray thumbnail: halved (``pyrDown``, a Gaussian blur and every second pixel) while 4 times
    larger, bilinear to 128 x 128, then each 2 x 2 averaged; one of 64 pixels a side or less, bilinear
    to 64 x 64. (OpenCV's area resize straight to 64 x 64 moves
    the hashes alike and takes 2-20 times longer: it has no fast path for such ratios.)"""
    image = np.asarray(pixels)
    if image.dtype not in (np.uint8, np.uint16, np.float32):
        image = image.astype(np.float32)
    if image.ndim == 3:
        channels = image.shape[2]
        if channels == 3:
            image = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
        elif channels == 4:
            image = cv2.cvtColor(image, cv2.COLOR_RGBA2GRAY)
        else:
            image = image[:, :, 0]
    image = np.ascontiguousarray(image)
    while min(image.shape[:2]) >= 4 * THUMB:
        image = cv2.pyrDown(image)
    if max(image.shape[:2]) <= THUMB:  # enlarged: the 2 x 2 averages would only add a blur
        return cv2.resize(image, (THUMB, THUMB), interpolation=cv2.INTER_LINEAR).astype(np.float32, copy=False)
    image = cv2.resize(image, (2 * THUMB, 2 * THUMB), interpolation=cv2.INTER_LINEAR)
    return cv2.resize(image, (THUMB, THUMB), interpolation=cv2.INTER_AREA).astype(np.float32, copy=False)


def image_looks(pixels: np.ndarray) -> np.ndarray:
    """The ``LOOKS`` hashes of one image (uint64): the whole image's, then its windows' (each leaving
    out the bottom right, bottom left, top right, top left, and a rim all round). ``FLAT`` (zeros) for
    an image of one colour, which has no shape to compare."""
    coefficients = (_ROWS @ thumbnail(pixels) @ _COLUMNS).reshape(LOOKS, -1)
    whole = np.abs(coefficients[0])
    if whole[1:].max() <= 1e-5 * whole[0]:  # no shape: what is left is float rounding
        return np.zeros(LOOKS, np.uint64)
    # The median of the 63 that are not the mean: the 32nd smallest of them.
    median = np.partition(coefficients[:, 1:], 31, axis=1)[:, 31:32]
    packed = np.packbits(coefficients > median, axis=1)  # first coefficient in the highest bit
    return packed.view(">u8").reshape(-1).astype(np.uint64)


__all__ = ["FLAT", "HASH_KIND", "LOOKS", "THUMB", "TRIM", "image_looks", "thumbnail"]
