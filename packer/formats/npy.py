"""npy-memmap shards: plain ``.npy`` files that ``np.load(path, mmap_mode="r")`` opens.

Per shard: ``NAME.images.npy`` (N x H x W x C), ``NAME.labels.npy`` (N, int64) and
``NAME.keys.npy`` (N, fixed-width unicode). Images are streamed to disk as they arrive; the header
is written first for the planned count and rewritten with the final count at the end (numpy pads
npy headers so the first axis can grow without moving the data).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np

from packer.errors import ConfigError
from packer.formats.base import ImageLayout
from packer.records import Sample


def _write_header(f, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(f, header)


class NpyWriter:
    """Writes one shard as three ``.npy`` files."""

    name: ClassVar[str] = "npy"
    variable_shape: ClassVar[bool] = False

    def __init__(self, directory: Path, shard: str, layout: ImageLayout, capacity: int) -> None:
        if layout.shape is None:
            raise ConfigError("the npy format stores one N x H x W x C array and needs a fixed image size")
        self.directory, self.shard, self.layout = Path(directory), shard, layout
        self.dtype = np.dtype(layout.dtype)
        self.images_name = f"{shard}.images.npy"
        self._f = open(self.directory / self.images_name, "wb")
        _write_header(self._f, self.dtype, (capacity, *layout.shape))
        self._data_start = self._f.tell()
        self.labels: list[int] = []
        self.keys: list[str] = []

    def add(self, sample: Sample) -> None:
        """Append one image (must have the layout's shape) with its label and key."""
        image = np.ascontiguousarray(sample.image, dtype=self.dtype)
        if image.shape != self.layout.shape:
            raise ValueError(f"image of shape {image.shape} in a shard of shape {self.layout.shape}")
        self._f.write(image.data)
        self.labels.append(sample.label)
        self.keys.append(sample.key)

    def close(self) -> list[str]:
        """Fix the image header to the final count and write labels and keys."""
        n = len(self.labels)
        self._f.seek(0)
        _write_header(self._f, self.dtype, (n, *self.layout.shape))  # type: ignore[misc]
        if self._f.tell() != self._data_start:  # cannot happen with numpy's padded headers
            raise RuntimeError("npy header changed length; refusing to write a corrupt file")
        self._f.truncate(self._data_start + n * (self.layout.sample_bytes or 0))
        self._f.close()
        labels_name, keys_name = f"{self.shard}.labels.npy", f"{self.shard}.keys.npy"
        np.save(self.directory / labels_name, np.asarray(self.labels, dtype=np.int64), allow_pickle=False)
        keys = np.asarray(self.keys, dtype=str) if self.keys else np.zeros(0, dtype="<U1")
        np.save(self.directory / keys_name, keys, allow_pickle=False)
        return [self.images_name, labels_name, keys_name]
