"""What every reader is: the output it reads (its files, manifest and facts), how its samples are
returned (transforms, meta, the crop it holds), and where its whole batches go.

Readers keep only the output path and the parsed manifest in their state. File handles are opened
on first use inside the process that uses them, reopened after a fork (a handle inherited from the
parent would be shared with it), and never pickled, so datasets travel cheaply to spawned workers.
Map-style readers share ``readers.datasets.mapstyle.PackedDataset``; tensors come from
``readers.datasets.tensors``; the jobs a reader holds are objects of their own: ``OutputFiles``
(files and identity), ``OutputInfo`` (the manifest's facts), ``ImageCrops`` (crop and flip),
``BatchBuffers`` (where batches go, the loader's choice).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from packer.spec.errors import ConfigError
from packer.spec.sample_layout import SampleLayout
from packer.spec.splits_record import check_split_member
from readers.augment.crops import CenterCrop, Placement, RandomResizedCrop
from readers.augment.image_crops import ImageCrops
from readers.compose.combine import concat
from readers.datasets.image_transform import TRANSFORM_INPUTS, ImageTransform
from readers.datasets.output_files import OutputFiles
from readers.datasets.output_info import FromInfo, OutputInfo
from readers.datasets.samples import TargetTransform, Transform, build_sample
from readers.datasets.tensors import BatchNormalize, ImageConverter, checked_memory_format
from readers.loading.batch_buffers import BatchBuffers
from readers.remote.block_cache import BlockCache
from readers.remote.urls import is_url

DEFAULT_CACHE_LIMIT = 16 << 30
"""Bytes of blocks read by ranges that ``cache_dir`` keeps at most, by default (``readers.remote.block_cache``)."""


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
    ``label_offset`` (detection outputs) is added to every box's label as the reader returns it:
    stored labels index the categories from 0, torchvision's detectors want them from 1 (0 is their
    background), so ``label_offset=1`` feeds them with no glue; nothing on disk changes.

    ``crop`` (``readers.RandomResizedCrop`` or ``readers.CenterCrop``, held as ``crops``) gives every image that size,
    from images stored in any size; ``flip=True`` mirrors each image left to right with probability
    1/2. Both are drawn per sample from ``(seed, epoch, index)`` (``readers.augment.crops``): the same for
    the same seed and epoch whatever the workers, new every epoch (``set_epoch``; ``make_loader``
    follows its own epochs). With ``return_meta`` the meta dict says what was done (``"crop"``:
    the box in the stored image's pixels, and ``"flip"``).

    ``memory_format=torch.channels_last`` lays whole batches of normalized images out as NHWC memory
    (viewed as NCHW, as ``tensor.to(memory_format=torch.channels_last)`` does), what channels-last CNN
    training wants and FFCV gives by default, with the same values; batches of stored values
    (``normalize=False``) are NHWC memory either way. Single samples (``ds[i]``) stay CHW.

    Each shard file is checked when a process first opens it: its size against the manifest (and,
    for LMDB, the checksum of the pages LMDB follows, so a damaged file is refused instead of
    crashing the process), and that the output is still the one this dataset opened (an output
    replaced since, by ``packer convert --overwrite``, is an error, never a mix of the two).
    ``verify=True`` also checks each file's SHA-256 against the manifest before its first read
    (about a second per GB from the page cache): no damaged byte is ever read.

    A map-style output at a URL (``s3://bucket/out``, ``gs://``, ``https://``) is read at random:
    npy and hdf5 outputs by byte ranges, only the samples asked for (``readers.remote.ranges``: a
    batch's requests at once, neighbours joined), each sample checked against the CRC-32 its shard
    records; the blocks read are kept in ``cache_dir`` when given, at most about ``cache_limit`` bytes
    (default ``DEFAULT_CACHE_LIMIT``). LMDB outputs, whose page layout cannot be read by ranges, and
    any output with ``download=True``, are read through ``cache_dir``: each shard file downloaded
    whole once, when a sample of it is first asked for, checked against the manifest's size and
    SHA-256 as it streams, and read from the local copy after.
    """

    format_name: str = ""
    reads_urls: bool = False  # True for readers that stream shards from URLs (readers.remote.urls)
    reads_ranges: bool = False  # True for readers of formats read by byte ranges from URLs (readers.remote.ranges)

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
        label_offset: int = 0,
        memory_format: torch.memory_format = torch.contiguous_format,
        cache_dir: Optional[str | os.PathLike] = None,
        cache_limit: int = DEFAULT_CACHE_LIMIT,
        download: bool = False,
    ) -> None:
        reading = self._remote_reading(root, cache_dir, cache_limit, download)
        ranged, cached = reading == "ranges", reading == "download"
        if is_url(root) and verify:
            raise ConfigError(
                "verify=True checks local shard files before they are read; streamed shards are "
                "always checked against the manifest's size and SHA-256 as they arrive"
            )
        self.root: Any = root if is_url(root) else Path(root)  # Path, or the URL as given (readers.remote.urls)
        self.files = OutputFiles.open(self.root, self.format_name or None, bool(verify))
        """The output's files and identity: the manifest read once, each shard file checked before use."""
        if cached:  # a map-style output at a URL: its shards downloaded once, verified, then read locally
            self.root = self.files.through_cache(cache_dir)
        elif ranged:  # only the samples asked for, each checked against its CRC-32
            self.files.read_by_ranges(BlockCache(cache_dir, cache_limit) if cache_dir is not None else None)
        self.manifest = self.files.manifest
        if not is_url(root):
            check_split_member(self.root, self.files.manifest_sha256)
        self.verify = bool(verify)
        if transform_input not in TRANSFORM_INPUTS:
            raise ConfigError(f"transform_input must be one of {', '.join(TRANSFORM_INPUTS)}, not {transform_input!r}")
        self.normalize = bool(normalize)
        self.memory_format = checked_memory_format(memory_format)
        self.transform_input = transform_input
        self.transform = transform  # sets convert and apply_transform (a property: assigning it later works too)
        self.target_transform = target_transform
        self.return_meta = return_meta
        self.seed = int(seed)
        self.buffers = BatchBuffers()
        """Where whole batches go: fresh memory here; a loader's copy gets the loader's (``for_loader``)."""
        self._offsets = self.manifest.shard_offsets
        self.layout = SampleLayout.from_manifest(self.manifest)
        self.info = OutputInfo(self.manifest, self.root)
        """What the manifest tells (``classes``, ``categories``, ...; given as the reader's attributes too)."""
        # Read for every sample: plain attributes, not looked up through info.
        self.text_fields, self.has_target, self.geometry = (
            self.info.text_fields,
            self.info.has_target,
            self.info.geometry,
        )
        self.crops = ImageCrops.asked(crop, flip, self.root, self.manifest, self.layout, self.info.ignore_index)
        """The crop and flip applied to each image (``readers.augment.image_crops.ImageCrops``), or None."""
        self.label_offset = self._checked_offset(label_offset)
        """Added to each box's label of a detection output's targets (0: the stored labels)."""

    def _remote_reading(self, root: Any, cache_dir: Any, cache_limit: int, download: bool) -> Optional[str]:
        """How the output at ``root`` is read: ``"ranges"`` (npy, hdf5 at a URL), ``"download"`` (whole
        shard files into ``cache_dir``: lmdb at a URL, or ``download=True``), ``"stream"`` (wds at a
        URL) or None (a local folder). ConfigError for options that do not go together."""
        name = type(self).__name__
        if not is_url(root):
            reading = None
        elif self.reads_urls:
            reading = "stream"
        elif self.reads_ranges and not download and not str(root).startswith("pipe:"):
            reading = "ranges"
        else:
            reading = "download"
        if download and reading != "download":
            where = "a local folder" if reading is None else "streamed"
            raise ConfigError(
                f"download=True downloads the shards of an output at a URL that {name} reads at "
                f"random; {root} is {where}"
            )
        if reading == "download" and cache_dir is None:
            why = (
                "its pages cannot be read by byte ranges"
                if not self.reads_ranges
                else "download=True asks it"
                if download
                else "a pipe: command cannot be read by byte ranges"
            )
            raise ConfigError(
                f"{name} reads {root} at random and {why}, so each of its shards is downloaded once into a "
                f"local cache: pass cache_dir= (or convert with --format npy or hdf5, read by ranges, or "
                f"wds, whose shards stream from URLs)"
            )
        if cache_limit != DEFAULT_CACHE_LIMIT and (reading != "ranges" or cache_dir is None):
            raise ConfigError(
                "cache_limit= bounds the blocks that npy and hdf5 outputs read by byte ranges keep in "
                + (
                    "cache_dir=: pass cache_dir= too"
                    if reading == "ranges"
                    else f"cache_dir=; {name} of {root} "
                    "is not read by ranges (whole shards kept in cache_dir= are not bounded)"
                )
            )
        if cache_limit <= 0:
            raise ConfigError(f"cache_limit= is a number of bytes above 0, not {cache_limit}")
        return reading

    @property
    def transform(self) -> Optional[Transform]:
        """The transform applied to each image (see the class); assigning it (``ds.transform = f``,
        as ImageFolder code does) takes effect for the samples read after."""
        return self._transform

    @transform.setter
    def transform(self, transform: Optional[Transform]) -> None:
        self._transform = transform
        uint8 = self.manifest.uint8_images
        # With a transform on uint8 images, the transform gets the stored pixels and the
        # normalization comes after it (ImageTransform); otherwise the converter normalizes.
        # transform_input="normalized" keeps packer 0.2.0's way: the transform gets normalized floats.
        before = self.transform_input == "normalized" or transform is None or not uint8
        self.convert = ImageConverter(self.manifest, self.normalize and before, self.memory_format)
        self.apply_transform: Optional[Callable[[Any], Any]] = None
        if transform is not None and self.manifest.has_image and self.transform_input != "normalized":
            after = BatchNormalize(self.manifest, self.memory_format) if self.normalize and uint8 else None
            self.apply_transform = ImageTransform(transform, after, self.transform_input)
        elif transform is not None:
            self.apply_transform = transform

    @property
    def image_shape(self) -> Optional[tuple[int, int, int]]:
        """(H, W, C) of every image this reader returns, or None when images keep their own sizes."""
        if not self.layout.has_image:
            return None
        size = self.crops.size if self.crops is not None else None
        if size is None:
            return self.layout.shape
        return (size[0], size[1], self.layout.channels)

    def epoch_now(self) -> int:
        """The epoch whose crops and flips samples read now get (``set_epoch``)."""
        return int(getattr(self, "epoch", 0))

    def for_loader(self, buffers: BatchBuffers, seed: int, normalize: bool = True) -> ReaderBase:
        """A copy of this reader for a loader: its whole batches go to ``buffers``, its crops and flips are
        drawn from ``seed``, and with ``normalize=False`` its images stay as stored (the loader
        normalizes them, on the device). The caller's reader keeps its own settings."""
        reader = copy.copy(self)
        reader.buffers, reader.seed = buffers, int(seed)
        if not normalize:
            reader.convert = ImageConverter(self.manifest, normalize=False)
        return reader

    def with_memory_format(self, memory_format: torch.memory_format) -> ReaderBase:
        """A copy of this reader whose whole batches are laid out as ``memory_format`` says."""
        reader = copy.copy(self)
        reader.memory_format = checked_memory_format(memory_format)
        reader.transform = self.transform  # makes the converter again, with the new layout
        return reader

    def cropped(self, crop: Any, bucket_ids: Optional[Any] = None) -> ReaderBase:
        """A copy of this reader whose images get ``crop`` (its flip kept); with ``AspectBuckets``,
        ``bucket_ids`` (each sample's bucket) lets a batch of one bucket be read as one tensor."""
        flip = self.crops is not None and self.crops.augment.flip
        crops = ImageCrops.asked(crop, flip, self.root, self.manifest, self.layout, self.info.ignore_index)
        reader = copy.copy(self)
        reader.crops = crops.with_buckets(bucket_ids) if crops is not None and bucket_ids is not None else crops
        return reader

    def batch_tensor(self, n: int, size: Optional[tuple[int, int]] = None) -> tuple[Optional[int], torch.Tensor]:
        """``(ring slot or None, empty (n, C, H, W) batch tensor)`` for this reader's fixed image size (or
        ``size``, a batch's own), from its ``buffers``. Float32 when normalizing, contiguous or NHWC
        memory (``memory_format``); otherwise the stored dtype in the stored NHWC byte order."""
        h, w = size if size is not None else self.image_shape[:2]  # type: ignore[index]
        c = self.layout.channels
        out_dtype = self.convert.batch_dtype(self.layout.np_dtype)
        return self.buffers.batch_tensor(n, (c, h, w), out_dtype, self.convert.channels_last)

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
        if meta is not None:
            ImageCrops.describe(meta, geometry, placement, self.geometry)
        return build_sample(
            values[0],
            label,
            self.apply_transform,
            meta,
            tuple(values[1:]),
            self.target_transform,
            self.has_target,
            self.label_offset,
        )

    def _checked_offset(self, offset: Any) -> int:
        """``label_offset`` once checked: a whole number, and only where there are box labels to move."""
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise ConfigError(f"label_offset must be a whole number, got {offset!r}")
        if offset and not any(f.kind_of.labelled_boxes for f in self.text_fields):
            raise ConfigError(
                f"label_offset moves the box labels of detection outputs; {self.root} has none. For class "
                "labels pass target_transform=lambda label: label + 1"
            )
        return offset

    @property
    def fixed_images(self) -> bool:
        """True when samples are one image of one size and nothing else: batches are one tensor
        (images stored in one size, or given one by ``crop``)."""
        return self.layout.has_image and not self.text_fields and self.image_shape is not None

    # What the manifest tells, as torchvision's datasets name it (documented on OutputInfo).
    classes = FromInfo()
    class_to_idx = FromInfo()
    class_counts = FromInfo()
    class_map_sha256 = FromInfo()
    categories = FromInfo()
    ignore_index = FromInfo()
    stats = FromInfo()
    pad_id = FromInfo()

    def __add__(self, other: Any) -> Any:
        """``a + b`` as torch's (a ConcatDataset; a ChainDataset for streams), refused with ValueError when
        the class maps differ: the same label would mean another class in each part (``readers.concat``)."""
        return concat([self, other])

    @property
    def one_by_one(self) -> bool:
        """True when samples must be made one by one (a ``transform``, a ``target_transform`` or
        ``return_meta``): the whole-batch paths, which write images and labels straight into batch
        tensors, would skip them."""
        return self.transform is not None or self.target_transform is not None or self.return_meta

    def batch_normalizer(self) -> BatchNormalize:
        """The normalization of this output as a per-batch callable (see BatchNormalize)."""
        return BatchNormalize(self.manifest, self.memory_format)

    def __len__(self) -> int:
        return self.manifest.samples

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r}, samples={len(self)}, shards={len(self.manifest.shards)})"
