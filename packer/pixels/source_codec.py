"""``--codec source``: each source file's own bytes, where the preprocessing would not change its pixels.

A JPEG or PNG file is kept byte for byte when decoding it as the converter decodes (EXIF orientation
applied, nothing resized, no colour conversion) already gives the pixels the options ask for: under
``--resize none``, or ``--resize max`` when its longer side is within ``--size``, without ``--crop``,
in its own colour mode (RGB, or gray with ``--mode L``). Every other file is re-encoded from its
preprocessed pixels: a JPEG at ``--quality``, anything else (a lossless source) as PNG. Readers
decode each stored image by its content and apply the EXIF orientation a kept file carries, so the
pixels are the conversion's (``decode_source``).

A kept JPEG is still decoded at conversion, to refuse a damaged file and to count its pixels for the
statistics, but at 1/8 scale (libjpeg-turbo decodes every coefficient, skipping most of the inverse
DCT): its histogram is that of the 8x8 block averages, each counted for the pixels its block covers
(``block_histogram``), so the recorded mean is close and the spread somewhat low. With
``--normalize auto``, whose normalization comes from those statistics, kept JPEGs are decoded in
full instead.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, NamedTuple, Optional

import numpy as np
from PIL import Image

from packer.pixels import jpeg
from packer.spec.codecs import decode_image
from packer.spec.errors import DecodeError

if TYPE_CHECKING:  # the converter's settings; readers, which decode these images too, never load them
    from packer.config import PreprocessConfig

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

NO_PIXEL_LIMIT = 1 << 62
"""The pixel limit readers decode stored ``source`` images under: none (the conversion applied its own)."""

SOURCE_STATS = "kept JPEGs counted at 1/8 scale"
"""What the manifest's statistics say of how kept JPEGs were counted (not said when decoded in full)."""


def source_format(data: bytes) -> Optional[str]:
    """``jpeg`` or ``png`` by the file's first bytes, else None."""
    if data.startswith(jpeg.SOI):
        return "jpeg"
    if data.startswith(PNG_SIGNATURE):
        return "png"
    return None


def reencode_codec(data: bytes) -> str:
    """The codec a file that must change is stored in: JPEG for a JPEG source, PNG for any other (lossless)."""
    return "jpeg" if source_format(data) == "jpeg" else "png"


class Kept(NamedTuple):
    """A source file stored as it is: its displayed (width, height), EXIF orientation, and the
    pixel histogram the statistics take (Pillow's layout, 256 counts per channel); ``scaled`` when
    that histogram was counted at 1/8 scale (each block for the pixels it covers)."""

    original_size: tuple[int, int]
    orientation: int
    histogram: list[int]
    scaled: bool = False
    upright: Optional[np.ndarray] = None
    """With ``keep(..., looks=True)``: the pixels its perceptual hash is taken from
    (``packer.pixels.looks``), upright, HxWxC (a JPEG's RGB with a fourth byte unused): a PNG's own,
    a JPEG's decoded with the shorter side at least ``LOOKS_SIDE``."""


def _within(size: tuple[int, int], cfg: PreprocessConfig) -> bool:
    """True when the preprocessing keeps an image of displayed ``size`` as it is."""
    if cfg.crop is not None or cfg.dtype != "uint8":
        return False
    if cfg.resize == "none":
        return True
    return cfg.resize == "max" and cfg.size is not None and max(size) <= cfg.size[0]


def keep(
    data: bytes, cfg: PreprocessConfig, path: str = "<bytes>", full: bool = False, looks: bool = False
) -> Optional[Kept]:
    """What a file that can be stored as it is holds (``Kept``), or None when it must be re-encoded
    (or when only the full decode can tell, which then also reports a damaged file). ``full``:
    count a kept JPEG's pixels from a full decode. ``looks``: with the pixels its perceptual hash is
    taken from (``Kept.upright``). DecodeError for too many pixels."""
    fmt = source_format(data)
    if fmt == "jpeg":
        return _keep_jpeg(data, cfg, path, full, looks)
    if fmt == "png":
        return _keep_png(data, cfg, path, looks)
    return None


LOOKS_SIDE = 40
"""The shorter side a kept JPEG is decoded at, at least, for its perceptual hash (``packer.pixels.looks``).
Measured for the hash of ``dct64-trim5`` (a 64 x 64 thumbnail): a 256-pixel JPEG's 1/8 (32 pixels)
hashed up to 20 bits away from the same pixels in full; from 40 pixels on, within 6. The grid of
``dct-area-trim5`` does better: 1/8 against full of 70 generated images and the 40 sample
photographs at 500 x 375, 427 x 320 and 341 x 256 (1/8: 46, 40 and 32 pixels), within 6 bits, 97%
within 4. 40 stays: 64 would decode most such files a second time."""


def _looks_pixels(
    data: bytes, size: tuple[int, int], gray: bool, orientation: int, checked: jpeg.ScaledJpeg
) -> np.ndarray:
    """The pixels a kept JPEG of ``size`` (as stored) is hashed from, upright: decoded at the smallest
    M/8 whose shorter side is at least ``LOOKS_SIDE`` (``checked``, the check's decode, when it is
    that one), whatever scale the check itself took: the hash does not depend on other options."""
    w, h = size
    short = max(1, min(w, h))
    need = (min(w, -(-LOOKS_SIDE * w // short)), min(h, -(-LOOKS_SIDE * h // short)))
    wanted = jpeg.eighths_for(size, need)
    scaled = checked if checked.eighths == (8 if wanted > jpeg.MAX_EIGHTHS else wanted) else None
    scaled = scaled or jpeg.decode_scaled(data, size, need, gray) or checked
    if orientation == 1 and scaled.pixels is not None:
        return scaled.pixels  # libjpeg-turbo's own, as they are: a copy costs as much as the hash
    return np.asarray(jpeg.upright(scaled.image, orientation))


def _keep_jpeg(data: bytes, cfg: PreprocessConfig, path: str, full: bool, looks: bool) -> Optional[Kept]:
    from packer.pixels.decoding import _check_pixels, _exif_orientation, _orientation

    if cfg.mode not in ("RGB", "L"):
        return None
    header = jpeg.plain_header(data)
    if header is not None:
        w, h, gray = header.width, header.height, header.gray
        orientation = 1 if header.exif is None else _exif_orientation(header.exif)
    if header is None or orientation is None:  # XMP, several APP1 blocks, EXIF Pillow must read: Pillow decides
        try:
            with Image.open(io.BytesIO(data)) as img:
                if img.format != "JPEG" or img.mode not in ("RGB", "L"):
                    return None  # CMYK, YCCK: re-encoded from the converted pixels
                (w, h), gray, orientation = img.size, img.mode == "L", _orientation(img)
        except Exception:  # noqa: BLE001 - damaged or odd: the full decode reports it, or re-encodes it
            return None
    if gray != (cfg.mode == "L"):
        return None  # another colour mode: re-encoded from the converted pixels
    displayed = (h, w) if orientation in (5, 6, 7, 8) else (w, h)
    if not _within(displayed, cfg):
        return None
    _check_pixels(w, h, cfg, path)
    # w // 8, not w / 8 rounded up: eighths_for compares with the exact scaled size, so asking for
    # the rounded-up size chose 2/8 (four times the pixels) for any side that is not a multiple of 8
    eighth = (max(1, w // 8), max(1, h // 8))
    scaled = None if full else jpeg.decode_scaled(data, (w, h), eighth, gray)
    if scaled is None:  # in full: asked for, or an image under 8 pixels a side, which does not scale
        scaled = jpeg.decode_scaled(data, (w, h), None, gray)
    if scaled is None:
        return None  # libjpeg-turbo refuses it: the full decode reports it, or re-encodes what Pillow reads
    turned = _looks_pixels(data, (w, h), gray, orientation, scaled) if looks else None
    if scaled.eighths == 8:
        return Kept(displayed, orientation, scaled.image.histogram(), upright=turned)
    return Kept(displayed, orientation, block_histogram(scaled.image, (w, h)), True, turned)


def block_histogram(image: Image.Image, size: tuple[int, int]) -> list[int]:
    """The histogram (Pillow's layout, 256 counts per channel) of a JPEG of ``size`` (width, height,
    as stored) decoded at 1/8 scale (``image``): each block average counted for the source pixels
    its 8x8 block covers, so partial blocks at the right and bottom edges count less and every
    channel counts exactly width x height pixels."""
    (w, h), pixels = size, np.asarray(image)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    rows = np.minimum(8, h - 8 * np.arange(pixels.shape[0]))
    cols = np.minimum(8, w - 8 * np.arange(pixels.shape[1]))
    weights = (rows[:, None] * cols[None, :]).ravel().astype(np.float64)
    counts = [np.bincount(pixels[:, :, c].ravel(), weights=weights, minlength=256) for c in range(pixels.shape[2])]
    return np.rint(np.concatenate(counts)).astype(np.int64).tolist()


def _keep_png(data: bytes, cfg: PreprocessConfig, path: str, looks: bool) -> Optional[Kept]:
    from packer.pixels.decoding import _check_pixels, _orientation

    try:
        with Image.open(io.BytesIO(data)) as img:
            bits = data[24] if len(data) > 24 else 0  # IHDR's bit depth: Pillow opens 16-bit RGB as RGB
            if img.mode != cfg.mode or img.mode not in ("RGB", "L") or "transparency" in img.info or bits != 8:
                return None  # palette, alpha, 16-bit, another mode: re-encoded from the converted pixels
            orientation = _orientation(img)
            w, h = img.size
            displayed = (h, w) if orientation in (5, 6, 7, 8) else (w, h)
            if not _within(displayed, cfg):
                return None
            _check_pixels(w, h, cfg, path)
            img.load()  # the whole file decoded: a damaged one is refused here
            upright = np.asarray(jpeg.upright(img, orientation)) if looks else None
            return Kept(displayed, orientation, img.histogram(), upright=upright)
    except DecodeError:
        raise
    except Exception:  # noqa: BLE001 - damaged or odd: the full decode reports it, or re-encodes it
        return None


def decode_stored(data, codec: str, mode: str = "RGB") -> np.ndarray:
    """The HxWxC pixels of one stored image of any encoded codec (``codecs.decode_image``), the
    ``source`` codec's by ``decode_source``."""
    if codec == "source":
        return decode_source(data, mode)
    return decode_image(data, codec, mode)


def decode_source(data, mode: str = "RGB") -> np.ndarray:
    """The HxWxC uint8 pixels of a stored ``--codec source`` image (a kept file, or one packer
    re-encoded), as the converter decodes a file under ``--resize none``: by its content, turned by
    its EXIF orientation, in ``mode``. Errors pass through (DecodeError for a damaged file)."""
    from packer.config import PreprocessConfig
    from packer.pixels.preprocess import decode

    # No pixel limit (the conversion checked each file against its --max-pixels), and Pillow's own
    # limit, which decode sets for the converter, left as the caller had it.
    cfg = PreprocessConfig(size=None, resize="none", mode=mode, mean=None, std=None, max_pixels=NO_PIXEL_LIMIT)
    limit = Image.MAX_IMAGE_PIXELS
    try:
        return decode(bytes(data), cfg).pixels
    finally:
        Image.MAX_IMAGE_PIXELS = limit
