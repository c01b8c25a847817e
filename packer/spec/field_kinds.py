"""The kinds of variable-length field an output stores per sample, each as one object.

A field's kind (``TextField.kind`` in the manifest: ``text``, ``tokens``, ``json``, ``detection``,
``mask``, ``geometry``) says what its bytes hold. Each kind here knows everything the rest of
packer and the readers ask of it: its manifest entry, the name its field must have, its tar member
and how a tar shard stores it, the check ``packer verify`` makes of its bytes, and the value a
reader makes of them (numpy and plain Python only: the readers turn arrays into tensors). Nothing
else compares a kind's name; a new kind (token blocks, say) is a class here, registered in
``KINDS``, plus each format's encoder where it needs one.

This module is part of what every output is: the readers import it, so it imports neither torch
nor any writer.
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from packer.spec import text
from packer.spec.text import TOKEN_DTYPE, TextConfig

if TYPE_CHECKING:
    from packer.spec.entries import TextField


class FieldKind:
    """UTF-8 text (``KEY.txt`` in a tar shard): the base every kind refines."""

    name = "text"
    member = "txt"
    """The tar member's extension (``KEY.<member>``)."""
    field_name: Optional[str] = None
    """The field name this kind must have, or None where its name is free (``text``)."""
    itemsize = 1
    """Bytes per element: a sample's length is its byte count divided by this."""
    feature: Optional[str] = None
    """The layout feature (``packer.spec.sample_layout``) an output with this kind needs its readers to know."""
    target = False
    """A training target (boxes, masks): read as the sample's target, never as its text."""
    class_indices = False
    """Its values are class indices, so outputs combined must share one class map."""
    labelled_boxes = False
    """A target of boxes with a ``labels`` array (category indices from 0), which a reader's
    ``label_offset`` moves."""
    readable = True
    """A text a collate can pad and a length can be measured on (text, tokens, json)."""
    described_as = "UTF-8 text"
    made_by_converter = False
    """Made by the converter (from the decoded image: the geometry), not read from a file of the sample."""

    def stored(self, data: bytes, path: str, config: TextConfig) -> bytes:
        """What is stored of a sample's source file ``data`` (``path``, for messages): UTF-8 text with LF
        newlines, from the file's ``config.encoding`` (``packer.spec.text``)."""
        return text.decode_text(data, path, config.encoding).encode("utf-8")

    def entry(self, field: TextField) -> dict:
        """The manifest's entry for ``field`` (see docs/FORMATS.md)."""
        return {
            "kind": self.name,
            "dtype": "str",
            "encoding": "utf-8",
            "newlines": "LF",
            "shape": [],
            "length_unit": "bytes",
            **_source(field),
        }

    def info(self, entry: dict) -> Optional[dict]:
        """What ``TextField.info`` keeps of a manifest entry of this kind (None: nothing)."""
        return None

    def describe(self, field: TextField, annotations: Optional[dict]) -> list[str]:
        """What ``packer info`` says of ``field`` (``annotations``: the manifest's, for boxes)."""
        return [f"{field.name:<9} UTF-8 {self.described_as.removeprefix('UTF-8 ')}, LF line ends"]

    def problem(self, field: TextField, data: bytes) -> str:
        """What is wrong with one sample's stored bytes of ``field``, or ``""`` (``packer verify``)."""
        try:
            self.check_text(bytes(data).decode("utf-8"))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
            return f"{field.name} does not decode as {self.described_as}: {e}"
        except _Damaged as e:
            return f"{field.name}: {e}"
        return ""

    def check_text(self, text: str) -> None:
        """Raise where ``text`` is not what this kind stores (ValueError for bad JSON, _Damaged otherwise)."""

    def read(self, data: Any) -> Any:
        """The value of one sample's stored bytes: a ``str`` for text."""
        return bytes(data).decode("utf-8")

    def tar_member(self, value: bytes) -> Optional[tuple[bytes, ...]]:
        """The parts of this field's tar member, or None where the sample has no member."""
        return (value,)

    def from_tar(self, fields: dict, member: str) -> bytes:
        """The stored bytes of a grouped tar sample's member, as the other formats hold them; KeyError
        where the member is missing, ValueError where it is damaged."""
        return fields[member]


class _Damaged(Exception):
    """A stored value that parses but is not what its kind holds."""


class Tokens(FieldKind):
    """Token ids, little-endian int32 (``KEY.tokens.npy``: an ``.npy`` member, so that webdataset's own
    decoders read it as an array)."""

    name = "tokens"
    member = "tokens.npy"
    itemsize = 4

    def stored(self, data: bytes, path: str, config: TextConfig) -> bytes:
        """The text's token ids (``config.tokenizer``, cut at ``config.max_length``) as int32 bytes."""
        decoded = text.decode_text(data, path, config.encoding)
        return text.token_ids(decoded, path, config.tokenizer, config.max_length).tobytes()  # type: ignore[arg-type]

    def entry(self, field: TextField) -> dict:
        return {
            "kind": "tokens",
            "dtype": "int32",
            "shape": [None],
            "length_unit": "tokens",
            "tokenizer": field.tokenizer,
            **_source(field),
        }

    def problem(self, field: TextField, data: bytes) -> str:
        return "" if len(data) % 4 == 0 else f"{field.name}: {len(data)} bytes is not a whole number of int32 token ids"

    def describe(self, field: TextField, annotations: Optional[dict]) -> list[str]:
        tok = field.tokenizer or {}
        return [
            f"{field.name:<9} int32 token ids from {tok.get('file')} (vocabulary {tok.get('vocab_size')}, "
            f"pad id {tok.get('pad_id')}, max length {tok.get('max_length') or 'none'})"
        ]

    def read(self, data: Any) -> np.ndarray:
        """The token ids as int64 (what embedding layers index with)."""
        return np.frombuffer(data, dtype=TOKEN_DTYPE).astype(np.int64)

    def tar_member(self, value: bytes) -> Optional[tuple[bytes, ...]]:
        from packer.spec.codecs import npy_header

        return (npy_header(TOKEN_DTYPE.str, (len(value) // 4,)), value)

    def from_tar(self, fields: dict, member: str) -> bytes:
        from packer.spec.codecs import CODECS

        ids = CODECS["npy"].decode(fields[member])
        if ids.dtype != TOKEN_DTYPE or ids.ndim != 1:
            raise ValueError(f"KEY.{member} holds {ids.dtype} {ids.shape}, not 1-D int32 token ids")
        return ids.tobytes()


class Json(FieldKind):
    """A paired ``.json`` file's JSON text (``KEY.data.json``: ``KEY.json`` is packer's own metadata);
    stored empty, and without a tar member, where ``--allow-missing`` found none."""

    name = "json"
    member = "data.json"
    field_name = "json"
    described_as = "JSON"

    def stored(self, data: bytes, path: str, config: TextConfig) -> bytes:
        """The file's JSON as UTF-8 text (checked to parse)."""
        return text.json_text(data, path, config.encoding).encode("utf-8")

    def check_text(self, text: str) -> None:
        if text:  # an empty json is a missing one (--allow-missing)
            json.loads(text)

    def read(self, data: Any) -> Any:
        """The parsed object, or None for a json stored empty."""
        return _parsed(data)

    def tar_member(self, value: bytes) -> Optional[tuple[bytes, ...]]:
        return (value,) if value else None  # an empty member is not JSON to webdataset

    def from_tar(self, fields: dict, member: str) -> bytes:
        return fields.get(member, b"")  # no member: missing (--allow-missing)


class Geometry(FieldKind):
    """How the source image's pixels map to the stored ones, as JSON (``KEY.geometry.json``), made by
    the converter for an image with a paired json (``packer.pixels.geometry``)."""

    name = "geometry"
    member = "geometry.json"
    field_name = "geometry"
    feature = "the geometry of each image"
    readable = False
    made_by_converter = True
    described_as = "JSON"

    def entry(self, field: TextField) -> dict:
        return {
            "kind": "geometry",
            "dtype": "str",
            "encoding": "utf-8",
            "shape": [],
            "holds": "how the source image's pixels map to the stored ones (scale, offset, orientation)",
        }

    def check_text(self, text: str) -> None:
        json.loads(text)  # never empty: the converter makes one for every image

    def read(self, data: Any) -> Any:
        """The geometry as a dict (``packer.pixels.geometry.Geometry.to_dict``)."""
        return _parsed(data)

    def describe(self, field: TextField, annotations: Optional[dict]) -> list[str]:
        return [f"{field.name:<9} each image's geometry (scale, offset, orientation of its pixels) as UTF-8 JSON"]


class Detection(FieldKind):
    """A detection target as JSON (``KEY.target.json``): boxes XYXY in the stored image's pixels, labels
    indexing the manifest's categories (``packer.targets.detection``)."""

    name = "detection"
    member = "target.json"
    field_name = "target"
    feature = "detection targets"
    target = True
    labelled_boxes = True
    readable = False
    described_as = "JSON"

    def entry(self, field: TextField) -> dict:
        return {
            "kind": "detection",
            "dtype": "str",
            "encoding": "utf-8",
            "shape": [],
            "length_unit": "bytes",
            "boxes": "XYXY float32 pixels of the stored image",
            "labels": "indices into annotations.categories",
        }

    def describe(self, field: TextField, annotations: Optional[dict]) -> list[str]:
        a = annotations or {}
        names = a.get("categories") or []
        return [
            f"{field.name:<9} detection boxes (XYXY pixels of the stored image) from {a.get('source')} "
            f"({a.get('format')}): {a.get('boxes')} boxes, {a.get('boxes_dropped')} dropped by the crop "
            f"(under {a.get('min_visibility')} of their area left), {a.get('images_without_boxes')} "
            f"image(s) without any",
            f"categories {len(names)}: {', '.join(names[:20])}{' ...' if len(names) > 20 else ''}",
        ]

    def check_text(self, text: str) -> None:
        target = json.loads(text)
        boxes, labels = target["boxes"], target["labels"]
        if len(boxes) != len(labels) or any(len(b) != 4 or not b[0] <= b[2] or not b[1] <= b[3] for b in boxes):
            raise _Damaged("the boxes are not XYXY boxes, one per label")

    def read(self, data: Any) -> dict:
        """The target as torchvision's detection models take it, in numpy: ``boxes`` float32 (N, 4) XYXY
        pixels of the stored image, ``labels`` int64 (N,), ``iscrowd`` int64 and ``area`` float32 where
        COCO gave them, ``masks`` uint8 (N, H, W) where COCO gave segmentations, ``difficult`` where VOC
        did, ``visible`` float32 (the share of each annotated box inside the image) where the
        conversion's crop cut a box, and the image's ``geometry`` (a dict; see ``packer.pixels.geometry``)."""
        stored = json.loads(bytes(data).decode("utf-8"))
        target: dict[str, Any] = {
            "boxes": np.asarray(stored["boxes"], dtype=np.float32).reshape(-1, 4),
            "labels": np.asarray(stored["labels"], dtype=np.int64),
        }
        for name, dtype in (
            ("iscrowd", np.int64),
            ("area", np.float32),
            ("difficult", np.int64),
            ("visible", np.float32),
        ):
            if name in stored:
                target[name] = np.asarray(stored[name], dtype=dtype)
        if "masks" in stored:  # COCO instance masks, stored as RLE of the stored image
            from pycocotools import mask as cocomask

            w, h = (stored.get("geometry") or {}).get("size") or (0, 0)
            rle = [{"size": m["size"], "counts": m["counts"].encode("ascii")} for m in stored["masks"]]
            masks = [cocomask.decode(m) for m in rle]
            target["masks"] = np.stack(masks) if masks else np.zeros((0, h, w), dtype=np.uint8)
        target["geometry"] = stored.get("geometry")
        return target


class Mask(FieldKind):
    """A segmentation mask: a grayscale PNG of class indices (``KEY.mask.png``; ``packer.targets.segmentation``)."""

    name = "mask"
    member = "mask.png"
    field_name = "mask"
    feature = "segmentation masks"
    target = True
    class_indices = True
    readable = False

    def entry(self, field: TextField) -> dict:
        return {
            "kind": "mask",
            "dtype": "uint8",
            "encoding": "png",
            "shape": [None, None],
            "values": "class indices (palette indices kept)",
            **(field.info or {}),
        }

    def info(self, entry: dict) -> Optional[dict]:
        """The mask's ``ignore_index`` (the value of padding) and ``source`` (the masks folder)."""
        return {k: entry[k] for k in ("ignore_index", "source") if k in entry}

    def describe(self, field: TextField, annotations: Optional[dict]) -> list[str]:
        info = field.info or {}
        return [
            f"{field.name:<9} segmentation masks from {info.get('source')}: class indices as grayscale PNG, "
            f"resized with nearest-neighbour, padding {info.get('ignore_index')}"
        ]

    def problem(self, field: TextField, data: bytes) -> str:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(bytes(data))) as img:
                img.load()
                if img.format != "PNG" or img.mode != "L":
                    found = f"a {img.format} {img.mode} image"
                    return f"{field.name}: the mask is {found}, not a grayscale PNG of class indices"
        except Exception as e:  # noqa: BLE001 - Pillow reports damage in many ways
            return f"{field.name} does not decode as a PNG: {e}"
        return ""

    def read(self, data: Any) -> np.ndarray:
        """The mask's class indices as an int64 (H, W) array."""
        from PIL import Image

        with Image.open(io.BytesIO(bytes(data))) as img:
            return np.asarray(img, dtype=np.uint8).astype(np.int64)


KINDS: dict[str, FieldKind] = {k.name: k for k in (FieldKind(), Tokens(), Json(), Detection(), Mask(), Geometry())}
"""Every kind of variable-length field, by its name in the manifest."""

TEXT_KINDS = tuple(KINDS)
"""The kinds' names, in the order the manifest's docs list them."""


def kind_of(name: str) -> FieldKind:
    """The kind named ``name`` (a manifest's ``fields.<name>.kind``); KeyError for a kind this packer lacks."""
    return KINDS[name]


def fits(kind: str, name: str) -> bool:
    """Whether a field named ``name`` may hold ``kind``: a kind with a name of its own has that name, and a
    name that is some kind's own holds that kind."""
    own = {k.field_name: k.name for k in KINDS.values() if k.field_name is not None}
    wanted = KINDS[kind].field_name
    return (wanted is None or wanted == name) and own.get(name, kind) == kind


def _parsed(data: Any) -> Any:
    """Stored UTF-8 JSON as its object (None for empty bytes)."""
    text = bytes(data).decode("utf-8")
    return json.loads(text) if text else None


def _source(field: TextField) -> dict:
    """How the sources of a text field were read, as its manifest entry records it."""
    return {"source_encoding": field.encoding, "missing": "stored empty" if field.allow_missing else "skipped"}
