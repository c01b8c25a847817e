"""Conversion settings: validated once, frozen, and copied into the manifest."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from packer.spec.errors import ConfigError
from packer.spec.registry import get_format
from packer.spec.sample_layout import DEFAULT_QUALITY, ImageCodec  # noqa: F401 - the CLI's default comes from here
from packer.spec.text import TextConfig

RESIZE_MODES = ("shorter-crop", "shorter", "max", "stretch", "pad", "none")
GEOMETRIES = ("torchvision", "fractional")
"""How ``shorter-crop`` places its crop: ``torchvision``, as ``Resize(N)`` then ``CenterCrop(N)``
compute it (the image resized to an integer size, the crop at a rounded offset); ``fractional``,
the largest centred box of the target's aspect ratio resized in one step (packer before 0.3.0)."""
COLOR_MODES = ("RGB", "L")
INTERPOLATIONS = ("bilinear", "bicubic", "lanczos", "box", "hamming", "nearest")
DTYPES = ("uint8", "float16", "float32")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AUTO = "auto"
DEFAULT_SHARD_BYTES = 256 * 1024**2
DEFAULT_MAX_PIXELS = 89_478_485  # Pillow's own default limit: 1024 * 1024 * 1024 // 4 // 3
DUP_DISTANCE = 4
"""Bits two images' perceptual hashes may differ by and still be near-duplicates, by default
(``--dup-distance``; ``packer.output.near_duplicates``). The hashes' bits change in pairs (a
coefficient crossing the median lets another cross back), so 4 is two coefficients moved:
resized, re-encoded, brightened and 5%-cropped copies of photographs mostly stay within it, and
unrelated photographs were 10 or more apart (docs/FORMATS.md, "Image hashes")."""
MAX_DUP_DISTANCE = 8
"""The largest ``--dup-distance``: unrelated photographs' hashes came within 10 bits, and the search
compares far more candidates above it (each of three chunks within 3 bits: 30 times those of 2)."""


@dataclass(frozen=True)
class PreprocessConfig:
    """The deterministic preprocessing applied once to every image.

    ``size`` is (width, height) and is None only with ``resize="none"``; with ``resize="shorter"``
    it is square, (N, N): the shorter side goes to N, the longer keeps the aspect ratio, as
    torchvision's ``Resize(N)``; with ``resize="max"`` too: the longer side goes to N when it is
    longer (never enlarged), the aspect kept (FFCV's ``max_resolution``). ``crop`` (width,
    height), when set, is then cut from the centre as torchvision's ``CenterCrop`` cuts it (padded
    with ``fill`` where the image is smaller), and is the stored size. ``mean``/``std`` are per
    channel on the 0..1 scale; None means no normalization (pixels scaled to 0..1). With
    ``dtype="uint8"`` pixels are stored as they are and readers normalize; with a float dtype the
    normalized values are stored. ``auto_normalize`` (uint8 only; ``mean``/``std`` are then None)
    records the converted images' own mean and std, computed while converting, as the
    normalization. Images of more than ``max_pixels`` pixels are skipped (decompression-bomb
    protection). ``reduced_decode`` lets the JPEG decoder scale an image down by M/8 (M = 1..5)
    while decoding as long as it stays at least the target size (packer.pixels.jpeg): faster decoding,
    pixels within a few levels of a full decode (docs/BENCHMARKS.md). ``geometry`` is how
    ``shorter-crop`` places its crop (``GEOMETRIES``).
    """

    size: Optional[tuple[int, int]] = (224, 224)
    resize: str = "shorter-crop"
    mode: str = "RGB"
    interpolation: str = "bilinear"
    fill: tuple[int, ...] = (0, 0, 0)
    background: tuple[int, ...] = (255, 255, 255)
    mean: Optional[tuple[float, ...]] = IMAGENET_MEAN
    std: Optional[tuple[float, ...]] = IMAGENET_STD
    dtype: str = "uint8"
    max_pixels: int = DEFAULT_MAX_PIXELS
    auto_normalize: bool = False
    reduced_decode: bool = True
    geometry: str = "torchvision"
    crop: Optional[tuple[int, int]] = None

    def __post_init__(self) -> None:
        if self.max_pixels < 1:
            raise ConfigError(
                f"--max-pixels must be positive (it guards against decompression bombs), got {self.max_pixels}"
            )
        _choice("resize", self.resize, RESIZE_MODES)
        _choice("mode", self.mode, COLOR_MODES)
        _choice("interpolation", self.interpolation, INTERPOLATIONS)
        _choice("dtype", self.dtype, DTYPES)
        _choice("geometry", self.geometry, GEOMETRIES)
        if self.resize == "none":
            object.__setattr__(self, "size", None)
        elif self.size is None or len(self.size) != 2 or min(self.size) < 1:
            raise ConfigError(f"--size must be a positive WIDTHxHEIGHT with --resize {self.resize}")
        elif self.size[0] * self.size[1] > self.max_pixels:
            raise ConfigError(
                f"--size {self.size[0]}x{self.size[1]} has more pixels than --max-pixels "
                f"{self.max_pixels}; choose a smaller size"
            )
        elif self.resize in ("shorter", "max") and self.size[0] != self.size[1]:
            side = "shorter" if self.resize == "shorter" else "longer"
            raise ConfigError(
                f"--resize {self.resize} takes one number, the {side} side's size (--size 256), not "
                f"{self.size[0]}x{self.size[1]}: the other side follows the aspect ratio"
            )
        if self.crop is not None:
            if len(self.crop) != 2 or min(self.crop) < 1:
                raise ConfigError(f"--crop must be a positive size such as 224 or 224x160, got {self.crop}")
            if self.crop[0] * self.crop[1] > self.max_pixels:
                raise ConfigError(f"--crop {self.crop[0]}x{self.crop[1]} has more pixels than --max-pixels")
            object.__setattr__(self, "crop", tuple(self.crop))
        c = self.channels
        object.__setattr__(self, "fill", _per_channel("--fill", self.fill, c, int))
        object.__setattr__(self, "background", _per_channel("--background", self.background, c, int))
        if self.auto_normalize:
            if self.dtype != "uint8":
                raise ConfigError(
                    f"--normalize auto needs --dtype uint8: {self.dtype} storage holds normalized values, so the "
                    "mean and std would have to be known before the first image is written (a separate statistics "
                    "pass). Use --dtype uint8 (readers then normalize with the statistics computed while converting), "
                    "or pass --normalize MEAN,STD (e.g. the values `packer info` shows for a uint8 conversion)"
                )
            object.__setattr__(self, "mean", None)  # filled into the manifest when the statistics are known
            object.__setattr__(self, "std", None)
        if (self.mean is None) != (self.std is None):
            raise ConfigError("--normalize needs both a mean and a std")
        if self.mean is not None:
            object.__setattr__(self, "mean", _per_channel("--normalize mean", self.mean, c, float))
            object.__setattr__(self, "std", _per_channel("--normalize std", self.std, c, float))
            if not all(math.isfinite(v) for v in self.mean + self.std):
                raise ConfigError(f"--normalize values must be finite numbers, got mean {self.mean} std {self.std}")
            if any(s <= 0 for s in self.std):
                raise ConfigError(f"--normalize std must be positive, got {self.std}")

    @property
    def max_file_bytes(self) -> int:
        """Largest source file read: 8 bytes per allowed pixel (16-bit RGBA, uncompressed) plus 1 MiB."""
        return self.max_pixels * 8 + 1024**2

    @property
    def channels(self) -> int:
        """Channels of a stored image: 3 for RGB, 1 for L."""
        return 3 if self.mode == "RGB" else 1

    @property
    def image_shape(self) -> Optional[tuple[int, int, int]]:
        """Stored (height, width, channels), or None when images keep their own size."""
        if self.crop is not None:
            return (self.crop[1], self.crop[0], self.channels)
        if self.size is None or self.resize in ("shorter", "max"):
            return None
        return (self.size[1], self.size[0], self.channels)

    def to_dict(self) -> dict:
        """JSON-ready form, as stored in the manifest's ``preprocess`` entry."""
        d = asdict(self)
        d["normalize"] = None if self.mean is None else {"mean": d.pop("mean"), "std": d.pop("std")}
        if d.pop("auto_normalize"):
            d["normalize"] = AUTO
        d.pop("mean", None)
        d.pop("std", None)
        if self.resize != "shorter-crop":
            d.pop("geometry")  # it places shorter-crop's crop only: other outputs' records are as before
        if self.crop is None:
            d.pop("crop")  # outputs without one keep the records of packers before it
        if self.reduced_decode:  # how: a record, so that a change of the method changes the fingerprint too
            from packer.pixels.jpeg import SCALING

            d["jpeg_scaling"] = SCALING
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "PreprocessConfig":
        """Inverse of ``to_dict``."""
        d = dict(d)
        d.setdefault("reduced_decode", False)  # outputs written before it existed decoded in full
        if d.get("resize", "shorter-crop") == "shorter-crop":
            d.setdefault("geometry", "fractional")  # shorter-crop outputs written before it existed
        d.pop("jpeg_scaling", None)  # how reduced_decode scaled (packer.pixels.jpeg): a record, not an option
        norm = d.pop("normalize", None)
        tuples = {k: tuple(d[k]) for k in ("size", "fill", "background", "crop") if d.get(k) is not None}
        d.update(tuples)
        if norm == AUTO:
            return cls(**d, auto_normalize=True)
        return cls(**d, mean=tuple(norm["mean"]) if norm else None, std=tuple(norm["std"]) if norm else None)


@dataclass(frozen=True)
class ShardSize:
    """How samples are cut into shards: a sample count, a byte budget, or ``auto``.

    ``auto`` cuts shards of at most 256 MiB, at least 4 per worker when they keep 1000 samples each
    (up to 64; ``packer.run.plan``), and makes their number a multiple of the worker count, so that every worker
    gets the same amount of work. A source of images of one shape (no text) large enough for 64
    shards of one count (at most 20,000 samples, fitting 256 MiB) is cut at that count instead, a cut known before
    the walk of the tree ends (``packer.run.plan.auto_cut``, ``packer.run.early_start``).
    """

    samples: Optional[int] = None
    bytes: Optional[int] = None

    def __post_init__(self) -> None:
        if self.samples is not None and self.bytes is not None:
            raise ConfigError("--shard-size is either a sample count or a byte size, not both")
        if (self.samples is not None and self.samples < 1) or (self.bytes is not None and self.bytes < 1):
            raise ConfigError("--shard-size must be positive")

    @property
    def is_auto(self) -> bool:
        """True when neither a count nor a byte size was given."""
        return self.samples is None and self.bytes is None

    def describe(self) -> str:
        """Short text for summaries and the manifest."""
        if self.samples is not None:
            return f"{self.samples} samples"
        if self.bytes is not None:
            return f"{self.bytes} bytes"
        return "auto"


DEFAULT_MIN_VISIBILITY = 0.1
"""Least share of a box's area that must be left inside the stored image for the box to be kept (as
Ultralytics keeps candidates after a geometric augmentation)."""

BOX_COORDS = ("auto", "stored", "displayed")


@dataclass(frozen=True)
class MaskConfig:
    """``--masks DIR``: a class-index PNG per image (the same relative path, ``.png``), carried through
    the image's geometry with nearest-neighbour resampling; ``ignore_index`` fills padding; ``coords``
    as ``DetectionConfig.coords`` (which grid an EXIF-turned image's mask is drawn on)."""

    folder: str
    ignore_index: int = 255
    coords: str = "auto"
    sidecar: bool = False
    """Masks beside their images instead (``0001.jpg`` with ``0001.png`` in one folder); ``folder`` unused."""

    def __post_init__(self) -> None:
        if not 0 <= self.ignore_index <= 255:
            raise ConfigError(f"--mask-ignore must be 0..255 (masks are 8-bit), not {self.ignore_index}")
        _choice("box-coords", self.coords, BOX_COORDS)

    @property
    def source_name(self) -> str:
        """The masks folder's name, as the manifest records it (no absolute paths in an output)."""
        if self.sidecar:
            return "beside the images"
        return self.folder.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class DetectionConfig:
    """``--annotations PATH`` (``format`` found from the content unless given) and the crop rule."""

    path: str
    format: Optional[str] = None
    min_visibility: float = DEFAULT_MIN_VISIBILITY
    coords: str = "auto"
    """Which pixels the boxes are on: ``stored`` (the file's grid, EXIF orientation not applied),
    ``displayed`` (the turned image), or ``auto`` (see ``packer.targets.annotations``)."""

    def __post_init__(self) -> None:
        _choice("box-coords", self.coords, BOX_COORDS)
        if not 0 <= self.min_visibility <= 1:
            raise ConfigError(
                f"--min-box-visibility must be a share of the box's area, 0 to 1, not {self.min_visibility}"
            )


@dataclass(frozen=True)
class ConvertConfig:
    """Everything that decides the content of an output: format, preprocessing, shard layout, order,
    image codec, how text is read, detection annotations.

    ``shuffle`` is None for sorted source order, or the seed of a global permutation of the samples
    (so that streamed tar shards need only a small read-time shuffle buffer).
    """

    format: str
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    shard_size: ShardSize = field(default_factory=ShardSize)
    shuffle: Optional[int] = None
    codec: ImageCodec = field(default_factory=ImageCodec)
    text: TextConfig = field(default_factory=TextConfig)
    detection: Optional[DetectionConfig] = None
    """Detection annotations to carry through the geometry into each sample's ``target``
    (``packer.targets.detection``)."""
    masks: Optional[MaskConfig] = None
    """Segmentation masks to carry through the geometry into each sample's ``mask``
    (``packer.targets.segmentation``)."""
    image_hashes: bool = True
    """Hash every stored image (``packer.pixels.looks``) into the output's ``image_hashes.npy`` and
    report its near-duplicates."""
    dup_distance: int = DUP_DISTANCE
    """Bits two images' hashes may differ by and still be reported as near-duplicates."""
    drop_duplicates: bool = False
    """Keep the first image (by key) of each group of near-duplicates, and skip the others
    (``packer.ops.dedupe``)."""

    def __post_init__(self) -> None:
        get_format(self.format)  # ConfigError naming the known formats
        if self.drop_duplicates and not self.image_hashes:
            raise ConfigError("--drop-duplicates finds them by the images' hashes: leave out --no-image-hashes")
        if not 0 <= self.dup_distance <= MAX_DUP_DISTANCE:
            raise ConfigError(
                f"--dup-distance takes 0 to {MAX_DUP_DISTANCE} bits (of 64), got {self.dup_distance}: "
                "unrelated photographs' hashes come within 10 bits"
            )
        if self.detection is not None and self.masks is not None:
            raise ConfigError(
                "--annotations and --masks together are not supported yet: convert the boxes and the "
                "masks into two outputs"
            )
        if self.shuffle is not None and self.shuffle < 0:
            raise ConfigError(f"--shuffle takes a seed >= 0, got {self.shuffle}")
        if self.codec.encoded and self.preprocess.dtype != "uint8":
            raise ConfigError(
                f"--codec {self.codec.name} stores 8-bit pixels and cannot hold --dtype {self.preprocess.dtype}; "
                f"use --dtype uint8 (readers then normalize as the manifest records), or --codec raw to store "
                f"{self.preprocess.dtype} values"
            )
        pre = self.preprocess
        if self.codec.name == "source" and (pre.resize not in ("none", "max") or pre.crop is not None):
            what = f"--resize {pre.resize}" if pre.crop is None else "--crop"
            raise ConfigError(
                f"--codec source keeps the files that --resize none or max (without --crop) leaves as "
                f"they are; with {what} every image changes and would be re-encoded: use --codec "
                "jpeg or png, or --resize max --size N"
            )


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"--{name} must be one of {', '.join(choices)}; got {value!r}")


def _per_channel(name: str, values, channels: int, kind):
    values = tuple(kind(v) for v in values)
    if len(values) == channels:
        return values
    if len(values) == 1:
        return values * channels
    if channels == 1 and len(values) == 3:
        # Grayscale with RGB settings (e.g. the ImageNet statistics): use the channel average.
        return (kind(round(sum(values) / 3, 6)) if kind is float else round(sum(values) / 3),)
    raise ConfigError(f"{name} needs 1 or {channels} values, got {len(values)}: {values}")


TOKEN_SHARD_BYTES = 128 * 1024**2
"""A token output's shard, by default: 64 Mi uint16 ids (a few seconds to write, a handful of
files for a corpus of billions of tokens)."""


@dataclass(frozen=True)
class PackConfig:
    """A corpus tokenized and packed into blocks (``packer convert CORPUS --pack BLOCK``).

    ``block``: the inputs of a block (it stores up to ``block + 1`` ids); ``packing``: ``concat`` or
    ``best-fit`` (``packer.tokens.packing``); ``tokenizer``: a ``tokenizer.json``; ``eos``: the
    end-of-text id (None: the tokenizer's own); ``bos`` / ``bos_id``: add a beginning id (found in
    the tokenizer, or this one); ``documents``, ``text_key``, ``encoding``: how the corpus is read
    (``packer.sources.corpus``); ``shuffle_seed``: the documents' order (None: as read); ``shard_size``:
    blocks per shard (a sample count) or bytes of ids; ``strict``: stop at the first bad document.
    """

    format: str
    block: int
    tokenizer: str
    packing: str = "concat"
    eos: Optional[int] = None
    bos: bool = False
    bos_id: Optional[int] = None
    documents: str = "file"
    text_key: str = "text"
    encoding: str = "utf-8"
    shuffle_seed: Optional[int] = None
    shard_size: ShardSize = field(default_factory=ShardSize)
    strict: bool = False

    def __post_init__(self) -> None:
        from packer.spec.token_blocks import PACKINGS

        get_format(self.format).check_tokens()
        if self.block < 1:
            raise ConfigError(f"--pack must be a block size of at least 1 token, got {self.block}")
        if self.packing not in PACKINGS:
            raise ConfigError(f"--pack-mode {self.packing!r}: use one of {', '.join(PACKINGS)}")
        if self.documents not in ("file", "lines"):
            raise ConfigError(f"--documents {self.documents!r}: use file or lines")
        TextConfig(self.encoding)  # checks the encoding

    def blocks_per_shard(self, itemsize: int) -> int:
        """Blocks in each shard: the count given, or as many as fill the byte size (default
        ``TOKEN_SHARD_BYTES``) with ids of ``itemsize`` bytes."""
        if self.shard_size.samples is not None:
            return self.shard_size.samples
        size = self.shard_size.bytes or TOKEN_SHARD_BYTES
        return max(1, size // (itemsize * (self.block + 1)))
