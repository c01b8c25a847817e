"""The manifest: one JSON file per output, written last, that makes a folder a packer output.

Readers trust nothing else: the format and its version, the field layout, the preprocessing, and
every shard with its sample count, files, sizes and SHA-256 checksums.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from packer.spec.class_map import class_map_digest
from packer.spec.codecs import IMAGE_CODECS
from packer.spec.entries import FileEntry, TextField
from packer.spec.errors import ManifestError
from packer.spec.field_kinds import TEXT_KINDS, fits
from packer.spec.registry import ENCODED_SINCE, FORMATS, TEXT_SINCE

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
"""Version of the manifest's own layout; each format has its own ``format_version`` too."""

SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")
"""What a shard file name may be made of."""

TEXT_FIELD_NAMES = ("text", "json", "target", "mask", "geometry")
"""Names of the variable-length fields a manifest may list besides image, label and key."""


@dataclass
class ShardEntry:
    """One shard in the manifest: its name, sample count and files."""

    name: str
    samples: int
    files: list[FileEntry]
    image_sources: Optional[dict] = None
    """``--codec source`` outputs: ``kept`` (runs ``[start, stop)`` of samples stored as their source
    files' bytes) and the counts re-encoded as ``jpeg`` and ``png``; None for other outputs."""

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "name": self.name,
            "samples": self.samples,
            "files": [f.to_dict() for f in self.files],
            **({"image_sources": self.image_sources} if self.image_sources is not None else {}),
        }

    def kept_sources(self) -> list[bool]:
        """Per sample of the shard, True where its image is its source file's bytes (``--codec source``)."""
        kept = [False] * self.samples
        for start, stop in (self.image_sources or {}).get("kept", []):
            kept[start:stop] = [True] * (stop - start)
        return kept

    def file(self, suffix: str) -> str:
        """The relative path of this shard's file whose name ends with ``suffix``."""
        for f in self.files:
            if f.path.endswith(suffix):
                return f.path
        raise ManifestError(f"shard {self.name} has no file ending in {suffix!r}")


@dataclass
class Manifest:
    """The parsed content of ``manifest.json``."""

    format: str
    format_version: int
    packer_version: str
    samples: int
    classes: Optional[list[str]]
    fields: dict[str, dict]
    preprocess: dict
    shards: list[ShardEntry]
    skipped: list[dict] = field(default_factory=list)
    source: dict = field(default_factory=dict)
    sharding: dict = field(default_factory=dict)
    class_counts: Optional[list[int]] = None
    stats: Optional[dict] = None
    """Pixel mean/std and original-size histograms (see docs/FORMATS.md); None in older outputs."""
    duplicates: list[list[str]] = field(default_factory=list)
    manifest_version: int = MANIFEST_VERSION
    annotations: Optional[dict] = None
    """Detection outputs: where the boxes came from and their categories (``packer.targets.detection``)."""
    history: list[dict] = field(default_factory=list)
    """What was done to the output after its conversion, oldest first (a repack: ``packer.repack``);
    absent from the file while empty."""

    def to_dict(self) -> dict:
        """JSON-ready form, keys in a fixed order so two equal runs write equal files."""
        return {
            "manifest_version": self.manifest_version,
            "format": self.format,
            "format_version": self.format_version,
            "packer_version": self.packer_version,
            "samples": self.samples,
            "classes": self.classes,
            "class_map_sha256": self.class_map_sha256,
            "class_counts": self.class_counts,
            "stats": self.stats,
            "fields": self.fields,
            "preprocess": self.preprocess,
            "sharding": self.sharding,
            "shards": [s.to_dict() for s in self.shards],
            "skipped": self.skipped,
            "duplicates": self.duplicates,
            "source": self.source,
            **({"annotations": self.annotations} if self.annotations is not None else {}),
            **({"history": self.history} if self.history else {}),
        }

    @classmethod
    def from_dict(cls, d: dict, where: str = MANIFEST_NAME) -> "Manifest":
        """Parse and check a manifest; ManifestError names ``where`` and what is wrong."""
        try:
            shards = [
                ShardEntry(
                    s["name"],
                    _whole(s["samples"], "a shard's samples", where),
                    [_file_entry(f, where) for f in s["files"]],
                    s.get("image_sources"),
                )
                for s in d["shards"]
            ]
            m = cls(
                format=d["format"],
                format_version=_whole(d["format_version"], "format_version", where, least=1),
                packer_version=d.get("packer_version", "?"),
                samples=_whole(d["samples"], "samples", where),
                classes=d.get("classes"),
                fields=d["fields"],
                preprocess=d["preprocess"],
                shards=shards,
                skipped=d.get("skipped", []),
                source=d.get("source", {}),
                sharding=d.get("sharding", {}),
                class_counts=d.get("class_counts"),
                stats=d.get("stats"),
                duplicates=d.get("duplicates", []),
                manifest_version=int(d.get("manifest_version", 1)),
                annotations=d.get("annotations"),
                history=d.get("history", []),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"{where} is not a valid packer manifest (bad or missing entry: {e})") from None
        names = m.classes
        if names is not None and (not isinstance(names, list) or not all(isinstance(c, str) for c in names)):
            raise ManifestError(f"{where}: classes must be a list of names; the manifest is damaged")
        recorded = d.get("class_map_sha256")  # absent in older manifests
        if recorded is not None and recorded != m.class_map_sha256:
            raise ManifestError(
                f"{where}: the class map does not match its recorded digest (class_map_sha256); "
                "the manifest was edited or is damaged"
            )
        _check_layout(m, where)
        _check_annotations(m, where)
        _check_shards(m, where)
        total = sum(s.samples for s in m.shards)
        if total != m.samples:
            raise ManifestError(f"{where}: shard sample counts add up to {total}, not {m.samples}")
        return m

    @property
    def class_map_sha256(self) -> Optional[str]:
        """The digest of the class map (``packer.spec.class_map.class_map_digest``); None when unlabelled."""
        return class_map_digest(self.classes)

    @property
    def image_codec(self) -> str:
        """How images are stored: ``raw``, ``jpeg`` or ``png`` (``raw`` when the manifest predates codecs
        or the output has no images)."""
        return self.fields["image"].get("codec", "raw") if self.has_image else "raw"

    @property
    def has_image(self) -> bool:
        """Whether samples have an image field (text-only outputs do not)."""
        return "image" in self.fields

    @property
    def text_fields(self) -> tuple[TextField, ...]:
        """The variable-length text, token-id and json fields, in stored order."""
        return tuple(TextField.from_dict(name, f) for name, f in self.fields.items() if name in TEXT_FIELD_NAMES)

    @property
    def sample_fields(self) -> tuple[str, ...]:
        """Names of the fields each sample returns, in order (``image``, ``text``, ``json``), before its label
        (an image's ``geometry`` is not one: readers give it in the meta dict)."""
        return tuple(
            name for name in self.fields if name == "image" or (name in TEXT_FIELD_NAMES and name != "geometry")
        )

    @property
    def shard_offsets(self) -> list[int]:
        """Index of each shard's first sample in the whole dataset, plus the total at the end."""
        offsets = [0]
        for s in self.shards:
            offsets.append(offsets[-1] + s.samples)
        return offsets


def _whole(value: Any, what: str, where: str, least: int = 0) -> int:
    """``value`` when it is a whole number of at least ``least`` as JSON writes one (not "40", 40.7
    or true), else ManifestError: a count read loosely would make a reader misplace samples."""
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ManifestError(
            f"{where}: {what} {value!r} is not a whole number of at least {least}; the manifest is damaged"
        )
    return value


def _file_entry(d: dict, where: str) -> FileEntry:
    """One file record of the manifest, its numbers checked."""
    crc = d.get("structure_crc32")
    if crc is not None and _whole(crc, "a file's structure_crc32", where) >= 1 << 32:
        raise ManifestError(f"{where}: structure_crc32 {crc} is not a CRC-32; the manifest is damaged")
    return FileEntry(d["path"], _whole(d["bytes"], "a file's bytes", where), d["sha256"], crc)


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _check_shards(m: "Manifest", where: str) -> None:
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


def _check_layout(m: "Manifest", where: str) -> None:
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
    if "image" in m.fields or not m.text_fields:  # text-only outputs have no image field
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


def _check_annotations(m: "Manifest", where: str) -> None:
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


def write_manifest(directory: str | os.PathLike, manifest: Manifest) -> Path:
    """Write ``manifest.json`` atomically (temporary file, then rename) and return its path.

    No fsync: like the shard files, it relies on the page cache. An interrupted or killed process
    never leaves a manifest behind; after a power loss, ``packer verify`` finds damaged shards.
    """
    path = Path(directory) / MANIFEST_NAME
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest.to_dict(), f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)
    return path


def read_manifest(directory: str | os.PathLike, expect_format: Optional[str] = None) -> Manifest:
    """Read and check the manifest of a packed output.

    Raises ManifestError when the folder is not a packer output, is incomplete, is of another
    format than ``expect_format``, or was written by a newer packer.
    """
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if not directory.is_dir():
        raise ManifestError(f"{directory} is not a folder; expected a packer output folder")
    if not path.is_file():
        splits = _split_names(directory)
        if splits:
            raise ManifestError(
                f"{directory} holds the splits {', '.join(splits)} of one conversion, each a packer "
                f"output: open one of them, e.g. {directory / splits[0]}"
            )
        raise ManifestError(
            f"{directory} has no {MANIFEST_NAME}: it is not a packer output, or its conversion did not finish"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError(f"{path} cannot be read as JSON: {e}") from None
    return parse_manifest(text, str(path), expect_format, str(directory))


def _split_names(directory: Path) -> list[str]:
    """The split names listed in ``directory``'s splits.json (``packer.ops.splits``), if it has one."""
    try:
        data = json.loads((directory / "splits.json").read_text(encoding="utf-8"))
        return [str(name) for name in data["splits"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def parse_manifest(
    text: str, where: str, expect_format: Optional[str] = None, output: Optional[str] = None
) -> Manifest:
    """Parse and check the text of a ``manifest.json`` read from ``where`` (a path or a URL), the
    manifest of ``output``; ManifestError as ``read_manifest``."""
    path, directory = where, output or where
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as e:
        raise ManifestError(f"{path} cannot be read as JSON: {e}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path} is not a packer manifest")
    version = data.get("manifest_version", 1)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ManifestError(f"{path}: manifest_version {version!r} is not a whole number")
    if version > MANIFEST_VERSION:
        # Checked before parsing: a newer manifest may have a different layout.
        raise ManifestError(
            f"{path} has manifest version {version}; this packer reads up to "
            f"{MANIFEST_VERSION}. Upgrade packer to read it."
        )
    manifest = Manifest.from_dict(data, str(path))
    if manifest.format not in FORMATS:
        raise ManifestError(f"{path}: unknown format {manifest.format!r}; known: {', '.join(FORMATS)}")
    newest = FORMATS[manifest.format].newest
    if manifest.format_version > newest:
        raise ManifestError(
            f"{path}: {manifest.format} format version {manifest.format_version} is newer than this packer "
            f"reads ({newest}). Upgrade packer to read it."
        )
    if expect_format is not None and manifest.format != expect_format:
        raise ManifestError(f"{directory} holds the {manifest.format} format, not {expect_format}")
    return manifest


def unsafe_file(path: Path, root: Path) -> Optional[str]:
    """Why a file an output lists must not be opened, or None: a FIFO or device would block or
    feed any reader forever, a folder is not a shard file, and a symbolic link may point outside
    the output (the manifest's names are plain files inside it). A missing file is not unsafe."""
    try:
        if path.is_symlink() and not path.resolve().is_relative_to(root.resolve()):
            return "is a symbolic link to a file outside the output"
        st = path.stat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a FIFO, device or folder)"
    return None


def file_entry(
    directory: Path, relpath: str, sha256: Optional[str] = None, structure: Optional[Callable[[Path], int]] = None
) -> FileEntry:
    """Size and SHA-256 of one written file, for the manifest (the file is read for its SHA-256
    unless the writer hashed it as it wrote it: ``sha256``), and its structure checksum when the
    format has one (``structure``, see FormatSpec)."""
    path = directory / relpath
    return FileEntry(
        relpath, path.stat().st_size, sha256 or sha256_of(path), structure(path) if structure is not None else None
    )


def sha256_of(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()
