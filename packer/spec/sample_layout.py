"""What every sample of an output stores: one layout record that writers, ``verify`` and readers share.

The converter builds it from its configuration (``SampleLayout.from_config``), and everything that
reads an output builds the same record from the manifest (``SampleLayout.from_manifest``), so a
writer and the code that reads its shards back can never disagree about what a sample holds.

The image field is stored in one of a few ways (``ImageStorage``), chosen here once; each format
maps every storage it supports to its own encoder. A new kind of stored field is added here (a
field of the record, a storage or a ``features`` name) and then to each format's encoder.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from packer.spec.codecs import IMAGE_CODECS
from packer.spec.entries import TextField
from packer.spec.errors import ConfigError
from packer.spec.field_kinds import Detection, Geometry, Mask

if TYPE_CHECKING:
    from packer.spec.manifest import Manifest

DEFAULT_QUALITY = 90


@dataclass(frozen=True)
class ImageCodec:
    """How stored images are encoded: ``raw`` pixels, ``jpeg`` (lossy, at ``quality``), ``png``
    (lossless), or ``source``: each JPEG or PNG file's own bytes where the preprocessing keeps its
    pixels, the others re-encoded (JPEG at ``quality``, PNG; ``packer.pixels.source_codec``). ``quality``
    matters for jpeg and source only; above 95 Pillow advises that files grow for no visible gain."""

    name: str = "raw"
    quality: int = DEFAULT_QUALITY

    def __post_init__(self) -> None:
        if self.name not in IMAGE_CODECS:
            raise ConfigError(f"--codec must be one of {', '.join(IMAGE_CODECS)}; got {self.name!r}")
        if not 1 <= self.quality <= 95:
            raise ConfigError(f"--quality must be 1-95 (JPEG quality; 90 is a good default), got {self.quality}")

    @property
    def encoded(self) -> bool:
        """True when images are stored as encoded file bytes (jpeg, png) rather than raw pixels."""
        return self.name != "raw"

    def to_dict(self) -> dict:
        """The manifest's entries for it in ``fields.image``: ``codec``, and ``quality`` for jpeg and source."""
        if self.name in ("jpeg", "source"):
            return {"codec": self.name, "quality": self.quality}
        return {"codec": self.name}


class ImageStorage(enum.Enum):
    """How a sample's image is stored; every format maps each kind it supports to its own encoder."""

    NONE = "none"
    """No image field: text-only samples."""
    FIXED = "fixed"
    """Raw pixels, every image of one (H, W, C) shape and dtype."""
    VARIABLE = "variable"
    """Raw pixels, each image of its own (H, W) (``--resize none``)."""
    ENCODED = "encoded"
    """The JPEG or PNG bytes of each image (``--codec jpeg|png``)."""


# Names of what a layout uses beyond raw images of one size: each format's description says from
# which format version it stores each one (``packer.spec.registry``).
ENCODED_IMAGES = "encoded images"
TEXT_FIELDS = "text fields"
NO_IMAGE = "samples without an image"
VARIABLE_RAW = "raw images of varying sizes"
DETECTION_TARGETS = Detection.feature
SEGMENTATION_MASKS = Mask.feature
SAMPLE_GEOMETRY = Geometry.feature
SOURCE_BYTES = "source file bytes"
ENCODED_SIZES = "the size of each encoded image of varying size"
RAW_SIZES = "the size of each raw image of varying size, apart from the images"


@dataclass(frozen=True)
class SampleLayout:
    """What a shard stores per sample: the image field's dtype, shape (H, W, C; None for images of
    their own sizes), channels, codec and colour ``mode`` (unless ``has_image`` is False), then the
    variable-length ``text`` fields in order, then label and key.

    With an encoding codec (jpeg, png) writers store each sample's ``Sample.encoded`` bytes, and
    ``sample_bytes`` is the size of the pixels before encoding.
    """

    dtype: str
    shape: Optional[tuple[int, int, int]]
    channels: int
    codec: ImageCodec = ImageCodec()
    has_image: bool = True
    text: tuple[TextField, ...] = ()
    mode: str = "RGB"

    @cached_property
    def image(self) -> ImageStorage:
        """How the image field is stored (the one place this is decided)."""
        if not self.has_image:
            return ImageStorage.NONE
        if self.codec.encoded:
            return ImageStorage.ENCODED
        return ImageStorage.VARIABLE if self.shape is None else ImageStorage.FIXED

    @cached_property
    def np_dtype(self) -> np.dtype:
        """``dtype`` as a numpy dtype."""
        return np.dtype(self.dtype)

    @property
    def sample_bytes(self) -> Optional[int]:
        """Bytes of one stored image (0 without images), when the shape is fixed."""
        if not self.has_image:
            return 0
        if self.shape is None:
            return None
        return int(np.prod(self.shape)) * self.np_dtype.itemsize

    @property
    def sizes_indexed(self) -> bool:
        """True when each shard holds an index of its images' (H, W, C), apart from the images: images of
        varying size (``NPY_IMAGE_SHAPES`` and its kin in ``packer.spec.shard_names``)."""
        return self.has_image and self.shape is None

    @property
    def fixed_images(self) -> bool:
        """True when a sample is one image of one size (raw or encoded) and nothing else: batches are
        one tensor."""
        return self.has_image and self.shape is not None and not self.text

    def features(self) -> frozenset[str]:
        """What this layout uses beyond fixed-size raw images (see ``packer.spec.registry``)."""
        found = set()
        if self.image is ImageStorage.ENCODED:
            found.add(ENCODED_IMAGES)
        if self.image is ImageStorage.ENCODED and self.codec.name == "source":
            found.add(SOURCE_BYTES)
        if self.image is ImageStorage.ENCODED and self.shape is None:
            found.add(ENCODED_SIZES)
        if self.image is ImageStorage.VARIABLE:
            found.add(RAW_SIZES)
        if self.image is ImageStorage.VARIABLE:
            found.add(VARIABLE_RAW)
        if self.image is ImageStorage.NONE:
            found.add(NO_IMAGE)
        if self.text:
            found.add(TEXT_FIELDS)
        found.update(f.kind_of.feature for f in self.text if f.kind_of.feature is not None)
        return frozenset(found)

    def fields(self) -> dict[str, dict]:
        """The manifest's ``fields`` entry for this layout: the sample's fields in order, then label and key."""
        out: dict[str, dict] = {}
        if self.has_image:
            out["image"] = {
                "dtype": self.dtype,
                "shape": list(self.shape) if self.shape else None,
                "channels": self.channels,
                "layout": "HWC",
                **self.codec.to_dict(),
            }
        for f in self.text:
            out[f.name] = f.to_dict()
        out["label"] = {"dtype": "int64", "shape": []}
        out["key"] = {"dtype": "str", "shape": []}
        return out

    def check_image(self, image: Optional[np.ndarray]) -> None:
        """ValueError unless there is an ``image`` of this layout's shape (any shape when sizes vary)."""
        if image is None or (self.shape is not None and image.shape != self.shape):
            found = None if image is None else image.shape
            raise ValueError(f"image of shape {found} in a shard of shape {self.shape}")

    @classmethod
    def from_config(cls, config, fields: Sequence[str]) -> "SampleLayout":
        """The layout of samples of ``fields`` (see ``packer.sources.discover``) converted under ``config``
        (a ``packer.config.ConvertConfig``)."""
        pre, text = config.preprocess, config.text
        extra = []
        for name in fields:
            if name == "text" and text.tokenizer is not None:
                extra.append(TextField("text", "tokens", text.tokenizer_info(), text.encoding, text.allow_missing))
            elif name in ("text", "json"):
                extra.append(TextField(name, name, None, text.encoding, text.allow_missing))
        if "image" in fields and "json" in fields:  # a paired json is stored as it is: with where its pixels went
            extra.append(TextField("geometry", "geometry"))
        if getattr(config, "detection", None) is not None:
            extra.append(TextField("target", "detection"))
        masks = getattr(config, "masks", None)
        if masks is not None:
            extra.append(
                TextField("mask", "mask", info={"ignore_index": masks.ignore_index, "source": masks.source_name})
            )
        if "image" not in fields:
            return cls.without_image(tuple(extra), pre.mode)
        codec = config.codec if config.codec.name == "jpeg" else ImageCodec(config.codec.name)  # quality: jpeg's
        return cls(pre.dtype, pre.image_shape, pre.channels, codec, True, tuple(extra), pre.mode)

    @classmethod
    def without_image(cls, text: tuple[TextField, ...], mode: str = "RGB") -> "SampleLayout":
        """The layout of samples of ``text`` fields alone (the image settings are unused)."""
        return cls("uint8", None, 0, ImageCodec(), False, text, mode)

    @classmethod
    def from_manifest(cls, manifest: "Manifest") -> "SampleLayout":
        """The layout a (checked) manifest records."""
        image = manifest.fields.get("image")
        text = manifest.text_fields
        mode = manifest.preprocess.get("mode", "RGB")
        if image is None:
            return cls.without_image(text, mode)
        codec = ImageCodec(image.get("codec", "raw"), _recorded_quality(image))
        shape = tuple(image["shape"]) if image.get("shape") else None
        channels = int(image.get("channels") or (shape[2] if shape else (1 if mode == "L" else 3)))
        return cls(str(np.dtype(image["dtype"])), shape, channels, codec, True, text, mode)


def _recorded_quality(image: dict) -> int:
    """The JPEG quality a manifest's image field records: only a record (nothing reads images by
    it), so a value out of range in a damaged manifest falls back to the default, not an error."""
    quality = image.get("quality") if image.get("codec") in ("jpeg", "source") else None
    if isinstance(quality, int) and not isinstance(quality, bool) and 1 <= quality <= 95:
        return quality
    return DEFAULT_QUALITY


def choose(layout: SampleLayout, encoders: dict, fmt: str):
    """``encoders[layout.image]``: a format's encoder for the way this layout stores images.

    ConfigError naming the format when it has none (a storage added to the layout and not yet to
    this format): packer refuses to write what it could not read back.
    """
    try:
        return encoders[layout.image]
    except KeyError:
        raise ConfigError(
            f"the {fmt} format cannot store {layout.image.value} images; choose another --format"
        ) from None
