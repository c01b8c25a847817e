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

import copy
import functools
import logging
from typing import Any, Iterable, Iterator, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader

from readers.augment import device_decode
from readers.compose.mixture import Mixture
from readers.datasets.base import ReaderBase
from readers.datasets.defaults import default_options
from readers.datasets.mapstyle import PackedDataset
from readers.datasets.tensors import BatchNormalize, ImageConverter
from readers.loading.collate import (
    ArraysAcrossWorkers,
    Numbered,
    RingBatch,
    SlotRing,
    detection_collate,
    packed_collate,
    pad_collate,
    shared_memory_free,
)
from readers.loading.sampler import (
    ORDER_VERSION,
    EpochBatchSampler,
    LengthBucketSampler,
    SamplerBatches,
    distributed_rank,
)

log = logging.getLogger(__name__)

WDS_SHUFFLE_BUFFER = 1000
"""Shuffle buffer (samples per worker) that make_loader gives a tar-shard reader opened without one."""


class PackedLoader:
    """Iterates like a DataLoader over ``(images, labels)`` batches; see ``make_loader``.

    ``loader`` is the underlying DataLoader, ``sampler`` the batch sampler (map-style readers).
    """

    def __init__(
        self,
        dataset: ReaderBase,
        loader: DataLoader,
        sampler: Optional[Union[EpochBatchSampler, SamplerBatches]],
        normalize: Optional[BatchNormalize],
        device: Optional[torch.device],
        ring: Optional[SlotRing] = None,
        order: Optional[dict] = None,
        decoder: Optional[device_decode.DeviceDecoder] = None,
    ) -> None:
        self.dataset, self.loader, self.sampler, self.decoder = dataset, loader, sampler, decoder
        self.normalize, self.device, self.ring = normalize, device, ring
        self.order = dict(order or {})  # what the batch order depends on: batch_size, world_size, seed (, workers)
        self.epoch = 0  # of the current pass (or of the next one, before any pass)
        self._consumed = 0  # batches handed out in the current epoch
        self._chosen: Optional[tuple[int, int]] = None  # (epoch, first batch) of the next pass, if one was asked for
        self._passes = 0  # passes begun: each new one moves on to the next epoch unless one was chosen
        if sampler is not None:
            # Frameworks (Lightning) call set_epoch on loader.sampler: that call chooses the epoch as ours does.
            sampler.follow(self.set_epoch)

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch``'s order (without a call, each new pass is the next epoch's).

        After ``load_state_dict``, the epoch the state was saved in keeps its place in that epoch.
        """
        epoch = int(epoch)
        if self._chosen is None or self._chosen[0] != epoch:
            self._chosen = (epoch, 0)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        # The epoch is chosen when the first batch is asked for, not at iter(): Lightning calls iter()
        # once only to check that the loader is iterable, and calls set_epoch between iter() and the
        # first batch. A framework that stops after len(self) batches never runs a pass to its end,
        # yet the next pass is the next epoch.
        if self._chosen is not None:
            epoch, start = self._chosen
        else:
            epoch, start = self.epoch + (1 if self._passes else 0), 0
        self._chosen = None
        self._passes += 1
        number = self._passes
        self.epoch, self._consumed = epoch, start
        if self.sampler is not None:
            self.sampler.begin(epoch, start)
        else:  # seen by the workers, persistent ones too, when this pass starts
            self.dataset.start_pass(epoch, start)  # type: ignore[union-attr]
        if self.ring is not None:
            self.ring.reset()  # slots of batches a left pass never handed out
        yield from self._batches(number, start)

    def _batches(self, number: int, start: int) -> Iterator:
        """The batches of pass ``number`` from batch ``start``, placed and counted."""
        batches = _in_order(self.loader, start)
        # Asked before each batch is taken, not after: with persistent workers a newer pass shares
        # the DataLoader's iterator, and a batch this left pass took would be lost to it.
        while number == self._passes:
            batch = next(batches, _END)
            if batch is _END:
                break
            if self.dataset.has_target:  # detection_collate's (images, targets[, metas])
                self._consumed += 1
                yield self._place_detection(batch)
                batch = None
                continue
            if isinstance(batch, dict):  # pad_collate's batches (outputs with text fields)
                self._consumed += 1
                yield self._place(batch)
                batch = None
                continue
            if isinstance(batch, device_decode.EncodedBatch):  # decode="device"
                self._consumed += 1
                yield self.decoder(batch)  # type: ignore[misc]
                batch = None
                continue
            if isinstance(batch, RingBatch):
                images, labels, rest = self.ring.hand_out(batch.slot, batch.n), torch.from_numpy(batch.labels), []  # type: ignore[union-attr]
            else:
                images, labels, *rest = batch
            batch = None
            if self.device is not None:
                images = images.to(self.device, non_blocking=True)
                labels = labels.to(self.device, non_blocking=True)
            if self.normalize is not None:
                images = self.normalize(images)
            self._consumed += 1
            out = (images, labels, *rest)
            images = labels = rest = None  # so that only the caller holds the batch now
            yield out
            out = None

    def _place_detection(self, batch: tuple) -> tuple:
        """A detection batch with its images and targets' tensors on the device, the images normalized."""
        images, targets, *rest = batch
        tensor = lambda v: torch.from_numpy(v) if isinstance(v, np.ndarray) else v  # noqa: E731 - crossed as numpy
        if isinstance(targets, list):
            targets = [{k: tensor(v) for k, v in t.items()} if isinstance(t, dict) else tensor(t) for t in targets]
        if self.device is not None:
            move = lambda t: t.to(self.device, non_blocking=True)  # noqa: E731
            images = move(images) if torch.is_tensor(images) else [move(i) for i in images]
            if torch.is_tensor(targets):  # stacked masks
                targets = move(targets)
            else:
                targets = [
                    move(t) if torch.is_tensor(t) else {k: move(v) if torch.is_tensor(v) else v for k, v in t.items()}
                    for t in targets
                ]
        if self.normalize is not None:
            images = self.normalize(images) if torch.is_tensor(images) else [self.normalize(i[None])[0] for i in images]
        return (images, targets, *rest)

    def _place(self, batch: dict) -> dict:
        """A pad_collate batch with its tensors on the device and its images normalized (arrays that
        crossed from a worker as numpy, see ArraysAcrossWorkers, become tensors again)."""
        batch = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
        if self.device is not None:
            batch = {k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
        if self.normalize is not None and "images" in batch:
            batch["images"] = self.normalize(batch["images"])
        return batch

    def state_dict(self) -> dict:
        """Where this loader stands: the epoch and the batches already handed out in it (plus what
        the batch order depends on, checked when loading). A pass left before its end (a loop that
        breaks to save a checkpoint) is resumed where it was left; the same loader iterated again
        moves on to the next epoch instead, unless ``load_state_dict`` or ``set_epoch`` says otherwise."""
        epoch, consumed = self._chosen if self._chosen is not None else (self.epoch, self._consumed)
        if consumed >= len(self):  # taken during the last batch: the next run starts the next epoch
            epoch, consumed = epoch + 1, 0
        return {"epoch": epoch, "batches": consumed, "size": _size(self.dataset), **self.order}

    def load_state_dict(self, state: dict) -> None:
        """Make the next iteration continue after the batches ``state`` says were handed out.

        Refused when the batch order would differ from the run that saved it: another batch size,
        seed, world size, dataset size, bucketing, or (tar shards) worker count; pass the same values.
        """
        mine = {"size": _size(self.dataset), **self.order}
        state = {"bucket_by_length": False, **state}  # states saved before bucketing existed did not bucket
        for key, value in mine.items():
            if key in state and state[key] != value:
                raise ValueError(
                    f"cannot resume: the state was saved with {key}={state[key]}, this loader has "
                    f"{key}={value}; make the loader with the same {key}"
                )
        if self.sampler is not None:
            self.sampler.load_state_dict(state)
        self.epoch = int(state["epoch"])
        self._chosen = (self.epoch, int(state["batches"]))


_END = object()
"""What ``next`` gives at the end of a pass's batches."""


def _size(dataset: Any) -> int:
    """The samples a loader's epoch order is made for: an output's, or a mixture's epoch."""
    return len(dataset) if isinstance(dataset, Mixture) else dataset.manifest.samples


def _in_order(batches: Iterable, first: int) -> Iterator:
    """``batches`` with ``Numbered`` ones put back in number order from ``first`` (the DataLoader takes
    one batch from each worker in turn, which after a resume need not be the epoch's planned order)."""
    waiting: dict[int, Any] = {}
    expected = first
    for batch in batches:
        if not isinstance(batch, Numbered):
            yield batch
            continue
        waiting[batch[0]] = batch[1]
        while expected in waiting:
            yield waiting.pop(expected)
            expected += 1
    if waiting:
        raise RuntimeError(f"batches {sorted(waiting)} arrived but batch {expected} never did")


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

    ``decode="device"``: for JPEG-stored outputs read with ``crop=``, the workers send each batch's
    JPEG bytes and crop placements, and the loader decodes, crops, flips and normalizes them on
    ``device`` (nvJPEG through torchvision on CUDA; see ``readers.augment.device_decode``). The same crops
    as ``decode="workers"`` (the default), within a level of each pixel with libjpeg-turbo's decode;
    ``scripts/gpu_check.py`` measures nvJPEG's difference, and which decode is faster.
    """
    if decode not in device_decode.DECODE_WHERE:
        raise ValueError(f"decode={decode!r}: use one of {', '.join(map(repr, device_decode.DECODE_WHERE))}")
    if isinstance(dataset, Mixture):
        if decode != "workers":
            raise ValueError("decode='device' reads one output; a mixture's parts are decoded in the workers")
        if bucket_by_length:
            raise ValueError("bucket_by_length batches one output by its lengths; a mixture draws its own samples")
        return _mixture_loader(dataset, batch_size, shuffle, seed, drop_last, device, overrides)
    if not isinstance(dataset, ReaderBase):
        raise TypeError(
            f"make_loader takes a packer reader (readers.open_dataset) or a readers.open_mixture, not "
            f"{type(dataset).__name__}"
        )
    device = torch.device(device) if device is not None else None
    cuda = device is not None and device.type == "cuda"
    normalize = None
    reader = copy.copy(dataset)  # the loader's own view: settings below never leak into the caller's dataset
    m = dataset.manifest
    stored_uint8 = m.has_image and m.fields["image"]["dtype"] == "uint8"
    if bucket_by_length and not isinstance(dataset, PackedDataset):
        raise ValueError("bucket_by_length needs random access (npy, lmdb or hdf5); tar shards are read in order")
    if cuda and dataset.convert.normalize is not None and stored_uint8 and dataset.transform is None:
        # Same batches as the reader would give, but uint8 through the pipes and the PCIe bus,
        # normalized once on the GPU.
        normalize = dataset.convert.normalize
        reader.convert = ImageConverter(dataset.manifest, normalize=False)
    decoder = None
    if decode == "device":
        why = device_decode.refusal(dataset, isinstance(dataset, PackedDataset), "collate_fn" in overrides)
        if why is not None:
            raise ValueError(f"make_loader(decode='device') cannot read {dataset.root}: {why}")
        decoder = device_decode.DeviceDecoder(device, dataset.layout.mode, dataset.convert.normalize)
        reader.encoded_batches, normalize = True, None  # the decoder normalizes on the device
    transport = reader.convert.batch_dtype(np.dtype(m.fields["image"]["dtype"] if m.has_image else "uint8"))
    seed = int(getattr(dataset, "seed", 0)) if seed is None else int(seed)
    reader.seed = seed
    shape = dataset.image_shape
    if (
        m.has_image
        and shape is None
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
    reader.shared_batches = ours
    ring = None
    if workers and ours and not cuda and decoder is None and dataset.fixed_images and not reader.one_by_one:
        h, w, c = shape
        per_worker = int(options.get("prefetch_factor") or 2) + 2  # queued + the caller's current and previous
        need = SlotRing.bytes_needed(workers, per_worker, (batch_size, c, h, w), transport)
        free = shared_memory_free()
        if free is None or need <= free // 2:
            ring = reader.ring = SlotRing(
                workers, per_worker, (batch_size, c, h, w), transport, reader.convert.normalize is None
            )
        else:
            log.info(
                "make_loader: %d MB free in /dev/shm, too little for reusable batch buffers (%d MB)",
                free // 2**20,
                need // 2**20,
            )
    text = bool(dataset.text_fields) and not dataset.has_target
    if dataset.has_target:
        options.setdefault("collate_fn", detection_collate if cuda else ArraysAcrossWorkers(detection_collate))
    if text:
        pad = functools.partial(pad_collate, pad_id=dataset.pad_id, fields=m.sample_fields)
        options.setdefault("collate_fn", pad if cuda else ArraysAcrossWorkers(pad))  # cuda: tensors, to be pinned
    options.setdefault("collate_fn", packed_collate)
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
    else:  # tar shards: the reader makes the batches itself, an equal number per rank (see configure_batches)
        sampler = None
        reader.shuffle = (reader.shuffle or WDS_SHUFFLE_BUFFER) if shuffle else 0
        reader.configure_batches(
            batch_size,
            drop_last=drop_last,
            rank=rank,
            world_size=world,
            workers=workers,
            control=torch.zeros(2, dtype=torch.int64).share_memory_(),
        )
        loader = DataLoader(reader, batch_size=None, **options)
    log.debug("make_loader: %s", {k: v for k, v in options.items() if k != "collate_fn"})
    order = {"batch_size": batch_size, "world_size": world, "seed": seed, "bucket_by_length": bucket_by_length or False}
    order["sampler"] = None  # make_loader's own
    if isinstance(sampler, EpochBatchSampler):
        order["order"] = ORDER_VERSION  # a mid-epoch state of another epoch order is refused by the sampler
    if dataset.augment is not None:
        order["augment"] = repr(dataset.augment)  # the crops a resumed run continues with
    if isinstance(sampler, SamplerBatches):
        order["sampler"] = type(sampler.sampler).__name__  # a state saved with another sampler is refused
        if dataset.augment is None or not dataset.augment.random:
            del order["seed"]  # the caller's sampler draws the order, not make_loader's seed
    if sampler is None:
        order["workers"] = workers  # the tar-shard batch plan depends on it
    return PackedLoader(reader, loader, sampler, normalize, device, ring, order, decoder)


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
    if first.has_target:
        options.setdefault("collate_fn", detection_collate if cuda else ArraysAcrossWorkers(detection_collate))
    elif first.text_fields:
        pad = functools.partial(pad_collate, pad_id=first.pad_id, fields=m.sample_fields)
        options.setdefault("collate_fn", pad if cuda else ArraysAcrossWorkers(pad))
    options.setdefault("collate_fn", packed_collate)
    sampler = EpochBatchSampler(
        len(mixture), batch_size, shuffle=shuffle, seed=seed, rank=rank, world_size=world, drop_last=drop_last
    )
    loader = DataLoader(mixture, batch_sampler=sampler, **options)
    order = {
        "batch_size": batch_size,
        "world_size": world,
        "seed": seed,
        "bucket_by_length": False,
        "sampler": None,
        "order": ORDER_VERSION,
        "mixture": {
            "parts": {n: [len(d), w] for n, d, w in zip(mixture.names, mixture.datasets, mixture.weights)},
            "seed": mixture.seed,
        },
    }
    if first.augment is not None:
        order["augment"] = repr(first.augment)
    return PackedLoader(mixture, loader, sampler, None, device, None, order)


__all__ = ["make_loader", "PackedLoader"]
