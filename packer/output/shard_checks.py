"""The checks ``packer verify`` makes of one shard: its files against the manifest (``check_files``),
then its samples read back with the format's stock library (``check_samples``): each sample's stored
CRC-32, its decoded shape or text, its indexed size; a token shard's blocks, document starts and ids.
``packer.output.verify`` runs them over a whole output, each shard in a child process it can stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from packer.pixels.source_codec import decode_stored
from packer.records import StoredSample
from packer.spec.checksums import stored_crc32
from packer.spec.entries import TextField
from packer.spec.listed_files import sha256_of, unsafe_file
from packer.spec.manifest import Manifest, ShardEntry
from packer.spec.registry import FORMATS, SOURCE_SINCE
from packer.spec.sample_layout import SampleLayout


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an output: where (shard, file or sample) and what."""

    shard: str
    message: str
    sample: Optional[int] = None
    key: Optional[str] = None

    def __str__(self) -> str:
        where = self.shard if self.sample is None else f"{self.shard} sample {self.sample}"
        if self.key:
            where += f" ({self.key})"
        return f"{where}: {self.message}"


def check_files(root: Path, shard: ShardEntry) -> list[Problem]:
    """Existence, size and SHA-256 of each of a shard's files."""
    problems = []
    for f in shard.files:
        path = root / f.path
        unsafe = unsafe_file(path, root)
        if unsafe:
            problems.append(Problem(shard.name, f"{f.path} {unsafe}"))
            continue
        if not path.is_file():
            problems.append(Problem(shard.name, f"{f.path} is missing"))
            continue
        size = path.stat().st_size
        if size != f.bytes:
            kind = "truncated" if size < f.bytes else "longer than recorded"
            problems.append(Problem(shard.name, f"{f.path} is {kind}: {size} bytes, the manifest says {f.bytes}"))
        elif sha256_of(path) != f.sha256:
            problems.append(Problem(shard.name, f"{f.path} has changed: its SHA-256 does not match the manifest"))
    return problems


def check_samples(
    root: Path,
    manifest: Manifest,
    shard: ShardEntry,
    progress: Optional[Callable[[int], None]] = None,
    labels: Optional[list[int]] = None,
    intact: bool = False,
) -> list[Problem]:
    """Decode every sample of a shard and compare it with its stored checksum and the recorded layout.

    The labels read are appended to ``labels`` when given. ``intact``: the shard's files were found
    as the manifest records them (``check_files``), so the format may read them by its own index
    (``FormatSpec.scan_intact``).
    """
    if manifest.tokens is not None:
        return check_token_shard(root, manifest, shard, progress)
    layout = SampleLayout.from_manifest(manifest)
    sized = layout.sizes_indexed and manifest.format_version >= SOURCE_SINCE  # every image's size is indexed
    problems: list[Problem] = []
    position = 0
    try:
        spec = FORMATS[manifest.format]
        for s in spec.scan_intact(root, shard, layout) if intact else spec.scan(root, shard, layout):
            position = s.local + 1
            if labels is not None:
                labels.append(s.label)
            message = _sample_problem(s, layout, sized)
            if message:
                problems.append(Problem(shard.name, message, s.local, s.key))
            if progress is not None:
                progress(1)
    except Exception as e:  # any decoder error is a finding to report, never a crash of verify
        problems.append(Problem(shard.name, f"unreadable from sample {position} on: {type(e).__name__}: {e}", position))
    return problems


def check_token_shard(
    root: Path, manifest: Manifest, shard: ShardEntry, progress: Optional[Callable[[int], None]] = None
) -> list[Problem]:
    """A token shard read with the format's stock library: its blocks inside its stream, its document
    starts in order, every id within the vocabulary (``packer.spec.token_shards``)."""
    assert manifest.tokens is not None
    try:
        opened = FORMATS[manifest.format].open_token_shard(root, shard.name)
        message = opened.check(manifest.tokens, shard.samples, shard.name)
    except Exception as e:  # noqa: BLE001 - a damaged file is a finding, never a crash of verify
        message = f"unreadable: {type(e).__name__}: {e}"
    if progress is not None:
        progress(shard.samples)
    return [Problem(shard.name, message.removeprefix(f"{shard.name}: "))] if message else []


def _sample_problem(s: StoredSample, layout: SampleLayout, sized: bool = False) -> str:
    """What is wrong with one stored sample, or ``""``. Checked against the stored CRC-32 first (over
    the image's stored bytes and then each text field's), then decoded to check its shape or text,
    and with ``sized`` its size against the shard's index of sizes."""
    if stored_crc32(s.encoded, s.image, (s.fields[f.name] for f in layout.text)) != s.crc32:
        what = "image bytes" if s.encoded is None else f"{layout.codec.name} image bytes"
        what = "stored bytes" if layout.text else what
        return f"{what} do not match their stored CRC-32 (damaged)"
    for f in layout.text:
        message = _text_problem(f, s.fields[f.name])
        if message:
            return message
    if not layout.has_image:
        return ""
    image = s.image
    if s.encoded is not None:
        try:
            image = decode_stored(s.encoded, layout.codec.name, layout.mode)
        except Exception as e:  # noqa: BLE001 - Pillow reports bad data with many types
            return f"image does not decode as {layout.codec.name}: {type(e).__name__}: {e}"
    if (
        image is None
        or image.dtype != layout.np_dtype
        or image.ndim != 3
        or (layout.shape is not None and image.shape != layout.shape)
    ):
        found = "missing" if image is None else f"{image.dtype} {image.shape}"
        return f"image is {found}, expected {layout.dtype} {layout.shape or '(H, W, C)'}"
    if sized and s.shape != tuple(image.shape):
        recorded = "no size" if s.shape is None else f"{s.shape}"
        return f"image is {tuple(image.shape)}, its shard's index of sizes has {recorded}"
    return ""


def _text_problem(f: TextField, data: bytes) -> str:
    """What is wrong with one text field's stored bytes, or ``""`` (its kind's check)."""
    return f.kind_of.problem(f, data)
