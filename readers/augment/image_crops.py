"""What a reader holds of its crops and flips: the options asked for, checked against the output,
drawn per ``(seed, epoch, index)``, rendered onto each stored image, and the targets, masks and
geometry moved with the pixels. One object, so readers share it instead of inheriting it."""

from __future__ import annotations

import copy
from typing import Any, Optional

import numpy as np
import torch

from packer.spec.errors import ConfigError
from packer.spec.manifest import Manifest
from packer.spec.sample_layout import SampleLayout
from readers.augment.buckets import AspectBuckets
from readers.augment.crops import Augment, CenterCrop, Placement, RandomResizedCrop
from readers.augment.placing import place_geometry, place_mask, place_target
from readers.augment.render import render, stored_size, upright_stored


class ImageCrops:
    """The crop and flip of one reader's images (``augment``), for an output of images in ``mode``
    stored with ``codec``. ``fill``: a segmentation mask's value where a centre crop pads (its ignore
    index); ``min_visibility``: the share of a box a crop must leave for it to stay (the conversion's)."""

    def __init__(
        self, augment: Augment, mode: str, codec: str, fill: Optional[int] = None, min_visibility: float = 0.0
    ) -> None:
        self.augment, self.mode, self.codec = augment, mode, codec
        self.fill, self.min_visibility = fill, float(min_visibility)
        self.bucket_of_index: Optional[np.ndarray] = None
        """With ``AspectBuckets``: each sample's bucket (``with_buckets``), so a batch of one bucket is
        made as one tensor of its resolution."""

    def with_buckets(self, bucket_ids: np.ndarray) -> ImageCrops:
        """A copy that knows each sample's bucket (``bucket_ids[index]``) for whole-batch reads."""
        other = copy.copy(self)
        other.bucket_of_index = np.asarray(bucket_ids, dtype=np.int32 if len(bucket_ids) < 2**31 else np.int64)
        return other

    def batch_resolution(self, indices: Any) -> Optional[tuple[int, int]]:
        """(height, width) of every image of the batch at ``indices`` when they all share one bucket,
        else None (their sizes differ: the batch is made sample by sample)."""
        if self.bucket_of_index is None or not len(indices):
            return None
        ids = self.bucket_of_index[np.asarray(indices, dtype=np.int64)]
        if (ids != ids[0]).any():
            return None
        return self.augment.crop.resolutions[int(ids[0])]  # type: ignore[union-attr]

    @classmethod
    def asked(
        cls, crop: Any, flip: bool, root: Any, manifest: Manifest, layout: SampleLayout, fill: Optional[int] = None
    ) -> Optional[ImageCrops]:
        """The crop and flip asked for, checked against what the output at ``root`` stores; None for neither."""
        if crop is None and not flip:
            return None
        if crop is not None and not isinstance(crop, (RandomResizedCrop, CenterCrop, AspectBuckets)):
            raise ConfigError(
                f"crop takes readers.RandomResizedCrop(size) or readers.CenterCrop(size), not "
                f"{type(crop).__name__}; a torchvision transform goes to transform="
            )
        what = "crop=" if crop is not None else "flip=True"
        if not manifest.has_image:
            raise ConfigError(f"{what} needs images, and {root} stores none")
        if layout.np_dtype != np.uint8:
            raise ConfigError(
                f"{what} crops and flips 8-bit images, and {root} stores {layout.np_dtype} "
                "(--dtype): convert with --dtype uint8 (readers normalize it as the manifest says)"
            )
        visibility = float((manifest.annotations or {}).get("min_visibility", 0.0))
        return cls(Augment(crop, bool(flip)), layout.mode, layout.codec.name, fill, visibility)

    @property
    def size(self) -> Optional[tuple[int, int]]:
        """(height, width) of every image out, or None without a crop (images keep their sizes)."""
        return self.augment.size

    @property
    def random(self) -> bool:
        """True when the result depends on the epoch (a random crop, or the flip)."""
        return self.augment.random

    def placed(
        self, stored: Any, seed: int, index: int, epoch: int, codec: Optional[str] = None
    ) -> tuple[Any, str, Placement, tuple[int, int]]:
        """One stored image made ready to crop (``upright_stored``: its codec may change), the Placement
        drawn for ``(seed, epoch, index)``, and the (height, width) it was drawn for; ``render`` makes
        the image. ``codec`` defaults to the output's."""
        stored, codec = upright_stored(stored, codec or self.codec, self.mode)
        h, w = stored_size(stored, codec)
        return stored, codec, self.augment.placement(seed, epoch, index, h, w), (h, w)

    def image(
        self, stored: Any, seed: int, index: int, epoch: int, codec: Optional[str] = None
    ) -> tuple[np.ndarray, Placement]:
        """One stored image (an HWC array, or encoded bytes) cropped and flipped as drawn for
        ``(seed, epoch, index)``, with the Placement that made it."""
        stored, codec, placement, _ = self.placed(stored, seed, index, epoch, codec)
        return render(stored, codec, self.mode, placement), placement

    def target(self, target: Any, placement: Placement) -> Any:
        """A sample's target (a detection dict, or a segmentation mask) moved with its image's crop and flip."""
        if torch.is_tensor(target):  # a segmentation mask: the ignore index where a centre crop pads
            return place_mask(target, placement, self.fill)  # type: ignore[arg-type]
        return place_target(target, placement, self.min_visibility)

    @staticmethod
    def describe(meta: dict, geometry: Any, placement: Optional[Placement], with_geometry: bool) -> None:
        """Say in a sample's meta dict what its crop and flip were: ``"crop"`` (left, top, right, bottom
        in the stored image's pixels) and ``"flip"``; with ``with_geometry``, its ``"geometry"`` composed
        with the crop (it maps onto the returned image)."""
        if with_geometry:
            meta["geometry"] = place_geometry(geometry, placement) if placement is not None else geometry
        if placement is not None:
            meta["crop"] = [round(v, 4) for v in placement.box]
            meta["flip"] = placement.flip

    def __repr__(self) -> str:
        return f"ImageCrops({self.augment!r})"


__all__ = ["ImageCrops"]
