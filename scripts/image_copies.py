"""Photograph-like generated images and the changes copies of photographs go through (resized,
re-encoded, brightened, cropped): what the near-duplicate benchmark (``bench_looks.py``) and the
tests of the image hashes compare."""

from __future__ import annotations

import io

import cv2
import numpy as np
from PIL import Image, ImageEnhance


def textured(seed: int, kind: int, height: int = 240, width: int = 320) -> np.ndarray:
    """A photograph-like RGB image: noise at four scales (most of it coarse) and a stripe pattern,
    colours and stripes shared by images of one ``kind``, the noise each image's own."""
    rng, shared = np.random.default_rng(seed), np.random.default_rng(1000 + kind)
    image = np.zeros((height, width, 3), np.float32)
    for scale, amplitude in ((3, 6), (12, 12), (40, 22), (120, 30)):
        noise = rng.standard_normal((height // scale + 2, width // scale + 2, 3)).astype(np.float32)
        image += cv2.resize(noise, (width, height), interpolation=cv2.INTER_CUBIC) * amplitude
    stripes = 15 * np.sin(np.arange(width) * shared.uniform(0.02, 0.08) + rng.uniform(0, 6.28))
    image += stripes[None, :, None]
    return np.clip(image + shared.uniform(70, 150, 3), 0, 255).astype(np.uint8)


def jpeg(pixels: np.ndarray, quality: int) -> np.ndarray:
    """``pixels`` through a JPEG file of ``quality``."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=quality)
    return np.asarray(Image.open(io.BytesIO(out.getvalue())).convert("RGB"))


def brightened(pixels: np.ndarray, factor: float = 1.2) -> np.ndarray:
    return np.asarray(ImageEnhance.Brightness(Image.fromarray(pixels)).enhance(factor))


def resized(pixels: np.ndarray, scale: float = 2 / 3) -> np.ndarray:
    h, w = pixels.shape[:2]
    return cv2.resize(pixels, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_AREA)


def cropped(pixels: np.ndarray, share: float = 0.05, where: str = "top-left") -> np.ndarray:
    """``pixels`` less ``share`` of each side: at one corner's two sides, or half of it all round."""
    h, w = pixels.shape[:2]
    dy, dx = round(h * share), round(w * share)
    if where == "centre":
        return pixels[dy // 2 : h - (dy - dy // 2), dx // 2 : w - (dx - dx // 2)]
    top, left = where.split("-")
    rows = slice(dy, None) if top == "top" else slice(None, h - dy)
    cols = slice(dx, None) if left == "left" else slice(None, w - dx)
    return pixels[rows, cols]


CHANGES = {
    "resized to 2/3": resized,
    "JPEG quality 60": lambda p: jpeg(p, 60),
    "brightened by 20%": brightened,
    "5% cropped off the top left": lambda p: cropped(p, where="top-left"),
    "5% cropped off the bottom right": lambda p: cropped(p, where="bottom-right"),
    "5% cropped all round": lambda p: cropped(p, where="centre"),
    "all four": lambda p: jpeg(brightened(resized(cropped(p, where="top-right"))), 60),
}
"""Each change a copy may have gone through, by name; ``all four`` is cropped 5% off the top right,
resized to 2/3, brightened by 20% and saved as JPEG quality 60."""
