"""Contact sheets of what a reader returns: each sample's image as training will get it (crops and
flips included when the reader draws them), its class name under it, detection boxes drawn with
their category names and segmentation masks laid over it in a palette. Pillow only (``packer
preview`` draws with it); ``sample_lines`` says the same in text, for terminals and CI logs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

PALETTE = (
    (230, 25, 75),
    (60, 180, 75),
    (255, 225, 25),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
    (210, 245, 60),
    (250, 190, 212),
    (0, 128, 128),
    (170, 110, 40),
)
"""Colours of categories and mask classes, by index (repeating): distinct on photographs."""

CAPTION = 14
"""Pixels under each tile for its caption."""


@dataclass
class Shown:
    """One sample as a sheet shows it: its position in the output, its key, the HWC uint8 image, its
    label (a class index, or -1), and its target (a detection dict or a mask), or why it could not be read."""

    index: int
    key: Optional[str] = None
    image: Optional[np.ndarray] = None
    label: int = -1
    target: Any = None
    error: Optional[str] = None


def read_samples(dataset: Any, indices: Sequence[int]) -> list[Shown]:
    """The samples at ``indices`` of ``dataset`` (opened with ``normalize=False, return_meta=True``)
    as ``Shown``: by index on map-style readers, by one pass in order on tar shards. A sample that
    cannot be read becomes a ``Shown`` that says why, and the others are still read."""
    from readers.datasets.mapstyle import PackedDataset

    wanted = {int(i): Shown(int(i)) for i in indices}
    if isinstance(dataset, PackedDataset):
        for i, shown in wanted.items():
            try:
                _fill(shown, dataset[i], dataset)
            except Exception as e:  # noqa: BLE001 - shown on the sheet and reported, the rest still drawn
                shown.error = f"{type(e).__name__}: {e}"
    else:
        try:
            for sample in dataset:
                meta = sample[-1]
                shown = wanted.get(int(meta["index"]))
                if shown is not None:
                    _fill(shown, sample, dataset)
                if all(s.image is not None for s in wanted.values()):
                    break
        except Exception as e:  # noqa: BLE001 - a damaged tar shard ends the pass: the rest are reported
            for shown in wanted.values():
                if shown.image is None:
                    shown.error = f"{type(e).__name__}: {e}"
    for shown in wanted.values():
        if shown.image is None and shown.error is None:
            shown.error = "not in the output"
    return [wanted[int(i)] for i in indices]


def _fill(shown: Shown, sample: tuple, dataset: Any) -> None:
    """Fill ``shown`` from one ``(image, target_or_label, meta)`` sample of a reader."""
    image, second, meta = sample[0], sample[1], sample[-1]
    shown.key, shown.label = meta.get("key"), int(meta.get("label", -1))
    shown.image = pixels(image, dataset)
    if isinstance(second, dict) or (torch.is_tensor(second) and second.dim() >= 2):
        shown.target = second


def pixels(image: Any, dataset: Any) -> np.ndarray:
    """An image as the reader returned it (CHW uint8, or the stored normalized floats) as HWC RGB uint8."""
    array = image.numpy() if torch.is_tensor(image) else np.asarray(image)
    if array.dtype != np.uint8:  # stored as floats, normalized: undo the manifest's normalization
        norm = dataset.manifest.preprocess.get("normalize") or {"mean": [0.0], "std": [1.0]}
        mean = np.asarray(norm["mean"], np.float32).reshape(-1, 1, 1)
        std = np.asarray(norm["std"], np.float32).reshape(-1, 1, 1)
        array = np.clip((array.astype(np.float32) * std + mean) * 255.0 + 0.5, 0, 255).astype(np.uint8)
    hwc = np.ascontiguousarray(array.transpose(1, 2, 0))
    return np.repeat(hwc, 3, axis=2) if hwc.shape[2] == 1 else hwc


def contact_sheet(
    samples: Sequence[Shown],
    columns: int,
    tile: int = 160,
    classes: Optional[Sequence[str]] = None,
    categories: Optional[Sequence[str]] = None,
    ignore_index: Optional[int] = None,
) -> Image.Image:
    """The sheet: ``samples`` in rows of ``columns`` tiles of ``tile`` x ``tile`` pixels (each image
    scaled to fit, centred), the class name (or key) under each; boxes in their category's colour
    with its name; masks blended in their class's colour (``ignore_index`` left clear)."""
    rows = max(1, -(-len(samples) // columns))
    sheet = Image.new("RGB", (columns * tile, rows * (tile + CAPTION)), (24, 24, 24))
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for n, shown in enumerate(samples):
        x0, y0 = (n % columns) * tile, (n // columns) * (tile + CAPTION)
        caption = _caption(shown, classes)
        if shown.image is not None:
            _draw_tile(sheet, draw, font, shown, (x0, y0), tile, categories, ignore_index)
        else:
            draw.rectangle((x0 + 2, y0 + 2, x0 + tile - 3, y0 + tile - 3), outline=(200, 0, 0), width=2)
            draw.text((x0 + 6, y0 + tile // 2 - 6), "unreadable", fill=(255, 80, 80), font=font)
        draw.text((x0 + 3, y0 + tile + 1), caption[: max(4, tile // 6)], fill=(235, 235, 235), font=font)
    return sheet


def _caption(shown: Shown, classes: Optional[Sequence[str]]) -> str:
    """What goes under a tile: its class name, else its key, with its index."""
    if classes and 0 <= shown.label < len(classes):
        name = classes[shown.label]
    else:
        name = shown.key or ""
    return f"{shown.index}: {name}"


def _draw_tile(
    sheet: Image.Image,
    draw: ImageDraw.ImageDraw,
    font: Any,
    shown: Shown,
    corner: tuple[int, int],
    tile: int,
    categories: Optional[Sequence[str]],
    ignore_index: Optional[int],
) -> None:
    """One sample's image scaled into its tile, its mask laid over it and its boxes drawn on it."""
    image = shown.image
    h, w = image.shape[:2]  # type: ignore[union-attr]
    scale = min(tile / w, tile / h)
    tw, th = max(1, round(w * scale)), max(1, round(h * scale))
    ox, oy = corner[0] + (tile - tw) // 2, corner[1] + (tile - th) // 2
    picture = Image.fromarray(image).resize((tw, th), Image.Resampling.BILINEAR)
    target = shown.target
    if torch.is_tensor(target) and target.dim() == 2:  # a segmentation mask: classes blended in
        mask = Image.fromarray(target.numpy().astype(np.int64).clip(0, 255).astype(np.uint8))
        mask = np.asarray(mask.resize((tw, th), Image.Resampling.NEAREST))
        painted = np.asarray(picture).copy()
        for value in np.unique(mask):
            if int(value) == 0 or (ignore_index is not None and int(value) == ignore_index):
                continue
            where = mask == value
            colour = np.array(PALETTE[int(value) % len(PALETTE)], np.float32)
            painted[where] = (0.5 * painted[where] + 0.5 * colour).astype(np.uint8)
        picture = Image.fromarray(painted)
    sheet.paste(picture, (ox, oy))
    if isinstance(target, dict) and "boxes" in target:
        labels = target.get("labels")
        for k, box in enumerate(np.asarray(target["boxes"], np.float64).reshape(-1, 4)):
            label = int(labels[k]) if labels is not None else 0
            colour = PALETTE[label % len(PALETTE)]
            left, top, right, bottom = (
                ox + box[0] * scale,
                oy + box[1] * scale,
                ox + box[2] * scale,
                oy + box[3] * scale,
            )
            draw.rectangle((left, top, max(left, right - 1), max(top, bottom - 1)), outline=colour, width=2)
            name = categories[label] if categories and 0 <= label < len(categories) else str(label)
            draw.text((left + 2, max(corner[1], top - 11)), name, fill=colour, font=font)


def sample_lines(
    samples: Sequence[Shown], classes: Optional[Sequence[str]], categories: Optional[Sequence[str]]
) -> list[str]:
    """A line per sample: index, key, class, and its boxes (count and category names) or mask
    classes, or why it could not be read."""
    lines = []
    for s in samples:
        if s.error is not None:
            lines.append(f"{s.index}\tunreadable: {s.error}")
            continue
        h, w = s.image.shape[:2]  # type: ignore[union-attr]
        if classes and 0 <= s.label < len(classes):
            name = classes[s.label]
        else:
            name = str(s.label) if s.label >= 0 else ""  # unlabelled (detection outputs: their boxes say)
        parts = [str(s.index), s.key or "", name, f"{w}x{h}"]

        if isinstance(s.target, dict) and "boxes" in s.target:
            labels = [int(v) for v in np.asarray(s.target.get("labels", [])).reshape(-1)]
            names = [categories[v] if categories and 0 <= v < len(categories) else str(v) for v in labels]
            parts.append(f"{len(labels)} box(es): {', '.join(names)}" if labels else "0 boxes")
        elif torch.is_tensor(s.target):
            values = sorted(int(v) for v in torch.unique(s.target))
            parts.append(f"mask classes {values}")
        lines.append("\t".join(parts))
    return lines


__all__ = ["Shown", "read_samples", "pixels", "contact_sheet", "sample_lines", "PALETTE"]
