"""The format writers, chosen by name through one registry."""

from __future__ import annotations

from packer.errors import ConfigError
from packer.formats.base import ImageLayout, ShardWriter
from packer.formats.hdf5 import Hdf5Writer
from packer.formats.lmdb import LmdbWriter
from packer.formats.npy import NpyWriter
from packer.formats.wds import WdsWriter

WRITERS: dict[str, type[ShardWriter]] = {
    "npy": NpyWriter,
    "lmdb": LmdbWriter,
    "hdf5": Hdf5Writer,
    "wds": WdsWriter,
}


def get_writer(name: str) -> type[ShardWriter]:
    """The writer class registered for format ``name``."""
    try:
        return WRITERS[name]
    except KeyError:
        raise ConfigError(f"unknown format {name!r}; choose one of {', '.join(WRITERS)}") from None


__all__ = ["WRITERS", "get_writer", "ImageLayout", "ShardWriter"]
