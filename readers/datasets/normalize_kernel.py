"""One compiled pass from stored uint8 pixels to normalized float32: ``x * scale + bias`` per channel.

A normalized image is written into its slot of a batch once, each byte read once and each float
written once, in whichever pair of layouts meets: the source HWC (pixels side by side, as OpenCV's
resize and the stored images have them) or planar (as torch's resize writes it), the slot NCHW or
channels-last. numpy's way is a cast, a multiply and an add, three passes over the slot, plus a
regrouping of the channels when the layouts differ; numba compiles each loop below to one pass.

Each value is ``float32(x) * scale[c]`` rounded to float32, then ``+ bias[c]`` rounded to float32,
as numpy computes it: numba's default (no ``fastmath``) keeps both roundings (no fused multiply-add),
so every host, layout, worker count and rank gives the same float32 values as numpy's passes.

The loops index flat, contiguous arrays, which LLVM vectorizes (the rows of 2-D views defeat it).
They are compiled on first use and cached on disk (``cache=True``: next to this file, or in the
user's cache folder where that is not writable), so a DataLoader worker loads them, not compiles;
where numba finds nowhere to cache (a read-only install and home), each process compiles them.
This module imports numba: ``readers.datasets.tensors`` imports it for a reader of uint8 images that
normalizes on the CPU, when the reader is made, or at the first normalize otherwise.
"""

from __future__ import annotations

from typing import Callable

import numba
import numpy as np


def _jit(function: Callable[..., None]) -> Callable[..., None]:
    """``function`` compiled by numba on first call, cached on disk where numba finds a place."""
    try:
        return numba.njit(cache=True, nogil=True, boundscheck=False)(function)
    except RuntimeError:  # "cannot cache function ...: no locator available": compiled in each process
        return numba.njit(nogil=True, boundscheck=False)(function)


@_jit
def pixels_to_pixels(src: np.ndarray, dst: np.ndarray, scale_row: np.ndarray, bias_row: np.ndarray) -> None:
    """``src`` uint8 HWC rows, (H, W * C), into ``dst`` float32 rows of that shape; the factors tiled
    along one row. Row by row (LLVM vectorizes a row's loop, not one flat loop in steps of a row),
    three rows a third of the image apart at a time: three streams of stores in flight, which write
    a slot that is not in the cache faster than one stream, waiting on the memory, does
    (docs/BENCHMARKS.md, C21's run of 2026-12-06); the NCHW loops write three planes so already."""
    third = src.shape[0] // 3
    for y in range(third):
        s0, s1, s2 = src[y], src[y + third], src[y + 2 * third]
        d0, d1, d2 = dst[y], dst[y + third], dst[y + 2 * third]
        for k in range(s0.shape[0]):
            d0[k] = np.float32(s0[k]) * scale_row[k] + bias_row[k]
            d1[k] = np.float32(s1[k]) * scale_row[k] + bias_row[k]
            d2[k] = np.float32(s2[k]) * scale_row[k] + bias_row[k]
    for y in range(3 * third, src.shape[0]):
        s, d = src[y], dst[y]
        for k in range(s.shape[0]):
            d[k] = np.float32(s[k]) * scale_row[k] + bias_row[k]


@_jit
def pixels_to_planes(src: np.ndarray, dst: np.ndarray, channels: int, scale: np.ndarray, bias: np.ndarray) -> None:
    """``src`` flat uint8 HWC into ``dst`` flat float32 CHW (``channels`` planes)."""
    pixels = src.shape[0] // channels
    if channels == 3:  # the common case, written out so that LLVM sees a stride of 3
        s0, s1, s2, b0, b1, b2 = scale[0], scale[1], scale[2], bias[0], bias[1], bias[2]
        for i in range(pixels):
            dst[i] = np.float32(src[3 * i]) * s0 + b0
            dst[pixels + i] = np.float32(src[3 * i + 1]) * s1 + b1
            dst[2 * pixels + i] = np.float32(src[3 * i + 2]) * s2 + b2
        return
    for c in range(channels):
        sc, bi, base = scale[c], bias[c], c * pixels
        for i in range(pixels):
            dst[base + i] = np.float32(src[channels * i + c]) * sc + bi


@_jit
def planes_to_planes(src: np.ndarray, dst: np.ndarray, channels: int, scale: np.ndarray, bias: np.ndarray) -> None:
    """``src`` flat uint8 CHW into ``dst`` flat float32 CHW."""
    pixels = src.shape[0] // channels
    for c in range(channels):
        sc, bi, base = scale[c], bias[c], c * pixels
        for i in range(pixels):
            dst[base + i] = np.float32(src[base + i]) * sc + bi


@_jit
def planes_to_pixels(src: np.ndarray, dst: np.ndarray, channels: int, scale: np.ndarray, bias: np.ndarray) -> None:
    """``src`` flat uint8 CHW into ``dst`` flat float32 HWC."""
    pixels = src.shape[0] // channels
    if channels == 3:  # written out: LLVM then stores the three channels of a pixel side by side
        s0, s1, s2, b0, b1, b2 = scale[0], scale[1], scale[2], bias[0], bias[1], bias[2]
        for i in range(pixels):
            dst[3 * i] = np.float32(src[i]) * s0 + b0
            dst[3 * i + 1] = np.float32(src[pixels + i]) * s1 + b1
            dst[3 * i + 2] = np.float32(src[2 * pixels + i]) * s2 + b2
        return
    for c in range(channels):
        sc, bi, base = scale[c], bias[c], c * pixels
        for i in range(pixels):
            dst[channels * i + c] = np.float32(src[base + i]) * sc + bi


__all__ = ["pixels_to_pixels", "pixels_to_planes", "planes_to_planes", "planes_to_pixels"]
