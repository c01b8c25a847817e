"""``TokenStream``: the blocks of a wds token output at a URL, streamed a tar shard at a time.

    ds = open_dataset("s3://bucket/tokens")      # a wds token output, no cache_dir: a TokenStream
    loader = make_loader(ds, batch_size=16)       # the same blocks as TokenBlocks gives, in a streamed order

A shard is read whole, front to back, when a block of it is first made into a batch
(``readers.remote.urls.iter_remote_tar``: its size and SHA-256 checked against the manifest before
a block of it is used), and let go once its last block is made; the blocks in between are
references. ``make_loader`` reads it as it reads tar outputs of samples
(``readers.loading.tar_batches.TarBatches``): each rank and DataLoader worker reads shards of its
own, in a new order each epoch, through a shuffle buffer of blocks; every rank gets the same number
of batches; a resumed loader draws the batches it handed out before without making them (nor
streaming their shards), and goes on with the next one. Without ``make_loader`` it yields the
blocks one at a time, in order, the shards shared out over the DataLoader's workers.

Random access (a sampler, a mixture) needs ``TokenBlocks``: ``open_dataset(url, cache_dir=...)``
downloads each shard once and reads it at random. (A ``TokenStream`` made directly with
``cache_dir=`` keeps checked copies of what it streams, for later passes.)
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional, Union

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from packer.spec.codecs import npy_view
from packer.spec.errors import ManifestError
from packer.spec.shard_names import TAR_SUFFIX, TAR_TOKEN_MEMBERS
from packer.spec.token_blocks import fill_blocks
from packer.spec.token_shards import TokenShard
from readers.datasets.output_files import OutputFiles
from readers.datasets.token_output import TokenOutput
from readers.loading.batch_buffers import SlotRing
from readers.loading.tar_batches import TarBatches, warn_few_shards
from readers.remote.urls import file_url, iter_remote_tar

MEMBERS = tuple(name.partition(".")[2] for name in TAR_TOKEN_MEMBERS)
"""The fields of a token tar's one sample, as a tar reader groups its members: ``blocks.npy``, ..."""


class TokenStream(TokenOutput, IterableDataset):
    """The blocks of the wds token output at the URL ``root``, streamed (see the module); the options
    are ``TokenBlocks``' (``verify`` changes nothing: every streamed shard is checked)."""

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
        self.root = str(root)
        self.files = OutputFiles.open(self.root)
        super().__init__(
            root, self.files.manifest, return_dict=return_dict, block_mask=block_mask, vocab_size=vocab_size, seed=seed
        )
        if self.manifest.format != "wds":
            raise ValueError(
                f"{root} is a {self.manifest.format} output: only tar shards (wds) stream; open it with "
                "readers.open_dataset(url, cache_dir=...), which reads its shards at random through a cache"
            )
        self.cache_dir = cache_dir
        self.batches: Optional[TarBatches] = None
        """The whole batches this reader makes (``batch_by``), or None: it yields blocks."""
        self._offsets = self.manifest.shard_offsets
        self._held: Optional[tuple[int, dict[int, list]]] = None  # see _holding

    def __len__(self) -> int:
        """Blocks in the output; with ``batch_by``, this rank's batches per epoch."""
        return self.batches.count(self._shard_blocks()) if self.batches is not None else self.manifest.samples

    def _shard_blocks(self) -> list[int]:
        return [s.samples for s in self.manifest.shards]

    def shard(self, number: int) -> TokenShard:
        """Shard ``number``'s arrays, streamed whole and checked (ManifestError naming it otherwise)."""
        entry = self.manifest.shards[number]
        name = entry.file(TAR_SUFFIX)
        url = file_url(self.root, name)
        samples = list(iter_remote_tar(self.root, next(f for f in entry.files if f.path == name), self.cache_dir))
        if len(samples) != 1 or sorted(set(samples[0]) - {"__key__"}) != sorted(MEMBERS):
            raise ManifestError(f"{url} is not a token shard (its members are not {', '.join(TAR_TOKEN_MEMBERS)})")
        try:
            blocks, documents, tokens = (npy_view(samples[0][member]) for member in MEMBERS)
        except ValueError as e:
            raise ManifestError(f"{url} holds a member that is not an array ({e})") from None
        shard = TokenShard(tokens, np.array(blocks), np.array(documents))
        problem = shard.check(self.section, entry.samples, url, values=False)
        if problem:
            raise ManifestError(f"{problem}; run packer verify {self.root}")
        return shard

    def blocks_of(self, number: int) -> Iterator[tuple[int, int]]:
        """``(shard, block)`` of each block of shard ``number`` in stored order: references, the shard
        is streamed when a block of it is first made into a batch (``make_batch``)."""
        held = self._holding()
        left = held.setdefault(number, [None, 0])
        left[1] += self.manifest.shards[number].samples
        for local in range(self.manifest.shards[number].samples):
            yield number, local

    def _holding(self) -> dict[int, list]:
        """This process's shards: ``[TokenShard or None (not streamed yet), blocks not yet made]`` by
        number; a shard goes once its last block is made (a fork, or a copy, holds its own)."""
        if self._held is None or self._held[0] != os.getpid():
            self._held = (os.getpid(), {})
        return self._held[1]

    def passed(self, items: list[tuple[int, int]]) -> None:
        """The blocks ``items`` were drawn and not made (a resumed loader's first batches): their shards
        need not be streamed for them."""
        self._release(items)

    def _release(self, items: list[tuple[int, int]]) -> None:
        held = self._holding()
        for number, _ in items:
            left = held[number]
            left[1] -= 1
            if left[1] <= 0:
                del held[number]

    def __iter__(self) -> Iterator[Any]:
        if self.batches is not None:
            yield from self.batches.iterate(
                self._shard_blocks(), self.seed, self.blocks_of, self.make_batch, self.passed
            )
            return
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for number in range(worker, len(self.manifest.shards), workers):
            for item in self.blocks_of(number):
                batch = self.make_batch([item])
                if not self.return_dict:
                    yield batch[0][0], batch[1][0]
                else:
                    yield {k: (v[0] if k not in ("cu_seqlens", "max_seqlen") else v) for k, v in batch.items()}

    def make_batch(self, items: list[tuple[int, int]], epoch: int = 0) -> Any:
        """The batch of the blocks ``items`` (each ``(shard, block)``), in that order (in a loader's
        worker, into a ring slot where one is free: ``TokenOutput.assemble``)."""
        groups: dict[int, tuple[list[int], list[int]]] = {}
        for row, (number, local) in enumerate(items):
            rows, blocks = groups.setdefault(number, ([], []))
            rows.append(row)
            blocks.append(local)
        held = self._holding()

        def fill(out: np.ndarray) -> list:
            runs: list[Any] = [None] * len(items)
            for number, (rows, blocks) in groups.items():
                entry = held.setdefault(number, [None, len(blocks)])
                if entry[0] is None:
                    entry[0] = self.shard(number)
                tokens, starts = entry[0].read(blocks)
                for row, found in zip(
                    rows, fill_blocks(out, rows, tokens, starts, self.section.block, self.section.pad_id)
                ):
                    runs[row] = found
            return runs

        batch = self.assemble(len(items), fill, shared=self.batches is not None)
        self._release(items)  # copied: a shard whose last block this was goes
        return batch

    def batch_by(self, batches: TarBatches, ring: Optional[SlotRing] = None) -> None:
        """Yield the whole batches ``batches`` plans instead of blocks, in ``ring``'s slots where given;
        ``len()`` is then this rank's batches per epoch. ``make_loader`` makes the plan and starts each
        pass."""
        self.batches, self._ring = batches, ring
        self._held = None  # a copy (make_loader's) holds shards of its own
        warn_few_shards(len(self.manifest.shards), batches.world, batches.workers)

    def __repr__(self) -> str:
        s = self.section
        return (
            f"TokenStream({self.root!r}: {self.manifest.samples} blocks of {s.block} ({s.packing}) in "
            f"{len(self.manifest.shards)} tar shards, {s.tokens:,} tokens of {s.documents:,} documents, "
            f"vocabulary {s.vocab_size})"
        )


__all__ = ["TokenStream"]
