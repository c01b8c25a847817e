"""``packer tune``: find the DataLoader worker count and prefetch factor that read an output fastest
on this machine, by measuring instead of guessing.

Worker counts double (1, 2, 4, ...) until a doubling no longer gains a clear margin; the main
process alone (0 workers, the DataLoader default) is measured first as the baseline. Then a few
prefetch factors are tried at the chosen count. Where figures are within the margin, the cheaper
setting wins (fewer workers, smaller prefetch: less memory). What is measured is injectable
(``tune(measure, ...)``): ``LoaderMeasure`` is the real one.
"""

from __future__ import annotations

import gc
import os
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

from torch.utils.data import IterableDataset

from packer.advisor.memory import PeakMemory
from packer.advisor.timing import check_images, one_thread, time_loader
from packer.spec.errors import ConfigError
from packer.spec.registry import FORMATS
from readers.datasets.base import ReaderBase
from readers.loading.loader import make_loader

DEFAULT_MARGIN = 0.10
"""Smallest relative gain that counts as real: shared machines drift by several percent between runs."""

DEFAULT_PREFETCH = 2  # the DataLoader's and make_loader's default
PREFETCH_FACTORS = (1, 4)
"""Prefetch factors tried beside the default at the chosen worker count."""

MIN_TRIAL_SECONDS = 0.2
"""The least time a trial gets; when less is left, the search stops."""

_clock: Callable[[], float] = time.monotonic
"""The clock the time budget is kept by; a module attribute so that a test can run the search on a fake clock
instead of sleeping (wall-clock asserts flake on a loaded machine)."""


@dataclass(frozen=True)
class Trial:
    """One setting to measure: ``num_workers`` and ``prefetch_factor`` (None with 0 workers)."""

    num_workers: int
    prefetch_factor: Optional[int] = None

    def describe(self) -> str:
        """Short text such as ``2 workers, prefetch 4``."""
        if not self.num_workers:
            return "main process (0 workers)"
        return f"{self.num_workers} worker{'s' if self.num_workers > 1 else ''}, prefetch {self.prefetch_factor}"


@dataclass(frozen=True)
class Measurement:
    """What one trial gave: samples/s, the peak PSS of all processes in bytes, the timed samples and seconds."""

    samples_per_s: float
    peak_memory: int = 0
    samples: int = 0
    seconds: float = 0.0


Measure = Callable[[Trial, float], Measurement]
"""Measures one trial within about the given seconds."""


@dataclass
class TuneResult:
    """The trials in the order run, the recommended one, why the worker search stopped, seconds used."""

    trials: list[tuple[Trial, Measurement]]
    best: Trial
    stopped: str
    seconds: float

    def measured(self, trial: Trial) -> Measurement:
        """The measurement of ``trial`` (the last one, if it ran twice)."""
        return [m for t, m in self.trials if t == trial][-1]

    @property
    def baseline(self) -> Optional[Measurement]:
        """The main-process measurement (0 workers), if it ran."""
        found = [m for t, m in self.trials if t.num_workers == 0]
        return found[0] if found else None


def worker_counts(max_workers: int) -> list[int]:
    """0, then doubling from 1 up to ``max_workers``, which is included even when not a power of two."""
    counts, w = [0], 1
    while w < max_workers:
        counts.append(w)
        w *= 2
    if max_workers >= 1:
        counts.append(max_workers)
    return counts


def tune(
    measure: Measure,
    *,
    max_workers: int,
    seconds: float,
    margin: float = DEFAULT_MARGIN,
    prefetch_factors: tuple[int, ...] = PREFETCH_FACTORS,
    on_trial: Optional[Callable[[Trial, float], None]] = None,
) -> TuneResult:
    """Search worker counts by doubling, then prefetch factors, within ``seconds`` in all.

    Each trial gets an equal share of the time left among the trials still planned (at least
    MIN_TRIAL_SECONDS), so a search that stops early leaves more time to the rest; the most a trial
    ran over its share (a measure stopping its workers) is kept free, so the whole ends close to
    ``seconds``; when the time is up, the search stops where it is. Doubling stops when a count is not faster than
    the best so far by ``margin`` (0.10: 10%). ``on_trial(trial, seconds)`` is called before each.
    """
    start = _clock()
    deadline = start + seconds
    counts = worker_counts(max_workers)
    trials: list[tuple[Trial, Measurement]] = []
    overrun = 0.0  # the most a trial took beyond its share (stopping workers), kept free at the end

    def run(trial: Trial, planned_after: int) -> Optional[Measurement]:
        nonlocal overrun
        begin = _clock()
        remaining = deadline - begin - overrun
        if remaining < MIN_TRIAL_SECONDS:
            return None
        # A short budget measures the first trials for the minimum each rather than none at all.
        share = min(remaining, max(MIN_TRIAL_SECONDS, remaining / (1 + planned_after)))
        if on_trial is not None:
            on_trial(trial, share)
        m = measure(trial, share)
        overrun = max(overrun, _clock() - begin - share)
        trials.append((trial, m))
        return m

    stopped = f"tried up to {max_workers} worker(s), the most that can help here"
    best_rate = 0.0
    for i, w in enumerate(counts):
        m = run(Trial(w, DEFAULT_PREFETCH if w else None), len(counts) - i - 1 + len(prefetch_factors))
        if m is None:
            stopped = "the time (--seconds) ran out"
            break
        if w == 0:  # the baseline: no doubling is compared with it
            continue
        if best_rate and m.samples_per_s < best_rate * (1 + margin):
            stopped = (
                f"doubling to {w} workers changed samples/s by {m.samples_per_s / best_rate - 1:+.0%} "
                f"(less than +{margin:.0%})"
            )
            break
        best_rate = max(best_rate, m.samples_per_s)
    if not trials:
        raise ConfigError(f"{seconds:g} seconds leave no time to measure anything; give a few seconds per worker count")
    workers = _cheapest([(t.num_workers, m) for t, m in trials if t.num_workers], margin)
    base = [m for t, m in trials if t.num_workers == 0]
    if workers is None or (base and base[0].samples_per_s > _rate_of(trials, workers) * (1 + margin)):
        workers = 0
    if workers:
        for i, p in enumerate(prefetch_factors):
            if run(Trial(workers, p), len(prefetch_factors) - i - 1) is None:
                break
        prefetch = _cheapest([(t.prefetch_factor or 0, m) for t, m in trials if t.num_workers == workers], margin)
        best = Trial(workers, prefetch)
    else:
        best = Trial(0)
    return TuneResult(trials, best, stopped, _clock() - start)


def _cheapest(options: list[tuple[int, Measurement]], margin: float) -> Optional[int]:
    """The smallest setting whose samples/s is within ``margin`` of the fastest (fewer workers or a
    smaller prefetch: less memory for no clear loss), or None without options."""
    if not options:
        return None
    fastest = max(m.samples_per_s for _, m in options)
    return min(v for v, m in options if m.samples_per_s * (1 + margin) >= fastest)


def _rate_of(trials: list[tuple[Trial, Measurement]], workers: int) -> float:
    return max(m.samples_per_s for t, m in trials if t.num_workers == workers)


def most_useful_workers(dataset: ReaderBase, batch_size: int, cpus: int) -> int:
    """The most workers worth trying: twice the usable CPUs (beyond that they only compete), and no
    more than the batches of one epoch (tar shards: the shards), since each worker makes whole ones."""
    if isinstance(dataset, IterableDataset):
        units = len(dataset.manifest.shards)
    else:
        units = -(-len(dataset) // batch_size)
    return max(1, min(2 * cpus, units))


class LoaderMeasure:
    """The real measure: ``make_loader`` over ``dataset`` with the trial's settings, timed by
    ``time_loader`` (warm-up excluded; one torch thread here, as in the workers), with the peak PSS
    of this process and its workers sampled
    every ``memory_every`` seconds. ``tick`` gets elapsed seconds as batches arrive (progress bar).
    ConfigError when the output's images cannot be batched at ``batch_size`` (--resize none).
    """

    def __init__(
        self,
        dataset: ReaderBase,
        batch_size: int,
        *,
        device: Optional[str] = None,
        tick: Optional[Callable[[float], None]] = None,
        memory_every: float = 0.2,
    ) -> None:
        check_images(dataset.manifest, batch_size, dataset.root, text_ok=True)
        self.dataset, self.batch_size, self.device = dataset, batch_size, device
        self.tick, self.memory_every = tick, memory_every

    def __call__(self, trial: Trial, seconds: float) -> Measurement:
        options: dict = {"num_workers": trial.num_workers}
        if trial.num_workers:
            options["prefetch_factor"] = trial.prefetch_factor or DEFAULT_PREFETCH
        with PeakMemory(every=self.memory_every) as memory, warnings.catch_warnings(), one_thread():
            # Trying more workers than cores is the point of a trial: PyTorch's warning about it is noise here.
            warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
            loader = make_loader(self.dataset, self.batch_size, device=self.device, **options)
            warmup = min(max(1, trial.num_workers), len(loader))  # a worker's first batch includes its start
            rate = time_loader(loader, seconds, warmup, tick=self.tick)
            del loader  # stops the (persistent) workers
            gc.collect()
        return Measurement(rate.samples_per_s, memory.peak, rate.samples, rate.seconds)


def recommended_code(
    root: str | os.PathLike,
    fmt: str,
    batch_size: int,
    trial: Trial,
    cuda: bool = False,
    text: bool = False,
    detection: bool = False,
) -> dict[str, str]:
    """Python to paste for ``trial``: ``{"make_loader": ..., "DataLoader": ...}``, each complete (imports
    included) and defining ``loader``; ``text`` for outputs with text fields (padded batches),
    ``detection`` for outputs of ``(image, target)`` samples (``detection_collate``)."""
    path = repr(str(root))
    args = [f"open_dataset({path})", f"batch_size={batch_size}", f"num_workers={trial.num_workers}"]
    if trial.num_workers:
        args.append(f"prefetch_factor={trial.prefetch_factor or DEFAULT_PREFETCH}")
    if cuda:
        args.append('device="cuda"')
    packed = f"from readers import make_loader, open_dataset\n\n{_call('loader = make_loader', args)}"
    streamed = not FORMATS[fmt].random_access
    dl = [f"open_dataset({path}{', shuffle=1000' if streamed else ''})", f"batch_size={batch_size}"]
    if not streamed:  # an iterable dataset shuffles itself (its buffer above); DataLoader refuses shuffle=True
        dl.append("shuffle=True")
    dl.append(f"num_workers={trial.num_workers}")
    if trial.num_workers:
        dl += [f"prefetch_factor={trial.prefetch_factor or DEFAULT_PREFETCH}", "persistent_workers=True"]
    if cuda:
        dl.append("pin_memory=True")
    if detection:
        dl.append("collate_fn=detection_collate")
        plain = (
            "from torch.utils.data import DataLoader\n\nfrom readers import detection_collate, open_dataset\n\n"
            + _call("loader = DataLoader", dl)
        )
    elif text:
        opened, dl[0] = dl[0], "dataset"
        dl.append("collate_fn=partial(pad_collate, pad_id=dataset.pad_id, fields=dataset.manifest.sample_fields)")
        plain = (
            "from functools import partial\n\nfrom torch.utils.data import DataLoader\n\n"
            f"from readers import open_dataset, pad_collate\n\ndataset = {opened}\n" + _call("loader = DataLoader", dl)
        )
    else:
        dl.append("collate_fn=packed_collate")
        plain = (
            "from torch.utils.data import DataLoader\n\nfrom readers import open_dataset, packed_collate\n\n"
            + _call("loader = DataLoader", dl)
        )
    if cuda:
        plain += '# in the loop: images = images.to("cuda", non_blocking=True)\n'
    return {"make_loader": packed, "DataLoader": plain}


def _call(head: str, args: list[str], width: int = 100) -> str:
    """``head(args)`` on one line, or one argument per line when that is longer than ``width``."""
    line = f"{head}({', '.join(args)})\n"
    if len(line) <= width:
        return line
    return f"{head}(\n" + "".join(f"    {a},\n" for a in args) + ")\n"
