"""The samples of a packer output read back for another layout: a repack worker's source.

Each sample is read with its format's stock-library scanner (the one ``verify`` uses), checked
against the CRC-32 stored beside it, and turned into the ``Sample`` the target writer stores: its
stored bytes kept where the target stores the same thing (raw pixels, or the JPEG, PNG or source
file bytes of the same codec), decoded and encoded again only where the codec changes. Labels,
keys and every other field (text, token ids, json, boxes, masks, geometry) are stored bytes and
pass through untouched.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
from PIL import Image

from packer.pixels.source_codec import decode_stored
from packer.records import Sample, SourceItem, StoredSample
from packer.spec.checksums import stored_crc32
from packer.spec.codecs import encode_image
from packer.spec.errors import ManifestError
from packer.spec.manifest import ShardEntry
from packer.spec.registry import get_format
from packer.spec.sample_layout import ImageStorage, SampleLayout


@dataclass(frozen=True)
class RepackJob:
    """What a repack worker reads: the source output's folder, format and layout, and its shards
    that hold the job's samples, each with the dataset index of its first sample; ``labels``, the
    new label of each old one where labels change (``packer combine``), else None."""

    root: str
    format: str
    layout: SampleLayout
    shards: tuple[tuple[ShardEntry, int], ...]
    labels: Optional[tuple[int, ...]] = None


def overlapping(shards: list[ShardEntry], first: int, stop: int) -> tuple[tuple[ShardEntry, int], ...]:
    """The shards (with their first index) that hold any of the dataset indices ``[first, stop)``."""
    found, start = [], 0
    for shard in shards:
        if start < stop and start + shard.samples > first:
            found.append((shard, start))
        start += shard.samples
    return tuple(found)


def stored_samples(
    job: RepackJob, items: tuple[SourceItem, ...], target: SampleLayout
) -> Iterator[tuple[SourceItem, Sample, bool]]:
    """``(item, sample for target, kept)`` for each of ``items`` (dataset indices in order, one run),
    ``kept`` telling whether the image is a source file's own bytes (``--codec source``). A sample
    whose stored CRC-32 does not match is refused (ManifestError): a damaged sample is never copied."""
    if not items:
        return
    first, stop = items[0].index, items[-1].index + 1
    spec = get_format(job.format)
    root = Path(job.root)
    position = 0
    for shard, start in job.shards:
        lo, hi = max(first - start, 0), min(stop - start, shard.samples)
        kept_runs = (shard.image_sources or {}).get("kept", [])
        scan = spec.scan(root, shard, job.layout, lo)
        try:
            for stored in _readable(scan, job.root, shard.name):
                if stored.local < lo:
                    continue
                if stored.local >= hi:
                    break
                item = items[position]
                position += 1
                where = f"{job.root}: {shard.name} sample {stored.local} ({stored.key})"
                fields = {name: bytes(value) for name, value in stored.fields.items()}
                # -1: no checksum recorded (tar shards of packer 0.1); there is nothing to compare then.
                if stored.crc32 >= 0 and stored_crc32(stored.encoded, stored.image, fields.values()) != stored.crc32:
                    raise ManifestError(
                        f"{where} does not match its CRC-32; the output is damaged (run packer "
                        "verify on it), so it is not repacked"
                    )
                kept = any(a <= stored.local < b for a, b in kept_runs)
                image, encoded = _image(stored, job.layout, target, where)
                label = job.labels[stored.label] if job.labels is not None and stored.label >= 0 else stored.label
                yield item, Sample(item.index, stored.key, image, label, encoded, fields), kept
                if stored.local + 1 >= hi:
                    break  # the run is done: the next sample is not read at all
        finally:
            scan.close()  # type: ignore[attr-defined]
    if position != len(items):
        raise ManifestError(
            f"{job.root}: {len(items) - position} of the samples its manifest lists could not be "
            "read back; the output is damaged (run packer verify on it)"
        )


def _readable(scan: Iterator[StoredSample], root: str, shard: str) -> Iterator[StoredSample]:
    """``scan``'s samples, its library's errors (a key or file that is not there) a ManifestError
    naming the shard: an output of a packer before 0.2, without per-sample checksums, or a damaged one."""
    try:
        yield from scan
    except (KeyError, ValueError, ManifestError) as e:
        raise ManifestError(
            f"{root}: {shard} cannot be read back ({e}): a damaged output (run packer verify on it), "
            "or one of a packer before 0.2, which recorded no per-sample checksums; convert its "
            "source folder again"
        ) from None


def _image(
    stored: StoredSample, source: SampleLayout, target: SampleLayout, where: str
) -> tuple[Optional[np.ndarray], Optional[bytes]]:
    """``(image, encoded)`` of the target sample: raw pixels, or an encoded image's bytes with an
    array of its shape only (what the writers check and index), as the converter's worker makes them."""
    if target.image is ImageStorage.NONE:
        return None, None
    if source.image is not ImageStorage.ENCODED:
        pixels = stored.image
        assert pixels is not None
        if target.image is ImageStorage.ENCODED:
            return pixels, encode_image(np.ascontiguousarray(pixels), target.codec.name, target.codec.quality)
        return pixels, None
    data = bytes(stored.encoded or b"")
    if target.image is ImageStorage.ENCODED and target.codec.name == source.codec.name:
        return _shape_only(stored, source, data, where), data  # the same bytes: nothing decoded
    try:
        pixels = decode_stored(data, source.codec.name, source.mode)
    except Exception as e:  # noqa: BLE001 - any decoder error: the stored image is damaged
        raise ManifestError(f"{where} does not decode ({e}); the output is damaged (run packer verify on it)") from None
    if target.image is ImageStorage.ENCODED:
        return pixels, encode_image(pixels, target.codec.name, target.codec.quality)
    return pixels, None


def _shape_only(stored: StoredSample, source: SampleLayout, data: bytes, where: str) -> np.ndarray:
    """An array of the (H, W, C) a stored encoded image decodes to, without its pixels: from the
    shard's index of sizes, the layout's fixed shape, or the file's header (older outputs)."""
    shape = stored.shape or source.shape
    if shape is None:
        try:
            with Image.open(io.BytesIO(data)) as img:
                shape = (img.size[1], img.size[0], source.channels)
        except Exception as e:  # noqa: BLE001 - any decoder error: the stored image is damaged
            raise ManifestError(
                f"{where} is not an image ({e}); the output is damaged (run packer verify on it)"
            ) from None
    return np.broadcast_to(np.zeros((1, 1, 1), np.uint8), tuple(shape))
