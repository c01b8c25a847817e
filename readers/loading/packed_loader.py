"""``PackedLoader``: what ``make_loader`` returns. It iterates its DataLoader's batches in their epoch
order, puts them on the device and normalizes them there, follows its epochs, and saves and restores
where it stands in one (``state_dict``)."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader

from readers.augment import device_decode
from readers.compose.mixture import Mixture
from readers.datasets.base import ReaderBase
from readers.datasets.tensors import BatchNormalize
from readers.datasets.token_blocks import BatchChunk, RingBlocks, RingChunk
from readers.loading.batch_buffers import RingBatch, SlotRing
from readers.loading.collate import Numbered
from readers.loading.sampler import EpochBatchSampler, SamplerBatches
from readers.loading.tar_batches import TarBatches


class PackedLoader:
    """Iterates like a DataLoader over ``(images, labels)`` batches; see ``make_loader``.

    ``loader`` is the underlying DataLoader, ``sampler`` the batch sampler (map-style readers), ``batches``
    the batch plan of a tar-shard reader; ``ring`` the reusable batch buffers its workers fill, if any.
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
        batches: Optional[TarBatches] = None,
        memory_format: torch.memory_format = torch.contiguous_format,
    ) -> None:
        self.dataset, self.loader, self.sampler, self.decoder = dataset, loader, sampler, decoder
        self.memory_format = memory_format
        """How image batches are laid out when handed out: the workers write whole batches so; batches
        stacked from samples (a transform, meta, targets, text) or decoded on the device are copied so."""
        self.batches = batches  # a tar-shard reader's batch plan, whose passes this loader starts
        self.normalize, self.device, self.ring = normalize, device, ring
        self.order = dict(order or {})  # what the batch order depends on: batch_size, world_size, seed (, workers)
        self.epoch = 0  # of the current pass (or of the next one, before any pass)
        self._consumed = 0  # batches handed out in the current epoch
        self._chosen: Optional[tuple[int, int]] = None  # (epoch, first batch) of the next pass, if one was asked for
        self._passes = 0  # passes begun: each new one moves on to the next epoch unless one was chosen
        if sampler is not None:
            # Frameworks (Lightning) call set_epoch on loader.sampler: that call chooses the epoch as ours does.
            sampler.follow(self.set_epoch)

    def __getattr__(self, name: str) -> Any:
        # Only names no attribute has get here. A framework reading these is about to re-make a torch
        # DataLoader around this loader's dataset, which would lose its epoch order, collate and device
        # placement: an AttributeError (what getattr(x, name, default) and hasattr expect) that says so.
        if name in _REMADE_FROM:
            raise AttributeError(
                f"PackedLoader has no {name!r}: it is not a torch DataLoader, and one re-made around its dataset "
                "(accelerate's skip_first_batches, the transformers Trainer's default get_resumed_dataloader) "
                "would lose its batch order. Resume it from its own state instead: loader.load_state_dict(state) "
                "(Accelerate: accelerator.register_for_checkpointing(loader); transformers: override "
                "get_resumed_dataloader to load the state, see docs/READERS.md, Training frameworks)"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch``'s order (without a call, each new pass is the next epoch's).

        After ``load_state_dict``, the epoch the state was saved in keeps its place in that epoch.
        """
        epoch = int(epoch)
        if self._chosen is None or self._chosen[0] != epoch:
            self._chosen = (epoch, 0)

    def __len__(self) -> int:
        # batches, not the DataLoader's items: a worker may read several batches as one (BatchChunks)
        return len(self.sampler) if self.sampler is not None else len(self.loader)

    def describe(self) -> dict:
        """What this loader makes of its output: batches per pass, the batch size, and with
        ``buckets`` each bucket's resolution and image count and the share of pixels its crops cut
        away (beside what centred square crops would), from the output's index alone."""
        about: dict = {"batches": len(self), "batch_size": self.order.get("batch_size")}
        crops = getattr(self.dataset, "crops", None)  # a mixture has none of its own
        if crops is not None and crops.bucket_of_index is not None:
            about.update(crops.augment.crop.describe(self.dataset.image_sizes))
        return about

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
        elif self.batches is not None:  # seen by the workers, persistent ones too, when this pass starts
            self.batches.start_pass(epoch, start)
        if self.ring is not None:
            self.ring.reset()  # slots of batches a left pass never handed out
        yield from self._batches(number, start)

    def _batches(self, number: int, start: int) -> Iterator:
        """The batches of pass ``number`` from batch ``start``, placed and counted."""
        batches = _handed_out(_in_order(self.loader, start), self.ring)
        # Asked before each batch is taken, not after: with persistent workers a newer pass shares
        # the DataLoader's iterator, and a batch this left pass took would be lost to it.
        while number == self._passes:
            batch = next(batches, _END)
            if batch is _END:
                break
            if isinstance(batch, RingBlocks):  # token blocks written into a ring slot by a worker
                batch = batch.hand_out(self.ring)  # type: ignore[arg-type]
                if isinstance(batch, tuple):
                    self._consumed += 1
                    yield tuple(t.to(self.device, non_blocking=True) if self.device else t for t in batch)
                    batch = None
                    continue
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
                images, labels = self.decoder(batch)  # type: ignore[misc]
                yield self._laid_out(images), labels
                batch = images = labels = None
                continue
            if isinstance(batch, RingBatch):
                images, labels, rest = (
                    self.ring.hand_out(batch.slot, batch.n, batch.size),
                    torch.from_numpy(batch.labels),
                    [],
                )  # type: ignore[union-attr]
            else:
                images, labels, *rest = batch
            batch = None
            if self.device is not None:
                images = images.to(self.device, non_blocking=True)
                labels = labels.to(self.device, non_blocking=True)
            if self.normalize is not None:
                images = self.normalize(images)
            self._consumed += 1
            out = (self._laid_out(images), labels, *rest)
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
        return (self._laid_out(images), targets, *rest)

    def _place(self, batch: dict) -> dict:
        """A pad_collate batch with its tensors on the device and its images normalized (arrays that
        crossed from a worker as numpy, see ArraysAcrossWorkers, become tensors again)."""
        batch = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
        if self.device is not None:
            batch = {k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
        if self.normalize is not None and "images" in batch:
            batch["images"] = self.normalize(batch["images"])
        if "images" in batch:
            batch["images"] = self._laid_out(batch["images"])
        return batch

    def _laid_out(self, images: Any) -> Any:
        """``images`` as ``memory_format`` lays batches out: a 4-D tensor not yet so (stacked from
        samples, decoded on the device) is copied so; lists of images of their own sizes are left."""
        if (
            torch.is_tensor(images)
            and images.dim() == 4
            and self.memory_format != torch.contiguous_format
            and not images.is_contiguous(memory_format=self.memory_format)
        ):
            return images.contiguous(memory_format=self.memory_format)
        return images

    def state_dict(self) -> dict:
        """Where this loader stands: the epoch and the batches already handed out in it (plus what
        the batch order depends on, checked when loading). A pass left before its end (a loop that
        breaks to save a checkpoint) is resumed where it was left; the same loader iterated again
        moves on to the next epoch instead, unless ``load_state_dict`` or ``set_epoch`` says otherwise."""
        epoch, consumed = self._chosen if self._chosen is not None else (self.epoch, self._consumed)
        if consumed >= len(self):  # taken during the last batch: the next run starts the next epoch
            epoch, consumed = epoch + 1, 0
        return {"epoch": epoch, "batches": consumed, **self._source(), **self.order}

    def _source(self) -> dict:
        """What the state is of: the samples the epoch order is made for, and the output(s) read
        (their manifests' SHA-256: another output of the same size must not continue this epoch)."""
        parts = self.dataset.datasets if isinstance(self.dataset, Mixture) else [self.dataset]
        digests = [getattr(getattr(p, "files", None), "manifest_sha256", None) for p in parts]
        source: dict = {"size": _size(self.dataset)}
        if all(digests):
            source["output"] = "+".join(d[:16] for d in digests)  # type: ignore[index]
        return source

    def load_state_dict(self, state: dict) -> None:
        """Make the next iteration continue after the batches ``state`` says were handed out.

        Refused when the batch order would differ from the run that saved it: another seed, dataset
        size, bucketing, or (tar shards) worker count; pass the same values. A map-style output's
        state continues on another number of ranks with the same global batch (batch size x ranks):
        the rest of the epoch is every sample not yet seen, each once (``EpochBatchSampler``).
        """
        mine = {**self._source(), **self.order}
        state = {"bucket_by_length": False, **state}  # states saved before bucketing existed did not bucket
        if "output" in state and "output" in mine and state["output"] != mine["output"]:
            raise ValueError(
                "cannot resume: the state was saved reading another output (manifest SHA-256 "
                f"{state['output']}..., this loader reads {mine['output']}...); open the output it was saved with"
            )
        regroups = self.sampler is not None and self.order.get("sampler") is None and self.sampler.regroups
        for key, value in mine.items():
            if key in state and state[key] != value:
                if regroups and key in ("batch_size", "world_size"):
                    continue  # the sampler checks the global batch and where the state was taken
                if key == "world_size" and self.sampler is None:
                    raise ValueError(
                        f"cannot resume on {value} ranks a state saved on {state[key]}: tar shards are "
                        "assigned to ranks and their DataLoader workers, so the rest of an epoch is known "
                        f"only on {state[key]} ranks; resume there, or at the next epoch (state['epoch'] += 1 "
                        "and state['batches'] = 0)"
                    )
                raise ValueError(
                    f"cannot resume: the state was saved with {key}={state[key]}, this loader has "
                    f"{key}={value}; make the loader with the same {key}"
                )
        if self.sampler is not None:
            self.sampler.load_state_dict(state)
        self.epoch = int(state["epoch"])
        self._chosen = (self.epoch, int(state["batches"]))


_REMADE_FROM = frozenset({"batch_sampler", "drop_last"})
"""What re-making a DataLoader around a loader reads first (a map-style dataset's batch sampler, an
iterable one's drop_last), where a framework does that to skip batches."""

_END = object()
"""What ``next`` gives at the end of a pass's batches."""


def _size(dataset: Any) -> int:
    """The samples a loader's epoch order is made for: an output's, or a mixture's epoch."""
    return len(dataset) if isinstance(dataset, Mixture) else dataset.manifest.samples


def _handed_out(items: Iterable, ring: Optional[SlotRing]) -> Iterator:
    """The DataLoader's ``items``, a chunk of batches (``BatchChunks``: a ``RingChunk`` in a ring slot,
    or a ``BatchChunk``) given as its batches one by one, in order; any other item as it is."""
    for item in items:
        if isinstance(item, RingChunk):
            yield from item.hand_out(ring)  # type: ignore[arg-type]
        elif isinstance(item, BatchChunk):
            yield from item
        else:
            yield item


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


__all__ = ["PackedLoader"]
