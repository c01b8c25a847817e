"""The DataLoader options ``make_loader`` picks for a dataset on this machine: workers from the
physical cores (and the batches or shards there are), prefetch and reusable batch buffers within a
share of the available memory, pinned memory for CUDA."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import IterableDataset

from packer.system import usable_cpus
from readers.datasets.base import ReaderBase

MEMORY_SHARE = 0.25
"""Most of the available memory that batches in flight (worker queues and the ring of reusable batch
buffers) may take."""


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
            cores.add(
                (topo.joinpath("physical_package_id").read_text().strip(), topo.joinpath("core_id").read_text().strip())
            )
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
    """Bytes of one batch as it crosses the worker pipes (an estimate for variable sizes and text)."""
    m = dataset.manifest
    if not dataset.fixed_images:  # about what is stored per sample, at least what a 224 x 224 image would be
        stored = sum(f.bytes for s in m.shards for f in s.files) / max(1, m.samples)
        return int(batch_size * max(stored, 4096 if not m.has_image else 224 * 224 * m.fields["image"]["channels"]))
    itemsize = torch.empty(0, dtype=transport_dtype).element_size()
    return batch_size * itemsize * int(np.prod(dataset.image_shape))


def default_options(
    dataset: ReaderBase,
    batch_size: int,
    transport_dtype: torch.dtype,
    *,
    cores: Optional[int] = None,
    memory: Optional[int] = None,
    cuda: bool = False,
    world_size: int = 1,
    samples: Optional[int] = None,
) -> dict[str, Any]:
    """The DataLoader options ``make_loader`` picks for this dataset on this machine.

    ``cores`` and ``memory`` default to ``physical_cores()`` and ``available_memory()``, shared
    between the processes of a distributed job on this machine (``LOCAL_WORLD_SIZE``, set by
    torchrun). Workers are capped by this rank's batches (tar shards: its shards) of ``samples``
    (default: the dataset's; a mixture's epoch for one of its parts).
    """
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    cores = max(1, (physical_cores() if cores is None else cores) // local)
    memory = available_memory() if memory is None else memory
    memory = None if memory is None else memory // local
    per_batch = batch_bytes(dataset, batch_size, transport_dtype)
    if isinstance(dataset, IterableDataset):
        # The smallest rank's shards: every rank runs as many workers, and one without a shard is idle
        units = max(1, len(dataset.manifest.shards) // world_size)
    else:
        units = -(-(len(dataset) if samples is None else samples) // world_size // batch_size)
    workers = max(0, min(cores, units))
    prefetch = 2
    if memory is not None and workers:
        budget = int(memory * MEMORY_SHARE)
        # Per worker: its queued batches and the reusable ring slots (queued + 2 the caller holds).
        while workers and workers * (2 * prefetch + 2) * per_batch > budget:
            if prefetch > 1:
                prefetch -= 1
            else:
                workers -= 1
    options: dict[str, Any] = {"num_workers": workers, "pin_memory": cuda}
    if workers:
        options.update(persistent_workers=True, prefetch_factor=prefetch)
    return options


__all__ = ["default_options", "physical_cores", "available_memory", "batch_bytes", "MEMORY_SHARE"]
