"""What an image looks like, in 64-bit perceptual hashes: near-duplicates are images whose hashes
differ in a few bits (``packer.output.near_duplicates`` finds them).

The hash is a DCT hash ("pHash"): the image in gray, projected on the 8 x 8 lowest cosine
frequencies over its area; each of the 64 coefficients gives one bit, set when it is above the
median of the 63 that are not the mean. Resizing, re-encoding and a change of brightness move few
bits. A crop moves many: the low frequencies shift with the frame (5% off one corner flips 12 bits
of 64 on average in photographs, as many as separate two unrelated images at times). So each image
also gets the hashes of five windows of it, trimmed by ``TRIM`` (5%) at each corner and around the
centre: a copy cropped by about that much hashes (as a whole) like one of its original's windows.
``LOOKS`` hashes an image: its own first, then its windows'.

The projection is taken from a grid: the gray image halved (2 x 2 means) while a side is at least
``HALVE_FROM`` pixels, so 64 to 127 cells a side, each cosine integrated over the cells' spans. The
coefficients are taken an image at a time, the bits a batch at a time (``LooksBatch``): in a
converter's worker, between decodes, each numpy call costs two to three times what it does in a
loop. (The projections of a batch at once are no faster there: their temporaries are large enough
for the allocator to map and unmap them each time, and OpenBLAS would start threads that the
other workers' cores cannot spare.)

The bits are the coefficients in row-major order (vertical frequency, then horizontal), the first
in the hash's highest bit.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import cv2
import numpy as np

HASH_KIND = "dct-area-trim5"
"""How ``image_looks`` hashes, as the manifest records it: a change of the rule is a new name (the
rule of packers before it, ``dct64-trim5``, hashed a 64 x 64 thumbnail)."""
HALVE_FROM = 128
"""A side of at least this many pixels is halved (2 x 2 means) before the projection: a grid of 64
to 127 cells a side keeps the 8 lowest frequencies as a 64 x 64 thumbnail resampled by area did,
at a third of the cost."""
TRIM = 0.05
"""The share of each side the five windows leave out: all of it at one corner's two sides, half of
it at every side for the centre window."""
LOOKS = 6
"""Hashes an image has: its own, then those of its four corner windows and its centre window."""
FLAT = 0
"""The hashes of an image of one colour (every real hash has 32 bits set): never a near-duplicate."""
BATCH = 256
"""Images whose coefficients a worker gathers before hashing them (``LooksBatch``)."""
GRID_BITS = 30
"""Coefficients are rounded to 2^-GRID_BITS of the image's mean coefficient (rounded to a power of
two): 30 bits keep every shape a float32 coefficient held (24 bits), and drop the noise of summing
in float64 (53 bits) in whatever order the host's BLAS takes."""
_FREQUENCIES = 8
_SPANS = ((0, 0), (1, 1), (1, 2), (2, 1), (2, 2), (3, 3))
"""Each hash's (row, column) span, of ``_basis``'s four: the whole side, less ``TRIM`` at its end,
less ``TRIM`` at its start, less half of it at both."""
_PICK = np.array(
    [
        [(r * _FREQUENCIES + i) * 4 * _FREQUENCIES + c * _FREQUENCIES + j for i in range(8) for j in range(8)]
        for r, c in _SPANS
    ]
)
"""Where each hash's 64 coefficients lie in the 32 x 32 product of ``_basis`` (row spans x column spans)."""
_POWERS = np.left_shift(np.uint64(1), np.arange(63, -1, -1, dtype=np.uint64))


def _gray(pixels: np.ndarray) -> np.ndarray:
    """``pixels`` (H x W, H x W x 1, 3 as RGB, or 4 as RGBA; uint8, uint16 or float) in gray (ITU-R
    601, OpenCV's ``COLOR_RGB2GRAY``), 2-D."""
    image = np.asarray(pixels)
    if image.dtype not in (np.uint8, np.uint16, np.float32):
        image = image.astype(np.float32)
    if image.ndim == 2:
        return image
    channels = image.shape[2]
    if channels == 3:
        return cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    if channels == 4:
        return cv2.cvtColor(image, cv2.COLOR_RGBA2GRAY)
    return image[:, :, 0]


class _Plan(NamedTuple):
    """How an image of one size is hashed: its halvings (each the size after it and the factors), and
    the cosines of its grid's rows (32 x rows) and columns (columns x 32)."""

    halvings: tuple[tuple[int, int, int, int], ...]
    rows: np.ndarray
    columns: np.ndarray


@lru_cache(maxsize=512)
def _side(length: int) -> tuple[tuple[int, ...], np.ndarray]:
    """A side of ``length`` pixels as the grid has it: its lengths after each halving (while at least
    ``HALVE_FROM``), and the cosines over its cells (``_basis``). Cached by side, not by size, so
    photographs of many sizes share them."""
    lengths, cells, scale = [], length, 1
    while cells >= HALVE_FROM:
        cells, scale = cells // 2, scale * 2
        lengths.append(cells)
    return tuple(lengths), _basis(cells, length / scale)


@lru_cache(maxsize=256)
def _plan(height: int, width: int) -> _Plan:
    """The ``_Plan`` of an image of ``height`` x ``width`` pixels: each side halved (2 x 2 means)
    while it is at least ``HALVE_FROM``; an odd last pixel is left out, and the grid's last cell
    then stands for the part of a cell it leaves."""
    (rows, row_basis), (columns, column_basis) = _side(height), _side(width)
    halvings = []
    for i in range(max(len(rows), len(columns))):
        h = rows[min(i, len(rows) - 1)] if rows else height
        w = columns[min(i, len(columns) - 1)] if columns else width
        halvings.append((h, w, 1 + (i < len(rows)), 1 + (i < len(columns))))
    # numpy multiplies by a transposed view slowly: the columns' cosines are laid out for it
    transposed = np.ascontiguousarray(column_basis.T)
    transposed.flags.writeable = False  # cached and shared
    return _Plan(tuple(halvings), row_basis, transposed)


def _basis(cells: int, extent: float) -> np.ndarray:
    """The 8 lowest DCT-II cosines over each of four spans of a side of ``cells`` cells covering
    ``extent`` cells (32 x cells, float64; the spans of ``_SPANS``): each cosine integrated exactly
    over the part of each cell inside the span (the last cell reaching to ``extent``), so a window's
    coefficients are those of the window resampled, without resampling, and an image of one colour
    has no coefficient but its mean (a sampled cosine would leak the mean into the others wherever
    the cells do not split the span evenly)."""
    left = np.arange(cells, dtype=np.float64)
    right = left + 1
    right[-1] = extent
    t = TRIM * extent
    u = np.arange(1, _FREQUENCIES, dtype=np.float64)[:, None]
    rows = []
    for start, stop in ((0.0, extent), (0.0, extent - t), (t, extent), (t / 2, extent - t / 2)):
        lo, hi = np.clip(left, start, stop), np.clip(right, start, stop)  # each cell's part in the span
        size = stop - start
        waves = size / (np.pi * u) * (np.sin(np.pi * u * (hi - start) / size) - np.sin(np.pi * u * (lo - start) / size))
        rows.append(np.concatenate([(hi - lo)[None, :], waves]))
    basis = np.concatenate(rows)
    basis.flags.writeable = False  # cached and shared
    return basis


def image_coefficients(pixels: np.ndarray) -> np.ndarray:
    """The 64 DCT coefficients of each of an image's ``LOOKS`` windows (LOOKS x 64, float32):
    ``pixels`` in gray, halved to a grid of at most 127 cells a side (``_plan``), projected on the
    cosines of each window's span."""
    image = _gray(pixels)
    plan = _plan(*image.shape)
    for h, w, fy, fx in plan.halvings:
        # whole multiples of the factors: OpenCV's area resize then takes its fast path of exact means
        image = cv2.resize(image[: h * fy, : w * fx], (w, h), interpolation=cv2.INTER_AREA)
    coefficients = (plan.rows @ image.astype(np.float64) @ plan.columns).ravel()[_PICK]
    # The same on every host: the order BLAS sums in is its kernel's (AVX2's and AVX-512's differ),
    # and a hash compares coefficients with their median, so rounding noise flipped bits wherever
    # coefficients are equal or zero (images of flat areas: the same output hashed differently on
    # two hosts). Summed in float64, the noise is far below the grid (``GRID_BITS``) every
    # coefficient is then rounded to: equal ones stay equal, zeros zero.
    unit = math.ldexp(1.0, math.frexp(max(abs(float(coefficients[0, 0])), 1.0))[1] - GRID_BITS)
    coefficients *= 1.0 / unit  # a power of two: exact
    np.rint(coefficients, out=coefficients)
    coefficients *= unit
    return coefficients.astype(np.float32)


def hashes_of(coefficients: np.ndarray) -> np.ndarray:
    """The hashes (images x ``LOOKS``, uint64) of images' coefficients (images x LOOKS x 64): each
    bit set where its coefficient is above the median; ``FLAT`` (zeros) for an image of one colour,
    which has no shape to compare."""
    whole = np.abs(coefficients[:, 0])
    flat = whole[:, 1:].max(axis=1) <= 1e-5 * whole[:, 0]  # no shape: what is left is float rounding
    # Of the 63 that are not the mean, the 31 after the 32nd smallest (the median) are above it, and
    # the mean is compared with it. Where others equal the median (an image of flat areas has many
    # equal coefficients, zeros among them), equal ones are ordered by their place: a tie is broken
    # the same way on every host, never by rounding.
    rest = coefficients[:, :, 1:]
    median = np.partition(rest, 31, axis=2)[:, :, 31:32]
    above = rest > median
    tied = above.sum(axis=2) != 31
    if tied.any():
        order = np.argsort(rest[tied], axis=1, kind="stable")
        fixed = np.zeros(order.shape, bool)
        np.put_along_axis(fixed, order[:, 32:], True, axis=1)
        above[tied] = fixed
    bits = np.concatenate([coefficients[:, :, :1] > median, above], axis=2)
    looks = bits @ _POWERS  # first coefficient in the highest bit
    looks[flat] = FLAT
    return looks


class LooksBatch:
    """The hashes of images added one at a time: each image's coefficients as it comes, the hashes of
    ``BATCH`` of them at a time (a handful of numpy calls, not a handful an image)."""

    def __init__(self) -> None:
        self._pending: list[np.ndarray] = []
        self._hashed: list[np.ndarray] = []

    def add(self, pixels: np.ndarray) -> None:
        """Add the next image (as ``image_coefficients`` takes it)."""
        self._pending.append(image_coefficients(pixels))
        if len(self._pending) >= BATCH:
            self._hashed.append(hashes_of(np.stack(self._pending)))
            self._pending = []

    def table(self) -> np.ndarray:
        """The hashes of every image added, in order (images x ``LOOKS`` uint64)."""
        if self._pending:
            self._hashed.append(hashes_of(np.stack(self._pending)))
            self._pending = []
        return np.concatenate(self._hashed) if self._hashed else np.zeros((0, LOOKS), np.uint64)


def image_looks(pixels: np.ndarray) -> np.ndarray:
    """The ``LOOKS`` hashes of one image (uint64): the whole image's, then its windows' (each leaving
    out the bottom right, bottom left, top right, top left, and a rim all round)."""
    return hashes_of(image_coefficients(pixels)[None])[0]


__all__ = [
    "BATCH",
    "FLAT",
    "HALVE_FROM",
    "HASH_KIND",
    "LOOKS",
    "TRIM",
    "LooksBatch",
    "image_coefficients",
    "hashes_of",
    "image_looks",
]
