"""The format writers, chosen by name through one registry."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

from packer.errors import ConfigError
from packer.formats import hdf5, lmdb, npy, wds
from packer.formats.base import ImageLayout, ShardWriter
from packer.formats.hdf5 import Hdf5Writer
from packer.formats.lmdb import LmdbWriter
from packer.formats.npy import NpyWriter
from packer.formats.wds import WdsWriter
from packer.manifest import ShardEntry
from packer.records import StoredSample

WRITERS: dict[str, type[ShardWriter]] = {
    "npy": NpyWriter,
    "lmdb": LmdbWriter,
    "hdf5": Hdf5Writer,
    "wds": WdsWriter,
}


Scanner = Callable[[Path, ShardEntry], Iterator[StoredSample]]

SCANNERS: dict[str, Scanner] = {
    "npy": npy.scan_shard,
    "lmdb": lmdb.scan_shard,
    "hdf5": hdf5.scan_shard,
    "wds": wds.scan_shard,
}
"""Per format: read every sample of one shard back with the stock library (``packer verify``)."""


def get_writer(name: str) -> type[ShardWriter]:
    """The writer class registered for format ``name``."""
    try:
        return WRITERS[name]
    except KeyError:
        raise ConfigError(f"unknown format {name!r}; choose one of {', '.join(WRITERS)}") from None


__all__ = ["WRITERS", "SCANNERS", "get_writer", "ImageLayout", "ShardWriter"]
