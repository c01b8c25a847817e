"""Token outputs: a tokenized corpus packed into blocks for language-model pretraining.

A token output's samples are *blocks*: up to ``block + 1`` token ids each (``block`` inputs and, one
position on, their next-token targets). Each shard stores its blocks' tokens in one flat stream,
where block ``j`` is ``tokens[start_j : start_j + length_j]``, and the positions in that stream where
a document (or the piece of one that a block holds) starts. How the blocks were cut is the
manifest's ``tokens`` section (``TokenSection``): ``concat`` joins every document, each followed by
the end-of-text token, and cuts the stream into blocks overlapping by one token (a shard's stream
is a slice of the corpus's); ``best-fit`` places whole documents into blocks and pads the rest.

This module is part of what every output is: the section, the token dtype, and what a reader makes
of one block (inputs, labels, position ids restarting at each document, ``cu_seqlens``), numpy only.
The files of each format's token shards are ``packer.spec.token_shards``'s.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np

from packer.spec.errors import ConfigError, ManifestError
from packer.spec.listed_files import sha256_of

PACKINGS = ("concat", "best-fit")
"""How documents become blocks (``--pack-mode``)."""

IGNORE_INDEX = -100
"""The label of a position with no next token (padding): what ``torch.nn.CrossEntropyLoss`` ignores."""

MAX_SHARD_TOKENS = 2**32 - 1
"""The most tokens one shard's stream holds: its block and document positions are uint32."""

POSITION_DTYPE = np.dtype("<u4")
"""Stored dtype of block starts and lengths and of document starts, within a shard's stream."""


def token_dtype(vocab_size: int) -> np.dtype:
    """The stored dtype of ids below ``vocab_size``: uint16 when they fit (2 bytes a token), else
    uint32; ConfigError beyond uint32."""
    if vocab_size <= 2**16:
        return np.dtype("<u2")
    if vocab_size <= 2**32:
        return np.dtype("<u4")
    raise ConfigError(f"a vocabulary of {vocab_size} ids does not fit uint32 token ids")


@dataclass(frozen=True)
class TokenSection:
    """The manifest's ``tokens`` section: how a corpus became blocks, and what it held.

    ``block``: the inputs of a block (a block stores up to ``block + 1`` tokens); ``dtype``: the
    stored ids (``uint16``, ``uint32``); ``packing``: ``concat`` or ``best-fit``; ``eos`` and
    ``bos``: the ids added around each document (``bos`` None: none); ``pad_id``: the id readers put
    in padding (labels there are ``IGNORE_INDEX``); ``vocab_size``; ``tokenizer``: its file name,
    SHA-256 and vocabulary size. Counts: ``documents`` and ``tokens`` of the corpus (with the added
    ids), ``stored`` tokens in the shards (concat repeats each shard's last token at the next one's
    start; best-fit repeats a long document's token at each cut), ``padding`` (block positions
    without a token: the sum over the blocks of ``block + 1 - length``) and ``dropped`` (tokens not
    stored: none, by either packing). ``shuffle_seed``: the seed of the documents' order, None for sorted order.
    """

    block: int
    dtype: str
    packing: str
    eos: int
    bos: Optional[int]
    pad_id: int
    vocab_size: int
    tokenizer: dict
    documents: int = 0
    tokens: int = 0
    stored: int = 0
    padding: int = 0
    dropped: int = 0
    shuffle_seed: Optional[int] = None
    text: dict = field(default_factory=dict)
    """How the corpus's texts were found: ``documents`` (``file`` or ``lines``), ``text_key``."""

    @property
    def np_dtype(self) -> np.dtype:
        """``dtype`` as a numpy dtype."""
        return np.dtype(self.dtype).newbyteorder("<")

    def padding_share(self, blocks: int) -> float:
        """The share of ``blocks``' positions that hold no token."""
        return self.padding / (blocks * (self.block + 1)) if blocks else 0.0

    def to_dict(self) -> dict:
        """JSON-ready form, in a fixed key order."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: object, where: str) -> "TokenSection":
        """The section of a manifest read from ``where``; ManifestError when it is not one."""
        try:
            if not isinstance(d, dict):
                raise TypeError("not an object")
            section = cls(**d)
        except TypeError as e:
            raise ManifestError(f"{where}: the tokens section is not one this packer reads ({e})") from None
        numbers = (section.block, section.eos, section.pad_id, section.vocab_size, section.documents, section.tokens)
        counts = (section.stored, section.padding, section.dropped)
        if (
            not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (*numbers, *counts))
            or section.block < 1
            or section.packing not in PACKINGS
            or section.dtype not in ("uint16", "uint32")
            or token_dtype(section.vocab_size).itemsize > np.dtype(section.dtype).itemsize
            or not (section.bos is None or isinstance(section.bos, int))
        ):
            raise ManifestError(
                f"{where}: the tokens section {d!r} is not a block size, a packing ({', '.join(PACKINGS)}), "
                "uint16 or uint32 ids of its vocabulary and whole counts; the manifest is damaged"
            )
        return section


def tokenizer_record(path: str, vocab_size: int) -> dict:
    """What the manifest records of a ``tokenizer.json``: its file name, SHA-256 and vocabulary size
    (``--append`` and ``packer combine`` compare the hash)."""
    return {"file": os.path.basename(path), "sha256": sha256_of(path), "vocab_size": int(vocab_size)}


@dataclass
class BlockBatch:
    """Blocks as training reads them, numpy arrays of ``n`` rows of ``block`` positions.

    ``input_ids`` (int64; ``pad_id`` in padding), ``labels`` (the next token of each input;
    ``IGNORE_INDEX`` where there is none), ``position_ids`` (restarting at 0 at each block's start,
    at each document's start and where padding starts), ``cu_seqlens`` (int32: the start of each
    such run in the flattened batch, then ``n * block``; what variable-length attention takes) and
    ``max_seqlen`` (the longest run)."""

    input_ids: np.ndarray
    labels: np.ndarray
    position_ids: np.ndarray
    cu_seqlens: np.ndarray
    max_seqlen: int


def read_blocks(
    pieces: Sequence[np.ndarray],
    document_starts: Sequence[Sequence[int]],
    block: int,
    pad_id: int,
    out: Optional[np.ndarray] = None,
) -> BlockBatch:
    """The ``BlockBatch`` of blocks given as their stored tokens (``pieces``, each up to ``block + 1``
    ids) and the positions in each where a document starts (``document_starts``, sorted): ``out``
    (or fresh memory) filled by ``fill_blocks``, then ``finish_blocks``."""
    n = len(pieces)
    out = batch_memory(n, block, out)
    runs = fill_blocks(out, range(n), pieces, document_starts, block, pad_id)
    return finish_blocks(out, runs)


def batch_memory(n: int, block: int, out: Optional[np.ndarray] = None) -> np.ndarray:
    """Where a batch of ``n`` blocks is written: ``out`` (a loader's reusable shared memory), checked
    to be a C-contiguous ``(3, n, block)`` int64 array, or fresh memory."""
    if out is None:
        return np.empty((3, n, block), dtype=np.int64)
    if out.shape != (3, n, block) or out.dtype != np.int64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous (3, {n}, {block}) int64 array, not {out.dtype} {out.shape}")
    return out


def fill_blocks(
    out: np.ndarray,
    rows: Sequence[int],
    pieces: Sequence[np.ndarray],
    document_starts: Sequence[Sequence[int]],
    block: int,
    pad_id: int,
) -> list[list[int]]:
    """Write the inputs and labels of the blocks ``pieces`` into rows ``rows`` of ``out`` (see
    ``batch_memory``); returns where a run starts in each (the document starts inside it, and where
    its padding starts), what ``finish_blocks`` needs. The stored ids are copied here: once this
    returns, ``pieces`` (views of their shard) may go.

    Each block's ids are converted to int64 twice (inputs, and labels one position on): a batch
    costs about three int64 writes of its positions, with the position ids, which is what it holds."""
    inputs, labels = out[0], out[1]
    runs = []
    for row, tokens, docs in zip(rows, pieces, document_starts):
        length = len(tokens)
        real = min(length, block)
        inputs[row, :real] = tokens[:real]
        # From the stored ids again, not from the inputs: numpy converts uint16 to int64 several
        # times faster than it copies int64 rows one element apart.
        labels[row, : length - 1] = tokens[1 : block + 1]
        starts = [d for d in docs if 0 < d < real]
        if length <= block:
            inputs[row, real:] = pad_id
            labels[row, real - 1 :] = IGNORE_INDEX
            if real < block:  # padding runs as its own sequence
                starts.append(real)
        runs.append(starts)
    return runs


def finish_blocks(out: np.ndarray, runs: Sequence[Sequence[int]]) -> BlockBatch:
    """The ``BlockBatch`` of ``out`` once every row is filled (``fill_blocks``; ``runs`` in row order):
    the position ids of the whole batch at once, and ``cu_seqlens``."""
    _, n, block = out.shape
    cu = [0]
    for row, starts in enumerate(runs):
        base = row * block
        cu += [base + d for d in starts]
        cu.append(base + block)
    starts_ = np.asarray(cu, dtype=np.int64)
    lengths = np.diff(starts_)
    # Each position's distance from the start of its run.
    np.subtract(_count(n * block), np.repeat(starts_[:-1], lengths), out=out[2].reshape(-1))
    return BlockBatch(out[0], out[1], out[2], starts_.astype(np.int32), int(lengths.max()) if n else 0)


def split_blocks(blocks: BlockBatch, sizes: Sequence[int]) -> list[BlockBatch]:
    """``blocks`` as the consecutive batches of ``sizes`` rows it holds (a loader's chunk of batches,
    read at once): views of its rows, each with its own ``cu_seqlens`` and ``max_seqlen``, equal to
    what ``finish_blocks`` gives for those rows alone (every row's end is a run's)."""
    block = blocks.input_ids.shape[1]
    cu = blocks.cu_seqlens.astype(np.int64)
    out, first = [], 0
    for size in sizes:
        last = first + int(size)
        a, b = np.searchsorted(cu, [first * block, last * block])
        runs = cu[a : b + 1] - first * block
        lengths = np.diff(runs)
        out.append(
            BlockBatch(
                blocks.input_ids[first:last],
                blocks.labels[first:last],
                blocks.position_ids[first:last],
                runs.astype(np.int32),
                int(lengths.max()) if len(lengths) else 0,
            )
        )
        first = last
    return out


@functools.lru_cache(maxsize=8)
def _count(size: int) -> np.ndarray:
    """0, 1, ... ``size - 1``, made once per batch size."""
    values = np.arange(size, dtype=np.int64)
    values.flags.writeable = False
    return values


__all__ = [
    "PACKINGS",
    "IGNORE_INDEX",
    "MAX_SHARD_TOKENS",
    "POSITION_DTYPE",
    "token_dtype",
    "TokenSection",
    "tokenizer_record",
    "BlockBatch",
    "read_blocks",
    "batch_memory",
    "fill_blocks",
    "finish_blocks",
    "split_blocks",
]
