"""The preprocessing options, declared once for every command that takes them, and their parsing."""

from __future__ import annotations

from typing import Any, Callable, Optional, TypeVar

import click

from packer.config import (
    COLOR_MODES,
    DEFAULT_MAX_PIXELS,
    DTYPES,
    GEOMETRIES,
    INTERPOLATIONS,
    RESIZE_MODES,
    PreprocessConfig,
    parse_normalize,
    parse_size,
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


def _apply(options: tuple[Callable[[F], F], ...], command: F) -> F:
    for option in reversed(options):  # decorators apply bottom-up; the help lists them top-down
        command = option(command)
    return command


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
