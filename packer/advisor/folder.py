"""The baseline packer replaces: a Dataset that decodes and preprocesses each image from its own
file on every access, with a packed output's own preprocessing, so that comparisons are fair."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Optional, Sequence

import torch
from torch.utils.data import Dataset

from packer.config import PreprocessConfig
from packer.pixels.preprocess import load_image
from packer.sources.discover import discover
from packer.spec.errors import ConfigError, InputError
from packer.spec.manifest import Manifest
from readers.datasets.tensors import ImageConverter


def converter_for(preprocess: dict, normalize: bool = True) -> ImageConverter:
    """The ImageConverter a reader of an output with this manifest ``preprocess`` entry would use."""
    if preprocess.get("normalize") == "auto":
        raise ConfigError(
            "--normalize auto is only known once an output is converted; profile or compare against "
            "the converted output, whose manifest holds the computed mean and std"
        )
    # ImageConverter reads only the manifest's preprocess entry.
    return ImageConverter(SimpleNamespace(preprocess=preprocess), normalize)  # type: ignore[arg-type]


class FolderDataset(Dataset):
    """``(image, label)`` per source file: read, decode, resize (``preprocess``) and convert to a CHW
    tensor as a packer reader would give it (normalized float32, or the stored pixels with
    ``normalize=False``), all of it again on every access. ``items`` are ``(path, label)`` pairs.
    """

    def __init__(self, items: Sequence[tuple[str, int]], preprocess: PreprocessConfig, normalize: bool = True) -> None:
        self.items = list(items)
        self.preprocess = preprocess
        self.convert = converter_for(preprocess.to_dict(), normalize)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        return self.convert(load_image(path, self.preprocess)), label


def folder_items(source: str | os.PathLike, manifest: Optional[Manifest] = None) -> list[tuple[str, int]]:
    """``(path, label)`` of every image under ``source`` (labels 0 when unlabelled), leaving out the
    files that ``manifest``'s conversion skipped as unusable, so a loader over them never fails.

    Raises InputError when there is no image.
    """
    found = discover(source)
    skipped = {s["path"] for s in manifest.skipped} if manifest is not None else set()
    items = [(i.path, max(i.label, 0)) for i in found.items if i.relpath not in skipped and i.path not in skipped]
    if not items:
        raise InputError(f"no usable images found in {source}")
    return items
