"""``packer bench``: a DataLoader over a packer output against one over the raw folder it came from.

Both sides get the same preprocessing (the output's manifest), the same batch size and worker
count, and give the same batches: normalized float32 images and int labels. The packed side is
what packer users write, ``make_loader``; the folder side is the usual plain ``DataLoader`` over a
``Dataset`` that decodes each file per sample (``FolderDataset``). Each is timed for a bounded
time after its warm-up (worker start, first batch of each worker), with one torch thread in this
process, as in the workers.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch.utils.data import DataLoader

from packer.advisor.folder import FolderDataset, folder_items
from packer.advisor.host import describe_host
from packer.advisor.timing import Rate, check_images, one_thread, time_loader
from packer.config import PreprocessConfig
from packer.spec.errors import ConfigError
from readers.datasets.defaults import default_options
from readers.loading.loader import make_loader

PLOT_EXTRA = 'pip install matplotlib (or: pip install -e ".[plot]")'


@dataclass
class Comparison:
    """Samples/s of the packed output and of the raw folder, read with the same settings."""

    output: str
    source: str
    batch_size: int
    num_workers: int
    packed: Rate
    folder: Rate
    folder_images: int
    output_samples: int

    @property
    def speedup(self) -> float:
        """How many times faster the packed output reads than the folder."""
        return self.packed.samples_per_s / self.folder.samples_per_s if self.folder.samples_per_s else float("inf")

    def to_dict(self) -> dict:
        """JSON-ready form."""

        def side(rate: Rate) -> dict:
            return {
                "samples_per_s": rate.samples_per_s,
                "samples": rate.samples,
                "seconds": rate.seconds,
                "warmup_seconds": rate.warmup_seconds,
                "warm": rate.warm,
            }

        return {
            "output": self.output,
            "source": self.source,
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "packed": side(self.packed),
            "folder": side(self.folder),
            "speedup": self.speedup,
            "folder_images": self.folder_images,
            "output_samples": self.output_samples,
        }


def default_workers(dataset, batch_size: int) -> int:
    """The worker count ``make_loader`` would choose for this output on this machine."""
    return int(default_options(dataset, batch_size, torch.float32)["num_workers"])


def compare(
    dataset,
    source: str | os.PathLike,
    *,
    batch_size: int = 64,
    num_workers: Optional[int] = None,
    seconds: float = 10.0,
    tick: Optional[Callable[[float], None]] = None,
) -> Comparison:
    """Time ``make_loader(dataset)`` and a plain DataLoader over the images of ``source`` for about
    ``seconds`` each (after warm-up), both with ``batch_size`` and ``num_workers`` (default: what
    make_loader would choose). ``dataset`` is a packer reader opened with ``normalize=True``.

    The folder side leaves out the files the conversion skipped. InputError when ``source`` has
    no image; ConfigError for an output of varying image sizes with ``batch_size`` > 1.
    """
    manifest = dataset.manifest
    check_images(manifest, batch_size, dataset.root)
    items = folder_items(source, manifest)
    workers = default_workers(dataset, batch_size) if num_workers is None else num_workers
    packed = _timed(lambda: make_loader(dataset, batch_size, num_workers=workers), workers, seconds, tick)
    folder = FolderDataset(items, PreprocessConfig.from_dict(manifest.preprocess))
    extra = {"persistent_workers": True} if workers else {}
    plain = _timed(
        lambda: DataLoader(folder, batch_size=batch_size, shuffle=True, num_workers=workers, **extra),
        workers,
        seconds,
        tick,
    )
    return Comparison(str(dataset.root), str(source), batch_size, workers, packed, plain, len(items), manifest.samples)


def _timed(make: Callable[[], object], workers: int, seconds: float, tick: Optional[Callable[[float], None]]) -> Rate:
    with one_thread():
        loader = make()
        rate = time_loader(loader, seconds, min(max(1, workers), len(loader)), tick=tick)  # type: ignore[arg-type]
        del loader  # stops its workers before the other side starts
        gc.collect()
    return rate


def require_matplotlib() -> None:
    """ConfigError naming the install command when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(f"--plot draws with matplotlib, which is not installed: {PLOT_EXTRA}") from None


def plot(comparison: Comparison, path: str | os.PathLike) -> Path:
    """Draw the two rates as a bar chart PNG at ``path``, the host named under it (a ratio holds for
    the host it was measured on); ConfigError when matplotlib is missing."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    c = comparison
    names = ["raw folder\n(decode per sample)", f"packed\n({Path(c.output).name})"]
    rates = [c.folder.samples_per_s, c.packed.samples_per_s]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    bars = ax.bar(names, rates, color=["tab:gray", "tab:blue"])
    ax.bar_label(bars, labels=[f"{r:,.0f}" for r in rates])
    ax.set_ylabel("samples/s")
    ax.set_title(f"{c.speedup:.1f}x faster packed: batch {c.batch_size}, {c.num_workers} workers", fontsize=10)
    ax.margins(y=0.15)
    host = describe_host()
    fig.text(0.5, 0.01, f"{host.cpu}, {host.cores} cores, {host.simd}", ha="center", fontsize=7, color="dimgray")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path = Path(path)
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return path
