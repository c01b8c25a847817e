"""The files of a token output's shards, read with each format's stock library (numpy for npy).

A ``TokenShard`` is what both the readers and ``packer verify`` need of a shard: its token stream,
its blocks' ``(start, length)`` and its document starts, as arrays (memory-mapped where the format
allows). ``check`` says what is wrong with a shard whose files are complete but whose contents do
not hold together (a block beyond the stream, ids beyond the vocabulary).
"""

from __future__ import annotations

import mmap
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from packer.spec.codecs import npy_view
from packer.spec.shard_names import (
    HDF5_BLOCKS,
    HDF5_DOCUMENTS,
    HDF5_SUFFIX,
    HDF5_TOKENS,
    LMDB_BLOCKS,
    LMDB_DOCUMENTS,
    LMDB_SUFFIX,
    LMDB_TOKENS,
    NPY_BLOCKS,
    NPY_DOCUMENTS,
    NPY_TOKENS,
    TAR_SUFFIX,
    TAR_TOKEN_MEMBERS,
)
from packer.spec.token_blocks import POSITION_DTYPE, TokenSection


@dataclass
class TokenShard:
    """One shard of a token output: ``tokens`` (its stream: an array, or an h5py dataset), ``blocks``
    (N x 2: start, length) and ``documents`` (ascending starts), positions within ``tokens``;
    ``handle``: what must stay open while they are read (an HDF5 file, an LMDB transaction), with a
    ``close``."""

    tokens: Any
    blocks: np.ndarray
    documents: np.ndarray
    handle: Any = None

    def block(self, j: int) -> tuple[np.ndarray, list[int]]:
        """Block ``j``'s stored tokens and the starts of the documents in it, relative to its start."""
        tokens, starts = self.read([j])
        return tokens[0], starts[0]

    def read(self, local: Sequence[int]) -> tuple[list[np.ndarray], list[list[int]]]:
        """The stored tokens of the blocks ``local`` (views of the stream) and, for each, the starts of
        the documents in it relative to its start: looked up for all of them at once."""
        spans = self.blocks[np.asarray(local, dtype=np.int64)]
        # uint32, as the documents: searchsorted converts neither (an int64 needle converted the whole array)
        starts, ends = spans[:, 0], spans[:, 0] + spans[:, 1]
        lo, hi = np.searchsorted(self.documents, starts), np.searchsorted(self.documents, ends)
        starts_, ends_ = starts.tolist(), ends.tolist()
        tokens = [self.tokens[a:b] for a, b in zip(starts_, ends_)]
        documents = self.documents
        inside = [
            [d - a for d in documents[i:j].tolist()] if j > i else []
            for a, i, j in zip(starts_, lo.tolist(), hi.tolist())
        ]
        return tokens, inside

    def close(self) -> None:
        """Let go of what this shard holds open (an HDF5 file, an LMDB transaction and environment);
        no view of its stream may be used after."""
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.close()

    def check(self, section: TokenSection, samples: int, where: str, values: bool = True) -> str:
        """What is wrong with this shard of ``samples`` blocks as ``section`` describes them, or ``""``.
        ``values``: check every id too (a read of the whole stream, which ``packer verify`` makes; a
        reader checks the shape of things only)."""
        if self.tokens.ndim != 1 or self.tokens.dtype != section.np_dtype:
            return f"{where}: the tokens are {self.tokens.dtype} {self.tokens.shape}, not 1-D {section.dtype}"
        if self.blocks.shape != (samples, 2) or self.blocks.dtype != POSITION_DTYPE:
            return f"{where}: the blocks are {self.blocks.dtype} {self.blocks.shape}, not {samples} x 2 uint32"
        if self.documents.ndim != 1 or self.documents.dtype != POSITION_DTYPE:
            return f"{where}: the document starts are {self.documents.dtype} {self.documents.shape}, not 1-D uint32"
        ends = self.blocks[:, 0].astype(np.int64) + self.blocks[:, 1]
        if samples and (ends.max() > len(self.tokens) or self.blocks[:, 1].max() > section.block + 1):
            return f"{where}: a block lies beyond the token stream or holds more than {section.block + 1} tokens"
        if len(self.documents) and (
            np.any(np.diff(self.documents.astype(np.int64)) < 0) or self.documents[-1] >= len(self.tokens)
        ):
            return f"{where}: the document starts do not grow inside the token stream"
        if values and _largest(self.tokens) >= section.vocab_size:
            return f"{where}: a token id is beyond the vocabulary of {section.vocab_size}"
        return ""


def _largest(tokens: Any, step: int = 1 << 24) -> int:
    """The largest id of a stream (-1 when empty), read a part at a time (an h5py dataset is not in memory)."""
    return max((int(np.max(tokens[i : i + step])) for i in range(0, len(tokens), step)), default=-1)


def npy_token_files(shard: str) -> list[str]:
    """The files of npy token shard ``shard``: tokens, blocks, documents."""
    return [shard + suffix for suffix in (NPY_TOKENS, NPY_BLOCKS, NPY_DOCUMENTS)]


def open_npy_token_shard(directory: Path, shard: str, mmap: bool = True) -> TokenShard:
    """An npy token shard's arrays (``np.load``, memory-mapped unless ``mmap`` is False); OSError or
    ValueError where a file is missing or not an array."""
    names = npy_token_files(shard)
    tokens = np.load(Path(directory) / names[0], mmap_mode="r" if mmap else None, allow_pickle=False)
    # The small arrays are read whole (each block looks them up; a map each would hold a file open);
    # the stream is a plain array over its map (slicing a np.memmap costs more than copying a block).
    blocks, documents = (np.load(Path(directory) / name, allow_pickle=False) for name in names[1:])
    return TokenShard(np.asarray(tokens), blocks, documents)


def open_hdf5_token_shard(directory: Path, shard: str) -> TokenShard:
    """An HDF5 token shard's datasets (h5py); its stream memory-mapped where HDF5 stores it contiguous
    and uncompressed, as packer writes it (a block is then a slice of the map, not an HDF5 read)."""
    import h5py

    path = Path(directory) / f"{shard}{HDF5_SUFFIX}"
    f = h5py.File(path, "r")
    try:
        tokens = f[HDF5_TOKENS]
        blocks, documents = f[HDF5_BLOCKS][()], f[HDF5_DOCUMENTS][()]
        offset = tokens.id.get_offset() if tokens.chunks is None and tokens.compression is None else None
        if offset is not None and tokens.ndim == 1:
            tokens = np.asarray(np.memmap(path, dtype=tokens.dtype, mode="r", offset=offset, shape=tokens.shape))
            f.close()  # the map holds the file: no HDF5 handle stays open
            return TokenShard(tokens, blocks, documents)
    except BaseException:
        f.close()
        raise
    return TokenShard(tokens, blocks, documents, handle=f)


def open_wds_token_shard(directory: Path, shard: str) -> TokenShard:
    """A tar token shard's arrays, views of a read-only map of the tar (its members are stored whole,
    uncompressed); ValueError where the tar does not hold exactly the three members as plain files,
    ``tarfile.ReadError`` where it is no tar, OSError where it cannot be read."""
    path = Path(directory) / f"{shard}{TAR_SUFFIX}"
    with open(path, "rb") as f:
        with tarfile.open(fileobj=f, mode="r:") as tar:
            members = {m.name: m for m in tar.getmembers()}
        if sorted(members) != sorted(TAR_TOKEN_MEMBERS) or not all(
            m.isfile() and m.sparse is None for m in members.values()
        ):
            raise ValueError(f"its members are {sorted(members)}, not {list(TAR_TOKEN_MEMBERS)}")
        data = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    arrays = []
    for name in TAR_TOKEN_MEMBERS:
        m = members[name]
        if m.offset_data + m.size > len(data):
            raise ValueError(f"{name} ends past the file's end")
        arrays.append(npy_view(data[m.offset_data : m.offset_data + m.size]))
    blocks, documents, tokens = arrays
    return TokenShard(tokens, np.array(blocks), np.array(documents))  # the small ones copied: looked up often


def open_lmdb_token_shard(directory: Path, shard: str) -> TokenShard:
    """An LMDB token shard's arrays, views of the map (no copy) read in a transaction kept open with
    them; the environment is the process's shared one (``packer.spec.lmdb_envs``)."""
    from packer.spec.lmdb_envs import acquire, release

    # Resolved: py-lmdb refuses a second open of one file in a process, however its path is spelled.
    key, env = acquire(str((Path(directory) / f"{shard}{LMDB_SUFFIX}").resolve()))
    try:
        txn = env.begin(buffers=True)
        values = [txn.get(k) for k in (LMDB_TOKENS, LMDB_BLOCKS, LMDB_DOCUMENTS)]
        if any(v is None for v in values):
            raise ValueError(f"{shard} lacks one of the keys tokens, blocks, documents")
        tokens, blocks, documents = (npy_view(v) for v in values)
        blocks, documents = np.array(blocks), np.array(documents)
    except BaseException:
        release(key)
        raise
    return TokenShard(tokens, blocks, documents, handle=_LmdbHold(txn, key, release))


class _LmdbHold:
    """An LMDB shard's read transaction and its environment's share, let go of once: by ``close``, or
    when the shard is dropped."""

    def __init__(self, txn: Any, key: tuple, release: Any) -> None:
        self.txn, self.key, self.release = txn, key, release

    def close(self) -> None:
        txn, self.txn = self.txn, None
        if txn is not None:
            txn.abort()
            self.release(self.key)

    def __del__(self) -> None:
        self.close()


__all__ = ["TokenShard", "npy_token_files", "open_npy_token_shard", "open_hdf5_token_shard", "open_lmdb_token_shard"]
