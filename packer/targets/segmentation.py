"""Semantic segmentation masks that follow the pixels: one class-index PNG per image, carried through
the image's geometry and stored as each sample's ``mask`` field.

``--masks DIR`` pairs ``DIR/REL.png`` with the image at ``REL.*`` (``match_masks``; an image without
one is skipped and reported). Each worker decodes the mask without converting it to RGB (palette
indices stay indices; an RGB mask is refused: its colours are not classes), turns it by the image's
EXIF orientation when it is drawn on the stored grid, and resizes, crops and pads it exactly as the
image with nearest-neighbour resampling, padding with the ignore index (``mask_bytes``), so no class
index is invented. A mask of another size than its image is skipped with the reason. The mask is
stored as a grayscale PNG, which every stock library opens.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image

from packer.config import MaskConfig, PreprocessConfig
from packer.pixels.geometry import GridError, carry_indices, grid_is_displayed
from packer.pixels.preprocess import Decoded
from packer.pixels.read import read_source
from packer.records import Skipped
from packer.sources.discover import Discovery
from packer.spec.errors import DecodeError, InputError

MASK_FIELD = "mask"
LOSSLESS_FORMATS = ("PNG", "TIFF", "BMP", "GIF", "PPM")  # what a mask may be read from: nothing moves an index
MASK_MODES = ("L", "P", "1", "I;16", "I")  # class indices; RGB(A) masks are colours, refused


@dataclass(frozen=True)
class SegmentationJob:
    """What a worker needs to write the masks of its shard: each item's mask file (by item index)."""

    masks: dict[int, str]
    ignore_index: int = 255
    coords: str = "auto"


def match_masks(found: Discovery, config: MaskConfig) -> tuple[Discovery, dict[int, str]]:
    """``found`` without the images that have no mask (skipped and reported), numbered again, and the
    mask file of each kept item."""
    if config.sidecar:
        return _match_sidecars(found)
    folder = Path(config.folder)
    if not folder.is_dir():
        raise InputError(f"--masks {folder} is not a folder")
    root = Path(found.root).resolve()
    if folder.resolve() == root or root in folder.resolve().parents:
        raise InputError(
            f"--masks {folder} is inside the source folder {found.root}, where its PNGs would be packed "
            "as images too; keep the masks beside the images' folder (e.g. data/images, data/masks)"
        )
    kept, skipped, masks = [], list(found.skipped), {}
    for item in found.items:
        path = folder / (os.path.splitext(item.relpath)[0] + ".png")
        if not path.is_file():
            name = f"{config.source_name}/{os.path.splitext(item.relpath)[0]}.png"
            skipped.append(Skipped(item.relpath, f"no mask: {name} does not exist"))
            continue
        index = len(kept)
        kept.append(replace(item, index=index))
        masks[index] = str(path)
    return replace(found, items=kept, skipped=skipped), masks


def _match_sidecars(found: Discovery) -> tuple[Discovery, dict[int, str]]:
    """Masks beside their images: ``REL/NAME.png`` is the mask of the image ``REL/NAME.EXT`` (another
    extension) and no sample of its own; a PNG no image claims is an image, which then needs a mask."""
    by_stem: dict[str, list] = {}
    for item in found.items:
        by_stem.setdefault(os.path.splitext(item.relpath)[0], []).append(item)
    kept, skipped, masks = [], list(found.skipped), {}
    for stem, items in by_stem.items():
        pngs = [it for it in items if it.relpath.lower().endswith(".png")]
        images = [it for it in items if it not in pngs]
        if len(images) == 1 and len(pngs) == 1:
            index = len(kept)
            kept.append(replace(images[0], index=index))
            masks[index] = pngs[0].path
            continue
        reason = (
            "no mask: no .png shares its stem"
            if not pngs
            else f"ambiguous mask: {len(images)} images share the stem of {pngs[0].relpath}"
        )
        skipped += [Skipped(it.relpath, reason) for it in (images or pngs)]
    order = sorted(range(len(kept)), key=lambda i: kept[i].relpath)  # the sorted order of the images
    items = [replace(kept[i], index=n) for n, i in enumerate(order)]
    return replace(found, items=items, skipped=skipped), {n: masks[i] for n, i in enumerate(order)}


def mask_bytes(path: str, decoded: Decoded, cfg: PreprocessConfig, ignore_index: int, coords: str, key: str) -> bytes:
    """The stored PNG of the mask at ``path`` for the image ``decoded`` (see the module docstring);
    DecodeError (naming the image ``key``) when the mask cannot be used."""
    data = read_source(path, max_bytes=cfg.max_file_bytes)
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format not in LOSSLESS_FORMATS:
                raise DecodeError(
                    key,
                    f"bad mask: {os.path.basename(path)} is a {img.format} file; lossy compression "
                    "moves class indices: save masks as PNG",
                )
            img.load()
            mask = _indices(img, key)
    except DecodeError:
        raise
    except Exception:  # noqa: BLE001 - Pillow reports a corrupt file in many ways
        raise DecodeError(key, f"bad mask: {os.path.basename(path)} is not a readable image") from None
    try:
        displayed = grid_is_displayed(
            mask.size, decoded.stored_size, decoded.original_size, decoded.orientation, coords
        )
    except GridError as e:
        what = {
            "mismatch": "mask size mismatch",
            "contradicts": f"mask size contradicts --box-coords {coords}",
            "ambiguous": "ambiguous mask orientation",
        }[e.kind]
        detail = str(e) if e.kind == "ambiguous" else f"{os.path.basename(path)} is {e}"
        raise DecodeError(key, f"{what}: {detail}") from None
    out = carry_indices(mask, decoded.orientation, displayed, cfg, decoded.original_size, ignore_index, key)
    buf = io.BytesIO()
    out.save(buf, "PNG", compress_level=1)  # lossless; level 1: masks compress well at any level
    return buf.getvalue()


def _indices(img: Image.Image, key: str) -> Image.Image:
    """The mask as an 8-bit image of class indices (palette indices kept as they are)."""
    if img.mode not in MASK_MODES:
        what = "holds colours" if img.mode.startswith(("RGB", "CMYK", "YCbCr", "HSV", "LAB")) else "is not one channel"
        raise DecodeError(
            key,
            f"bad mask: a {img.mode} image {what}, not class indices; save masks as grayscale or "
            "palette PNGs of class indices",
        )
    if img.mode in ("I;16", "I"):
        values = np.asarray(img)
        if values.max(initial=0) > 255 or values.min(initial=0) < 0:
            raise DecodeError(key, "bad mask: class indices above 255 do not fit an 8-bit mask")
        return Image.fromarray(values.astype(np.uint8), "L")
    if img.mode == "1":
        return img.convert("L").point(lambda v: 1 if v else 0)
    return Image.fromarray(np.asarray(img, dtype=np.uint8), "L")  # P: the palette indices themselves


def mask_job(masks: Optional[dict[int, str]], config: Optional[MaskConfig], items) -> Optional[SegmentationJob]:
    """The masks of ``items`` (a shard's), for its worker; None for outputs without masks."""
    if masks is None or config is None:
        return None
    return SegmentationJob({it.index: masks[it.index] for it in items}, config.ignore_index, config.coords)
