"""What every reader of a token output knows of it: its manifest's ``tokens`` section, checked against
what the training code expects, and the batches as training takes them.

``TokenBlocks`` (``readers.datasets.token_blocks``) reads blocks at random from local shards (or
shards downloaded into a cache); ``TokenStream`` (``readers.datasets.token_stream``) streams the tar
shards of a wds token output from a URL. Both are a ``TokenOutput``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np
import torch

from packer.spec.errors import ManifestError
from packer.spec.manifest import Manifest
from packer.spec.token_blocks import BlockBatch, TokenSection, batch_memory, finish_blocks, split_blocks
from readers.loading.batch_buffers import SlotRing

OPTIONS = ("return_dict", "block_mask", "vocab_size", "seed", "verify", "cache_dir")
"""What ``open_dataset`` passes on to a token output's reader."""


class TokenOutput:
    """The ``tokens`` section of the token output ``root`` whose manifest is ``manifest`` (see the
    module); ``vocab_size``: the vocabulary the training code expects (an output of another is
    refused: its ids would index another embedding)."""

    has_target = False  # what PackedLoader asks of every dataset it loads
    classes = None  # what a mixture's parts compare

    def __init__(
        self,
        root: Any,
        manifest: Manifest,
        *,
        return_dict: bool,
        block_mask: bool,
        vocab_size: Optional[int],
        seed: int,
    ) -> None:
        section = manifest.tokens
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
        self.manifest = manifest
        self.section: TokenSection = section
        self.return_dict, self.block_mask, self.seed = bool(return_dict), bool(block_mask), int(seed)
        self._ring: Optional[SlotRing] = None  # make_loader's reusable shared slots, in its workers

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
        s, blocks = self.section, self.manifest.samples
        return (blocks * (s.block + 1) - s.padding) / max(blocks, 1)

    @property
    def padding_share(self) -> float:
        """The share of block positions that hold no token (best-fit packing; the last block of concat)."""
        return self.section.padding_share(self.manifest.samples)

    def assemble(
        self, n: int, fill: Callable[[np.ndarray], list], shared: bool = True, sizes: Optional[Sequence[int]] = None
    ) -> Any:
        """A batch of ``n`` blocks that ``fill(out)`` writes into ``out`` (see ``batch_memory``),
        returning each row's runs: in a loader's worker into a ring slot when one is free
        (``shared``), then sent as a ``RingBlocks``; else as ``as_batch`` gives it. With ``sizes``,
        the ``n`` blocks are consecutive batches of those sizes (a loader's chunk, ``BatchChunks``),
        sent as one ``RingChunk`` (or a ``BatchChunk`` of them)."""
        block = self.section.block
        claimed = None
        if shared and self._ring is not None and not self.block_mask:
            claimed = self._ring.claim(3 * n, torch.int64, (1, block))
        out = batch_memory(n, block, claimed[1].numpy().reshape(3, n, block) if claimed is not None else None)
        blocks = finish_blocks(out, fill(out))
        if sizes is not None:
            parts = split_blocks(blocks, sizes)
            if claimed is None:
                return BatchChunk(self.as_batch(part) for part in parts)
            runs = tuple(p.cu_seqlens for p in parts)
            longest = tuple(p.max_seqlen for p in parts)
            return RingChunk(claimed[0], n, block, tuple(sizes), runs, longest, self.return_dict)
        if claimed is not None:
            return RingBlocks(claimed[0], n, block, blocks.cu_seqlens, blocks.max_seqlen, self.return_dict)
        return self.as_batch(blocks)

    def as_batch(self, blocks: BlockBatch) -> Any:
        """A ``BlockBatch`` as training takes it: the dict of tensors (see the readers' modules), or the
        ``(input_ids, labels)`` pair with ``return_dict=False``."""
        if not self.return_dict:
            return torch.from_numpy(blocks.input_ids), torch.from_numpy(blocks.labels)
        out = batch_dict(
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
        return batch_dict(inputs, labels, positions, self.cu_seqlens, self.max_seqlen)


class RingChunk(NamedTuple):
    """What a DataLoader worker sends for a chunk of consecutive batches of blocks (``BatchChunks``)
    written into one ``SlotRing`` slot: the slot, its blocks, each batch's size and small parts."""

    slot: int
    n: int
    block: int
    sizes: tuple[int, ...]
    cu_seqlens: tuple[np.ndarray, ...]
    max_seqlen: tuple[int, ...]
    as_dict: bool

    def hand_out(self, ring: SlotRing) -> list:
        """In the loader: the chunk's batches, views of the slot, which is free again once no part of
        any of them is referred to."""
        inputs, labels, positions = ring.hand_out(self.slot, 3 * self.n, (1, self.block)).view(3, self.n, self.block)
        batches, first = [], 0
        for size, runs, longest in zip(self.sizes, self.cu_seqlens, self.max_seqlen):
            last = first + size
            if self.as_dict:
                batches.append(batch_dict(inputs[first:last], labels[first:last], positions[first:last], runs, longest))
            else:
                batches.append((inputs[first:last], labels[first:last]))
            first = last
        return batches


class BatchChunk(list):
    """The batches of a chunk (``BatchChunks``) read where no ring slot was free: handed out in order."""


def batch_dict(
    inputs: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor, cu_seqlens: np.ndarray, max_seqlen: int
) -> dict[str, Any]:
    """The dict of a batch of blocks."""
    return {
        "input_ids": inputs,
        "labels": labels,
        "position_ids": positions,
        "cu_seqlens": torch.from_numpy(cu_seqlens),
        "max_seqlen": max_seqlen,
    }


__all__ = ["TokenOutput", "RingBlocks", "RingChunk", "BatchChunk", "batch_dict", "OPTIONS"]
