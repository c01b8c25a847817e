"""Options declared once for every command that takes them (preprocessing, decoding, text fields,
targets), and the parsing of the preprocessing ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import click

from packer.cli.option_values import parse_normalize, parse_size
from packer.config import (
    COLOR_MODES,
    DEFAULT_MAX_PIXELS,
    DEFAULT_MIN_VISIBILITY,
    DTYPES,
    GEOMETRIES,
    INTERPOLATIONS,
    RESIZE_MODES,
    PreprocessConfig,
)

F = TypeVar("F", bound=Callable[..., Any])

# Two blocks, not one, because each keeps its place in `packer convert --help`: how pixels are
# shaped comes first, how source files are decoded comes after the text options.
_PREPROCESS_OPTIONS = (
    click.option(
        "--size",
        default="224",
        help="Target size: 224 (square) or WIDTHxHEIGHT such as 256x192 (width first; torchvision's "
        "sizes are (height, width)).",
    ),
    click.option(
        "--resize",
        type=click.Choice(RESIZE_MODES),
        default="shorter-crop",
        help="shorter-crop: shorter side to size, centre crop (torchvision's Resize(N) + CenterCrop(N)); "
        "shorter: shorter side to size, aspect kept (Resize(N)); max: longer side at most size, "
        "aspect kept, never enlarged; stretch: ignore aspect "
        "(Resize((H, W))); pad: letterbox with --fill; none: keep each image's size.",
    ),
    click.option(
        "--crop",
        default=None,
        help="After the resize, cut this size (224 or WIDTHxHEIGHT) from the centre, as torchvision's "
        "CenterCrop: --resize shorter --size 256 --crop 224 is Resize(256) + CenterCrop(224).",
    ),
    click.option(
        "--geometry",
        type=click.Choice(GEOMETRIES),
        default="torchvision",
        help="How shorter-crop places its crop: torchvision (an integer resized size, a rounded offset, "
        "as torchvision computes them) or fractional (the largest centred box of the target's shape, "
        "resized in one step; packer before 0.3.0).",
    ),
    click.option("--mode", type=click.Choice(COLOR_MODES), default="RGB", help="Colour mode: RGB, or L for grayscale."),
    click.option(
        "--interpolation",
        type=click.Choice(INTERPOLATIONS),
        default="bilinear",
        help="Resize filter (antialiased, Pillow's; bilinear is torchvision's Resize on PIL images: "
        "the same pixels with --full-decode).",
    ),
    click.option(
        "--fill",
        default="0,0,0",
        help="Padding colour for --resize pad, and where --crop is larger than the image (R,G,B or one gray value).",
    ),
    click.option(
        "--background",
        default="255,255,255",
        help="Colour that transparent pixels are composited on (R,G,B or one gray value).",
    ),
    click.option(
        "--normalize",
        default="imagenet",
        help="imagenet, none (pixels 0..1), auto (this data's own mean and std, computed while "
        "converting; needs --dtype uint8), or MEAN,STD (2 numbers, or C means then C stds).",
    ),
    click.option(
        "--dtype",
        type=click.Choice(DTYPES),
        default="uint8",
        help="Stored pixel type. uint8 keeps pixels and readers normalize; float stores normalized values.",
    ),
)
_DECODE_OPTIONS = (
    click.option(
        "--full-decode",
        is_flag=True,
        help="Decode JPEGs at full size even when the target is much smaller (slower; by default the "
        "decoder scales them by 5/8 or less, never below the target, pixels within a few levels).",
    ),
    click.option(
        "--max-pixels",
        type=click.IntRange(min=1),
        default=DEFAULT_MAX_PIXELS,
        help="Skip images with more pixels than this (decompression-bomb protection); --size must fit too.",
    ),
)


class OutputFolder(click.ParamType):
    """A local folder to write an output to, as given (a URL such as ``s3://bucket/out`` refused,
    never turned into a local folder named ``s3:``: ``packer.output.files.local_output``)."""

    name = "folder"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Path:
        from packer.output.files import local_output
        from packer.spec.errors import ConfigError

        try:
            return local_output(value)
        except ConfigError as e:
            self.fail(str(e), param, ctx)


class OutputLocation(click.ParamType):
    """An output to read: an existing local folder (a Path), or a URL (``s3://bucket/out``, ``https://``:
    ``packer.spec.locations``), kept as its string."""

    name = "output"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        from packer.spec.locations import names_url

        if isinstance(value, str) and names_url(value):
            if "://" not in value and not value.startswith("pipe:"):  # s3:/bucket, as pathlib spells it
                value = value.replace(":/", "://", 1)
            return value
        return click.Path(exists=True, file_okay=False, path_type=Path).convert(value, param, ctx)


class ConvertDestination(click.ParamType):
    """Where ``packer convert`` writes: a local folder, or a URL a fsspec backend writes (``s3://``,
    ``gs://``), kept as its string; ``http(s)://`` and ``pipe:`` are refused (nothing writes them)."""

    name = "folder or url"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        from packer.spec.locations import names_url

        text = str(value)
        if names_url(text):
            if "://" not in text and not text.startswith("pipe:"):  # s3:/bucket, as pathlib spells it
                text = text.replace(":/", "://", 1)
            scheme = text.split("://")[0] if "://" in text else "pipe"
            if scheme in ("http", "https", "pipe", "file"):
                self.fail(f"{text}: packer cannot write {scheme} URLs; give s3://, gs:// or a local folder", param, ctx)
            return text
        return OutputFolder().convert(value, param, ctx)


def _apply(options: tuple[Callable[[F], F], ...], command: F) -> F:
    for option in reversed(options):  # decorators apply bottom-up; the help lists them top-down
        command = option(command)
    return command


_TEXT_OPTIONS = (
    click.option(
        "--fields",
        "fields_",
        default=None,
        help="What a sample is: image, text, or several of image,text,json (files sharing a stem in one "
        "folder are one sample).  [default: found from the files]",
        show_default=False,
    ),
    click.option(
        "--allow-missing",
        is_flag=True,
        help="Pack paired samples missing their text or json file, with that field empty (else skipped).",
    ),
    click.option(
        "--encoding",
        default="utf-8",
        help="Encoding of .txt and .json files (a UTF-8 byte-order mark is dropped; CRLF becomes LF).",
    ),
    click.option(
        "--tokenizer",
        type=click.Path(exists=True, dir_okay=False),
        default=None,
        help="A local tokenizer.json (Hugging Face tokenizers): store int32 token ids instead of text.",
    ),
    click.option(
        "--max-length",
        type=click.IntRange(min=1),
        default=None,
        help="Truncate token ids to this many (special tokens kept); needs --tokenizer.",
    ),
)

_TARGET_OPTIONS = (
    click.option(
        "--annotations",
        "annotations",
        type=click.Path(exists=True, path_type=Path),
        default=None,
        help="Detection boxes for the images: a COCO instances .json, a YOLO labels folder (.txt per image, "
        "names from classes.txt or data.yaml) or a Pascal VOC folder of .xml; boxes follow every resize, "
        "crop and pad, and readers return (image, target).",
    ),
    click.option(
        "--annotation-format",
        type=click.Choice(["coco", "yolo", "voc"]),
        default=None,
        help="The format of --annotations.  [default: found from the content]",
        show_default=False,
    ),
    click.option(
        "--min-box-visibility",
        type=click.FloatRange(0, 1),
        default=DEFAULT_MIN_VISIBILITY,
        help="Drop a box that the crop leaves with less than this share of its area (counted and reported).",
    ),
    click.option(
        "--box-coords",
        type=click.Choice(["auto", "stored", "displayed"]),
        default="auto",
        help="Which pixels the boxes of --annotations are on when EXIF turns an image: the file's grid as "
        "stored, or the turned image (auto: YOLO's are on the turned image; COCO and VOC boxes by the "
        "image size they give; an image nothing decides is skipped and reported).",
    ),
    click.option(
        "--masks",
        "masks_dir",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        default=None,
        help="Semantic segmentation: a folder of class-index PNGs, REL.png for the image REL.*; resized with "
        "nearest-neighbour, cropped and padded exactly like their image; readers return (image, mask).",
    ),
    click.option(
        "--mask-sidecar",
        is_flag=True,
        help="Segmentation masks beside their images: 0001.png is the mask of 0001.jpg in the same folder.",
    ),
    click.option(
        "--mask-ignore",
        type=click.IntRange(0, 255),
        default=255,
        help="The mask value of padding (--resize pad, a --crop larger than the image).",
    ),
)


_PACK_OPTIONS = (
    click.option(
        "--pack",
        "pack",
        type=click.IntRange(min=1),
        default=None,
        metavar="BLOCK",
        help="Language-model pretraining: SOURCE is a corpus (.txt, .jsonl, .parquet files, a saved Hugging Face "
        "dataset, .gz/.zst of the text ones), tokenized with --tokenizer and packed into blocks of BLOCK inputs "
        "and their next-token targets. See docs/TOKENS.md.",
    ),
    click.option(
        "--pack-mode",
        type=click.Choice(["concat", "best-fit"]),
        default="concat",
        help="concat: every document then its end-of-text id, cut into blocks overlapping by one id (no "
        "padding, no token lost); best-fit: whole documents placed into blocks, the rest padded.",
    ),
    click.option(
        "--documents",
        type=click.Choice(["file", "lines"]),
        default="file",
        help="With --pack: a .txt file is one document, or each of its non-empty lines is one.",
    ),
    click.option(
        "--text-key",
        default="text",
        help="With --pack: the key of a .jsonl line, or the column of a table, that holds the text.",
    ),
    click.option(
        "--eos",
        type=click.IntRange(min=0),
        default=None,
        help="With --pack: the end-of-text id after each document.  [default: the tokenizer's <|endoftext|>, </s> ...]",
        show_default=False,
    ),
    click.option("--bos", is_flag=True, help="With --pack: add the tokenizer's beginning id before each document too."),
    click.option(
        "--bos-id",
        type=click.IntRange(min=0),
        default=None,
        help="With --pack: the beginning id to add (implies --bos).",
    ),
)


def pack_options(command: F) -> F:
    """Add --pack, --pack-mode, --documents, --text-key, --eos, --bos and --bos-id."""
    return _apply(_PACK_OPTIONS, command)


def text_options(command: F) -> F:
    """Add --fields, --allow-missing, --encoding, --tokenizer and --max-length."""
    return _apply(_TEXT_OPTIONS, command)


def target_options(command: F) -> F:
    """Add --annotations, --annotation-format, --min-box-visibility, --box-coords, --masks,
    --mask-sidecar and --mask-ignore."""
    return _apply(_TARGET_OPTIONS, command)


def preprocess_options(command: F) -> F:
    """Add --size, --resize, --crop, --geometry, --mode, --interpolation, --fill, --background,
    --normalize and --dtype."""
    return _apply(_PREPROCESS_OPTIONS, command)


def decode_options(command: F) -> F:
    """Add --full-decode and --max-pixels."""
    return _apply(_DECODE_OPTIONS, command)


def preprocess_config(
    size: str,
    resize: str,
    mode: str,
    interpolation: str,
    fill: str,
    background: str,
    normalize: str,
    dtype: str,
    max_pixels: int,
    full_decode: bool,
    geometry: str = "torchvision",
    crop: Optional[str] = None,
) -> PreprocessConfig:
    """The PreprocessConfig of the options above; ConfigError or click.BadParameter for a bad value."""
    return PreprocessConfig(
        size=None if resize == "none" else parse_size(size),
        resize=resize,
        mode=mode,
        interpolation=interpolation,
        fill=_ints(fill, "--fill"),
        background=_ints(background, "--background"),
        **parse_normalize(normalize),
        dtype=dtype,
        max_pixels=max_pixels,
        reduced_decode=not full_decode,
        geometry=geometry,
        crop=parse_size(crop) if crop else None,
    )


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers 0-255, got {text!r}", param_hint=name) from None
    if any(not 0 <= v <= 255 for v in values):
        raise click.BadParameter(f"values must be 0-255, got {text!r}", param_hint=name)
    return values
