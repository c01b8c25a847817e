"""The small interface every format writer implements, and what writers share.

A writer knows only how to put samples into its own files for one shard. Shard planning, naming,
hashing and the manifest live in the pipeline, once for all formats; a writer that writes a file
in order may hash it on the way (``HashedFile``), so that the pipeline need not read it back.
What a sample holds is the ``SampleLayout`` the writer is given (``packer.spec.sample_layout``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np

from packer.records import Sample
from packer.spec.sample_layout import SampleLayout


def encoded_bytes(sample: Sample, layout: SampleLayout) -> bytes:
    """What a writer stores for a sample of an encoded layout: its JPEG/PNG bytes (the worker
    encodes them once, before any writer sees the sample)."""
    if sample.encoded is None:
        raise ValueError(f"{sample.key}: a {layout.codec.name} shard stores encoded images, and this sample has none")
    return sample.encoded


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

    def __init__(self, directory: Path, shard: str, layout: SampleLayout, capacity: int) -> None:
        """Start a shard called ``shard`` in ``directory``; ``capacity`` is the most samples it gets."""

    def add(self, sample: Sample) -> None:
        """Append one sample."""

    def close(self) -> list[str]:
        """Finish the shard and return the names of its files, relative to ``directory``."""


class TokenBuffer:
    """A token shard's stream gathered in memory as its ids arrive (``write``), for a format that stores
    it whole at close (hdf5, lmdb); ``digests`` stays empty: their files are hashed once written."""

    def __init__(self, dtype: np.dtype, tokens: int) -> None:
        self.ids = np.empty(tokens, dtype=np.dtype(dtype).newbyteorder("<"))
        self.count = 0
        self.digests: dict[str, str] = {}

    def write(self, ids: np.ndarray) -> None:
        """Append ids to the stream."""
        self.ids[self.count : self.count + len(ids)] = ids
        self.count += len(ids)

    @property
    def stream(self) -> np.ndarray:
        """The ids written so far."""
        return self.ids[: self.count]
