"""The manifest: one JSON file per output, written last, that makes a folder a packer output.

Readers trust nothing else: the format and its version, the field layout, the preprocessing, and
every shard with its sample count, files, sizes and SHA-256 checksums. This module reads and writes
it; its checks are ``packer.spec.manifest_checks``, its files' sizes and checksums
``packer.spec.listed_files``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from packer.spec.class_map import class_map_digest
from packer.spec.entries import FileEntry, TextField
from packer.spec.errors import ManifestError
from packer.spec.manifest_checks import (
    TEXT_FIELD_NAMES,
    check_annotations,
    check_layout,
    check_shards,
    checked_file_entry,
    whole_number,
)
from packer.spec.registry import FORMATS, TOKENS_SINCE
from packer.spec.token_blocks import TokenSection

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
"""Version of the manifest's own layout; each format has its own ``format_version`` too."""


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
    tokens: Optional[TokenSection] = None
    """A token output's blocks: how the corpus was tokenized and packed (``packer.spec.token_blocks``);
    its samples are blocks and it has no ``fields``."""
    image_hashes: Optional[dict] = None
    """The file of the images' perceptual hashes: ``path``, ``bytes``, ``sha256``, ``kind`` (how they
    were hashed) and ``looks`` (hashes an image); None where there is none (``packer.output.image_hashes``)."""
    near_duplicates: Optional[dict] = None
    """The near-duplicate images those hashes found: ``kind``, ``distance`` (bits) and ``groups`` of keys."""

    @property
    def side_files(self) -> list[str]:
        """The files of the output the manifest lists beside its shards' (``image_hashes.npy``)."""
        return [self.image_hashes["path"]] if self.image_hashes is not None else []

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
            **({"tokens": self.tokens.to_dict()} if self.tokens is not None else {}),
            **({"image_hashes": self.image_hashes} if self.image_hashes is not None else {}),
            **({"near_duplicates": self.near_duplicates} if self.near_duplicates is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict, where: str = MANIFEST_NAME) -> "Manifest":
        """Parse and check a manifest; ManifestError names ``where`` and what is wrong."""
        try:
            shards = [
                ShardEntry(
                    s["name"],
                    whole_number(s["samples"], "a shard's samples", where),
                    [checked_file_entry(f, where) for f in s["files"]],
                    s.get("image_sources"),
                )
                for s in d["shards"]
            ]
            m = cls(
                format=d["format"],
                format_version=whole_number(d["format_version"], "format_version", where, least=1),
                packer_version=d.get("packer_version", "?"),
                samples=whole_number(d["samples"], "samples", where),
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
                tokens=TokenSection.from_dict(d["tokens"], where) if "tokens" in d else None,
                image_hashes=_image_hashes(d.get("image_hashes"), where),
                near_duplicates=_near_duplicates(d.get("near_duplicates"), where),
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
        check_layout(m, where)
        check_annotations(m, where)
        check_shards(m, where)
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
    def uint8_images(self) -> bool:
        """Whether samples have images stored as uint8 (which readers normalize as they read them)."""
        return self.has_image and self.fields["image"]["dtype"] == "uint8"

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
    if manifest.tokens is not None and (
        not FORMATS[manifest.format].token_writer or manifest.format_version < TOKENS_SINCE
    ):
        raise ManifestError(
            f"{path}: a {manifest.format} output of format version {manifest.format_version} cannot hold "
            "token blocks; the manifest is damaged"
        )
    if expect_format is not None and manifest.format != expect_format:
        raise ManifestError(f"{directory} holds the {manifest.format} format, not {expect_format}")
    return manifest


def _image_hashes(entry: object, where: str) -> Optional[dict]:
    """The manifest's ``image_hashes`` entry, checked: a plain file name of the output, its size and SHA-256."""
    if entry is None:
        return None
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("path"), str)
        or "/" in entry["path"]
        or entry["path"].startswith(".")
        or not isinstance(entry.get("bytes"), int)
        or not isinstance(entry.get("sha256"), str)
    ):
        raise ManifestError(f"{where}: its image_hashes entry is not a file of the output with a size and SHA-256")
    return entry


def _near_duplicates(entry: object, where: str) -> Optional[dict]:
    """The manifest's ``near_duplicates`` entry, checked: a distance in bits and groups of keys."""
    if entry is None:
        return None
    groups = entry.get("groups") if isinstance(entry, dict) else None
    distance = entry.get("distance") if isinstance(entry, dict) else None
    if (
        not isinstance(distance, int)
        or isinstance(distance, bool)
        or not 0 <= distance <= 64
        or not isinstance(groups, list)
        or not all(isinstance(g, list) and all(isinstance(k, str) for k in g) for g in groups)
    ):
        raise ManifestError(f"{where}: its near_duplicates entry is not a distance in bits with groups of sample keys")
    return entry
