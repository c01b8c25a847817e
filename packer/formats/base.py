"""The small interface every format writer implements, and the layout record it is given.

A writer knows only how to put samples into its own files for one shard. Shard planning, naming,
hashing and the manifest live in the pipeline, once for all formats; a writer that writes a file
in order may hash it on the way (``HashedFile``), so that the pipeline need not read it back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional, Protocol

import numpy as np

from packer.config import ImageCodec
from packer.records import Sample, TextField


@dataclass(frozen=True)
class ImageLayout:
    """What a shard stores per sample: the image field's shape, dtype and codec (unless
    ``has_image`` is False: text-only samples), then the variable-length ``text`` fields in order.

    ``shape`` (H, W, C) is None for images of variable sizes. With an encoding codec (jpeg, png)
    writers store each sample's ``Sample.encoded`` bytes, and ``sample_bytes`` is the size of the
    pixels before encoding.
    """

    dtype: str
    shape: Optional[tuple[int, int, int]]
    channels: int
    codec: ImageCodec = ImageCodec()
    has_image: bool = True
    text: tuple[TextField, ...] = ()

    @property
    def sample_bytes(self) -> Optional[int]:
        """Bytes of one stored image (0 without images), when the shape is fixed."""
        if not self.has_image:
            return 0
        if self.shape is None:
            return None
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize

    def fields(self) -> dict[str, dict]:
        """The manifest's ``fields`` entry for this layout: the sample's fields in order, then label and key."""
        out: dict[str, dict] = {}
        if self.has_image:
            out["image"] = {"dtype": self.dtype, "shape": list(self.shape) if self.shape else None,
                            "channels": self.channels, "layout": "HWC", **self.codec.to_dict()}
        for f in self.text:
            out[f.name] = f.to_dict()
        out["label"] = {"dtype": "int64", "shape": []}
        out["key"] = {"dtype": "str", "shape": []}
        return out


def check_image(sample: Sample, layout: ImageLayout) -> None:
    """ValueError unless ``sample`` has an image of the layout's shape (any shape when sizes vary)."""
    if sample.image is None or (layout.shape is not None and sample.image.shape != layout.shape):
        found = None if sample.image is None else sample.image.shape
        raise ValueError(f"image of shape {found} in a shard of shape {layout.shape}")


def encoded_bytes(sample: Sample, layout: ImageLayout) -> bytes:
    """What a writer stores for a sample of an encoded layout: its JPEG/PNG bytes (the worker
    encodes them once, before any writer sees the sample)."""
    if sample.encoded is None:
        raise ValueError(f"{sample.key}: a {layout.codec.name} shard stores encoded images, and this sample has none")
    return sample.encoded


def raw_bytes(image: np.ndarray, dtype: np.dtype) -> memoryview:
    """An image's pixels as a flat byte view in C order and ``dtype`` (copied only when needed), for
    a variable-length field of raw images."""
    return np.ascontiguousarray(image, dtype=dtype).reshape(-1).view(np.uint8).data


def raw_image(data, dtype: str | np.dtype, shape, where: str) -> np.ndarray:
    """The image ``raw_bytes`` made, from its bytes (any buffer) and recorded (H, W, C) shape."""
    array = np.frombuffer(data, dtype=np.uint8)
    shape = tuple(int(v) for v in shape)
    if array.size != int(np.prod(shape)) * np.dtype(dtype).itemsize:
        raise ValueError(f"{where}: {array.size} bytes of image data for shape {shape} of {np.dtype(dtype)}")
    return array.view(dtype).reshape(shape)


class HashedFile:
    """A file opened for writing that hashes what is written to it, in order: its SHA-256 without
    reading it back, as long as nothing is written through ``file`` (seeking back, truncating).
    With ``hashing`` False it only writes: for a file its writer will change later anyway."""

    def __init__(self, path: Path, hashing: bool = True) -> None:
        self.file = open(path, "wb")
        self._hash = hashlib.sha256() if hashing else None

    @property
    def hashing(self) -> bool:
        """Whether ``write`` hashes."""
        return self._hash is not None

    def write(self, data) -> None:
        """Append bytes or any buffer."""
        self.file.write(data)
        if self._hash is not None:
            self._hash.update(data)

    def hexdigest(self) -> str:
        """Hex SHA-256 of everything written through ``write`` (ValueError when not hashing)."""
        if self._hash is None:
            raise ValueError("this file was written without hashing")
        return self._hash.hexdigest()


class ShardWriter(Protocol):
    """Writes one shard: ``add`` samples in order, then ``close`` to get the files written.

    ``digests`` (file name -> hex SHA-256) holds, after ``close``, the files the writer hashed as it
    wrote them; the others are read back for the manifest."""

    name: ClassVar[str]
    digests: dict[str, str]

    def __init__(self, directory: Path, shard: str, layout: ImageLayout, capacity: int) -> None:
        """Start a shard called ``shard`` in ``directory``; ``capacity`` is the most samples it gets."""

    def add(self, sample: Sample) -> None:
        """Append one sample."""

    def close(self) -> list[str]:
        """Finish the shard and return the names of its files, relative to ``directory``."""
