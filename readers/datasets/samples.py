"""The values and tuple of one sample as readers return it: a stored text field's bytes made a value
(``decode_field``), and the ``(image, label[, meta])`` tuple around them (``build_sample``)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import torch

from packer.spec.entries import TextField

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
    label_offset: int = 0,
) -> tuple:
    """The tuple a reader yields: ``(image, label)`` or ``(image, label, meta)``; with text fields
    ``(first field, *rest, label[, meta])``. ``transform`` applies to the first field (the image,
    or the text of a text-only output), ``target_transform`` to the label (torchvision's
    ``target_transform``); ``meta["label"]`` keeps the stored label. With ``has_target`` (a detection
    output) samples are ``(image, target[, meta])`` as torchvision's detection datasets give them, the
    ``target_transform`` applied to the target dict; a segmentation output's ``(image, mask[, meta])``
    likewise, the mask an int64 (H, W) tensor. ``label_offset`` is added to a detection target's
    ``labels`` before the ``target_transform``."""
    if transform is not None:
        image = transform(image)
    if has_target:
        target = offset_labels(rest[0], label_offset)
        target = target if target_transform is None else target_transform(target)
        return (image, target) if meta is None else (image, target, meta)
    if target_transform is not None:
        label = target_transform(label)
    return (image, *rest, label) if meta is None else (image, *rest, label, meta)


def offset_labels(target: Any, offset: int) -> Any:
    """A detection ``target`` with ``offset`` added to its box ``labels`` (the reader's ``label_offset``)."""
    return {**target, "labels": target["labels"] + offset} if offset else target


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


__all__ = ["build_sample", "decode_field", "offset_labels", "Transform", "TargetTransform"]
