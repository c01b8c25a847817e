"""Decoding one image file up to its upright pixels in the colour mode: what ``packer.pixels.preprocess``
does before the resize.

Images are decoded by content, not by extension: plain JPEGs by libjpeg-turbo without Pillow
(``plain_jpeg``; scaled while decoding where ``--reduced-decode`` allows, to the size the resize
needs), anything else by Pillow (``oriented``). Then the EXIF orientation and the colour mode
(``to_color_mode``: transparency composited, 16-bit scaled).
"""

from __future__ import annotations

import warnings
from typing import Optional

import numpy as np
from PIL import Image
from PIL.TiffImagePlugin import IFDRational

from packer.config import PreprocessConfig
from packer.pixels import jpeg
from packer.pixels.resize import Area, draft_size, rgb
from packer.spec.errors import DecodeError

ORIENTATION, RESOLUTION_UNIT, X_RESOLUTION = 0x0112, 0x0128, 0x011A  # EXIF tags


def image_pixels(img: Image.Image) -> np.ndarray:
    """The pixels of an RGB or L image as a new HxWxC uint8 array (C = 3 or 1).

    What ``np.asarray`` gives, from Pillow's raw encoder in one call: ``tobytes`` (behind
    ``np.asarray``) encodes in 64 KB pieces and joins them, a second copy of every image in the
    worker's hot path. The encoder is Pillow's internal API: if it is not there or behaves
    otherwise, ``np.asarray``.
    """
    img.load()
    (w, h), channels = img.size, len(img.getbands())
    size = w * h * channels
    try:
        encoder = Image.core.raw_encoder(img.mode, img.mode)
        encoder.setimage(img.im, (0, 0, w, h))
        _, status, data = encoder.encode(size)
        encoder.cleanup()
    except Exception:  # noqa: BLE001 - Pillow's internals changed: its public way
        status, data = 0, b""
    if status != 1 or len(data) != size or not size:
        return np.asarray(img).reshape(h, w, channels)
    return np.frombuffer(data, np.uint8).reshape(h, w, channels)


def plain_jpeg(
    data: bytes,
    header: jpeg.PlainHeader,
    orientation: int,
    cfg: PreprocessConfig,
    path: str = "<bytes>",
    scratch: bool = False,
) -> Optional[tuple[Image.Image, tuple[int, int], Optional[Area]]]:
    """What ``oriented`` gives for a JPEG that needs nothing from Pillow, ``header`` being its
    ``jpeg.plain_header`` and ``orientation`` its EXIF orientation (``_exif_orientation``),
    decoded by libjpeg-turbo (scaled, or in full); None when libjpeg-turbo refuses the file: Pillow
    decodes it then, and explains the error. The pixels are those ``oriented`` would give: the same
    libjpeg-turbo decoding and orientation, only the header is read without Pillow. ``scratch``:
    see ``jpeg.decode_scaled``."""
    _check_pixels(header.width, header.height, cfg, path)
    return _scaled_jpeg(data, (header.width, header.height), header.gray, orientation, cfg, scratch)


def _scaled_jpeg(
    data: bytes, size: tuple[int, int], gray: bool, orientation: int, cfg: PreprocessConfig, scratch: bool
) -> Optional[tuple[Image.Image, tuple[int, int], Optional[Area]]]:
    """libjpeg-turbo's decoding of the JPEG ``data`` of ``size`` (as stored), scaled for ``cfg.size``
    when ``cfg.reduced_decode`` (else in full), turned by its EXIF ``orientation`` and in ``cfg``'s
    colour mode, as ``oriented`` returns it; None when libjpeg-turbo refuses the file. ``scratch``:
    see ``jpeg.decode_scaled``."""
    turned = orientation in (5, 6, 7, 8)
    original = (size[1], size[0]) if turned else size  # as displayed
    need = draft_size(original, cfg, swap=turned) if cfg.reduced_decode and cfg.size is not None else None
    scaled = jpeg.decode_scaled(data, size, need, gray, orientation, scratch)
    if scaled is None:
        return None
    return to_color_mode(scaled.image, cfg.mode, cfg.background), original, scaled.area


def oriented(
    img: Image.Image, cfg: PreprocessConfig, path: str = "<bytes>", data: Optional[bytes] = None, scratch: bool = False
) -> tuple[Image.Image, tuple[int, int], Optional[Area]]:
    """What ``decode`` does to an opened image before resizing: the pixel-count check, reduced JPEG
    decoding (given the file's ``data``), EXIF orientation and the colour mode.

    Returns the image (possibly not yet loaded: Pillow decodes lazily), its original (width,
    height) as displayed, and the area of the image that holds the picture (None: all of it; see
    packer.pixels.jpeg), which ``resize`` takes. Pillow's errors pass through; ``decode`` turns them into
    DecodeError. ``scratch``: see ``jpeg.decode_scaled``.
    """
    w, h = img.size
    _check_pixels(w, h, cfg, path)
    orientation = _orientation(img)
    if img.format == "TIFF" and orientation != 1:
        img.load()  # Pillow 13 turns a TIFF by its orientation as it loads and drops the tag: not twice
        if _orientation(img) == 1:
            return to_color_mode(img, cfg.mode, cfg.background), img.size, None
    turned = orientation in (5, 6, 7, 8)
    original = (h, w) if turned else (w, h)  # as displayed, after the EXIF orientation
    area = None
    if cfg.reduced_decode and cfg.size is not None and img.format in ("JPEG", "MPO"):  # MPO: JPEG + more frames
        if data is not None and img.mode in ("RGB", "L"):
            scaled = _scaled_jpeg(data, (w, h), img.mode == "L", orientation, cfg, scratch)
            if scaled is not None:
                return scaled
        # CMYK, or a file libjpeg-turbo refuses: Pillow's draft, which scales by 1/2, 1/4 or 1/8 only
        drafted = img.draft(None, draft_size(original, cfg, swap=turned))
        if drafted is not None and img.size != (w, h):
            area = jpeg.upright_area(img.size, drafted[1][2:], orientation)
    return to_color_mode(jpeg.upright(img, orientation), cfg.mode, cfg.background), original, area


def _check_pixels(w: int, h: int, cfg: PreprocessConfig, path: str) -> None:
    if w * h > cfg.max_pixels:
        raise DecodeError(path, f"too many pixels: {w}x{h} = {w * h:,} > --max-pixels {cfg.max_pixels:,}")


def _orientation(img: Image.Image) -> int:
    """The EXIF orientation (1..8; 1 when absent or unreadable)."""
    try:
        value = img.getexif().get(ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - a broken EXIF block: shown as stored
        return 1
    return value if value in range(1, 9) else 1


def _exif_orientation(block: bytes) -> Optional[int]:
    """The orientation in a JPEG's EXIF APP1 ``block``, read by Pillow's parser as ``_orientation``
    reads it from an opened image (1..8; 1 when absent). None when Pillow must open the file to
    decide: the parser fails, or the block holds a resolution that is not a fraction (opening a
    file, Pillow reads its dpi from there and refuses some such files)."""
    exif = Image.Exif()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow warns of odd but readable EXIF blocks
            exif.load(block)
        if RESOLUTION_UNIT in exif and not isinstance(exif.get(X_RESOLUTION, IFDRational(72)), IFDRational):
            return None
        value = exif.get(ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - whatever Pillow makes of it, it decides
        return None
    return value if value in range(1, 9) else 1


_INTEGER_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
"""Pillow's 16- and 32-bit integer modes, which ``to_color_mode`` scales to 8 bits."""


def to_color_mode(img: Image.Image, mode: str, background: tuple[int, ...]) -> Image.Image:
    """Convert any Pillow mode to ``mode`` (RGB or L).

    Transparency is composited over ``background``: an alpha channel, and the transparent colour of
    a palette, RGB or grayscale image (a PNG's tRNS chunk, Pillow's ``info["transparency"]``);
    16- and 32-bit integer images are scaled to 8 bits (Pillow's own conversion would clip them);
    CMYK and YCbCr use Pillow's conversion.
    """
    key = img.info.get("transparency") if img.mode in ("P", "RGB", "L", *_INTEGER_MODES) else None
    if img.mode in _INTEGER_MODES:
        a = np.asarray(img).astype(np.int64)
        peak = 65535 if img.mode.startswith("I;16") or a.max(initial=0) > 255 else 255
        gray = Image.fromarray((np.clip(a, 0, peak) * 255 // peak).astype(np.uint8), "L")
        if isinstance(key, int):  # the transparent gray value, before scaling: an alpha of its own
            gray.putalpha(Image.fromarray(np.where(a == key, 0, 255).astype(np.uint8), "L"))
        img = gray
    elif img.mode == "F":
        a = np.nan_to_num(np.asarray(img, dtype=np.float32))
        img = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8), "L")
    if img.mode in ("P", "RGB", "L") and key is not None:
        img = img.convert("RGBA")  # Pillow turns the transparent colour into alpha 0
    if img.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, rgb(background) + (255,))
        img = Image.alpha_composite(bg, rgba)
    if img.mode != mode:
        img = img.convert(mode)
    return img
