"""Samples/s of a loader, measured for a bounded time after its warm-up."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional

import torch

from packer.spec.errors import ConfigError
from packer.spec.manifest import Manifest

_clock: Callable[[], float] = time.perf_counter
"""The clock ``time_loader`` times by; a module attribute so that a test can time a fake loader on a fake clock
instead of sleeping (wall-clock asserts flake on a loaded machine)."""


@dataclass(frozen=True)
class Rate:
    """What a timed run of a loader gave: ``samples`` in ``seconds`` after the warm-up, and the warm-up's
    own ``warmup_seconds`` (loader and worker start, first batches). ``warm`` is False when the time
    ran out during the warm-up: the figures then include it."""

    samples: int
    seconds: float
    warmup_seconds: float
    warm: bool = True

    @property
    def samples_per_s(self) -> float:
        """Samples per second (0.0 when nothing was timed)."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def time_loader(
    loader: Iterable, seconds: float, warmup_batches: int = 1, tick: Optional[Callable[[float], None]] = None
) -> Rate:
    """Iterate ``loader`` pass after pass (epochs) for about ``seconds`` wall-clock seconds in all.

    The first ``warmup_batches`` batches (worker start, first reads) are not timed; give one per
    worker. Stops at the first batch that arrives after the time is up, so a run overshoots by at
    most one batch. A batch is ``(images, labels, ...)``; its size is ``len(labels)``. ``tick`` is
    called with the seconds elapsed since its last call (for a progress bar).
    """
    start = last = _clock()
    deadline = start + seconds
    batches = samples = warm_samples = 0
    timed_from: Optional[float] = None
    done = False
    while not done:
        seen = 0
        for batch in loader:
            seen += 1
            now = _clock()
            if tick is not None:
                tick(now - last)
            last = now
            if timed_from is None:
                batches += 1
                warm_samples += batch_size_of(batch)
                if batches >= warmup_batches:
                    timed_from = now
            else:
                samples += batch_size_of(batch)
            batch = None
            if now >= deadline:
                done = True
                break
        if not seen:
            raise ValueError("the loader yielded no batch: is the dataset empty?")
    end = _clock()
    if timed_from is None or samples == 0:  # the time ran out during the warm-up
        return Rate(warm_samples + samples, end - start, end - start, warm=False)
    return Rate(samples, end - timed_from, timed_from - start)


def busy_note(cpus: int) -> Optional[str]:
    """A warning when other processes already keep at least half of ``cpus`` busy (1-minute load
    average), since measurements then vary from run to run; None on a quiet machine."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    if load < cpus / 2:
        return None
    return (
        f"the load average is {load:.1f} on {cpus} core(s) before starting: other processes compete for the "
        "CPUs, so figures may vary between runs"
    )


def check_images(manifest: Manifest, batch_size: int, where: object, text_ok: bool = False) -> None:
    """ConfigError unless the output at ``where`` holds images that batches of ``batch_size`` can
    stack: the advisor measures image loading, and images kept at their own sizes (--resize none)
    cannot be stacked. ``text_ok``: text-only outputs pass too (``make_loader`` pads their batches)."""
    image = manifest.fields.get("image")
    if image is None and text_ok and manifest.text_fields:
        return
    if image is None:
        raise ConfigError(
            f"{where} holds no images (text samples only): profile and bench measure the loading "
            "of images (packer tune measures text outputs too)"
        )
    if image.get("shape") is None and batch_size > 1:
        raise ConfigError(
            f"{where} keeps each image's own size (--resize none): batches of several images cannot "
            "be stacked; use a batch size of 1"
        )


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one torch intra-op thread, as DataLoader workers do.

    What is measured in this process (a loader with 0 workers, a collate) then costs what it costs
    in a worker: with several threads on a machine whose cores are busy, a stack of a batch was
    measured 50x slower, which would blame the collate for other processes' load.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def batch_size_of(batch) -> int:
    """Samples in one loader batch: ``(images, labels, ...)``, or a pad_collate dict (text outputs)."""
    return len(batch["labels"]) if isinstance(batch, dict) else len(batch[1])
