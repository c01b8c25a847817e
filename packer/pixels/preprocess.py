"""Decode one image file and apply the deterministic preprocessing (orientation, colour, resize).

Images are decoded by content, not by extension. Resizing uses Pillow's antialiased filters (the
default, bilinear, matches torchvision's ``Resize`` with ``antialias=True``).
"""

from __future__ import annotations

import io
import math
import os
import stat
import struct
import warnings
from typing import NamedTuple, Optional

import numpy as np
from PIL import Image, UnidentifiedImageError
from PIL.TiffImagePlugin import IFDRational

from packer.config import PreprocessConfig
from packer.pixels import jpeg
from packer.spec.errors import DecodeError

ORIENTATION, RESOLUTION_UNIT, X_RESOLUTION = 0x0112, 0x0128, 0x011A  # EXIF tags

Area = tuple[float, float, float, float]
"""(left, top, right, bottom) of the picture within a decoded image, in its pixels."""

IMAGE_BLOCKS_KEPT = 8
"""Freed image buffers a converter worker's Pillow keeps for the next images (its PILLOW_BLOCKS_MAX).
With Pillow's default, 0, each image's memory goes back to the system as soon as the image is
gone and the next image's pages are faulted in afresh, a cost in kernel time on every image. A
decode holds three images at a time (decoded, half-resized, resized), a jpeg or png codec one
more. A kept block is at most Pillow's block size (16 MiB unless PILLOW_BLOCK_SIZE says
otherwise) and takes the size of the next image that reuses it: a worker keeps at most 128 MiB,
and that only after images of 16 MiB or more."""

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


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


SOURCE_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
"""How source files are opened. O_NONBLOCK: a path swapped for a FIFO after the check opens at once
(and is refused) instead of waiting for a writer; reads of regular files ignore it."""

READ_CHUNK = 64 * 1024**2
"""Bytes per read past the first, for files that changed size since they were opened or are large."""

_NOT_REGULAR = "not a regular file (a pipe, device or socket)"


def read_source(
    path: str | os.PathLike,
    max_bytes: Optional[int] = None,
    limit: str = "more than any image of --max-pixels could need",
    st: Optional[os.stat_result] = None,
) -> bytes:
    """The bytes of one source file; DecodeError for anything that is not a readable, non-empty file.

    Checked before opening (a FIFO or device named ``x.jpg`` would block, never end, or do something
    when opened) by its ``os.stat``, ``st`` if the caller took it, and again on the open file, before
    reading: a file over ``max_bytes`` would be read whole into memory (``limit`` says why there is
    one). stat, open, fstat and one read cost less per cached file than ``stat`` then
    ``open().read()`` (an isatty, a seek and a second read more).
    """
    where = str(path)
    try:
        if not stat.S_ISREG((st or os.stat(path)).st_mode):
            raise DecodeError(where, _NOT_REGULAR)
        fd = os.open(path, SOURCE_OPEN_FLAGS)
    except FileNotFoundError:
        reason = "broken symbolic link" if os.path.islink(path) else "file not found (removed while packer ran?)"
        raise DecodeError(where, reason) from None
    except OSError as e:
        raise DecodeError(where, f"cannot read file: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DecodeError(where, _NOT_REGULAR)
        if st.st_size == 0:
            raise DecodeError(where, "empty file: 0 bytes")
        if max_bytes is not None and st.st_size > max_bytes:
            raise DecodeError(where, f"file too large: {st.st_size:,} bytes, {limit} ({max_bytes:,})")
        data = _read_to_end(fd, st.st_size, max_bytes)
    except OSError as e:
        raise DecodeError(where, f"cannot read file: {e.strerror}") from None
    finally:
        try:
            os.close(fd)
        except OSError:
            pass  # the bytes are read (or an error is on its way); nothing was written
    if max_bytes is not None and len(data) > max_bytes:
        raise DecodeError(where, f"file too large: it grew past {max_bytes:,} bytes while read, {limit}")
    return data


def _read_to_end(fd: int, size: int, max_bytes: Optional[int] = None) -> bytes:
    """Everything from ``fd`` to the end of the file, ``size`` being its size when opened, but no more
    than one chunk past ``max_bytes``: one read when the file still has that size (a read asking for
    one byte more that returns less has reached the end)."""
    parts: list[bytes] = []
    if size < READ_CHUNK:
        first = os.read(fd, size + 1)
        if len(first) == size:
            return first
        parts.append(first)  # the file changed since fstat
    total, stop = sum(map(len, parts)), max_bytes if max_bytes is not None else math.inf
    while total <= stop:
        part = os.read(fd, READ_CHUNK)
        if not part:
            break
        parts.append(part)
        total += len(part)
    return b"".join(parts)


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


def draft_size(original: tuple[int, int], cfg: PreprocessConfig, swap: bool = False) -> tuple[int, int]:
    """The smallest decoded size (file orientation) from which the resize to ``cfg.size`` is still a
    reduction: what the JPEG decoder may scale an image down to while decoding (packer.pixels.jpeg).

    No margin above the target: the decoder's DCT scaling is itself a good low-pass filter.
    The pixel difference to a full decode is measured by ``scripts/bench.py --draft-check``.
    """
    (w, h), (tw, th) = original, cfg.size  # type: ignore[misc]
    if cfg.resize == "stretch":
        need = (tw, th)
    else:
        scale = max(tw / w, th / h) if cfg.resize in ("shorter-crop", "shorter") else min(tw / w, th / h)
        need = (math.ceil(w * scale - 1e-6), math.ceil(h * scale - 1e-6))  # 1500 * (224 / 1500) is 224.00000001
    return (need[1], need[0]) if swap else need


def finish_pixels(pixels: np.ndarray, cfg: PreprocessConfig) -> np.ndarray:
    """Turn uint8 HWC pixels into the stored dtype (normalizing for float storage)."""
    if cfg.dtype == "uint8":
        return np.ascontiguousarray(pixels, dtype=np.uint8)
    x = pixels.astype(np.float32) / 255.0
    if cfg.mean is not None:
        x = (x - np.asarray(cfg.mean, np.float32)) / np.asarray(cfg.std, np.float32)
    return np.ascontiguousarray(x, dtype=cfg.dtype)


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
        bg = Image.new("RGBA", rgba.size, _rgb(background) + (255,))
        img = Image.alpha_composite(bg, rgba)
    if img.mode != mode:
        img = img.convert(mode)
    return img


def _rgb(color: tuple[int, ...]) -> tuple[int, int, int]:
    return tuple(color) * 3 if len(color) == 1 else tuple(color[:3])  # type: ignore[return-value]


def torchvision_crop(original: tuple[int, int], size: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((resized width, height), (left, top))``: the size torchvision's ``Resize`` gives an image of
    ``original`` (width, height) so that it covers ``size`` (width, height), and the offset at which
    ``CenterCrop`` then cuts ``size`` out of it.

    For a square ``size`` (N, N) it is ``Resize(N)``: the shorter side to N, the longer one to
    ``int(N * long / short)`` (truncated, as torchvision computes it); other sizes scale by the side
    that binds. The offsets are ``int(round((resized - size) / 2))``, Python's rounding (half to even)
    as in torchvision's ``center_crop``.
    """
    (w, h), (tw, th) = original, size
    if tw * h >= th * w:  # the width binds (the image is at least as tall as the target's shape)
        rw, rh = tw, max(th, int(tw * h / w))
    else:
        rw, rh = max(tw, int(th * w / h)), th
    return (rw, rh), (int(round((rw - tw) / 2.0)), int(round((rh - th) / 2.0)))


TWO_STEP_LIMIT = 16
"""torchvision resizes the whole image, then crops: packer does the same (the same pixels) unless
the resized image would have more than this many times the pixels of what is kept (a 10 x 20000
strip: 224 x 448000), where it resizes the kept box in one step (within a level of the two steps)."""


def max_side(original: tuple[int, int], side: int) -> tuple[int, int]:
    """The (width, height) of an image of ``original`` size with its longer side at most ``side``:
    unchanged when it already fits (never enlarged), else the longer side ``side`` and the shorter
    ``int(side * short / long)`` (truncated as torchvision's Resize truncates), at least 1."""
    w, h = original
    if max(w, h) <= side:
        return (w, h)
    return (side, max(1, int(side * h / w))) if w >= h else (max(1, int(side * w / h)), side)


def resize(
    img: Image.Image,
    cfg: PreprocessConfig,
    area: Optional[Area] = None,
    original: Optional[tuple[int, int]] = None,
    path: str = "<bytes>",
) -> Image.Image:
    """Apply ``cfg.resize`` to reach ``cfg.size`` (width, height), from the ``area`` of ``img`` that
    holds the picture (None: all of it), then ``cfg.crop``. ``original`` is the picture's size
    before any scaled decoding (None: the area's size), which torchvision's geometry is computed on.
    DecodeError (naming ``path``) when ``--resize shorter`` would make more than ``--max-pixels``."""
    resample = _RESAMPLE[cfg.interpolation]
    if cfg.resize == "shorter":  # torchvision's Resize(N): the shorter side to N, the aspect kept
        box = area or (0.0, 0.0, *img.size)
        (rw, rh), _ = torchvision_crop(original or (round(box[2] - box[0]), round(box[3] - box[1])), cfg.size)  # type: ignore[arg-type]
        if cfg.crop is not None and rw * rh > TWO_STEP_LIMIT * cfg.crop[0] * cfg.crop[1]:
            return _crop_in_one_step(img, box, (rw, rh), cfg.crop, resample, cfg.fill)
        if cfg.crop is None and rw * rh > cfg.max_pixels:
            raise DecodeError(
                path,
                f"too many pixels after the resize: {rw}x{rh} is more than --max-pixels "
                f"{cfg.max_pixels:,} (--crop keeps a part of it)",
            )
        resized = img if area is None and img.size == (rw, rh) else img.resize((rw, rh), resample, box=box)
    else:
        resized = _resize(img, cfg, area, original)
    return resized if cfg.crop is None else center_crop(resized, cfg.crop, cfg.fill)


def _crop_in_one_step(
    img: Image.Image,
    box: Area,
    resized: tuple[int, int],
    crop: tuple[int, int],
    resample: Image.Resampling,
    fill: tuple[int, ...],
) -> Image.Image:
    """The centre ``crop`` of ``img``'s ``box`` resized to ``resized``, as one resize of the kept part
    of the box (torchvision's offsets; what lies outside the image is padded with ``fill`` after)."""
    (x0, y0, x1, y1), (rw, rh), (cw, ch) = box, resized, crop
    sx, sy = (x1 - x0) / rw, (y1 - y0) / rh
    kw, kh = min(cw, rw), min(ch, rh)
    left, top = int(round((rw - kw) / 2.0)), int(round((rh - kh) / 2.0))
    kept = img.resize(
        (kw, kh), resample, box=(x0 + left * sx, y0 + top * sy, x0 + (left + kw) * sx, y0 + (top + kh) * sy)
    )
    return center_crop(kept, (cw, ch), fill)


def center_crop(img: Image.Image, size: tuple[int, int], fill: tuple[int, ...]) -> Image.Image:
    """torchvision's ``CenterCrop`` of ``size`` (width, height): offsets ``int(round((side - size) /
    2))``; where the image is smaller, it is first padded (with ``fill``) as torchvision pads it,
    ``(size - side) // 2`` before and the rest after."""
    (w, h), (cw, ch) = img.size, size
    if (w, h) == (cw, ch):
        return img
    if cw > w or ch > h:
        pw, ph = max(cw, w), max(ch, h)
        canvas = Image.new(img.mode, (pw, ph), fill[0] if img.mode == "L" else _rgb(fill))
        canvas.paste(img, ((cw - w) // 2 if cw > w else 0, (ch - h) // 2 if ch > h else 0))
        img, (w, h) = canvas, (pw, ph)
    left, top = int(round((w - cw) / 2.0)), int(round((h - ch) / 2.0))
    return img.crop((left, top, left + cw, top + ch))


def _resize(
    img: Image.Image, cfg: PreprocessConfig, area: Optional[Area], original: Optional[tuple[int, int]]
) -> Image.Image:
    """``resize`` without the crop, for every mode but ``shorter`` (which ``resize`` does itself)."""
    if cfg.resize == "none":
        return img  # never decoded scaled: without a size there is nothing to scale to
    tw, th = cfg.size  # type: ignore[misc]
    x0, y0, x1, y1 = area or (0.0, 0.0, *img.size)
    w, h = x1 - x0, y1 - y0
    same = area is None and (w, h) == (tw, th)
    resample = _RESAMPLE[cfg.interpolation]
    if cfg.resize == "stretch":
        return img if same else img.resize((tw, th), resample, box=(x0, y0, x1, y1))
    if cfg.resize == "max":  # the longer side to N when it is longer, the aspect kept (FFCV's max_resolution)
        ow, oh = original or (round(w), round(h))
        new = max_side((ow, oh), tw)
        if area is None and img.size == new:
            return img
        return img.resize(new, resample, box=(x0, y0, x1, y1))
    if cfg.resize == "shorter-crop" and cfg.geometry == "torchvision":
        if same:
            return img
        ow, oh = original or (round(w), round(h))
        (rw, rh), (left, top) = torchvision_crop((ow, oh), (tw, th))
        if area is None and img.size == (ow, oh) and rw * rh <= TWO_STEP_LIMIT * tw * th:
            # The whole picture at its own size (a full decode): torchvision's two steps, byte for byte.
            resized = img if (rw, rh) == (ow, oh) else img.resize((rw, rh), resample)
            return resized.crop((left, top, left + tw, top + th))
        # A scaled decode (or a long strip): the same crop, mapped into the decoded image, one resize.
        return _crop_in_one_step(img, (x0, y0, x1, y1), (rw, rh), (tw, th), resample, cfg.fill)
    if cfg.resize == "shorter-crop":
        # fractional: the largest centred box of the target aspect ratio, resized in one step.
        if same:
            return img
        scale = max(tw / w, th / h)
        cw, ch = min(w, tw / scale), min(h, th / scale)
        left, top = x0 + max(0.0, (w - cw) / 2), y0 + max(0.0, (h - ch) / 2)
        return img.resize((tw, th), resample, box=(left, top, left + cw, top + ch))
    # pad: fit inside the target, centre on a canvas of the fill colour (letterbox).
    scale = min(tw / w, th / h)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    inner = img if area is None and (nw, nh) == (w, h) else img.resize((nw, nh), resample, box=(x0, y0, x1, y1))
    fill = cfg.fill[0] if img.mode == "L" else _rgb(cfg.fill)
    canvas = Image.new(img.mode, (tw, th), fill)
    canvas.paste(inner, ((tw - nw) // 2, (th - nh) // 2))
    return canvas
