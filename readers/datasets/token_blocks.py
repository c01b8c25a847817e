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
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
from torch.utils.data import Dataset

from packer.spec.errors import ManifestError
from packer.spec.manifest import ShardEntry
from packer.spec.registry import FORMATS
from packer.spec.token_blocks import fill_blocks
from packer.spec.token_shards import TokenShard
from readers.datasets.output_files import OutputFiles
from readers.datasets.shard_handles import ShardHandles
from readers.datasets.token_output import OPTIONS, BatchChunk, RingBlocks, RingChunk, TokenOutput
from readers.loading.batch_buffers import SlotRing
from readers.remote.urls import is_url

MAX_OPEN_SHARDS = 64
"""Shards a reader keeps open in one process (each holds a file descriptor), least recently used
closed first: a shuffled read of a large output would otherwise run out of descriptors."""


class TokenBlocks(TokenOutput, Dataset):
    """The blocks of a token output at ``root`` (see the module).

    ``vocab_size``: the vocabulary the training code expects; an output of another is refused (its
    ids would index another embedding). ``seed``: the default seed of ``make_loader``'s shuffle.
    ``verify=True`` checks each shard file's SHA-256 before its first read. ``root`` may be a URL
    (``s3://bucket/tokens``, ``https://``): each shard is then downloaded once into ``cache_dir``,
    checked against the manifest's size and SHA-256 as it streams, and read from there.
    """

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
        super().__init__(
            root, self.files.manifest, return_dict=return_dict, block_mask=block_mask, vocab_size=vocab_size, seed=seed
        )
        self._starts = self.manifest.shard_offsets
        self.handles = ShardHandles(MAX_OPEN_SHARDS)
        """The shards open in this process (least recently used closed first; a fork opens its own)."""

    # what the output holds -------------------------------------------------------------------
    def __len__(self) -> int:
        return self.manifest.samples

    # reading ---------------------------------------------------------------------------------
    def __getitem__(self, index: int) -> Any:
        index = int(index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"block {index} of {len(self)}")
        batch = self.batch_from([(self, [0], [index % len(self)])], 1, shared=False)
        if not self.return_dict:
            return batch[0][0], batch[1][0]
        return {k: (v[0] if k not in ("cu_seqlens", "max_seqlen") else v) for k, v in batch.items()}

    def __getitems__(self, indices: Sequence[int]) -> Any:
        """A whole batch of blocks, stacked (what ``make_loader``'s workers read); a chunk of batches
        (``indices`` with ``sizes``: ``BatchChunks``) as one ``RingChunk`` or ``BatchChunk``."""
        sizes = getattr(indices, "sizes", None)
        indices = [int(i) for i in indices]
        return self.batch_from([(self, range(len(indices)), indices)], len(indices), sizes=sizes)

    def with_ring(self, ring: Optional[SlotRing]) -> "TokenBlocks":
        """A copy whose batches read in a DataLoader worker are written into ``ring``'s shared slots
        (``make_loader``'s, made once: fresh shared memory for every batch costs the loader more
        than reading the batch)."""
        clone = object.__new__(TokenBlocks)
        clone.__dict__.update(self.__dict__)
        clone.handles, clone._ring = ShardHandles(MAX_OPEN_SHARDS), ring  # shards of its own
        return clone

    def batch_from(
        self,
        parts: Sequence[tuple["TokenBlocks", Sequence[int], Sequence[int]]],
        n: int,
        shared: bool = True,
        sizes: Optional[Sequence[int]] = None,
    ) -> Any:
        """A batch of ``n`` blocks: each part ``(reader, rows, indices)`` (this output, or a mixture's
        outputs like it) writes its blocks ``indices`` into rows ``rows``; in a loader's worker into a
        ring slot when one is free (``shared``). ``sizes``: the batches of a chunk (``assemble``)."""

        def fill(out: np.ndarray) -> list:
            runs: list[Any] = [None] * n
            for reader, rows, indices in parts:
                for row, starts in zip(rows, reader.fill(out, rows, indices)):
                    runs[row] = starts
            return runs

        return self.assemble(n, fill, shared, sizes)

    def fill(self, out: np.ndarray, rows: Sequence[int], indices: Sequence[int]) -> list[list[int]]:
        """Write blocks ``indices`` into rows ``rows`` of ``out`` shard by shard (``fill_blocks``: each
        shard's blocks are copied before the next shard is opened, which may close it); the runs of
        each row, in the order given."""
        by_shard: dict[int, list[int]] = {}
        for k, index in enumerate(indices):
            by_shard.setdefault(bisect.bisect_right(self._starts, index) - 1, []).append(k)
        runs: list[Any] = [None] * len(indices)
        for number, ks in by_shard.items():
            first = self._starts[number]
            tokens, documents = self.handles.get(number, self).read([indices[k] - first for k in ks])
            found = fill_blocks(out, [rows[k] for k in ks], tokens, documents, self.section.block, self.section.pad_id)
            for k, starts in zip(ks, found):
                runs[k] = starts
        return runs

    def open_shard(self, entry: ShardEntry) -> TokenShard:
        """A shard's arrays, checked (what ``ShardHandles`` opens in each process on first use)."""
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
            shard.close()
            raise ManifestError(f"{problem}; run packer verify {self.root}")
        return shard

    def close_shard(self, shard: TokenShard) -> None:
        """Let go of a shard ``ShardHandles`` closes (its file, its LMDB transaction)."""
        shard.close()

    def read_labels(self, shard: TokenShard) -> np.ndarray:
        """Blocks have no labels of their own (``ShardOpener``): their targets are their next ids."""
        raise TypeError("token blocks have no labels of their own")

    def __repr__(self) -> str:
        s = self.section
        return (
            f"TokenBlocks({str(self.root)!r}: {len(self)} blocks of {s.block} ({s.packing}), {s.tokens:,} tokens "
            f"of {s.documents:,} documents, vocabulary {s.vocab_size})"
        )


__all__ = ["TokenBlocks", "RingBlocks", "RingChunk", "BatchChunk", "OPTIONS"]
