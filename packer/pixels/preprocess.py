"""One image's preprocessing, from file to stored pixels: read, decode, resize, finish.

The steps are ``packer.pixels.read`` (the file), ``packer.pixels.decoding`` (upright pixels in the
colour mode), ``packer.pixels.resize`` (the resize rule), then ``finish_pixels`` (the stored dtype).
``decode`` is the converter worker's call for each image (its histogram feeds the statistics).
"""

from __future__ import annotations

import io
import os
import struct
import warnings
from typing import NamedTuple, Optional

import numpy as np
from PIL import Image, UnidentifiedImageError

from packer.config import PreprocessConfig
from packer.pixels import jpeg
from packer.pixels.decoding import _exif_orientation, _orientation, image_pixels, oriented, plain_jpeg
from packer.pixels.read import read_source
from packer.pixels.resize import Area, resize
from packer.spec.errors import DecodeError

IMAGE_BLOCKS_KEPT = 8
"""Freed image buffers a converter worker's Pillow keeps for the next images (its PILLOW_BLOCKS_MAX).
With Pillow's default, 0, each image's memory goes back to the system as soon as the image is
gone and the next image's pages are faulted in afresh, a cost in kernel time on every image. A
decode holds three images at a time (decoded, half-resized, resized), a jpeg or png codec one
more. A kept block is at most Pillow's block size (16 MiB unless PILLOW_BLOCK_SIZE says
otherwise) and takes the size of the next image that reuses it: a worker keeps at most 128 MiB,
and that only after images of 16 MiB or more."""


def keep_image_memory() -> None:
    """Have Pillow keep up to IMAGE_BLOCKS_KEPT freed image buffers for reuse, in this process. For
    processes that decode image after image (converter workers); a PILLOW_BLOCKS_MAX the user set
    wins, as Pillow read it at import."""
    if "PILLOW_BLOCKS_MAX" not in os.environ:
        Image.core.set_blocks_max(IMAGE_BLOCKS_KEPT)


def load_image(path: str | os.PathLike, cfg: PreprocessConfig) -> np.ndarray:
    """Return the preprocessed image at ``path`` as an HxWxC array of ``cfg.dtype``.

    Raises DecodeError (with a reason a person can act on) for any file that cannot be used.
    """
    return decode_image(read_source(path), cfg, str(path))


class Decoded(NamedTuple):
    """One decoded, preprocessed image, before conversion to the stored dtype.

    ``pixels`` is HxWxC uint8; ``original_size`` the source image's (width, height) as displayed
    (after EXIF orientation), before resizing; ``histogram`` (only when asked for) the counts of
    each 8-bit value per channel, 256 per channel, channel after channel (Pillow's ``histogram``);
    ``orientation`` the EXIF orientation applied (1..8; see ``packer.pixels.geometry``). ``kept``: the
    source file is stored as it is (``--codec source``) and was not decoded into ``pixels``, which
    then only have its shape (a read-only view of one zero).
    """

    pixels: np.ndarray
    original_size: tuple[int, int]
    histogram: Optional[list[int]] = None
    orientation: int = 1
    kept: bool = False
    scaled_counts: bool = False
    """With ``kept``: ``histogram`` was counted at 1/8 scale (``packer.pixels.source_codec``)."""
    upright: Optional[np.ndarray] = None
    """With ``kept``: the pixels the file was checked with, upright (a JPEG's at 1/8 scale), which its
    perceptual hash is taken from."""

    @property
    def hashed_pixels(self) -> np.ndarray:
        """The pixels the image's perceptual hash is taken from (``packer.pixels.looks``): those
        stored, or for a kept file those it was checked with."""
        return self.upright if self.kept and self.upright is not None else self.pixels

    @property
    def stored_size(self) -> tuple[int, int]:
        """The source's (width, height) as stored in the file, before the EXIF orientation."""
        w, h = self.original_size
        return (h, w) if self.orientation in (5, 6, 7, 8) else (w, h)


def decode_image(data: bytes, cfg: PreprocessConfig, path: str = "<bytes>") -> np.ndarray:
    """Decode image file bytes (by content, not extension) and preprocess them; see load_image."""
    return finish_pixels(decode(data, cfg, path).pixels, cfg)


def decode(data: bytes, cfg: PreprocessConfig, path: str = "<bytes>", histogram: bool = False) -> Decoded:
    """Decode image file bytes and preprocess them up to 8-bit pixels (``finish_pixels`` makes the
    stored array); with ``histogram`` also count the pixel values. DecodeError as in load_image."""
    Image.MAX_IMAGE_PIXELS = cfg.max_pixels  # Pillow's own bomb check, in case a size is only known late
    try:
        header = jpeg.plain_header(data)
        # None: not a plain JPEG, or one whose EXIF Pillow must read itself (see _exif_orientation)
        orientation = None if header is None else 1 if header.exif is None else _exif_orientation(header.exif)
        if header is not None and orientation is not None:
            plain = plain_jpeg(data, header, orientation, cfg, path, scratch=True)
            if plain is not None:
                return _resized(*plain, cfg, histogram, path, orientation)
        with warnings.catch_warnings():
            # Pillow warns on odd but readable files (e.g. a palette image with bytes transparency).
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as img:
                turn = _orientation(img)  # before oriented(): Pillow drops the tag of a TIFF it turns as it loads
                # Without the data, oriented does not try libjpeg-turbo again on a plain JPEG it declined.
                turned = oriented(img, cfg, path, None if orientation else data, scratch=True)
                return _resized(*turned, cfg, histogram, path, turn)
    except DecodeError:
        raise
    except UnidentifiedImageError:
        raise DecodeError(path, "not an image: unknown format or corrupt header") from None
    except Image.DecompressionBombError:
        raise DecodeError(path, f"too many pixels: more than --max-pixels {cfg.max_pixels:,}") from None
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError, struct.error, IndexError, TypeError) as e:
        # Pillow's plugins report truncated and corrupt data with all of these.
        raise DecodeError(path, f"corrupt or truncated image: {e or type(e).__name__}") from None


def _resized(
    img: Image.Image,
    original: tuple[int, int],
    area: Optional[Area],
    cfg: PreprocessConfig,
    histogram: bool,
    path: str = "<bytes>",
    orientation: int = 1,
) -> Decoded:
    """The last steps of ``decode``: resize, count the pixel values if asked, take the pixels."""
    img = resize(img, cfg, area, original, path)  # may be the image decoded into the scratch buffer, until copied
    # Pillow counts in one C pass over its own buffer: faster than numpy's bincount.
    counts = img.histogram() if histogram else None
    return Decoded(image_pixels(img), original, counts, orientation)


def finish_pixels(pixels: np.ndarray, cfg: PreprocessConfig) -> np.ndarray:
    """Turn uint8 HWC pixels into the stored dtype (normalizing for float storage)."""
    if cfg.dtype == "uint8":
        return np.ascontiguousarray(pixels, dtype=np.uint8)
    x = pixels.astype(np.float32) / 255.0
    if cfg.mean is not None:
        x = (x - np.asarray(cfg.mean, np.float32)) / np.asarray(cfg.std, np.float32)
    return np.ascontiguousarray(x, dtype=cfg.dtype)
