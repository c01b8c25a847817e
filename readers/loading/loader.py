"""``make_loader``: the one call training code needs to turn a packer reader into batches.

    from readers import open_dataset, make_loader
    loader = make_loader(open_dataset("packed/npy"), batch_size=64, device="cuda")
    for epoch in range(epochs):
        loader.set_epoch(epoch)  # optional: each new pass is the next epoch
        for images, labels in loader:
            ...

Defaults, each overridable by keyword (anything else goes to ``torch.utils.data.DataLoader``):

- ``num_workers``: the physical cores this process may use (not hyper-threads), capped by the
  number of batches (or shards, for tar shards) and by available memory;
- uint8 crosses the worker pipes and each batch is normalized once, after the copy to ``device``
  (on the GPU there), as the output's manifest says: 4x fewer bytes than float32 through shared
  memory. The batches are what the reader with ``normalize=True`` would give;
- ``pin_memory`` and ``non_blocking`` copies when ``device`` is a CUDA device;
- ``persistent_workers=True`` (with workers), ``prefetch_factor`` 2, lowered when batches are large
  against available memory;
- the batch sampler of ``readers.loading.sampler``: a seeded shuffle per epoch, split over ranks when
  ``torch.distributed`` is initialised, equal batch counts on every rank, resumable mid-epoch with
  ``state_dict()`` / ``load_state_dict()``.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader

from readers.augment import device_decode
from readers.augment.buckets import AspectBuckets
from readers.compose.mixture import Mixture
from readers.datasets.base import ReaderBase
from readers.datasets.defaults import default_options
from readers.datasets.mapstyle import PackedDataset
from readers.datasets.tensors import ImageConverter
from readers.datasets.token_blocks import TokenBlocks
from readers.datasets.token_stream import TokenStream
from readers.loading.batch_buffers import BatchBuffers, SlotRing, shared_memory_free
from readers.loading.bucket_sampler import AspectBucketSampler
from readers.loading.collate import ArraysAcrossWorkers, detection_collate, packed_collate, pad_collate
from readers.loading.length_sampler import LengthBucketSampler
from readers.loading.packed_loader import PackedLoader
from readers.loading.sampler import ORDER_VERSION, EpochBatchSampler, SamplerBatches, distributed_rank, epoch_order
from readers.loading.tar_batches import TarBatches
from readers.loading.token_loader import token_loader

log = logging.getLogger(__name__)

WDS_SHUFFLE_BUFFER = 1000
"""Shuffle buffer (samples per worker) that make_loader gives a tar-shard reader opened without one."""


def make_loader(
    dataset: ReaderBase,
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: Optional[int] = None,
    drop_last: bool = False,
    device: Union[str, torch.device, None] = None,
    bucket_by_length: Union[bool, str] = False,
    decode: str = "workers",
    buckets: Optional[AspectBuckets] = None,
    memory_format: Optional[torch.memory_format] = None,
    **overrides: Any,
) -> PackedLoader:
    """A loader of ``(images, labels)`` batches over a packer reader, with the defaults above.

    Outputs with text fields give ``pad_collate`` dicts instead (``input_ids``, ``attention_mask``,
    ``lengths``, ``texts``, ``json``, ``images``, ``labels``: those the samples have), padded with
    the tokenizer's pad id. ``bucket_by_length`` (True, or the name of the text field) batches
    samples of similar length (``LengthBucketSampler`` over ``dataset.lengths()``; map-style
    formats), which cuts the padding.

    ``device``: where batches go (``"cuda"``: pinned memory, ``non_blocking`` copies, normalized
    on the GPU). ``overrides`` replace any default or add any DataLoader option
    (``multiprocessing_context="spawn"``, ``num_workers=0``, ...). ``shuffle``, ``seed`` and
    ``drop_last`` go to the batch sampler; the rank split follows ``torch.distributed`` when it is
    initialised. ``seed`` (by default the dataset's, ``open_dataset(..., seed=)``, else 0) seeds the
    shuffle and the dataset's random crops and flips (``crop=``, ``flip=``), which follow the
    loader's epochs: each batch carries its epoch to the worker that reads it.

    ``sampler=`` (a ``WeightedRandomSampler``, a ``DistributedSampler``, any iterable of indices)
    or ``batch_sampler=`` (lists of indices) choose the order instead, on the map-style readers:
    batches are still read whole; ``shuffle``, ``seed`` and the rank split are then the sampler's,
    and a resumed epoch skips the batches already handed out (the same ones only if the sampler
    draws the same order for the same epoch). With images of their own sizes (``--resize none``)
    a ``transform`` that gives them one size lets batches be stacked.

    ``buckets`` (``readers.AspectBuckets``, for outputs of images of their own sizes on npy, lmdb or
    hdf5): each image goes to the bucket nearest its aspect ratio, known from the output's index of
    sizes, is cropped to the bucket's ratio and resized to its resolution (boxes and masks follow),
    and each batch holds one bucket (``readers.loading.bucket_sampler``); ``loader.describe()`` says
    how many images each bucket got and the share of pixels cropped away.

    ``memory_format=torch.channels_last`` (default: the dataset's, ``open_dataset(..., memory_format=)``)
    gives float32 image batches in NHWC memory, viewed as NCHW (``images.is_contiguous(memory_format=
    torch.channels_last)``), as FFCV does and channels-last CNN training wants: written so by the
    workers, with the same values as NCHW batches; on CUDA they stay so after normalization. Batches
    stacked from samples (a ``transform``, ``return_meta``, targets, text) or decoded on the device
    are copied into that layout as they are handed out.

    ``decode="device"``: for JPEG-stored outputs read with ``crop=``, the workers send each batch's
    JPEG bytes and crop placements, and the loader decodes, crops, flips and normalizes them on
    ``device`` (nvJPEG through torchvision on CUDA; see ``readers.augment.device_decode``). The same crops
    as ``decode="workers"`` (the default), within a level of each pixel with libjpeg-turbo's decode;
    ``scripts/gpu_check.py`` measures nvJPEG's difference, and which decode is faster.
    """
    if decode not in device_decode.DECODE_WHERE:
        raise ValueError(f"decode={decode!r}: use one of {', '.join(map(repr, device_decode.DECODE_WHERE))}")
    tokens = isinstance(dataset, (TokenBlocks, TokenStream)) or (
        isinstance(dataset, Mixture) and isinstance(dataset.datasets[0], TokenBlocks)
    )
    if tokens:
        if decode != "workers" or buckets is not None or bucket_by_length or memory_format is not None:
            raise ValueError("token blocks have no images to decode, bucket or lay out, nor lengths to bucket by")
        return token_loader(dataset, batch_size, shuffle, seed, drop_last, device, overrides)  # type: ignore[arg-type]
    if isinstance(dataset, Mixture):
        if decode != "workers":
            raise ValueError("decode='device' reads one output; a mixture's parts are decoded in the workers")
        if bucket_by_length:
            raise ValueError("bucket_by_length batches one output by its lengths; a mixture draws its own samples")
        if memory_format is not None and memory_format != torch.contiguous_format:
            raise ValueError(
                "memory_format lays out one output's batches as its workers write them; a mixture's batches "
                "are stacked from its parts' samples (NCHW): call images.contiguous(memory_format=...) on them"
            )
        return _mixture_loader(dataset, batch_size, shuffle, seed, drop_last, device, overrides)
    if not isinstance(dataset, ReaderBase):
        raise TypeError(
            f"make_loader takes a packer reader (readers.open_dataset) or a readers.open_mixture, not "
            f"{type(dataset).__name__}"
        )
    if memory_format is not None and memory_format != dataset.memory_format:
        dataset = dataset.with_memory_format(memory_format)
    bucket_ids = None
    if buckets is not None:
        dataset, bucket_ids = _bucketed(dataset, buckets, bucket_by_length, overrides, decode)
    device = torch.device(device) if device is not None else None
    cuda = device is not None and device.type == "cuda"
    normalize = None
    convert = dataset.convert  # the workers' (the loader's reader copy gets it: the caller's keeps its own)
    m = dataset.manifest
    stored_uint8 = m.uint8_images
    if bucket_by_length and not isinstance(dataset, PackedDataset):
        raise ValueError("bucket_by_length needs random access (npy, lmdb or hdf5); tar shards are read in order")
    if cuda and dataset.convert.normalize is not None and stored_uint8 and dataset.transform is None:
        # Same batches as the reader would give, but uint8 through the pipes and the PCIe bus,
        # normalized once on the GPU.
        normalize = dataset.convert.normalize
        convert = ImageConverter(dataset.manifest, normalize=False)
    decoder = None
    if decode == "device":
        why = device_decode.refusal(dataset, isinstance(dataset, PackedDataset), "collate_fn" in overrides)
        if why is not None:
            raise ValueError(f"make_loader(decode='device') cannot read {dataset.root}: {why}")
        decoder = device_decode.DeviceDecoder(device, dataset.layout.mode, dataset.convert.normalize)
        normalize = None  # the decoder normalizes on the device
    transport = convert.batch_dtype(np.dtype(m.fields["image"]["dtype"] if m.has_image else "uint8"))
    seed = int(getattr(dataset, "seed", 0)) if seed is None else int(seed)
    shape = dataset.image_shape
    if (
        m.has_image
        and shape is None
        and buckets is None
        and batch_size > 1
        and "collate_fn" not in overrides
        and dataset.transform is None
        and not dataset.has_target
    ):
        raise ValueError(
            "images of this output have different sizes (--resize none, shorter or max): open it with "
            "crop=readers.RandomResizedCrop(N) or CenterCrop(N), or use batch_size=1, a transform "
            "that gives every image one size, or a collate_fn that can batch them"
        )
    user_sampler = overrides.pop("sampler", None)
    user_batches = overrides.pop("batch_sampler", None)
    if (user_sampler is not None or user_batches is not None) and not isinstance(dataset, PackedDataset):
        raise ValueError(
            "tar shards are read in order, so a sampler cannot choose their samples: use shuffle= "
            "(a shuffle buffer), or convert to npy, lmdb or hdf5 for random access"
        )
    if user_sampler is not None and user_batches is not None:
        raise ValueError("pass sampler= or batch_sampler=, not both (as DataLoader)")
    if bucket_by_length and (user_sampler is not None or user_batches is not None):
        raise ValueError("bucket_by_length makes its own batches: pass it or a sampler, not both")
    rank, world = distributed_rank()
    options = default_options(dataset, batch_size, transport, cuda=cuda, world_size=world)
    options.update(overrides)
    workers = int(options.get("num_workers") or 0)
    if not workers:
        options.pop("persistent_workers", None)
        options.pop("prefetch_factor", None)
    ours = "collate_fn" not in overrides  # a collate of the caller's own sees plain samples, never ring slots
    ring = None
    whole = dataset.fixed_images or (bucket_ids is not None and not dataset.text_fields)  # one tensor a batch
    if workers and ours and not cuda and decoder is None and whole and not dataset.one_by_one:
        # Slots of the largest batch: a bucket's batch fills the first of its bytes.
        largest = max(buckets.resolutions, key=lambda r: r[0] * r[1]) if shape is None else None  # type: ignore[union-attr]
        h, w, c = shape if shape is not None else (*largest, dataset.layout.channels)  # type: ignore[misc]
        per_worker = int(options.get("prefetch_factor") or 2) + 2  # queued + the caller's current and previous
        need = SlotRing.bytes_needed(workers, per_worker, (batch_size, c, h, w), transport)
        free = shared_memory_free()
        if free is None or need <= free // 2:
            ring = SlotRing(workers, per_worker, (batch_size, c, h, w), transport, convert.channels_last)
        else:
            log.info(
                "make_loader: %d MB free in /dev/shm, too little for reusable batch buffers (%d MB)",
                free // 2**20,
                need // 2**20,
            )
    options.setdefault("collate_fn", collate_for(dataset, cuda))
    # The loader's own copy of the reader: these settings never leak into the caller's dataset.
    reader = dataset.for_loader(BatchBuffers(ring, ours, decoder is not None), seed, convert is dataset.convert)
    batches = None  # a tar-shard reader's batch plan (below)
    if isinstance(dataset, PackedDataset):
        sampler: Any
        if user_sampler is not None or user_batches is not None:
            # The caller's order, in whole batches of indices: __getitems__ still reads each batch
            # into one tensor. shuffle and seed are the sampler's business then; so is the rank split.
            sampler = SamplerBatches(
                user_batches if user_batches is not None else user_sampler,
                batch_size,
                drop_last,
                batched=user_batches is not None,
            )
            if world > 1 and not hasattr(sampler.sampler, "set_epoch"):
                raise ValueError(
                    "torch.distributed is initialised, and the sampler given does not split the samples "
                    "between ranks (it has no set_epoch): every rank would draw the same batches, or "
                    "overlapping ones. Pass a DistributedSampler, or a sampler that takes the rank"
                )
        elif bucket_ids is not None:
            sampler = AspectBucketSampler(
                bucket_ids,
                batch_size,
                areas=[h * w for h, w in buckets.resolutions],  # type: ignore[union-attr]
                shuffle=shuffle,
                seed=seed,
                rank=rank,
                world_size=world,
                drop_last=drop_last,
            )
        elif bucket_by_length:
            field = bucket_by_length if isinstance(bucket_by_length, str) else None
            sampler = LengthBucketSampler(
                dataset.lengths(field),
                batch_size,
                shuffle=shuffle,
                seed=seed,
                rank=rank,
                world_size=world,
                drop_last=drop_last,
            )
        else:
            sampler = EpochBatchSampler(
                len(dataset), batch_size, shuffle=shuffle, seed=seed, rank=rank, world_size=world, drop_last=drop_last
            )
        loader = DataLoader(reader, batch_sampler=sampler, **options)
    else:  # tar shards: the reader makes the batches itself, an equal number per rank (see TarBatches)
        sampler = None
        buffer = (dataset.shuffle or WDS_SHUFFLE_BUFFER) if shuffle else 0  # type: ignore[attr-defined]
        control = torch.zeros(2, dtype=torch.int64).share_memory_()
        batches = TarBatches(batch_size, drop_last, rank, world, workers, buffer, control)
        reader.batch_by(batches)  # type: ignore[attr-defined]
        loader = DataLoader(reader, batch_size=None, **options)
    log.debug("make_loader: %s", {k: v for k, v in options.items() if k != "collate_fn"})
    order = {"batch_size": batch_size, "world_size": world, "seed": seed, "bucket_by_length": bucket_by_length or False}
    order["sampler"] = None  # make_loader's own
    if isinstance(sampler, EpochBatchSampler):
        order["order"] = ORDER_VERSION  # a mid-epoch state of another epoch order is refused by the sampler
    if dataset.crops is not None:
        order["augment"] = repr(dataset.crops.augment)  # the crops a resumed run continues with
    if isinstance(sampler, SamplerBatches):
        order["sampler"] = type(sampler.sampler).__name__  # a state saved with another sampler is refused
        if dataset.crops is None or not dataset.crops.random:
            del order["seed"]  # the caller's sampler draws the order, not make_loader's seed
    if sampler is None:
        order["workers"] = workers  # the tar-shard batch plan depends on it
    layout = dataset.memory_format
    return PackedLoader(reader, loader, sampler, normalize, device, ring, order, decoder, batches, layout)


def _bucketed(
    dataset: ReaderBase, buckets: AspectBuckets, bucket_by_length: Any, overrides: dict, decode: str
) -> tuple[ReaderBase, Any]:
    """The reader a bucketed loader reads (a copy cropped by ``buckets``) and each sample's bucket;
    ValueError for what bucketing cannot do, saying what to do instead."""
    if not isinstance(buckets, AspectBuckets):
        raise TypeError(f"buckets takes a readers.AspectBuckets, not {type(buckets).__name__}")
    if not isinstance(dataset, PackedDataset):
        raise ValueError("buckets needs random access (npy, lmdb or hdf5): tar shards are read in order")
    if not dataset.layout.has_image or dataset.layout.shape is not None:
        raise ValueError(
            f"buckets batches images of their own sizes, and every image of {dataset.root} is stored in one "
            "size: convert with --resize none, shorter or max to keep their aspect ratios"
        )
    if dataset.crops is not None and dataset.crops.size is not None:
        raise ValueError("buckets crops each image to its bucket: open the dataset without crop= (flip= is kept)")
    if bucket_by_length or "sampler" in overrides or "batch_sampler" in overrides or decode != "workers":
        raise ValueError(
            "buckets makes its own batches, decoded in the workers: pass no bucket_by_length, sampler, "
            "batch_sampler or decode='device' with it"
        )
    ids = buckets.bucket_ids(dataset.image_sizes)
    return dataset.cropped(buckets, ids), ids


def collate_for(dataset: ReaderBase, cuda: bool) -> Callable[[Any], Any]:
    """The collate ``make_loader`` gives batches of ``dataset`` (or of a mixture of readers like it):
    ``detection_collate`` for detection and segmentation outputs, ``pad_collate`` with the tokenizer's
    pad id for outputs with text fields, else ``packed_collate``. Off CUDA, small tensors of the first
    two cross the worker pipes as numpy (``ArraysAcrossWorkers``); on CUDA they stay tensors, to be pinned."""
    if dataset.has_target:
        return detection_collate if cuda else ArraysAcrossWorkers(detection_collate)
    if dataset.text_fields:
        pad = functools.partial(pad_collate, pad_id=dataset.pad_id, fields=dataset.manifest.sample_fields)
        return pad if cuda else ArraysAcrossWorkers(pad)
    return packed_collate


def _mixture_loader(
    mixture: Mixture,
    batch_size: int,
    shuffle: bool,
    seed: Optional[int],
    drop_last: bool,
    device: Union[str, torch.device, None],
    overrides: dict,
) -> PackedLoader:
    """``make_loader`` of a mixture: make_loader's sampler (equal batches per rank, exact resume) over
    the mixture's epoch; each part normalizes its own samples in the workers (``readers.compose.mixture``)."""
    if overrides.get("sampler") is not None or overrides.get("batch_sampler") is not None:
        raise ValueError("a mixture draws its own samples: pass no sampler or batch_sampler")
    device = torch.device(device) if device is not None else None
    cuda = device is not None and device.type == "cuda"
    first = mixture.datasets[0]
    m = first.manifest
    if (
        m.has_image
        and first.image_shape is None
        and batch_size > 1
        and "collate_fn" not in overrides
        and first.transform is None
        and not first.has_target
    ):
        raise ValueError(
            "the mixture's images have different sizes: open its parts with crop=readers.RandomResizedCrop"
            "(N) or CenterCrop(N), or use batch_size=1 or a collate_fn that can batch them"
        )
    if seed is not None and int(seed) != mixture.seed:
        mixture = mixture.with_seed(int(seed))  # as for one dataset: the loader's seed draws the crops too
    seed = mixture.seed
    rank, world = distributed_rank()
    transport = first.convert.batch_dtype(np.dtype(m.fields["image"]["dtype"] if m.has_image else "uint8"))
    options = default_options(first, batch_size, transport, cuda=cuda, world_size=world, samples=len(mixture))
    options.update(overrides)
    if not int(options.get("num_workers") or 0):
        options.pop("persistent_workers", None)
        options.pop("prefetch_factor", None)
    options.setdefault("collate_fn", collate_for(first, cuda))
    sampler, order = epoch_order(len(mixture), batch_size, shuffle, seed, drop_last, rank, world)
    loader = DataLoader(mixture, batch_sampler=sampler, **options)
    order = {**order, "mixture": mixture.order_record()}
    if first.crops is not None:
        order["augment"] = repr(first.crops.augment)
    return PackedLoader(mixture, loader, sampler, None, device, None, order)


__all__ = ["make_loader", "collate_for", "WDS_SHUFFLE_BUFFER"]
