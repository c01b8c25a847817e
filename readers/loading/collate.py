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

import numbers
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info

from readers.augment.device_decode import EncodedBatch
from readers.loading.batch_buffers import RingBatch


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
            return RingBatch(self.slot, len(self.labels), self.labels.numpy(), tuple(self.images.shape[2:]))
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


__all__ = ["PackedBatch", "packed_collate", "pad_collate", "detection_collate", "ArraysAcrossWorkers", "Numbered"]
