"""A source folder's images as ``packer preview SOURCE`` draws them, before any conversion: each
decoded upright as the converter decodes it, labelled by its class folder, with its annotations
(``--annotations``) placed on its pixels as a conversion with ``--resize none`` places them
(``packer.targets.detection``), so a box that would land on the wrong pixels is seen before a
dataset is packed with it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from packer.config import DetectionConfig, PreprocessConfig
from packer.pixels import preprocess, read
from packer.sources.discover import Discovery, discover
from packer.spec.errors import DecodeError
from packer.targets.detection import Matched, match_targets, target_bytes

AS_STORED = PreprocessConfig(size=None, resize="none")
"""The images' own pixels, upright: nothing resized, so the boxes are drawn where they are."""


@dataclass
class SourceSample:
    """One source image as a sheet shows it: the fields of ``readers.preview.sheet.Shown``, which the
    CLI makes of it (the converter's modules never import the readers, ``tests/test_imports.py``)."""

    index: int
    key: str
    image: Optional[np.ndarray] = None
    label: int = -1
    target: Optional[dict] = None
    error: Optional[str] = None


@dataclass
class SourceView:
    """A source folder's images (``found``) and, with annotations, what they were matched with."""

    found: Discovery
    matched: Optional[Matched] = None
    detection: Optional[DetectionConfig] = None

    @property
    def categories(self) -> Optional[list[str]]:
        """The annotations' category names, by label."""
        return None if self.matched is None else list(self.matched.annotations.categories)


def open_source(folder: Path, annotations: Optional[Path] = None, coords: str = "auto") -> SourceView:
    """The images of ``folder`` (a class-folder tree or a flat folder), paired with ``annotations``
    (COCO, YOLO or VOC) if given. InputError where the folder holds no image."""
    found = discover(folder)
    if annotations is None:
        return SourceView(found)
    detection = DetectionConfig(str(annotations), coords=coords)
    matched = match_targets(found, detection)
    return SourceView(matched.found, matched, detection)


def read_source_samples(view: SourceView, indices: Sequence[int]) -> list[SourceSample]:
    """The images at ``indices`` of ``view``: a file that cannot be decoded, or whose annotation does
    not fit it, becomes a sample that says why, and the others are still read."""
    items = view.found.items
    shown = []
    for i in indices:
        item = items[int(i)]
        sample = SourceSample(int(i), item.relpath, label=int(item.label))
        try:
            decoded = preprocess.decode(read.read_source(item.path), AS_STORED, item.relpath)
            sample.image = np.ascontiguousarray(decoded.pixels)
            if view.matched is not None and view.detection is not None:
                record = view.matched.targets.get(item.index)
                stored, _, _ = target_bytes(record, decoded, AS_STORED, 0.0, item.relpath, view.detection.coords)
                sample.target = json.loads(stored)
        except DecodeError as e:
            sample.image, sample.error = None, e.reason
        shown.append(sample)
    return shown


__all__ = ["AS_STORED", "SourceSample", "SourceView", "open_source", "read_source_samples"]
