"""Quick benchmark: conversion and read throughput of every format, as ratios measured in one run.

    python scripts/quick_bench.py [--images 3000] [--workers 2] [--work /tmp/packer-bench]

Makes ImageNet-like JPEGs (500x375 and 375x500, quality 90) from the photographs in
sample_data/images, then measures on this machine, in one run:
- the conversion floor: bare decode + resize with packer's own preprocessing in N processes;
- ``packer.convert`` for every format (images/s and ratio to the floor);
- a plain-folder DataLoader (decode + resize + normalize per sample) as the baseline;
- every reader through a DataLoader (batch 64, shuffled), float32 normalized and uint8, with 0 and
  N workers.
The machines are shared and noisy: compare the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from packer import ConvertConfig, PreprocessConfig, convert  # noqa: E402
from packer.discover import discover  # noqa: E402
from packer.formats import WRITERS  # noqa: E402
from packer.preprocess import load_image  # noqa: E402
from readers import open_dataset  # noqa: E402


def make_images(out: Path, count: int) -> None:
    """``count`` JPEGs in 10 classes: random crops of the sample photographs, resized, with noise."""
    photos = [Image.open(p).convert("RGB") for p in sorted((ROOT / "sample_data" / "images").glob("*/*"))]
    rng = np.random.default_rng(0)
    for i in range(count):
        src = photos[i % len(photos)]
        w, h = src.size
        cw, ch = int(w * rng.uniform(0.6, 1)), int(h * rng.uniform(0.6, 1))
        x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        img = src.crop((x, y, x + cw, y + ch)).resize((500, 375) if i % 3 else (375, 500), Image.BICUBIC)
        noisy = np.asarray(img, np.int16) + rng.integers(-8, 8, (img.size[1], img.size[0], 3))
        folder = out / f"c{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(folder / f"{i:05d}.jpg", quality=90)


def _decode_all(paths: list[str]) -> int:
    cfg = PreprocessConfig()
    for p in paths:
        load_image(p, cfg)
    return len(paths)


def floor(src: Path, workers: int) -> float:
    """Images/s of bare decode + resize (no writing) in ``workers`` processes."""
    paths = [i.path for i in discover(src).items]
    start = time.perf_counter()
    with get_context("fork").Pool(workers) as pool:
        done = sum(pool.map(_decode_all, [paths[k::workers] for k in range(workers)]))
    return done / (time.perf_counter() - start)


class PlainFolder(Dataset):
    """The baseline: decode, resize and normalize each sample from its own file, every epoch."""

    def __init__(self, src: Path) -> None:
        self.items = discover(src).items
        self.cfg = PreprocessConfig()
        self.mean = torch.tensor(self.cfg.mean).view(3, 1, 1)
        self.std = torch.tensor(self.cfg.std).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        item = self.items[i]
        pixels = torch.from_numpy(load_image(item.path, self.cfg).transpose(2, 0, 1).copy())
        return pixels.float().div_(255).sub_(self.mean).div_(self.std), item.label


def read_rate(ds, workers: int, shuffle: bool, epochs: int = 2) -> float:
    """Samples/s through a DataLoader (batch 64), after one warm-up epoch."""
    loader = DataLoader(ds, batch_size=64, shuffle=shuffle, num_workers=workers, persistent_workers=workers > 0)
    for _ in loader:
        pass
    count, start = 0, time.perf_counter()
    for _ in range(epochs):
        for _, labels in loader:
            count += len(labels)
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/packer-bench"))
    args = parser.parse_args()
    src = args.work / "images"
    if not src.is_dir() or len(discover(src).items) != args.images:
        shutil.rmtree(src, ignore_errors=True)
        make_images(src, args.images)
    base = floor(src, args.workers)
    print(f"conversion floor (decode+resize, {args.workers} processes): {base:.0f} images/s")
    for fmt in WRITERS:
        out = args.work / fmt
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        convert(src, out, ConvertConfig(fmt), workers=args.workers)
        rate = args.images / (time.perf_counter() - start)
        print(f"convert {fmt:5s}: {rate:5.0f} images/s = {rate / base:.0%} of the floor")
    plain = read_rate(PlainFolder(src), args.workers, shuffle=True, epochs=1)
    print(f"plain folder, float32, {args.workers} workers: {plain:.0f} samples/s")
    for fmt in WRITERS:
        extra = {"shuffle": 256} if fmt == "wds" else {}
        cells = []
        for normalize in (True, False):
            for workers in (0, args.workers):
                ds = open_dataset(args.work / fmt, normalize=normalize, **extra)
                rate = read_rate(ds, workers, shuffle=fmt != "wds")
                cells.append(f"{'float32' if normalize else 'uint8'}/{workers}w {rate:6.0f} ({rate / plain:4.1f}x)")
        print(f"read {fmt:5s}: " + "  ".join(cells))


if __name__ == "__main__":
    main()
