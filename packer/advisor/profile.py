"""``packer profile``: where the time of loading one sample goes, stage by stage.

A raw folder is timed as a plain ``Dataset`` would load it (open and read the file, decode,
preprocess, to tensor, collate); a packer output as a plain ``Dataset`` over it would (read the
stored bytes with the format's stock library, decode them for jpeg/png, to tensor, collate). The
preprocessing and the normalization are packer's own functions with the output's settings (for a
folder: ``packer convert``'s defaults unless another config is given). Everything runs in this
process, one sample at a time: the figures are the work per sample, not a loader's throughput.
Each stage's figure is its median over the samples, so that a pause caused by another process on a
shared machine does not make one stage look slow.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Sequence, TypeVar

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import default_collate

from packer.advisor.folder import converter_for, folder_items
from packer.advisor.timing import check_images, one_thread
from packer.config import PreprocessConfig
from packer.pixels.decoding import oriented
from packer.pixels.preprocess import finish_pixels
from packer.pixels.read import read_source
from packer.pixels.resize import resize
from packer.pixels.source_codec import decode_stored
from packer.spec.errors import DecodeError, InputError
from packer.spec.manifest import read_manifest
from packer.spec.registry import FORMATS
from packer.spec.sample_layout import SampleLayout
from readers.datasets.tensors import ImageConverter

FOLDER_STAGES = ("read", "decode", "preprocess", "to_tensor", "collate")
OUTPUT_STAGES = ("read", "decode", "to_tensor", "collate")
STAGE_NAMES = {
    "read": "open + read",
    "decode": "decode",
    "preprocess": "preprocess (resize)",
    "to_tensor": "to tensor + normalize",
    "collate": "collate",
}
"""How each stage is shown (for an output, ``read`` is ``read stored bytes``)."""

_PILLOW_ERRORS = (DecodeError, UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError)

T = TypeVar("T")


@dataclass
class Profile:
    """Median seconds per sample of each stage (``seconds``), over ``samples`` samples of ``source``.

    ``kind`` is ``folder`` or ``output``; ``codec`` the output's image codec (None for a folder);
    ``skipped`` counts files that could not be decoded (not timed); ``preprocess`` the settings
    used, in the manifest's form.
    """

    source: str
    kind: str
    samples: int
    batch_size: int
    seconds: dict[str, float]
    skipped: int = 0
    format: Optional[str] = None
    codec: Optional[str] = None
    preprocess: Optional[dict] = None

    @property
    def total(self) -> float:
        """Seconds per sample, all stages together."""
        return sum(self.seconds.values())

    def share(self, stage: str) -> float:
        """Fraction (0..1) of the time spent in ``stage``."""
        total = sum(self.seconds.values())
        return self.seconds[stage] / total if total > 0 else 0.0

    @property
    def dominant(self) -> str:
        """The stage that takes the most time."""
        return max(self.seconds, key=self.seconds.__getitem__)

    def name(self, stage: str) -> str:
        """How ``stage`` is shown."""
        return "read stored bytes" if stage == "read" and self.kind == "output" else STAGE_NAMES[stage]

    def advice(self) -> str:
        """One sentence: which stage dominates and what to do about it."""
        stage = self.dominant
        share = f"{self.share(stage):.0%}"
        src = _quoted(self.source)
        if self.kind == "folder":
            tips = {
                "read": f"many small random reads; pack the folder (packer convert {src} -f npy) so that reads "
                "come from a few large files",
                "decode": f"convert with packer convert {src} -f npy (raw codec) so decoding happens once, not "
                "every epoch",
                "preprocess": f"it gives the same result every epoch, so packer convert {src} -f npy does it "
                "once, offline",
                "to_tensor": f"convert (packer convert {src} -f npy) and load with make_loader, which sends uint8 "
                "through the workers and normalizes once per batch (on the GPU with device='cuda')",
                "collate": f"convert (packer convert {src} -f npy) and load with make_loader, whose workers "
                "write each sample straight into one batch tensor",
            }
        else:
            # in_memory=True exists for the map-style readers only, not for tar shards
            mapped = FORMATS[self.format].random_access
            ram = f"hold it in RAM with open_dataset({src!r}, in_memory=True), " if mapped else ""
            decoded = (
                f", or open it with open_dataset({src!r}, in_memory=True), which holds the images decoded"
                if mapped
                else ""
            )
            tips = {
                "read": f"storage is the limit: keep the output on a local SSD, {ram}or convert with --codec jpeg "
                "to read fewer bytes",
                "decode": f"convert again with --codec raw so decoding happens once{decoded}",
                "to_tensor": "use make_loader, which sends uint8 through the workers and normalizes once per batch "
                "(on the GPU with device='cuda')",
                "collate": "use make_loader, or collate_fn=readers.packed_collate, which writes samples straight "
                "into one batch tensor",
            }
        return f"{self.name(stage)} dominates ({share}): {tips[stage]}."

    def to_dict(self) -> dict:
        """JSON-ready form: stages with ms per sample and share, the dominant stage and the advice."""
        return {
            "source": self.source,
            "kind": self.kind,
            "format": self.format,
            "codec": self.codec,
            "samples": self.samples,
            "batch_size": self.batch_size,
            "skipped": self.skipped,
            "preprocess": self.preprocess,
            "stages": [
                {"stage": s, "name": self.name(s), "ms_per_sample": 1000 * self.seconds[s], "share": self.share(s)}
                for s in self.seconds
            ],
            "ms_per_sample": 1000 * self.total,
            "dominant": self.dominant,
            "advice": self.advice(),
        }


def _quoted(path: str) -> str:
    return f'"{path}"' if any(c.isspace() for c in path) else path


def spread(items: Sequence[T], n: int) -> list[T]:
    """``n`` items spread evenly over ``items`` (all of them when there are no more than ``n``)."""
    if len(items) <= n:
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


class _Clock:
    """Records the time since the previous ``lap`` (or since it was made) as a stage's."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds, self.last = seconds, time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = now - self.last
        self.last = now


def _medians(laps: list[dict[str, float]], stages: Sequence[str]) -> dict[str, float]:
    return {stage: float(np.median([lap[stage] for lap in laps])) for stage in stages}


def profile_folder(
    source: str | os.PathLike,
    samples: int = 200,
    batch_size: int = 64,
    preprocess: Optional[PreprocessConfig] = None,
    progress: Optional[Callable[[int], None]] = None,
) -> Profile:
    """Time each stage of loading ``samples`` images (spread over the folder) from their files.

    ``preprocess`` defaults to ``packer convert``'s defaults. Files that cannot be decoded are
    counted in ``skipped``, not timed. InputError when the folder has no usable image.
    """
    cfg = preprocess or PreprocessConfig()
    convert = converter_for(cfg.to_dict())
    items = spread(folder_items(source), samples)
    laps: list[dict[str, float]] = []
    done: list[tuple[torch.Tensor, int]] = []
    skipped = 0
    for k, (path, label) in enumerate([items[0], *items]):  # the first pass is a warm-up, not timed
        lap: dict[str, float] = {}
        clock = _Clock(lap)
        try:
            data = read_source(path, cfg.max_file_bytes)
            clock.lap("read")
            with Image.open(io.BytesIO(data)) as img:
                img, original, area = oriented(img, cfg, path, data)
                img.load()  # Pillow decodes lazily: make it happen in this stage
                clock.lap("decode")
                pixels = np.asarray(resize(img, cfg, area, original))
                array = finish_pixels(pixels[:, :, None] if pixels.ndim == 2 else pixels, cfg)
            clock.lap("preprocess")
            tensor = convert(array)
            clock.lap("to_tensor")
        except _PILLOW_ERRORS:
            skipped += k > 0
        else:
            if k:
                laps.append(lap)
                done.append((tensor, label))
        if progress is not None and k:
            progress(1)
    if not done:
        raise InputError(f"none of the {len(items)} images sampled from {source} could be decoded")
    seconds = _medians(laps, FOLDER_STAGES[:-1])
    seconds["collate"] = _collate_seconds(done, batch_size)
    return Profile(str(source), "folder", len(done), batch_size, seconds, skipped, preprocess=cfg.to_dict())


def profile_output(
    root: str | os.PathLike, samples: int = 200, batch_size: int = 64, progress: Optional[Callable[[int], None]] = None
) -> Profile:
    """Time each stage of loading ``samples`` samples (spread over the shards) from a packer output.

    Stored samples are read with the format's stock library (as ``packer verify`` reads them); the
    first of each shard with more than one is not timed (opening a shard is paid once per worker,
    not per sample). ManifestError when ``root`` is not a readable packer output, ConfigError when
    it holds no images.
    """
    manifest = read_manifest(root)
    check_images(manifest, 1, root)
    codec, mode = manifest.image_codec, manifest.preprocess["mode"]
    convert = ImageConverter(manifest)
    # The images alone, as before the layout was passed: reading the text fields too would be timed as "read".
    spec, layout = FORMATS[manifest.format], replace(SampleLayout.from_manifest(manifest), text=())
    shards = [s for s in manifest.shards if s.samples]
    quota = math.ceil(samples / max(1, len(shards)))
    laps: list[dict[str, float]] = []
    done: list[tuple[torch.Tensor, int]] = []
    for shard in shards:
        with contextlib.closing(spec.scan(Path(root), shard, layout)) as stored:  # a scanner holds its file open
            for k in range(min(quota + 1, shard.samples)):
                if len(done) >= samples:
                    break
                lap = {"decode": 0.0}  # stays 0 for raw pixels: nothing to decode
                clock = _Clock(lap)
                sample = next(stored)
                if codec == "raw":
                    array = np.array(sample.image)  # a copy: file maps are read only when touched
                    clock.lap("read")
                else:
                    data = bytes(sample.encoded)  # type: ignore[arg-type]
                    clock.lap("read")
                    array = decode_stored(data, codec, mode)
                    clock.lap("decode")
                tensor = convert(array)
                clock.lap("to_tensor")
                if k or shard.samples == 1:  # the first of a shard also opened it: not timed
                    laps.append(lap)
                    done.append((tensor, sample.label))
                    if progress is not None:
                        progress(1)
    if not done:
        raise InputError(f"{root} holds no sample to profile")
    seconds = _medians(laps, OUTPUT_STAGES[:-1])
    seconds["collate"] = _collate_seconds(done, batch_size)
    return Profile(str(root), "output", len(done), batch_size, seconds, 0, manifest.format, codec, manifest.preprocess)


def _collate_seconds(samples: list[tuple[torch.Tensor, int]], batch_size: int) -> float:
    """Median seconds per sample that ``default_collate`` (a plain DataLoader's) takes to batch
    ``samples``, ``batch_size`` at a time. Images of different sizes (--resize none) cannot be
    stacked: they are collated one per batch.
    """
    sizes = {tuple(t.shape) for t, _ in samples}
    step = batch_size if len(sizes) == 1 else 1
    per_sample = []
    with one_thread():  # as in a DataLoader worker, where a plain DataLoader collates
        for i in range(0, len(samples), step):
            batch = samples[i : i + step]
            start = time.perf_counter()
            default_collate(batch)
            per_sample.append((time.perf_counter() - start) / len(batch))
    return float(np.median(per_sample))
