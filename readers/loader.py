"""``make_loader``: the one call training code needs to turn a packer reader into batches.

    from readers import open_dataset, make_loader
    loader = make_loader(open_dataset("packed/npy"), batch_size=64, device="cuda")
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:
            ...

Defaults, each overridable by keyword (anything else goes to ``torch.utils.data.DataLoader``):

- ``num_workers``: the physical cores this process may use (not hyper-threads), capped by the
  number of batches (or shards, for tar shards) and by available memory;
- uint8 crosses the worker pipes and each batch is normalized once, after the copy to ``device``
  (on the GPU there), as the output's manifest says: 4x fewer bytes than float32 through shared
  memory. The batches are what the reader with ``normalize=True`` would give;
- ``pin_memory`` and ``non_blocking`` copies when ``device`` is a CUDA device;
- ``persistent_workers=True`` (with workers), ``prefetch_factor`` 2, lowered when batches are large
  against available memory;
- the batch sampler of ``readers.sampler``: a seeded shuffle per epoch, split over ranks when
  ``torch.distributed`` is initialised, equal batch counts on every rank, resumable mid-epoch with
  ``state_dict()`` / ``load_state_dict()``.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from packer.system import usable_cpus
from readers.base import BatchNormalize, ImageConverter, PackedDataset, ReaderBase
from readers.collate import Numbered, RingBatch, SlotRing, packed_collate
from readers.sampler import EpochBatchSampler, distributed_rank

log = logging.getLogger(__name__)

WDS_SHUFFLE_BUFFER = 1000
"""Shuffle buffer (samples per worker) that make_loader gives a tar-shard reader opened without one."""

MEMORY_SHARE = 0.25
"""Most of the available memory that batches waiting in worker queues may take."""


def physical_cores() -> int:
    """Physical cores among the CPUs this process may use (hyper-thread siblings count once).

    Capped by the cgroup CPU quota and the CPU affinity (``packer.system.usable_cpus``). Falls back
    to the usable CPU count where the topology cannot be read.
    """
    usable = usable_cpus()
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return usable
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topo.joinpath("physical_package_id").read_text().strip(),
                       topo.joinpath("core_id").read_text().strip()))
        except OSError:
            return usable
    return max(1, min(usable, len(cores)))


def available_memory() -> Optional[int]:
    """Bytes of memory available to new allocations (``MemAvailable``, capped by a cgroup limit), or None."""
    found: Optional[int] = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            room = int(limit) - used
            found = room if found is None else min(found, room)
    except (OSError, ValueError):
        pass
    return found


def batch_bytes(dataset: ReaderBase, batch_size: int, transport_dtype: torch.dtype) -> int:
    """Bytes of one batch of images as it crosses the worker pipes (an estimate for variable sizes)."""
    shape = dataset.manifest.fields["image"].get("shape") or [224, 224, dataset.manifest.fields["image"]["channels"]]
    itemsize = torch.empty(0, dtype=transport_dtype).element_size()
    return batch_size * itemsize * int(torch.tensor(shape).prod())


def default_options(dataset: ReaderBase, batch_size: int, transport_dtype: torch.dtype, *, cores: Optional[int] = None,
                    memory: Optional[int] = None, cuda: bool = False) -> dict[str, Any]:
    """The DataLoader options ``make_loader`` picks for this dataset on this machine.

    ``cores`` and ``memory`` default to ``physical_cores()`` and ``available_memory()``.
    """
    cores = physical_cores() if cores is None else cores
    memory = available_memory() if memory is None else memory
    per_batch = batch_bytes(dataset, batch_size, transport_dtype)
    units = len(dataset.manifest.shards) if isinstance(dataset, IterableDataset) else -(-len(dataset) // batch_size)
    workers = max(0, min(cores, units))
    prefetch = 2
    if memory is not None and workers:
        budget = int(memory * MEMORY_SHARE)
        while workers and workers * prefetch * per_batch > budget:
            if prefetch > 1:
                prefetch -= 1
            else:
                workers -= 1
    options: dict[str, Any] = {"num_workers": workers, "pin_memory": cuda}
    if workers:
        options.update(persistent_workers=True, prefetch_factor=prefetch)
    return options


class PackedLoader:
    """Iterates like a DataLoader over ``(images, labels)`` batches; see ``make_loader``.

    ``loader`` is the underlying DataLoader, ``sampler`` the batch sampler (map-style readers).
    """

    def __init__(self, dataset: ReaderBase, loader: DataLoader, sampler: Optional[EpochBatchSampler],
                 normalize: Optional[BatchNormalize], device: Optional[torch.device],
                 ring: Optional[SlotRing] = None) -> None:
        self.dataset, self.loader, self.sampler = dataset, loader, sampler
        self.normalize, self.device, self.ring = normalize, device, ring
        self._held: list[list] = []  # [slot, batch tensor handed out, its reference counts then]
        self.epoch = 0
        self._consumed = 0  # batches handed out in the current epoch
        self._resume_at = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the shuffle of epoch ``epoch`` (without calls, each full pass moves to the next epoch)."""
        if int(epoch) != self.epoch:
            self._resume_at = 0
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        if self.sampler is not None:
            self.sampler.set_epoch(self.epoch)
            self.sampler.start = self._resume_at
        else:  # seen by the workers, persistent ones too, when this pass starts
            self.dataset._batching["control"].copy_(torch.tensor([self.epoch, self._resume_at]))  # type: ignore
        self._consumed, self._resume_at = self._resume_at, 0
        self._release_ring_slots()  # before the workers start filling again
        for batch in _in_order(self.loader, self._consumed):
            self._release_ring_slots()
            if isinstance(batch, RingBatch):
                slot, n, labels = batch
                images, rest = self._hand_out(slot, n), []
            else:
                images, labels, *rest = batch
            batch = None
            if self.device is not None:
                images = images.to(self.device, non_blocking=True)
                labels = labels.to(self.device, non_blocking=True)
            if self.normalize is not None:
                images = self.normalize(images)
            self._consumed += 1
            out = (images, labels, *rest)
            images = labels = rest = None  # so that only the caller holds the batch now
            yield out
            out = None
        self.epoch += 1
        self._consumed = 0

    @staticmethod
    def _counts(t: torch.Tensor) -> tuple[int, int]:
        return sys.getrefcount(t), torch._C._storage_Use_Count(t.untyped_storage()._cdata)

    def _hand_out(self, slot: int, n: int) -> torch.Tensor:
        self._held.append([slot, self.ring.view(slot, n), None])  # type: ignore[union-attr]
        entry = self._held[-1]
        entry[2] = self._counts(entry[1])  # the counts of "only this loader holds it" (no local name for it)
        return entry[1]

    def _release_ring_slots(self) -> None:
        """Give back to the workers the ring slots of batches that nobody refers to any more."""
        still = []
        for entry in self._held:
            if self._counts(entry[1]) == entry[2]:
                self.ring.release(entry[0])  # type: ignore[union-attr]
            else:
                still.append(entry)
        self._held = still

    def state_dict(self) -> dict:
        """Where this loader stands: the epoch and the batches already handed out in it (plus what
        the batch order depends on, checked when loading)."""
        state = {"epoch": self.epoch, "batches": self._consumed}
        if self.sampler is not None:
            s = self.sampler
            state.update(seed=s.seed, size=s.size, world_size=s.world_size, batch_size=s.batch_size)
        return state

    def load_state_dict(self, state: dict) -> None:
        """Make the next iteration continue after the batches ``state`` says were handed out."""
        if self.sampler is not None:
            self.sampler.load_state_dict(state)
        self.epoch = int(state["epoch"])
        self._resume_at = int(state["batches"])


def _in_order(batches: Iterable, first: int) -> Iterator:
    """``batches`` with ``Numbered`` ones put back in number order from ``first`` (the DataLoader takes
    one batch from each worker in turn, which after a resume need not be the epoch's planned order)."""
    waiting: dict[int, Any] = {}
    expected = first
    for batch in batches:
        if not isinstance(batch, Numbered):
            yield batch
            continue
        waiting[batch[0]] = batch[1]
        while expected in waiting:
            yield waiting.pop(expected)
            expected += 1
    if waiting:
        raise RuntimeError(f"batches {sorted(waiting)} arrived but batch {expected} never did")


def make_loader(
    dataset: ReaderBase,
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    device: Union[str, torch.device, None] = None,
    **overrides: Any,
) -> PackedLoader:
    """A loader of ``(images, labels)`` batches over a packer reader, with the defaults above.

    ``device``: where batches go (``"cuda"``: pinned memory, ``non_blocking`` copies, normalized
    on the GPU). ``overrides`` replace any default or add any DataLoader option
    (``multiprocessing_context="spawn"``, ``num_workers=0``, ...). ``shuffle``, ``seed`` and
    ``drop_last`` go to the batch sampler; the rank split follows ``torch.distributed`` when it is
    initialised.
    """
    if not isinstance(dataset, ReaderBase):
        raise TypeError(f"make_loader takes a packer reader (readers.open_dataset), not {type(dataset).__name__}")
    device = torch.device(device) if device is not None else None
    cuda = device is not None and device.type == "cuda"
    normalize = None
    reader = copy.copy(dataset)  # the loader's own view: settings below never leak into the caller's dataset
    stored_uint8 = dataset.manifest.fields["image"]["dtype"] == "uint8"
    if cuda and dataset.convert.normalize is not None and stored_uint8 and dataset.transform is None:
        # Same batches as the reader would give, but uint8 through the pipes and the PCIe bus,
        # normalized once on the GPU.
        normalize = dataset.convert.normalize
        reader.convert = ImageConverter(dataset.manifest, normalize=False)
    transport = reader.convert.batch_dtype(np.dtype(dataset.manifest.fields["image"]["dtype"]))
    options = default_options(dataset, batch_size, transport, cuda=cuda)
    options.update(overrides)
    workers = int(options.get("num_workers") or 0)
    if not workers:
        options.pop("persistent_workers", None)
        options.pop("prefetch_factor", None)
    shape = dataset.manifest.fields["image"].get("shape")
    ring = None
    if workers and not cuda and shape and reader.transform is None and not reader.return_meta \
            and getattr(torch._C, "_storage_Use_Count", None) is not None:
        h, w, c = shape
        per_worker = int(options.get("prefetch_factor") or 2) + 2  # queued + the caller's current and previous
        ring = SlotRing(workers, per_worker, (batch_size, c, h, w), transport, reader.convert.normalize is None)
        reader.ring = ring
    rank, world = distributed_rank()
    options.setdefault("collate_fn", packed_collate)
    if isinstance(dataset, PackedDataset):
        sampler: Optional[EpochBatchSampler] = EpochBatchSampler(
            len(dataset), batch_size, shuffle=shuffle, seed=seed, rank=rank, world_size=world, drop_last=drop_last)
        loader = DataLoader(reader, batch_sampler=sampler, **options)
    else:  # tar shards: the reader makes the batches itself, an equal number per rank (see configure_batches)
        sampler = None
        reader.seed = seed
        reader.shuffle = (reader.shuffle or WDS_SHUFFLE_BUFFER) if shuffle else 0
        reader.configure_batches(batch_size, drop_last=drop_last, rank=rank, world_size=world, workers=workers,
                                 control=torch.zeros(2, dtype=torch.int64).share_memory_())
        loader = DataLoader(reader, batch_size=None, **options)
    log.debug("make_loader: %s", {k: v for k, v in options.items() if k != "collate_fn"})
    return PackedLoader(reader, loader, sampler, normalize, device, ring)


__all__ = ["make_loader", "PackedLoader", "default_options", "physical_cores", "available_memory"]
