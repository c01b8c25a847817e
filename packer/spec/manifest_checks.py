"""The checks of a manifest as it is parsed (``Manifest.from_dict``): whole numbers, file records,
shards and files listed once with SHA-256s, plain file names, the field layout, the normalization,
a detection output's categories. Each raises ManifestError naming ``where`` and what is wrong."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from packer.spec.codecs import IMAGE_CODECS
from packer.spec.entries import FileEntry
from packer.spec.errors import ManifestError
from packer.spec.field_kinds import TEXT_KINDS, fits
from packer.spec.registry import ENCODED_SINCE, TEXT_SINCE

if TYPE_CHECKING:  # the manifest imports these checks
    from packer.spec.manifest import Manifest

SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")
"""What a shard file name may be made of."""

TEXT_FIELD_NAMES = ("text", "json", "target", "mask", "geometry")
"""Names of the variable-length fields a manifest may list besides image, label and key."""


def whole_number(value: Any, what: str, where: str, least: int = 0) -> int:
    """``value`` when it is a whole number of at least ``least`` as JSON writes one (not "40", 40.7
    or true), else ManifestError: a count read loosely would make a reader misplace samples."""
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ManifestError(
            f"{where}: {what} {value!r} is not a whole number of at least {least}; the manifest is damaged"
        )
    return value


def checked_file_entry(d: dict, where: str) -> FileEntry:
    """One file record of the manifest, its numbers checked."""
    crc = d.get("structure_crc32")
    if crc is not None and whole_number(crc, "a file's structure_crc32", where) >= 1 << 32:
        raise ManifestError(f"{where}: structure_crc32 {crc} is not a CRC-32; the manifest is damaged")
    return FileEntry(d["path"], whole_number(d["bytes"], "a file's bytes", where), d["sha256"], crc)


_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_shards(m: "Manifest", where: str) -> None:
    """Each shard once, each file once, checksums that are SHA-256s, and no shard holding more
    samples than it has bytes (every format stores at least a label per sample)."""
    names = [s.name for s in m.shards]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ManifestError(f"{where}: shard {', '.join(twice)} is listed more than once; the manifest is damaged")
    paths = [f.path for s in m.shards for f in s.files]
    if len(set(paths)) != len(paths):
        twice = sorted({p for p in paths if paths.count(p) > 1})
        raise ManifestError(f"{where}: file {', '.join(twice)} is listed more than once; the manifest is damaged")
    for shard in m.shards:
        for f in shard.files:
            if not isinstance(f.sha256, str) or not _SHA256.fullmatch(f.sha256):
                raise ManifestError(f"{where}: {f.path} has no SHA-256 (64 hex digits); the manifest is damaged")
        if shard.samples > sum(f.bytes for f in shard.files):
            raise ManifestError(
                f"{where}: shard {shard.name} cannot hold {shard.samples} samples in "
                f"{sum(f.bytes for f in shard.files)} bytes; the manifest is damaged"
            )


def check_layout(m: "Manifest", where: str) -> None:
    """Types and names a reader relies on: plain file names inside the output, a known image dtype."""
    for shard in m.shards:
        for f in shard.files:
            if not SAFE_NAME.fullmatch(f.path) or f.path.startswith("."):
                # Packer writes only shard-NNNNN.*: anything else would be a path, or a name that a
                # pipe: command or a URL could misread (quotes, $(...), spaces, ?, #).
                raise ManifestError(f"{where}: file path {f.path!r} is not a plain name inside the output")
    if not isinstance(m.fields, dict):
        raise ManifestError(f"{where}: fields is not an object")
    _check_text_fields(m, where)
    if m.tokens is not None:
        if m.fields:
            raise ManifestError(
                f"{where}: a token output's samples are blocks and have no fields; the manifest is damaged"
            )
    elif "image" in m.fields or not m.text_fields:  # text-only outputs have no image field
        _check_image_field(m, where)
    if not isinstance(m.preprocess, dict):
        raise ManifestError(f"{where}: preprocess is not an object")
    _check_normalize(m.preprocess.get("normalize"), where)
    if m.stats is not None and not isinstance(m.stats, dict):
        raise ManifestError(f"{where}: stats is not an object")


def _check_normalize(norm: Any, where: str) -> None:
    """The normalization readers apply: per-channel means and positive stds, finite numbers (a std of
    0 would turn every batch into NaN), or none, or ``auto`` not yet computed."""
    if norm is None or norm == "auto":
        return
    mean, std = (norm.get("mean"), norm.get("std")) if isinstance(norm, dict) else (None, None)
    if not isinstance(mean, (list, tuple)) or not isinstance(std, (list, tuple)):
        mean = std = ()
    numbers = [v for v in (*mean, *std) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if (
        not mean
        or len(mean) != len(std)
        or len(numbers) != 2 * len(mean)
        or not all(math.isfinite(v) for v in numbers)
        or not all(v > 0 for v in std)
    ):
        raise ManifestError(
            f"{where}: preprocess.normalize {norm!r} is not per-channel finite means and positive "
            "stds; the manifest is damaged"
        )


def _check_text_fields(m: "Manifest", where: str) -> None:
    for name in TEXT_FIELD_NAMES:
        f = m.fields.get(name)
        if f is None:
            continue
        if m.format_version < TEXT_SINCE:
            raise ManifestError(
                f"{where}: field {name} needs format version {TEXT_SINCE} or later, not "
                f"{m.format_version}; the manifest is damaged"
            )
        if not isinstance(f, dict) or f.get("kind") not in TEXT_KINDS or not fits(f["kind"], name):
            raise ManifestError(
                f"{where}: fields.{name} {f!r} is not a field this packer reads "
                f"(kind one of {', '.join(TEXT_KINDS)}). Upgrade packer to read it."
            )


def check_annotations(m: "Manifest", where: str) -> None:
    """A detection output's ``annotations`` name its categories (what its labels index)."""
    if "target" not in m.fields:
        return
    names = (m.annotations or {}).get("categories")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ManifestError(
            f"{where}: a detection output needs annotations.categories, a list of names; the manifest is damaged"
        )


def _check_image_field(m: "Manifest", where: str) -> None:
    image = m.fields.get("image")
    if not isinstance(image, dict):
        raise ManifestError(f"{where}: fields.image is missing")
    try:
        dtype = np.dtype(image.get("dtype"))
    except TypeError:
        dtype = None
    if dtype is None or dtype.hasobject or dtype.kind not in "uif":
        raise ManifestError(f"{where}: fields.image.dtype {image.get('dtype')!r} is not a plain number type")
    shape = image.get("shape")
    if shape is not None and (
        not isinstance(shape, list) or len(shape) != 3 or not all(isinstance(v, int) and v > 0 for v in shape)
    ):
        raise ManifestError(f"{where}: fields.image.shape {shape!r} is not [H, W, C]")
    codec = image.get("codec", "raw")
    if codec not in IMAGE_CODECS:
        raise ManifestError(
            f"{where}: fields.image.codec {codec!r} is unknown to this packer, which reads "
            f"{', '.join(IMAGE_CODECS)}. Upgrade packer to read it."
        )
    if codec != "raw" and (dtype != np.uint8 or m.format_version < ENCODED_SINCE):
        raise ManifestError(
            f"{where}: {codec} images need uint8 storage and format version {ENCODED_SINCE} or "
            f"later, not {dtype} and version {m.format_version}; the manifest is damaged"
        )
