"""One table of field codecs, used to encode when writing and to decode when reading.

Each codec turns a value into bytes and back, by a file-name extension as WebDataset uses them
(``KEY.npy``, ``KEY.cls``, ``KEY.json``). None of them executes code on load: npy is read with
``allow_pickle=False``. The image codecs (``--codec``) are here too: ``raw`` pixels, or JPEG/PNG
file bytes made with Pillow and read with Pillow, or libjpeg-turbo directly for JPEGs.
"""

from __future__ import annotations

import functools
import io
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import simplejpeg
from PIL import Image

from packer.spec.errors import PackerError


@dataclass(frozen=True)
class Codec:
    """A pair of functions: ``encode(value) -> bytes`` and ``decode(bytes) -> value``."""

    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]


def encode_npy(array: np.ndarray) -> bytes:
    """An array as the bytes of a ``.npy`` file."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(array), allow_pickle=False)
    return buf.getvalue()


@functools.lru_cache(maxsize=64)
def npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The bytes ``np.save`` writes before the data of a C-order array of ``dtype`` (``array.dtype.str``)
    and ``shape``, so that writers can send the pixels from where they lie instead of copying them."""
    buf = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue()


def decode_npy(data: bytes) -> np.ndarray:
    """The array in the bytes of a ``.npy`` file (object arrays are refused)."""
    return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)


def npy_view(data) -> np.ndarray:
    """The array in a buffer holding a ``.npy`` file, as a view of the buffer (read-only when it is)
    rather than a copy; a copy for what a view cannot show (Fortran order). Object arrays are refused."""
    head = io.BytesIO(bytes(data[: min(len(data), 65546)]))  # magic, length and the longest v1 header
    major, _ = np.lib.format.read_magic(head)
    read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(head)
    if fortran or dtype.hasobject:
        return decode_npy(bytes(data))
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(data, dtype=dtype, count=count, offset=head.tell()).reshape(shape)


class NpyDecoder:
    """``decode_npy`` for a run of ``.npy`` values that share one header (a shard's images): the
    header of the first is parsed once (numpy parses each with ``ast``, slow next to the rest of a
    sample's read), later values with the same header bytes become arrays over their data without
    parsing or copying (read-only when the value is). Values with another header are parsed as
    usual."""

    def __init__(self) -> None:
        self._header: Optional[tuple[bytes, np.dtype, tuple[int, ...], int]] = None  # prefix, dtype, shape, nbytes

    def __call__(self, data) -> np.ndarray:
        """The array in the bytes (any buffer) of one ``.npy`` file."""
        if self._header is not None:
            prefix, dtype, shape, nbytes = self._header
            if len(data) == len(prefix) + nbytes and bytes(data[: len(prefix)]) == prefix:
                return np.frombuffer(data, dtype=dtype, offset=len(prefix)).reshape(shape)
        array = npy_view(data)
        if self._header is None and array.dtype.isnative and not array.dtype.hasobject and array.flags.c_contiguous:
            self._header = (bytes(data[: len(data) - array.nbytes]), array.dtype, array.shape, array.nbytes)
        return array


def raw_bytes(image: np.ndarray, dtype: np.dtype) -> memoryview:
    """An image's pixels as a flat byte view in C order and ``dtype`` (copied only when needed), for
    a variable-length field of raw images."""
    return np.ascontiguousarray(image, dtype=dtype).reshape(-1).view(np.uint8).data


def raw_image(data, dtype: str | np.dtype, shape, where: str) -> np.ndarray:
    """The image ``raw_bytes`` made, from its bytes (any buffer) and recorded (H, W, C) shape."""
    array = np.frombuffer(data, dtype=np.uint8)
    # a row of a shapes array gives Python ints by tolist(), many times cheaper than item by item
    shape = tuple(shape.tolist()) if isinstance(shape, np.ndarray) else tuple(int(v) for v in shape)
    if array.size != math.prod(shape) * np.dtype(dtype).itemsize:  # np.prod would make an array of it first
        raise ValueError(f"{where}: {array.size} bytes of image data for shape {shape} of {np.dtype(dtype)}")
    return array.view(dtype).reshape(shape)


def _encode_json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


CODECS: dict[str, Codec] = {
    "npy": Codec(encode_npy, decode_npy),
    "cls": Codec(lambda v: str(int(v)).encode("ascii"), lambda b: int(b)),
    "json": Codec(_encode_json, lambda b: json.loads(b.decode("utf-8"))),
    "txt": Codec(lambda v: str(v).encode("utf-8"), lambda b: b.decode("utf-8")),
}


def codec(extension: str) -> Codec:
    """The codec for ``extension`` (without the dot)."""
    try:
        return CODECS[extension]
    except KeyError:
        raise PackerError(f"no codec for .{extension} members; known: {', '.join(sorted(CODECS))}") from None


IMAGE_EXTENSIONS = {"raw": "npy", "jpeg": "jpg", "png": "png"}
"""The image codecs of one encoding, each with the extension of its bytes (the wds member ``KEY.EXT``).
Where a format stores bytes per image (lmdb, wds), raw images are ``.npy`` bytes; npy and hdf5 store
raw pixels as one N x H x W x C array."""

IMAGE_CODECS = (*IMAGE_EXTENSIONS, "source")
"""Every image codec: those of IMAGE_EXTENSIONS, and ``source`` (each image JPEG or PNG by its own
bytes, ``packer.pixels.source_codec``)."""


def image_extension(codec: str, data: bytes | memoryview | None = None) -> str:
    """The file extension of one stored image's bytes: the codec's, or for ``source`` ``jpg`` or
    ``png`` by the bytes themselves."""
    if codec != "source":
        return IMAGE_EXTENSIONS[codec]
    return "jpg" if data is not None and bytes(data[:3]) == b"\xff\xd8\xff" else "png"


PNG_COMPRESS_LEVEL = 1
"""zlib level of stored PNGs. Level 1 encodes several times faster than Pillow's default 6 for
files only slightly larger, and decoding costs the same at every level: conversion time is what it
buys."""

JPEG_SUBSAMPLING = "4:2:0"
"""Chroma subsampling of stored JPEGs, the libjpeg and Pillow default, fixed here so a Pillow
upgrade cannot change it. On 224 x 224 photographs 4:4:4 made files much larger for a slightly
smaller mean pixel error."""

JPEG_RESTART_BLOCKS = 1
"""A restart marker after every MCU of a stored JPEG (its DRI segment says 1). Each MCU is then
coded on its own, so a reader decodes only the MCUs a crop covers (``readers.augment.jpeg_region``):
a random training crop keeps only part of an image. It costs a few bytes a marker and little in a
whole decode (docs/BENCHMARKS.md, 2026-12-06); every JPEG decoder reads it."""

_PIL_MODES = {1: "L", 3: "RGB"}


def encode_image(pixels: np.ndarray, codec: str, quality: int = 90) -> bytes:
    """An HxWxC uint8 image (C = 1 or 3) as the bytes of ``codec``: a JPEG at ``quality``, a PNG, or
    ``.npy`` bytes for ``raw``. Equal pixels give equal bytes (no timestamps or other metadata)."""
    if codec == "raw":
        return encode_npy(pixels)
    _known(codec)
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] not in _PIL_MODES:
        raise ValueError(f"{codec} stores H x W x 1 or H x W x 3 uint8 images, not {pixels.dtype} {pixels.shape}")
    img = Image.fromarray(
        np.ascontiguousarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels), _PIL_MODES[pixels.shape[2]]
    )
    buf = io.BytesIO()
    if codec == "jpeg":
        img.save(buf, "JPEG", quality=quality, subsampling=JPEG_SUBSAMPLING, restart_marker_blocks=JPEG_RESTART_BLOCKS)
    else:
        img.save(buf, "PNG", compress_level=PNG_COMPRESS_LEVEL)
    return buf.getvalue()


def decode_image(data: bytes | memoryview | np.ndarray, codec: str, mode: str = "RGB") -> np.ndarray:
    """The HxWxC image in bytes (or any buffer) written by ``encode_image``: uint8 in ``mode`` (RGB
    or L) for jpeg and png, the stored array for raw. Pillow errors pass through."""
    if codec == "raw":
        return decode_npy(bytes(data))
    _known(codec)
    if codec == "source":
        raise ValueError(
            "--codec source images are decoded by packer.pixels.source_codec.decode_stored, which applies "
            "the EXIF orientation of the files it kept"
        )
    if codec == "jpeg":
        pixels = _decode_jpeg(data, mode)
        if pixels is not None:
            return pixels
    with Image.open(io.BytesIO(data)) as img:
        if img.mode != mode:
            img = img.convert(mode)
        pixels = np.asarray(img)
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


_LIBJPEG_MODES = {"RGB": ("RGB", ("YCbCr", "RGB")), "L": ("GRAY", ("Gray",))}
"""mode -> (simplejpeg's output colour space, the JPEG colour spaces that already hold that mode)."""


def _decode_jpeg(data: bytes | memoryview | np.ndarray, mode: str) -> Optional[np.ndarray]:
    """libjpeg-turbo's decoding of a JPEG already in ``mode`` (as packer stores them), without Pillow
    parsing the file in Python: the pixels Pillow's wheels give (libjpeg-turbo too, with the same
    IDCT and upsampling). None for another mode or colour space, more pixels than Pillow's
    decompression-bomb limit, or any error: Pillow decodes those as before, and explains errors."""
    if mode not in _LIBJPEG_MODES:
        return None
    out, sources = _LIBJPEG_MODES[mode]
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        if colorspace not in sources or (Image.MAX_IMAGE_PIXELS and width * height > Image.MAX_IMAGE_PIXELS):
            return None
        return simplejpeg.decode_jpeg(data, colorspace=out, strict=True)
    except (ValueError, RuntimeError):
        return None


def _known(codec: str) -> None:
    if codec not in IMAGE_CODECS:
        raise PackerError(
            f"unknown image codec {codec!r}; this packer knows {', '.join(IMAGE_CODECS)}. "
            "Upgrade packer to read outputs written with newer codecs"
        )
