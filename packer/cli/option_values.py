"""The command line's option strings parsed into settings: ``--size`` (``parse_size``), ``--normalize``
(``parse_normalize``) and ``--shard-size`` (``parse_shard_size``); ConfigError says what is wrong."""

from __future__ import annotations

import math
import re

from packer.config import AUTO, IMAGENET_MEAN, IMAGENET_STD, ShardSize
from packer.spec.errors import ConfigError


def parse_size(text: str) -> tuple[int, int]:
    """Parse ``224`` (square) or ``256x192`` (width x height) into (width, height)."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:[xX×]\s*(\d+))?\s*", text)
    if not m:
        raise ConfigError(f"size must look like 224 or 256x192 (WIDTHxHEIGHT); got {text!r}")
    w = int(m.group(1))
    h = int(m.group(2)) if m.group(2) else w
    if w < 1 or h < 1:
        raise ConfigError(f"size must be positive; got {text!r}")
    return (w, h)


def parse_normalize(text: str) -> dict:
    """Parse ``imagenet``, ``none``, ``auto`` or ``MEAN,STD`` into PreprocessConfig's normalization
    arguments: ``mean``, ``std`` and ``auto_normalize``.

    ``MEAN,STD`` is either two numbers (the same for every channel) or 2xC numbers, the C means
    first, then the C stds: ``0.5,0.5`` or ``0.485,0.456,0.406,0.229,0.224,0.225``. ``auto`` uses
    the converted images' own mean and std, computed while converting.
    """
    t = text.strip().lower()
    if t == AUTO:
        return {"mean": None, "std": None, "auto_normalize": True}
    if t == "imagenet":
        return {"mean": IMAGENET_MEAN, "std": IMAGENET_STD, "auto_normalize": False}
    if t == "none":
        return {"mean": None, "std": None, "auto_normalize": False}
    try:
        nums = [float(v) for v in t.split(",")]
    except ValueError:
        nums = []
    if len(nums) < 2 or len(nums) % 2:
        raise ConfigError(
            f"--normalize takes imagenet, none, auto, or MEAN,STD (2 or 2xC numbers, means first); got {text!r}"
        )
    half = len(nums) // 2
    return {"mean": tuple(nums[:half]), "std": tuple(nums[half:]), "auto_normalize": False}


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}


def parse_shard_size(text: str) -> ShardSize:
    """Parse ``auto``, a sample count (``1000``) or a byte size (``256MB``, ``1GiB``)."""
    t = text.strip().lower()
    if t == "auto":
        return ShardSize()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", t)
    if not m or m.group(2) not in _UNITS:
        raise ConfigError(f"shard size must be auto, a sample count (1000) or a byte size (256MB, 1GiB); got {text!r}")
    number, unit = float(m.group(1)), m.group(2)
    if unit == "":
        if number != int(number):
            raise ConfigError(f"a sample count must be a whole number; got {text!r}")
        return ShardSize(samples=int(number))
    return ShardSize(bytes=int(math.ceil(number * _UNITS[unit])))
