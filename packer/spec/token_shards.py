"""The files of a token output's shards, read with each format's stock library (numpy for npy).

A ``TokenShard`` is what both the readers and ``packer verify`` need of a shard: its token stream,
its blocks' ``(start, length)`` and its document starts, as arrays (memory-mapped where the format
allows). ``check`` says what is wrong with a shard whose files are complete but whose contents do
not hold together (a block beyond the stream, ids beyond the vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packer.spec.shard_names import NPY_BLOCKS, NPY_DOCUMENTS, NPY_TOKENS
from packer.spec.token_blocks import POSITION_DTYPE, TokenSection


@dataclass
class TokenShard:
    """One shard of a token output: ``tokens`` (its stream), ``blocks`` (N x 2: start, length) and
    ``documents`` (ascending starts), positions within ``tokens``."""

    tokens: np.ndarray
    blocks: np.ndarray
    documents: np.ndarray

    def block(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """Block ``j``'s stored tokens and the starts of the documents in it, relative to its start."""
        start, length = int(self.blocks[j, 0]), int(self.blocks[j, 1])
        lo, hi = np.searchsorted(self.documents, (start, start + length))
        return self.tokens[start : start + length], self.documents[lo:hi].astype(np.int64) - start

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
        if values and len(self.tokens) and int(self.tokens.max()) >= section.vocab_size:
            return f"{where}: a token id is beyond the vocabulary of {section.vocab_size}"
        return ""


def npy_token_files(shard: str) -> list[str]:
    """The files of npy token shard ``shard``: tokens, blocks, documents."""
    return [shard + suffix for suffix in (NPY_TOKENS, NPY_BLOCKS, NPY_DOCUMENTS)]


def open_npy_token_shard(directory: Path, shard: str, mmap: bool = True) -> TokenShard:
    """An npy token shard's arrays (``np.load``, memory-mapped unless ``mmap`` is False); OSError or
    ValueError where a file is missing or not an array."""
    mode = "r" if mmap else None
    tokens, blocks, documents = (
        np.load(Path(directory) / name, mmap_mode=mode, allow_pickle=False) for name in npy_token_files(shard)
    )
    # The small arrays are read whole: each block looks them up.
    return TokenShard(tokens, np.ascontiguousarray(blocks), np.ascontiguousarray(documents))


__all__ = ["TokenShard", "npy_token_files", "open_npy_token_shard"]
