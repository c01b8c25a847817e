"""``make_loader`` of token blocks (``readers.datasets.token_blocks``) and of mixtures of them."""

from __future__ import annotations

import copy
from typing import Any, Optional, Union

import torch
from torch.utils.data import DataLoader

from readers.compose.mixture import Mixture
from readers.datasets.token_blocks import TokenBlocks
from readers.datasets.token_stream import TokenStream
from readers.loading.batch_buffers import SlotRing, shared_memory_free
from readers.loading.packed_loader import PackedLoader
from readers.loading.sampler import BatchChunks, distributed_rank, epoch_order
from readers.loading.tar_batches import TarBatches

STREAM_SHUFFLE_BUFFER = 4096
"""Blocks in the shuffle buffer of a streamed token output (``TokenStream``): references, whose
shards a worker holds whole until their last block is made (docs/TOKENS.md gives how many)."""


STREAM_ORDER = "token-stream-1"
"""The batch order of a streamed token output, as a loader's state records it."""


def token_loader(
    dataset: Union[TokenBlocks, TokenStream, Mixture],
    batch_size: int,
    shuffle: bool,
    seed: Optional[int],
    drop_last: bool,
    device: Union[str, torch.device, None],
    overrides: dict,
) -> PackedLoader:
    """``make_loader`` of token blocks: make_loader's sampler (a seeded shuffle of blocks per epoch,
    equal batches per rank, exact resume, on another rank count too) over whole batches read by
    ``TokenBlocks.__getitems__``. No worker by default: a batch is a few memory-mapped copies, which
    one process makes faster than it could hand them over from workers (``--workers`` in
    ``scripts/bench_tokens.py`` measures it); ``num_workers=`` overrides."""
    if overrides.get("sampler") is not None or overrides.get("batch_sampler") is not None:
        raise ValueError("token blocks are read in make_loader's own order: pass no sampler or batch_sampler")
    device = torch.device(device) if device is not None else None
    if isinstance(dataset, TokenStream):
        return _stream_loader(dataset, batch_size, shuffle, seed, drop_last, device, overrides)
    if isinstance(dataset, Mixture) and seed is not None and int(seed) != dataset.seed:
        dataset = dataset.with_seed(int(seed))  # the mixture's seed draws its parts' streams
    seed = dataset.seed if seed is None else int(seed)
    first = dataset.datasets[0] if isinstance(dataset, Mixture) else dataset
    rank, world = distributed_rank()
    options, workers = _options({"num_workers": 0, "collate_fn": _whole_batch}, device, overrides)
    per_chunk = chunk_batches(first, batch_size) if workers and isinstance(dataset, TokenBlocks) else 1
    ring = _ring(first, batch_size * per_chunk, workers, options) if isinstance(dataset, TokenBlocks) else None
    while ring is None and per_chunk > 1 and _ring(first, batch_size, workers, options) is not None:
        per_chunk //= 2  # a small /dev/shm (a container's 64 MiB): smaller chunks, down to a batch's ring
        ring = _ring(first, batch_size * per_chunk, workers, options)
    if ring is None:
        per_chunk = 1  # a chunk in fresh shared memory would cost more than it saves
    sampler, order = epoch_order(len(dataset), batch_size, shuffle, seed, drop_last, rank, world)
    if isinstance(dataset, Mixture):
        order["mixture"] = dataset.order_record()
        read: Any = dataset
    else:
        read = dataset.with_ring(ring)
    batches: Any = BatchChunks(sampler, per_chunk) if per_chunk > 1 else sampler
    loader = DataLoader(read, batch_sampler=batches, **options)
    return PackedLoader(dataset, loader, sampler, None, device, ring, order)  # type: ignore[arg-type]


def _stream_loader(
    dataset: TokenStream,
    batch_size: int,
    shuffle: bool,
    seed: Optional[int],
    drop_last: bool,
    device: Optional[torch.device],
    overrides: dict,
) -> PackedLoader:
    """``make_loader`` of a streamed token output: its tar shards shared out over ranks and workers
    as tar outputs of samples are (``TarBatches``), through a shuffle buffer of blocks, by a copy of
    ``dataset`` (the caller's stays as it was). One worker by default: batches are made, and shards
    streamed, in another process than the training loop's."""
    dataset = copy.copy(dataset)  # the caller's reader (and another loader's) keeps its own plan
    if seed is not None:
        dataset.seed = int(seed)
    rank, world = distributed_rank()
    options, workers = _options({"num_workers": 1, "collate_fn": _whole_batch}, device, overrides)
    control = torch.zeros(2, dtype=torch.int64).share_memory_()
    buffer = STREAM_SHUFFLE_BUFFER if shuffle else 0
    batches = TarBatches(batch_size, drop_last, rank, world, workers, buffer, control)
    ring = _ring(dataset, batch_size, workers, options)
    dataset.batch_by(batches, ring)
    loader = DataLoader(dataset, batch_size=None, **options)
    order = {
        "order": STREAM_ORDER,  # not TokenBlocks' (the same output read at random): their states don't mix
        "batch_size": batch_size,
        "world_size": world,
        "seed": dataset.seed,
        "workers": workers,  # the shards each worker reads
        "shuffle_buffer": buffer,
        "sampler": None,
    }
    return PackedLoader(dataset, loader, None, None, device, ring, order, None, batches)  # type: ignore[arg-type]


CHUNK_BYTES = 6 << 20
"""Bytes of blocks (inputs, labels and position ids) a DataLoader worker reads and sends at once: as
many whole batches as fill it (``chunk_batches``). Each item a worker hands over costs the two
processes a fixed time, paid once a chunk (docs/BENCHMARKS.md, the token reads, has the figures)."""

MAX_CHUNK = 16
"""Batches in a chunk at most: a pass left early drops the rest of its chunk, which was read for nothing."""


def chunk_batches(reader: Any, batch_size: int) -> int:
    """Batches of ``batch_size`` blocks of ``reader`` a worker reads as one item (``CHUNK_BYTES``)."""
    batch_bytes = 3 * 8 * batch_size * reader.block_size
    return max(1, min(MAX_CHUNK, CHUNK_BYTES // batch_bytes))


def _ring(reader: Any, batch_size: int, workers: int, options: dict) -> Optional[SlotRing]:
    """The reusable shared slots ``reader``'s batches are written into by the DataLoader's workers
    (fresh shared memory for every batch costs the loader more than reading it), where they help
    and the shared memory holds them; else None."""
    if not workers or options.get("pin_memory") or reader.block_mask:
        return None
    per_worker = int(options.get("prefetch_factor") or 2) + 2  # queued + the caller's current and previous
    shape = (3 * batch_size, 1, 1, reader.block_size)  # inputs, labels, position ids
    if SlotRing.bytes_needed(workers, per_worker, shape, torch.int64) > (shared_memory_free() or 0) // 2:
        return None
    return SlotRing(workers, per_worker, shape, torch.int64, False)


def _options(defaults: dict, device: Optional[torch.device], overrides: dict) -> tuple[dict[str, Any], int]:
    """The DataLoader's options (``defaults``, memory pinned for a CUDA device, the caller's
    ``overrides`` last, workers kept between epochs) and its worker count."""
    options: dict[str, Any] = dict(defaults)
    if device is not None and device.type == "cuda":
        options["pin_memory"] = True
    options.update(overrides)
    workers = int(options.get("num_workers") or 0)
    if workers:
        options.setdefault("persistent_workers", True)
    return options, workers


def _whole_batch(batch: Any) -> Any:
    """The collate of a dataset whose ``__getitems__`` gives whole batches: the batch as it is."""
    return batch


__all__ = ["token_loader", "chunk_batches", "CHUNK_BYTES"]
