"""``TokenBlocks``: the reader of a token output (``packer convert CORPUS --pack BLOCK``).

Each sample is one block of ``block`` positions, as language-model pretraining reads it::

    ds = open_dataset("packed/tokens")          # a TokenBlocks
    ds[0]["input_ids"], ds[0]["labels"]         # int64 [block]: the ids, and the next id of each
    loader = make_loader(ds, batch_size=16)     # a seeded shuffle of blocks per epoch, exact resume

``labels`` are the next token of each input, ``-100`` (what ``CrossEntropyLoss`` ignores) where
there is none (padding). ``position_ids`` restart at 0 at each document's start (and at the block's
start, and where padding starts); ``cu_seqlens`` (int32) gives the same runs as the offsets
variable-length attention takes (flash-attention's ``cu_seqlens``: for a batch, the runs of the
flattened ``batch * block`` positions), with ``max_seqlen``. ``block_mask=True`` adds
``attention_mask``, a bool ``[1, block, block]`` (``[batch, 1, block, block]``) mask that lets each
position attend to the positions before it in its own run only, as ``scaled_dot_product_attention``
takes it. ``return_dict=False`` gives the plain ``(input_ids, labels)`` pair.

The shards are memory-mapped (``np.load(..., mmap_mode="r")``): a block read copies its few KB and
nothing else, in whichever process reads it; each process opens the shards itself.
"""

from __future__ import annotations

import bisect
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from packer.spec.errors import ManifestError
from packer.spec.registry import FORMATS
from packer.spec.token_blocks import BlockBatch, TokenSection, read_blocks
from packer.spec.token_shards import TokenShard
from readers.datasets.output_files import OutputFiles
from readers.loading.batch_buffers import SlotRing
from readers.remote.urls import is_url

MAX_OPEN_SHARDS = 64
"""Shards a reader keeps open in one process (each holds a file descriptor), least recently used
closed first: a shuffled read of a large output would otherwise run out of descriptors."""

OPTIONS = ("return_dict", "block_mask", "vocab_size", "seed", "verify", "cache_dir")
"""What ``open_dataset`` passes on to ``TokenBlocks``."""


class TokenBlocks(Dataset):
    """The blocks of a token output at ``root`` (see the module).

    ``vocab_size``: the vocabulary the training code expects; an output of another is refused (its
    ids would index another embedding). ``seed``: the default seed of ``make_loader``'s shuffle.
    ``verify=True`` checks each shard file's SHA-256 before its first read. ``root`` may be a URL
    (``s3://bucket/tokens``, ``https://``): each shard is then downloaded once into ``cache_dir``,
    checked against the manifest's size and SHA-256 as it streams, and read from there.
    """

    has_target = False  # what PackedLoader asks of every dataset it loads
    classes = None  # what a mixture's parts compare

    def __init__(
        self,
        root: Union[str, os.PathLike],
        *,
        return_dict: bool = True,
        block_mask: bool = False,
        vocab_size: Optional[int] = None,
        seed: int = 0,
        verify: bool = False,
        cache_dir: Union[str, os.PathLike, None] = None,
    ) -> None:
        if is_url(root):
            if cache_dir is None:
                raise ValueError(
                    f"{root}: token blocks are read at random, so each shard is downloaded once into a cache: "
                    "pass cache_dir= (a local folder)"
                )
            self.files = OutputFiles.open(str(root), verify=verify)
            self.root = self.files.through_cache(cache_dir)  # each shard downloaded once, verified
        else:
            self.root = Path(root)
            self.files = OutputFiles.open(self.root, verify=verify)
        self.manifest = self.files.manifest
        section = self.manifest.tokens
        if section is None:
            raise ManifestError(
                f"{root} holds samples, not token blocks: open it with readers.open_dataset, or convert a corpus "
                "with packer convert CORPUS --tokenizer tokenizer.json --pack BLOCK"
            )
        if vocab_size is not None and int(vocab_size) != section.vocab_size:
            raise ValueError(
                f"{root} holds ids of a vocabulary of {section.vocab_size} ({section.tokenizer.get('file')}), "
                f"not {vocab_size}: it was tokenized with another tokenizer than the model expects"
            )
        self.section: TokenSection = section
        self.return_dict, self.block_mask, self.seed = bool(return_dict), bool(block_mask), int(seed)
        self._starts = self.manifest.shard_offsets
        self._open: OrderedDict[int, TokenShard] = OrderedDict()
        self._pid = os.getpid()
        self._ring: Optional[SlotRing] = None

    # what the output holds -------------------------------------------------------------------
    def __len__(self) -> int:
        return self.manifest.samples

    @property
    def block_size(self) -> int:
        """Positions of a block (its inputs; it stores one id more, the last target)."""
        return self.section.block

    @property
    def tokens(self) -> int:
        """Tokens of the corpus, with the end-of-text (and beginning) ids added to each document."""
        return self.section.tokens

    @property
    def documents(self) -> int:
        """Documents of the corpus that were tokenized."""
        return self.section.documents

    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary size (ids are below it)."""
        return self.section.vocab_size

    @property
    def tokenizer(self) -> dict:
        """The tokenizer's file name, SHA-256 and vocabulary size, as the manifest records them."""
        return dict(self.section.tokenizer)

    @property
    def tokens_per_block(self) -> float:
        """The ids a block holds on average, padding left out (a mixture weighs its parts by tokens)."""
        s = self.section
        return (len(self) * (s.block + 1) - s.padding) / max(len(self), 1)

    @property
    def padding_share(self) -> float:
        """The share of block positions that hold no token (best-fit packing; the last block of concat)."""
        return self.section.padding_share(len(self))

    # reading ---------------------------------------------------------------------------------
    def __getitem__(self, index: int) -> Any:
        index = int(index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"block {index} of {len(self)}")
        batch = self.batch_of(*self.pieces([index % len(self)]), shared=False)
        if not self.return_dict:
            return batch[0][0], batch[1][0]
        return {k: (v[0] if k not in ("cu_seqlens", "max_seqlen") else v) for k, v in batch.items()}

    def __getitems__(self, indices: Sequence[int]) -> Any:
        """A whole batch of blocks, stacked (what ``make_loader``'s workers read)."""
        return self._read([int(i) for i in indices])

    def with_ring(self, ring: Optional[SlotRing]) -> "TokenBlocks":
        """A copy whose batches read in a DataLoader worker are written into ``ring``'s shared slots
        (``make_loader``'s, made once: fresh shared memory for every batch costs the loader more
        than reading the batch)."""
        copy = object.__new__(TokenBlocks)
        copy.__dict__.update(self.__getstate__())
        copy._ring = ring
        return copy

    def _read(self, indices: list[int]) -> Any:
        return self.batch_of(*self.pieces(indices))

    def pieces(self, indices: Sequence[int]) -> tuple[list[np.ndarray], list[list[int]]]:
        """The stored ids of the blocks ``indices`` (views of their shards) and the document starts in
        each, looked up shard by shard: what ``batch_of`` makes a batch of."""
        self._trim()  # before reading, never during: the blocks read are views of their shards
        by_shard: dict[int, list[int]] = {}
        for row, index in enumerate(indices):
            by_shard.setdefault(bisect.bisect_right(self._starts, index) - 1, []).append(row)
        pieces: list[Any] = [None] * len(indices)
        starts: list[Any] = [None] * len(indices)
        for shard, rows in by_shard.items():
            first = self._starts[shard]
            tokens, documents = self._shard(shard).read([indices[r] - first for r in rows])
            for r, t, d in zip(rows, tokens, documents):
                pieces[r], starts[r] = t, d
        return pieces, starts

    def batch_of(self, pieces: list[np.ndarray], starts: list[list[int]], shared: bool = True) -> Any:
        """The batch of blocks given by ``pieces`` (this output's or a mixture's of outputs like it),
        written into a ring slot in a loader's worker when there is one free (``shared``)."""
        n = len(pieces)
        block = self.section.block
        claimed = None
        if shared and self._ring is not None and not self.block_mask:
            claimed = self._ring.claim(3 * n, torch.int64, (1, block))
        out = claimed[1].numpy().reshape(3, n, block) if claimed is not None else None
        blocks = read_blocks(pieces, starts, block, self.section.pad_id, out)
        if claimed is not None:
            return RingBlocks(claimed[0], n, block, blocks.cu_seqlens, blocks.max_seqlen, self.return_dict)
        if not self.return_dict:
            return torch.from_numpy(blocks.input_ids), torch.from_numpy(blocks.labels)
        return self._as_dict(blocks)

    def _as_dict(self, blocks: BlockBatch) -> dict:
        out = _batch(
            torch.from_numpy(blocks.input_ids),
            torch.from_numpy(blocks.labels),
            torch.from_numpy(blocks.position_ids),
            blocks.cu_seqlens,
            blocks.max_seqlen,
        )
        if self.block_mask:
            run = blocks.position_ids
            n, block = run.shape
            positions = np.arange(block)
            # the start of each position's run: the same start means the same run
            begin = positions[None, :] - run
            same = begin[:, :, None] == begin[:, None, :]
            causal = positions[:, None] >= positions[None, :]
            out["attention_mask"] = torch.from_numpy(same & causal[None]).unsqueeze(1)
        return out

    def _trim(self) -> None:
        """Close the least recently used shards beyond ``MAX_OPEN_SHARDS`` (each holds a file open)."""
        if self._pid != os.getpid():
            self._open, self._pid = OrderedDict(), os.getpid()  # a parent's: never used here
        while len(self._open) > MAX_OPEN_SHARDS:
            self._open.popitem(last=False)[1].close()

    def _shard(self, number: int) -> TokenShard:
        """Shard ``number``'s arrays, opened in this process on first use (a forked worker opens its own)."""
        if self._pid != os.getpid():
            self._open, self._pid = OrderedDict(), os.getpid()
        shard = self._open.get(number)
        if shard is not None:
            self._open.move_to_end(number)
        else:
            entry = self.manifest.shards[number]
            for f in entry.files:
                self.files.path(f.path)  # inside the output, of the recorded size (a URL's: downloaded, verified)
            try:
                shard = FORMATS[self.manifest.format].open_token_shard(self.root, entry.name)
            except Exception as e:  # noqa: BLE001 - numpy, h5py and lmdb each raise their own
                raise ManifestError(
                    f"{self.root}: shard {entry.name} cannot be read ({e}); run packer verify {self.root}"
                ) from None
            problem = shard.check(self.section, entry.samples, f"{self.root}/{entry.name}", values=False)
            if problem:
                raise ManifestError(f"{problem}; run packer verify {self.root}")
            self._open[number] = shard
        return shard

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_open"] = OrderedDict()  # memory maps are opened again by whoever unpickles
        return state

    def __repr__(self) -> str:
        s = self.section
        return (
            f"TokenBlocks({str(self.root)!r}: {len(self)} blocks of {s.block} ({s.packing}), {s.tokens:,} tokens "
            f"of {s.documents:,} documents, vocabulary {s.vocab_size})"
        )


class RingBlocks(NamedTuple):
    """What a DataLoader worker sends for a batch of blocks written into a ``SlotRing`` slot: the slot,
    the blocks in it, and the small parts by value."""

    slot: int
    n: int
    block: int
    cu_seqlens: np.ndarray
    max_seqlen: int
    as_dict: bool

    def hand_out(self, ring: SlotRing) -> Any:
        """In the loader: the batch over the slot, which is free again once no part of it is referred to."""
        inputs, labels, positions = ring.hand_out(self.slot, 3 * self.n, (1, self.block)).view(3, self.n, self.block)
        if not self.as_dict:
            return inputs, labels
        return _batch(inputs, labels, positions, self.cu_seqlens, self.max_seqlen)


def _batch(
    inputs: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor, cu_seqlens: np.ndarray, max_seqlen: int
) -> dict[str, Any]:
    return {
        "input_ids": inputs,
        "labels": labels,
        "position_ids": positions,
        "cu_seqlens": torch.from_numpy(cu_seqlens),
        "max_seqlen": max_seqlen,
    }


__all__ = ["TokenBlocks", "RingBlocks"]
