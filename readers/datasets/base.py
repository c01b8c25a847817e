"""What every reader shares: the manifest and sample layout, how samples are returned, file checks.

Readers keep only the output path and the parsed manifest in their state. File handles are opened
on first use inside the process that uses them, reopened after a fork (a handle inherited from the
parent would be shared with it), and never pickled, so datasets travel cheaply to spawned workers.
Map-style readers share ``readers.datasets.mapstyle.PackedDataset``; tensors come from ``readers.datasets.tensors``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from PIL import Image

from packer.pixels.source_codec import decode_stored
from packer.spec.entries import TextField
from packer.spec.errors import ConfigError
from packer.spec.field_kinds import Geometry, Json, Tokens
from packer.spec.sample_layout import SampleLayout
from packer.spec.splits_record import check_split_member
from readers.augment.crops import (
    Augment,
    CenterCrop,
    Placement,
    RandomResizedCrop,
    place_geometry,
    place_mask,
    place_target,
    render,
    stored_size,
    upright_stored,
)
from readers.compose.combine import concat
from readers.datasets.output_files import OutputFiles
from readers.datasets.tensors import BatchNormalize, ImageConverter
from readers.loading.collate import SlotRing, empty_batch
from readers.remote.urls import is_url

Transform = Callable[[torch.Tensor], Any]
TargetTransform = Callable[[int], Any]


def build_sample(
    image: Any,
    label: int,
    transform: Optional[Transform],
    meta: Optional[dict],
    rest: tuple = (),
    target_transform: Optional[TargetTransform] = None,
    has_target: bool = False,
) -> tuple:
    """The tuple a reader yields: ``(image, label)`` or ``(image, label, meta)``; with text fields
    ``(first field, *rest, label[, meta])``. ``transform`` applies to the first field (the image,
    or the text of a text-only output), ``target_transform`` to the label (torchvision's
    ``target_transform``); ``meta["label"]`` keeps the stored label. With ``has_target`` (a detection
    output) samples are ``(image, target[, meta])`` as torchvision's detection datasets give them, the
    ``target_transform`` applied to the target dict; a segmentation output's ``(image, mask[, meta])``
    likewise, the mask an int64 (H, W) tensor."""
    if transform is not None:
        image = transform(image)
    if has_target:
        target = rest[0] if target_transform is None else target_transform(rest[0])
        return (image, target) if meta is None else (image, target, meta)
    if target_transform is not None:
        label = target_transform(label)
    return (image, *rest, label) if meta is None else (image, *rest, label, meta)


def placement_meta(meta: Optional[dict], placement: Optional[Placement]) -> None:
    """Say in a sample's meta dict what its crop and flip were: ``"crop"`` (left, top, right,
    bottom in the stored image's pixels) and ``"flip"``."""
    if meta is not None and placement is not None:
        meta["crop"] = [round(v, 4) for v in placement.box]
        meta["flip"] = placement.flip


def decode_field(field: TextField, data) -> Any:
    """The value of a stored text field's bytes (its kind's ``read``, ``packer.spec.field_kinds``), arrays as
    tensors: ``str`` for text, a 1-D int64 tensor of token ids, the parsed object for json (None for a
    json field stored empty by --allow-missing), an int64 (H, W) tensor of a mask's class indices, a
    detection target as torchvision's detection models take it (``boxes`` float32 XYXY, ``labels``
    int64, ...; see ``packer.spec.field_kinds.Detection.read``)."""
    value = field.kind_of.read(data)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, dict) and any(isinstance(v, np.ndarray) for v in value.values()):
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in value.items()}
    return value


TRANSFORM_INPUTS = ("tensor", "pil", "normalized")
"""What a reader's transform gets: the stored uint8 tensor, a PIL image, or (``normalized``, packer
0.2.0's way) the normalized float32 tensor."""


class ImageTransform:
    """A reader's ``transform`` as torchvision's pipelines expect to be called on ImageFolder's images.

    The transform gets the stored pixels: a uint8 C x H x W tensor (what torchvision v2's
    ``ToImage`` gives, so v2 pipelines take it as they are), or with ``input="pil"`` a PIL image
    (for classic pipelines that start with ``ToTensor``). When the reader normalizes and what the
    transform returns is still a uint8 image, the output's normalization is applied to it then;
    a pipeline that makes floats (``ToDtype(scale=True)``, ``Normalize``) is left as it made them,
    never normalized twice. Outputs stored as floats are already normalized: the transform gets
    them as they are.
    """

    def __init__(self, transform: Transform, normalize: Optional[BatchNormalize], input: str = "tensor") -> None:
        self.transform, self.normalize, self.input = transform, normalize, input

    def __call__(self, image: Any) -> Any:
        if self.input == "pil" and torch.is_tensor(image) and image.dtype == torch.uint8:
            image = _pil(image)
        try:
            out = self.transform(image)
        except TypeError as e:
            if "PIL" in str(e) and self.input != "pil":
                raise TypeError(
                    f"{e}. This transform wants a PIL image (torchvision's classic transforms, such "
                    "as ToTensor, do): open the dataset with transform_input='pil', or use "
                    "torchvision.transforms.v2, which takes the uint8 tensor the reader gives"
                ) from e
            raise
        if self.normalize is not None and torch.is_tensor(out) and out.dtype == torch.uint8 and out.dim() == 3:
            out = self.normalize(out)
        return out


def _pil(image: torch.Tensor) -> Any:
    """A PIL image of a uint8 C x H x W tensor (RGB or L)."""

    hwc = image.permute(1, 2, 0).numpy()
    return Image.fromarray(hwc[:, :, 0] if hwc.shape[2] == 1 else hwc, "L" if hwc.shape[2] == 1 else "RGB")


class ReaderBase:
    """What every reader holds: the output's path, its manifest and how samples are returned.

    ``transform`` is applied to each image (random augmentation at training time) as torchvision's
    pipelines expect: it gets the stored uint8 C x H x W tensor (a PIL image with
    ``transform_input="pil"``) and the output's normalization follows it when it returns uint8
    (see ImageTransform); on a text-only output it gets the text,
    ``target_transform`` to each sample's int label (as torchvision's, e.g. to one-hot or to another
    numbering; batches of a ``make_loader`` then go through the per-sample path, never around it);
    ``return_meta=True`` adds a third item ``{"index", "key", "label"}`` to each sample: the
    sample's position in the output, its source path relative to the converted folder, its label.

    ``crop`` (``readers.RandomResizedCrop`` or ``readers.CenterCrop``) gives every image that size,
    from images stored in any size; ``flip=True`` mirrors each image left to right with probability
    1/2. Both are drawn per sample from ``(seed, epoch, index)`` (``readers.augment.crops``): the same for
    the same seed and epoch whatever the workers, new every epoch (``set_epoch``; ``make_loader``
    follows its own epochs). With ``return_meta`` the meta dict says what was done (``"crop"``:
    the box in the stored image's pixels, and ``"flip"``).

    Each shard file is checked when a process first opens it: its size against the manifest (and,
    for LMDB, the checksum of the pages LMDB follows, so a damaged file is refused instead of
    crashing the process), and that the output is still the one this dataset opened (an output
    replaced since, by ``packer convert --overwrite``, is an error, never a mix of the two).
    ``verify=True`` also checks each file's SHA-256 against the manifest before its first read
    (about a second per GB from the page cache): no damaged byte is ever read.
    """

    format_name: str = ""
    reads_urls: bool = False  # True for readers that stream shards from URLs (readers.remote.urls)

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        normalize: bool = True,
        transform: Optional[Transform] = None,
        target_transform: Optional[TargetTransform] = None,
        transform_input: str = "tensor",
        return_meta: bool = False,
        verify: bool = False,
        crop: Optional[RandomResizedCrop | CenterCrop] = None,
        flip: bool = False,
        seed: int = 0,
    ) -> None:
        if is_url(root) and not self.reads_urls:
            raise ConfigError(
                f"{type(self).__name__} reads local folders only ({root} is a URL): the "
                f"{self.format_name} format needs random access. Copy the output to a local disk, "
                "or convert with --format wds, whose shards stream from URLs"
            )
        if is_url(root) and verify:
            raise ConfigError(
                "verify=True checks local shard files before they are read; streamed shards are "
                "always checked against the manifest's size and SHA-256 as they arrive"
            )
        self.root: Any = root if is_url(root) else Path(root)  # Path, or the URL as given (readers.remote.urls)
        self.files = OutputFiles.open(self.root, self.format_name or None, bool(verify))
        """The output's files and identity: the manifest read once, each shard file checked before use."""
        self.manifest = self.files.manifest
        if not is_url(root):
            check_split_member(self.root, self.files.manifest_sha256)
        self.verify = bool(verify)
        if transform_input not in TRANSFORM_INPUTS:
            raise ConfigError(f"transform_input must be one of {', '.join(TRANSFORM_INPUTS)}, not {transform_input!r}")
        self.normalize = bool(normalize)
        self.transform_input = transform_input
        self.transform = transform  # sets convert and apply_transform (a property: assigning it later works too)
        self.target_transform = target_transform
        self.return_meta = return_meta
        self.seed = int(seed)
        self.ring: Optional[SlotRing] = None  # set by make_loader: reused shared batch buffers
        self.shared_batches = False  # set by make_loader: batches cross to the main process as they are
        self.encoded_batches = False  # set by make_loader(decode="device"): JPEG bytes and crops cross instead
        self._offsets = self.manifest.shard_offsets
        self.layout = SampleLayout.from_manifest(self.manifest)
        self.text_fields = self.manifest.text_fields
        self.has_target = any(f.kind_of.target for f in self.text_fields)
        """True for outputs whose samples are ``(image, target)``: detection boxes, or a segmentation mask."""
        self.geometry = any(isinstance(f.kind_of, Geometry) for f in self.text_fields)
        """True when each image's geometry is stored (beside a paired json): the last text field, given in
        ``return_meta``'s dict as ``"geometry"``, never in the sample tuple."""
        self.augment = self._augment(crop, flip)
        """The crop and flip applied to each image (``readers.augment.crops.Augment``), or None."""

    @property
    def transform(self) -> Optional[Transform]:
        """The transform applied to each image (see the class); assigning it (``ds.transform = f``,
        as ImageFolder code does) takes effect for the samples read after."""
        return self._transform

    @transform.setter
    def transform(self, transform: Optional[Transform]) -> None:
        self._transform = transform
        uint8 = self.manifest.has_image and self.manifest.fields["image"]["dtype"] == "uint8"
        # With a transform on uint8 images, the transform gets the stored pixels and the
        # normalization comes after it (ImageTransform); otherwise the converter normalizes.
        # transform_input="normalized" keeps packer 0.2.0's way: the transform gets normalized floats.
        before = self.transform_input == "normalized" or transform is None or not uint8
        self.convert = ImageConverter(self.manifest, self.normalize and before)
        self.apply_transform: Optional[Callable[[Any], Any]] = None
        if transform is not None and self.manifest.has_image and self.transform_input != "normalized":
            after = BatchNormalize(self.manifest) if self.normalize and uint8 else None
            self.apply_transform = ImageTransform(transform, after, self.transform_input)
        elif transform is not None:
            self.apply_transform = transform

    def _augment(self, crop: Any, flip: bool) -> Optional[Augment]:
        """The crop and flip asked for, checked against what this output stores; None for neither."""
        if crop is None and not flip:
            return None
        if crop is not None and not isinstance(crop, (RandomResizedCrop, CenterCrop)):
            raise ConfigError(
                f"crop takes readers.RandomResizedCrop(size) or readers.CenterCrop(size), not "
                f"{type(crop).__name__}; a torchvision transform goes to transform="
            )
        what = "crop=" if crop is not None else "flip=True"
        if not self.manifest.has_image:
            raise ConfigError(f"{what} needs images, and {self.root} stores none")
        if self.layout.np_dtype != np.uint8:
            raise ConfigError(
                f"{what} crops and flips 8-bit images, and {self.root} stores {self.layout.np_dtype} "
                "(--dtype): convert with --dtype uint8 (readers normalize it as the manifest says)"
            )
        return Augment(crop, bool(flip))

    def place_target(self, target: Any, placement: Optional[Placement]) -> Any:
        """A sample's target (detection dict, or segmentation mask) moved with its image's crop and flip."""
        if placement is None or not self.has_target:
            return target
        if torch.is_tensor(target):  # a segmentation mask: the ignore index where a centre crop pads
            return place_mask(target, placement, self.ignore_index)
        return place_target(target, placement, float((self.manifest.annotations or {}).get("min_visibility", 0.0)))

    @property
    def image_shape(self) -> Optional[tuple[int, int, int]]:
        """(H, W, C) of every image this reader returns, or None when images keep their own sizes."""
        if not self.layout.has_image:
            return None
        size = self.augment.size if self.augment is not None else None
        if size is None:
            return self.layout.shape
        return (size[0], size[1], self.layout.channels)

    def epoch_now(self) -> int:
        """The epoch whose crops and flips samples read now get (``set_epoch``)."""
        return int(getattr(self, "epoch", 0))

    def stored_out(
        self, stored: Any, index: int, epoch: int, codec: Optional[str] = None
    ) -> tuple[np.ndarray, Optional[Placement]]:
        """One stored image (an HWC array, or encoded bytes; ``codec`` defaults to the output's) as
        this reader returns it, with the Placement that made it: decoded, then cropped and flipped as
        ``augment`` draws it for ``(seed, epoch, index)``.
        Without ``augment`` just the decoded pixels (and None)."""
        codec, mode = codec or self.layout.codec.name, self.layout.mode
        if self.augment is None:
            return (stored if codec == "raw" else decode_stored(stored, codec, mode)), None
        stored, codec, placement, _ = self.placed(stored, index, epoch, codec)
        return render(stored, codec, mode, placement), placement

    def placed(self, stored: Any, index: int, epoch: int, codec: str) -> tuple[Any, str, Placement, tuple[int, int]]:
        """One stored image made ready to crop (``upright_stored``: its codec may change), the
        Placement ``augment`` draws for ``(seed, epoch, index)``, and the (height, width) it was drawn
        for; ``render`` makes the image."""
        stored, codec = upright_stored(stored, codec, self.layout.mode)
        h, w = stored_size(stored, codec)
        return stored, codec, self.augment.placement(self.seed, epoch, index, h, w), (h, w)  # type: ignore[union-attr]

    def batch_tensor(self, n: int) -> tuple[Optional[int], torch.Tensor]:
        """``(ring slot or None, empty (n, C, H, W) batch tensor)`` for this reader's fixed image size:
        a free slot of make_loader's ring when there is one, else fresh (shared) memory. Float32 when
        normalizing, contiguous; otherwise the stored dtype in the stored NHWC byte order."""
        h, w, c = self.image_shape
        out_dtype = self.convert.batch_dtype(self.layout.np_dtype)
        claimed = self.ring.claim(n, out_dtype) if self.ring is not None else None
        if claimed is not None:
            return claimed
        return None, empty_batch((n, c, h, w), out_dtype, self.convert.normalize is None, shared=self.shared_batches)

    def check_unchanged(self) -> None:
        """ManifestError when the output is no longer the one this dataset opened (``OutputFiles.check_unchanged``)."""
        self.files.check_unchanged()

    def path(self, relpath: str) -> Path:
        """Path of a shard file named in the manifest, checked before its first use in a process
        (``OutputFiles.path``). Call ``check_unchanged`` again once the file is open."""
        return self.files.path(relpath)

    def sample_of(
        self, index: int, key: Optional[str], label: int, values: Sequence[Any], placement: Optional[Placement]
    ) -> tuple:
        """The tuple a reader yields for one sample (``build_sample``), from its decoded ``values`` (the
        image, then each text field's value, the geometry last where it is stored) and the crop's
        ``placement``; with ``return_meta`` its dict says its index, key, stored label, geometry (composed
        with the crop: it maps onto the returned image) and crop. Every reader builds its samples here."""
        values = list(values)
        geometry = values.pop() if self.geometry else None
        meta = {"index": index, "key": key, "label": label} if self.return_meta else None
        if meta is not None and self.geometry:
            meta["geometry"] = place_geometry(geometry, placement) if placement is not None else geometry
        placement_meta(meta, placement)
        return build_sample(
            values[0], label, self.apply_transform, meta, tuple(values[1:]), self.target_transform, self.has_target
        )

    @property
    def fixed_images(self) -> bool:
        """True when samples are one image of one size and nothing else: batches are one tensor
        (images stored in one size, or given one by ``crop``)."""
        return self.layout.has_image and not self.text_fields and self.image_shape is not None

    def length_field(self, field: Optional[str] = None) -> TextField:
        """The text field ``field`` names; by default the first text or token-id field (else json)."""
        fields = {f.name: f for f in self.text_fields if f.kind_of.readable}
        if not fields:
            raise ValueError(f"{self.root} has no text fields, so its samples have no length")
        if field is None:
            return next((f for f in fields.values() if not isinstance(f.kind_of, Json)), next(iter(fields.values())))
        if field not in fields:
            raise ValueError(f"{self.root} has no field {field!r}; its text fields are {', '.join(fields)}")
        return fields[field]

    @property
    def pad_id(self) -> int:
        """Padding id of the token-id field's tokenizer (0 without one): what pad_collate should pad with."""
        tokens = next((f for f in self.text_fields if isinstance(f.kind_of, Tokens)), None)
        return int((tokens.tokenizer or {}).get("pad_id") or 0) if tokens else 0

    @property
    def classes(self) -> Optional[list[str]]:
        """Class names by index, or None for unlabelled data."""
        return self.manifest.classes

    @property
    def categories(self) -> Optional[list[str]]:
        """A detection output's category names, which ``target["labels"]`` index; None for other outputs."""
        return list(self.manifest.annotations["categories"]) if self.manifest.annotations else None

    @property
    def ignore_index(self) -> Optional[int]:
        """A segmentation output's ignore index (the value of padding in the masks); None for other outputs."""
        mask = next((f for f in self.text_fields if f.kind_of.class_indices), None)
        return int((mask.info or {}).get("ignore_index", 255)) if mask is not None else None

    @property
    def class_map_sha256(self) -> Optional[str]:
        """The digest of the class map (names in index order), the same for outputs whose labels agree;
        None for unlabelled data."""
        return self.manifest.class_map_sha256

    def __add__(self, other: Any) -> Any:
        """``a + b`` as torch's (a ConcatDataset; a ChainDataset for streams), refused with ValueError when
        the class maps differ: the same label would mean another class in each part (``readers.concat``)."""
        return concat([self, other])

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label, as torchvision's ``ImageFolder.class_to_idx``, from the manifest.

        ``{}`` for unlabelled data (``classes`` is None and every label is -1): still a dict, so code
        that looks names up or iterates it needs no special case."""
        return {name: index for index, name in enumerate(self.manifest.classes or [])}

    @property
    def one_by_one(self) -> bool:
        """True when samples must be made one by one (a ``transform``, a ``target_transform`` or
        ``return_meta``): the whole-batch paths, which write images and labels straight into batch
        tensors, would skip them."""
        return self.transform is not None or self.target_transform is not None or self.return_meta

    @property
    def class_counts(self) -> Optional[list[int]]:
        """Samples per class, from the manifest (no shard is opened); None for unlabelled data."""
        return self.manifest.class_counts

    @property
    def stats(self) -> Optional[dict]:
        """The manifest's dataset statistics (pixel mean/std, original sizes); None for older outputs."""
        return self.manifest.stats

    def batch_normalizer(self) -> BatchNormalize:
        """The normalization of this output as a per-batch callable (see BatchNormalize)."""
        return BatchNormalize(self.manifest)

    def __len__(self) -> int:
        return self.manifest.samples

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r}, samples={len(self)}, shards={len(self.manifest.shards)})"
