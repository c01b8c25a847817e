"""Batches built in one piece: the tensors a reader's ``__getitems__`` fills, and the collate that
passes them through.

A map-style reader given a whole batch of indices (PyTorch calls ``__getitems__`` when it exists)
writes every image straight into its slot of one batch tensor, normalizing on the way, instead of
making a tensor per sample that ``default_collate`` then copies again. Inside a DataLoader worker
the batch tensor is allocated in shared memory, so it crosses to the main process without a copy.

``packed_collate`` returns such a batch as it is; any other list of samples goes to PyTorch's
``default_collate``. A plain ``DataLoader`` with the default collate still gets correct batches
from a ``PackedBatch`` (it is also a list of per-sample views), only slower.
"""

from __future__ import annotations

import math
import numbers
import os
import weakref
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info

from readers.augment.device_decode import EncodedBatch


class PackedBatch(list):
    """The samples of one batch, already collated: ``images`` (N, C, H, W) and ``labels`` (N,).

    As a list it holds ``(images[i], labels[i])`` views, which is what ``default_collate`` expects.
    ``slot`` is the ``SlotRing`` slot the images were written into, if any.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, slot: int | None = None) -> None:
        super().__init__(zip(images, labels.tolist()))  # int labels, as dataset[i] gives
        self.images = images
        self.labels = labels
        self.slot = slot

    def collated(self) -> tuple:
        """``(images, labels)`` as ``default_collate`` would return them, or a ``RingBatch``."""
        if self.slot is not None:
            return RingBatch(self.slot, len(self.labels), self.labels.numpy())
        return self.images, self.labels


class Numbered(NamedTuple):
    """A batch with its position in the epoch, for batches made out of order (a NamedTuple, so that
    the DataLoader's pin-memory step keeps it intact on every PyTorch version)."""

    number: int
    batch: Any


def packed_collate(batch: Any) -> Any:
    """Collate for packer readers: a ``PackedBatch`` as it is, samples with text or json fields (a
    ``str``, a json ``dict`` or the ``None`` of one stored empty) by ``pad_collate``, anything else
    by ``default_collate``."""
    if isinstance(batch, Numbered):
        return Numbered(batch.number, packed_collate(batch.batch))
    if isinstance(batch, PackedBatch):
        return batch.collated()
    if isinstance(batch, EncodedBatch):  # make_loader(decode="device"): decoded by the loader
        return batch
    if (
        batch
        and all(isinstance(s, tuple) for s in batch)
        and any(x is None or isinstance(x, (str, dict)) for s in batch for x in s[:-1])
    ):
        return pad_collate(batch)
    return default_collate(batch)


def empty_batch(
    shape: tuple[int, int, int, int], dtype: torch.dtype, channels_last: bool = False, shared: bool = True
) -> torch.Tensor:
    """An uninitialized (N, C, H, W) tensor; in shared memory when ``shared`` and called in a DataLoader
    worker (only worth it when the batch crosses to the main process as it is: ``packed_collate``).

    ``channels_last=True`` lays the bytes out as N x H x W x C (the stored order), so filling it is
    a plain copy per sample; the tensor's shape is still (N, C, H, W).
    """
    n, c, h, w = shape
    physical = (n, h, w, c) if channels_last else (n, c, h, w)
    if not shared or get_worker_info() is None:
        # From numpy, which asks for huge pages for large arrays: a fresh batch then costs a few page
        # faults, not one per 4 KiB. torch.empty's memory, mapped afresh for each batch by some
        # processes' allocator and not by others, made uint8 reads in the main process run at one
        # of two very different rates from one process to the next.
        out = torch.from_numpy(np.empty(physical, dtype=torch.empty(0, dtype=dtype).numpy().dtype))
    else:
        # As default_collate does: fill shared memory directly instead of copying into it later.
        itemsize = torch.empty(0, dtype=dtype).element_size()
        storage = torch.UntypedStorage._new_shared(max(1, math.prod(physical) * itemsize))
        out = torch.empty(0, dtype=dtype).set_(storage, 0, physical)
    return out.permute(0, 3, 1, 2) if channels_last else out


class SlotRing:
    """Batch buffers in shared memory, made once and reused, between DataLoader workers and the loader.

    Every batch through a worker pipe normally lands in freshly mapped shared memory, and on a
    virtual machine faulting in those pages costs more than filling them. Here each worker owns
    ``per_worker`` slots made before the workers start. A worker fills a slot it owns that is free
    and sends only its number (``RingBatch``); ``make_loader``'s iterator hands out the slot itself,
    and the slot is free again once nothing refers to the batch any more (``hand_out``). When all of
    a worker's slots are held (a training loop that keeps batches), it falls back to the usual fresh
    shared memory: the ring only ever saves time, it never waits.
    """

    def __init__(
        self, workers: int, per_worker: int, shape: tuple[int, int, int, int], dtype: torch.dtype, channels_last: bool
    ) -> None:
        self.workers, self.per_worker, self.shape, self.dtype = workers, per_worker, shape, dtype
        self.channels_last = channels_last
        n, c, h, w = shape
        physical = (n, h, w, c) if channels_last else shape
        self.slots = [torch.empty(physical, dtype=dtype).share_memory_() for _ in range(workers * per_worker)]
        self.free = torch.ones(workers * per_worker, dtype=torch.uint8).share_memory_()
        self._out: dict[int, weakref.finalize] = {}  # slots handed out by the loader, by finalizer

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_out": {}}  # finalizers stay in the loader's process

    @staticmethod
    def bytes_needed(workers: int, per_worker: int, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        """Shared memory a ring of this size takes."""
        return workers * per_worker * math.prod(shape) * torch.empty(0, dtype=dtype).element_size()

    def view(self, slot: int, n: int) -> torch.Tensor:
        """The (n, C, H, W) batch tensor over slot ``slot``."""
        t = self.slots[slot][:n]
        return t.permute(0, 3, 1, 2) if self.channels_last else t

    def hand_out(self, slot: int, n: int) -> torch.Tensor:
        """In the loader: the batch in slot ``slot`` as a tensor that frees the slot when it dies.

        The tensor is made over a numpy view of the slot that only it (and every tensor sharing
        its memory: views, slices, numpy arrays of it) keeps alive; when the last of them goes,
        the view's finalizer marks the slot free. Exact, with no polling.
        """
        array = self.slots[slot].numpy()[:n]
        handed = self._out[slot] = weakref.finalize(array, self.release, slot)
        handed.atexit = False
        t = torch.from_numpy(array)
        return t.permute(0, 3, 1, 2) if self.channels_last else t

    def reset(self) -> None:
        """In the loader, before a pass: free the slots filled for batches never handed out (a pass
        left early, whose queued batches the DataLoader threw away)."""
        for slot in range(len(self.slots)):
            handed = self._out.get(slot)
            if handed is None or not handed.alive:
                self.free[slot] = 1

    def claim(self, n: int, dtype: torch.dtype) -> tuple[int, torch.Tensor] | None:
        """In a worker: a free slot of its own and its tensor for ``n`` samples, or None."""
        info = get_worker_info()
        if info is None or info.id >= self.workers or n > self.shape[0] or dtype != self.dtype:
            return None
        first = info.id * self.per_worker
        for slot in range(first, first + self.per_worker):
            if self.free[slot]:
                self.free[slot] = 0
                return slot, self.view(slot, n)
        return None

    def release(self, slot: int) -> None:
        """In the loader: slot ``slot`` may be filled again."""
        self.free[slot] = 1


class RingBatch(NamedTuple):
    """What a worker sends for a batch filled into a ``SlotRing`` slot."""

    slot: int
    n: int
    labels: np.ndarray  # numpy, pickled by value: a tensor would travel through its own shared memory


def shared_memory_free() -> int | None:
    """Bytes free in /dev/shm (where PyTorch puts shared tensors on Linux), or None where unknown."""
    try:
        st = os.statvfs("/dev/shm")
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


# What pad_collate calls each element of a sample, and the output key each kind goes to.
_KEYS = {"ids": "input_ids", "image": "images", "text": "texts", "json": "json", "label": "labels", "meta": "meta"}
_NAMES = {
    "ids": "token ids",
    "image": "image",
    "text": "text",
    "json": "json dict",
    "label": "label",
    "meta": "meta dict",
}


def pad_collate(
    samples: Sequence[Any],
    *,
    pad_id: int = 0,
    pad_to_multiple_of: int | None = None,
    max_length: int | None = None,
    fields: Sequence[str] | None = None,
) -> Any:
    """Collate samples with variable-length token ids: pad them to the longest of the batch.

    A sample is a 1-D integer tensor of token ids, or a tuple of fields (an image tensor, a text
    ``str``, 1-D token ids, a json ``dict``, at most one of each) followed by an ``int`` label and,
    with ``return_meta=True``, the meta dict. Returns a dict with the keys the samples have:

    - ``"input_ids"`` (B, L) int64, padded with ``pad_id`` to L = the longest ids of the batch, cut
      at ``max_length`` and rounded up to a multiple of ``pad_to_multiple_of``;
    - ``"attention_mask"`` (B, L) int64, 1 over tokens and 0 over padding; ``"lengths"`` (B,) int64;
    - ``"images"`` stacked (B, C, H, W); ``"texts"`` and ``"json"`` lists; ``"labels"`` (B,) int64;
      ``"meta"`` a list of the meta dicts.

    ``fields`` names the fields before the label (a reader's ``manifest.sample_fields``, e.g.
    ``("image", "text", "json")``; ``make_loader`` passes them): kinds then come from the names, so a
    json value of any type (a list, a number, None for a missing one) lands in ``"json"``.
    Without it, kinds are guessed from the values' types.

        from functools import partial
        sampler = LengthBucketSampler(ds.lengths(), batch_size=32, seed=0)
        loader = DataLoader(ds, batch_sampler=sampler, collate_fn=partial(pad_collate, pad_id=tok.pad_id))
        for batch in loader:
            logits = model(batch["input_ids"], attention_mask=batch["attention_mask"])
    """
    if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        raise ValueError(f"pad_to_multiple_of must be at least 1, got {pad_to_multiple_of}")
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be at least 1, got {max_length}")
    if max_length is not None and pad_to_multiple_of and max_length % pad_to_multiple_of:
        raise ValueError(
            f"max_length={max_length} is not a multiple of pad_to_multiple_of={pad_to_multiple_of}: "
            "the padded length could exceed max_length"
        )
    if isinstance(samples, Numbered):
        return Numbered(
            samples.number,
            pad_collate(
                samples.batch,
                pad_id=pad_id,
                pad_to_multiple_of=pad_to_multiple_of,
                max_length=max_length,
                fields=fields,
            ),
        )
    if isinstance(samples, PackedBatch) and samples.slot is None:  # a map-style reader's batch, already stacked
        return {"images": samples.images, "labels": samples.labels}
    if len(samples) == 0:
        raise ValueError("pad_collate got an empty batch")
    rows = [tuple(s) if isinstance(s, (tuple, list)) else (s,) for s in samples]
    structure = _structure if fields is None else lambda row, i: _named_structure(row, i, tuple(fields))
    kinds = structure(rows[0], 0)
    for i, row in enumerate(rows[1:], 1):
        other = structure(row, i)
        if other != kinds:
            raise ValueError(
                f"sample {i} is ({_describe(other)}) but sample 0 is ({_describe(kinds)}): "
                "every sample of a batch must have the same fields"
            )
    out: dict[str, Any] = {}
    for kind, column in zip(kinds, zip(*rows)):
        if kind == "ids":
            out["input_ids"], out["attention_mask"], out["lengths"] = _pad(
                column, pad_id, pad_to_multiple_of, max_length
            )
        elif kind == "image":
            out["images"] = _stack(column)
        elif kind == "label":
            out["labels"] = torch.tensor([int(x) for x in column], dtype=torch.int64)
        else:
            out[_KEYS[kind]] = list(column)
    return out


def detection_collate(samples: Sequence[Any]) -> Any:
    """Batch detection samples ``(image, target[, meta])`` as torchvision's detection models take them:
    ``(images, targets[, metas])``, the images stacked (B, C, H, W) when they share a size (else a
    list of tensors, which the models take too), the targets a list of dicts. Segmentation samples
    ``(image, mask)`` alike, the masks stacked (B, H, W) when they share a size."""
    if isinstance(samples, Numbered):
        return Numbered(samples.number, detection_collate(samples.batch))
    if len(samples) == 0:
        raise ValueError("detection_collate got an empty batch")
    images = [s[0] for s in samples]
    targets = [s[1] for s in samples]
    same = all(torch.is_tensor(i) and i.shape == images[0].shape for i in images)
    masks = all(torch.is_tensor(t) and t.shape == targets[0].shape for t in targets)
    batch = (torch.stack(images) if same else images, torch.stack(targets) if masks else targets)
    return batch if len(samples[0]) < 3 else (*batch, [s[2] for s in samples])


class ArraysAcrossWorkers:
    """Wraps a collate that returns a dict of tensors so that, inside a DataLoader worker, the
    tensors go back to the main process as numpy arrays (``PackedLoader`` turns them into tensors).

    Small batches (token ids, masks) cross a pipe faster pickled inline than as shared-memory
    tensors, which cost a shared-memory file each, so padded text batches cross inline. Tensors of
    ``INLINE_BYTES`` or more (image batches) stay tensors.
    """

    INLINE_BYTES = 1024**2

    def __init__(self, collate: Callable[[Any], Any]) -> None:
        self.collate = collate

    def __call__(self, samples: Any) -> Any:
        out = self.collate(samples)
        if get_worker_info() is None:
            return out
        if isinstance(out, Numbered):
            return Numbered(out.number, self._arrays(out.batch))
        return self._arrays(out)

    @staticmethod
    def _arrays(batch: Any) -> Any:
        small = ArraysAcrossWorkers.INLINE_BYTES
        inline = lambda v: v.numpy() if torch.is_tensor(v) and v.nbytes < small else v  # noqa: E731
        if isinstance(batch, dict):
            return {k: inline(v) for k, v in batch.items()}
        if isinstance(batch, tuple) and len(batch) >= 2 and isinstance(batch[1], list):
            # detection_collate's (images, targets[, metas]): each target's few small tensors would
            # otherwise cost a shared-memory file descriptor each, hundreds per batch
            targets = [{k: inline(v) for k, v in t.items()} if isinstance(t, dict) else inline(t) for t in batch[1]]
            return (batch[0], targets, *batch[2:])
        return batch


def _kind(x: Any) -> str | None:
    """What one element of a sample is (see ``_KEYS``), or None for something pad_collate cannot batch."""
    if isinstance(x, (torch.Tensor, np.ndarray)):
        integral = (
            x.dtype.kind in "iu"
            if isinstance(x, np.ndarray)
            else not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)
        )
        if x.ndim == 0 and integral:
            return "label"
        if x.ndim == 1 and integral:
            return "ids"
        return "image" if x.ndim >= 2 else None
    if isinstance(x, str):
        return "text"
    if isinstance(x, dict) or x is None:  # None: a json stored empty (--allow-missing), the only None readers give
        return "json"
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return "label"
    return None


def _structure(row: tuple, index: int) -> tuple[str, ...]:
    """The kinds of a sample's elements, by position; a clear error for a sample pad_collate cannot batch."""
    kinds = [_kind(x) for x in row]
    for pos, kind in enumerate(kinds):
        if kind is None:
            raise TypeError(
                f"sample {index}, element {pos}: pad_collate cannot batch a {type(row[pos]).__name__} "
                f"of shape {tuple(getattr(row[pos], 'shape', ()))}; it takes image tensors, 1-D "
                "integer token ids, str, dict and an int label"
            )
    if len(kinds) >= 2 and kinds[-2:] == ["label", "json"]:
        kinds[-1] = "meta"  # the dict after the label is the return_meta dict
    label_at = len(kinds) - (2 if kinds[-1] == "meta" else 1)
    for pos, kind in enumerate(kinds):
        if kind == "label" and pos != label_at:
            raise ValueError(
                f"sample {index}: an int at element {pos} of ({_describe(tuple(kinds))}); the label "
                "must be the last int, followed only by the meta dict"
            )
    seen: dict[str, int] = {}
    for pos, kind in enumerate(kinds):
        if kind in seen:
            raise ValueError(
                f"sample {index}: two {_NAMES[kind]} fields (elements {seen[kind]} and {pos}); "
                "pad_collate batches one of each: pass a collate_fn of your own for more"
            )
        seen[kind] = pos
    return tuple(kinds)


def _named_structure(row: tuple, index: int, fields: tuple[str, ...]) -> tuple[str, ...]:
    """The kinds of a sample of the named ``fields``, then its label and maybe its meta dict."""
    if len(row) not in (len(fields) + 1, len(fields) + 2):
        raise ValueError(
            f"sample {index} has {len(row)} elements; fields {', '.join(fields)} and a label "
            f"(and a meta dict) make {len(fields) + 1} or {len(fields) + 2}"
        )
    kinds = []
    for name, value in zip(fields, row):
        if name == "text" and isinstance(value, (torch.Tensor, np.ndarray)):
            kinds.append("ids")
        else:
            kinds.append({"image": "image", "text": "text", "json": "json"}.get(name, "json"))
    kinds.append("label")
    if len(row) == len(fields) + 2:
        kinds.append("meta")
    return tuple(kinds)


def _describe(kinds: tuple[str, ...]) -> str:
    return ", ".join(_NAMES[k] for k in kinds)


def _pad(
    column: Sequence[Any], pad_id: int, multiple: int | None, max_length: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, lengths)`` for a batch of 1-D token id tensors."""
    ids = [torch.as_tensor(x) for x in column]
    lengths = torch.tensor([len(x) for x in ids], dtype=torch.int64)
    if max_length is not None:
        lengths = lengths.clamp(max=max_length)
    width = int(lengths.max())
    if multiple:
        width = -(-width // multiple) * multiple
    mask = torch.arange(width) < lengths[:, None]
    out = torch.full((len(ids), width), pad_id, dtype=torch.int64)
    # Boolean-mask assignment fills row by row, the order of the concatenated (truncated) ids.
    out[mask] = torch.cat([x[:n] for x, n in zip(ids, lengths.tolist())]).to(torch.int64)
    return out, mask.to(torch.int64), lengths


def _stack(column: Sequence[Any]) -> torch.Tensor:
    """The images of a batch stacked (in shared memory inside a DataLoader worker, as default_collate does)."""
    images = [torch.as_tensor(x) for x in column]
    first = images[0].shape
    for i, image in enumerate(images):
        if image.shape != first:
            raise ValueError(
                f"the images of this batch differ in shape ({tuple(first)} in sample 0, "
                f"{tuple(image.shape)} in sample {i}): pack the output with a fixed --size "
                "(not --resize none), or resize them in a transform"
            )
    return default_collate(images)


__all__ = [
    "PackedBatch",
    "packed_collate",
    "pad_collate",
    "empty_batch",
    "SlotRing",
    "RingBatch",
    "Numbered",
    "shared_memory_free",
]
