"""The training task of scripts/bench.py (``--train-check``): random-resized crops and flips into batches.

Photographs are stored once in their own sizes, the longer side at most 256 (packer's
``--resize max --size 256``, FFCV's ``max_resolution=256``), as raw pixels and as JPEG q90, and read
back as shuffled float32 batches of 64 through ``RandomResizedCrop(224)`` + a horizontal flip,
normalized with ImageNet's mean and std, in 2 workers:

- packer: ``open_dataset(out, crop=RandomResizedCrop(224), flip=True)`` through ``make_loader``, NCHW
  batches and (max 256 rows) channels-last ones (``memory_format=torch.channels_last``) and uint8
  ones (``normalize=False``: the GPU path, compared with FFCV's float32 channels-last batches); the
  ``--codec source`` output (the photographs in full) also with ``RandomResizedCrop(224, reduced_decode=True)``;
  the max-256 JPEG output also with every file decoded whole (``packer (whole decodes)``), as readers
  decode JPEGs without restart markers (older outputs): the baseline of a crop's region decode;
- SPDL's thread-based pipeline over the same files (``SpdlTrainLoader``, with as many threads as
  workers and twice as many), when ``spdl`` and FFmpeg's libraries are installed;
- the torchvision-style folder pipeline: each file opened with Pillow every epoch, cropped with
  ``RandomResizedCrop.get_params``'s draw, resized (bilinear, antialiased), flipped, made a tensor
  and normalized, per sample in a ``DataLoader`` (written with Pillow: torchvision cannot be
  installed beside this machine's torch);
- FFCV, when ``--ffcv-python`` names a Python with ffcv installed: its ``RandomResizedCropRGBImageDecoder``
  + ``RandomHorizontalFlip`` + ``NormalizeImage`` + ``ToTensor`` + ``ToTorchImage`` from a ``.beton`` written
  with ``RGBImageField(max_resolution=256)``, ``write_mode`` raw and jpg, read with
  ``ToTorchImage(channels_last=False)`` (NCHW) and with its default (channels-last), each with both of
  FFCV's memory managers (its default process cache, and ``os_cache=True``, which its docs advise when
  the dataset fits in memory, as here: the default's rate jumped between rounds, docs/BENCHMARKS.md), each
  packer row compared with the faster of the two of the same storage and layout. This file runs itself
  there with ``--ffcv-side`` (it imports neither packer nor readers on that side).

Every rate is samples/s over ``--epochs`` epochs after one warm-up epoch (FFCV compiles its pipeline
then), all measured in one run of ``--repeat`` rounds: each round converts and reads every form once,
the tools taking turns, and the table gives the medians with each ratio's range over the rounds (a
2-core machine shared with other jobs moves single figures by 10-20%); storage is the bytes on disk
of each form.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BATCH = 64
SIZE = 224
UINT8 = "uint8 batches"
"""The label of packer's rows of unnormalized batches."""
MAX_SIDE = 256


def du(path: Path) -> int:
    """Bytes of the files under ``path`` (or of one file)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def items_of(src: Path) -> list[tuple[str, int]]:
    """(path, label) of every image under the class folders of ``src``, in sorted order."""
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    return [(str(f), k) for k, c in enumerate(classes) for f in sorted((src / c).iterdir()) if f.is_file()]


def count_rate(loader, epochs: int) -> float:
    """Samples/s over ``epochs`` passes of ``loader`` (batches whose second item is the labels)."""
    count, start = 0, time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            count += len(batch[1])
    return count / (time.perf_counter() - start)


def timed(loader, epochs: int) -> float:
    """Samples/s over ``epochs`` passes of ``loader`` after one warm-up pass, the disk's dirty pages
    written out first: a conversion just before (the tool's own, or another's) leaves hundreds of
    MB for the kernel to write back, which took CPU from FFCV's reads in some rounds and not others."""
    if hasattr(os, "sync"):  # Unix
        os.sync()
    for _ in loader:
        pass
    return count_rate(loader, epochs)


# The folder pipeline --------------------------------------------------------------------------------
def get_params(height: int, width: int, g: torch.Generator, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's ``RandomResizedCrop.get_params``, as it documents and implements it."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=g).item()
        aspect = math.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=g).item())
        w, h = int(round(math.sqrt(target_area * aspect))), int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,), generator=g).item())
            j = int(torch.randint(0, width - w + 1, size=(1,), generator=g).item())
            return i, j, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class FolderTrainSet(torch.utils.data.Dataset):
    """ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize, with Pillow."""

    def __init__(self, items: list[tuple[str, int]]) -> None:
        self.items = items
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)
        self.g = torch.Generator().manual_seed(0)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        from PIL import Image

        path, label = self.items[index]
        with Image.open(path) as img:
            img = img.convert("RGB")
        i, j, h, w = get_params(img.height, img.width, self.g)
        img = img.crop((j, i, j + w, i + h)).resize((SIZE, SIZE), Image.Resampling.BILINEAR)
        if torch.rand(1, generator=self.g).item() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float().div_(255)
        return (x - self.mean) / self.std, label


def seed_worker(worker: int) -> None:
    info = torch.utils.data.get_worker_info()
    info.dataset.g.manual_seed(1000 + worker)


def folder_loader(items: list[tuple[str, int]], workers: int):
    return torch.utils.data.DataLoader(
        FolderTrainSet(items),
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        worker_init_fn=seed_worker,
    )


class SpdlTrainLoader:
    """The same task as ``FolderTrainSet`` through SPDL, Meta's thread-based loader (``pip install spdl``,
    with FFmpeg's libraries): each epoch a ``spdl.pipeline`` pipeline whose ``threads`` threads demux
    and decode each JPEG with FFmpeg, cropped, resized (bilinear) and flipped by an FFmpeg filter
    graph as the crop drawn for it says (torchvision's ``get_params``, seeded per epoch and sample),
    made a normalized float32 CHW tensor in the same thread (as ``FolderTrainSet`` does: normalizing
    whole batches of 64 in one stage took 1 ms a sample, as long as the decode) and stacked by 64.
    Threads need no worker processes: SPDL's decoding releases the GIL."""

    def __init__(self, items: list[tuple[str, int]], threads: int) -> None:
        self.items, self.threads, self.epoch = items, threads, 0
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def load(self, index: int):
        import spdl.io

        path, label = self.items[index]
        packets = spdl.io.demux_image(path)
        g = torch.Generator().manual_seed(self.epoch * 1_000_003 + index)
        i, j, h, w = get_params(packets.height, packets.width, g)
        flip = ",hflip" if torch.rand(1, generator=g).item() < 0.5 else ""
        graph = f"crop={w}:{h}:{j}:{i},scale={SIZE}:{SIZE}:flags=bilinear{flip},format=rgb24"
        frames = spdl.io.decode_packets(packets, filter_desc=graph)
        x = torch.from_numpy(spdl.io.to_numpy(spdl.io.convert_frames(frames))).permute(2, 0, 1).float().div_(255)
        return (x - self.mean) / self.std, label

    def collate(self, samples: list) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])

    def __len__(self) -> int:
        return -(-len(self.items) // BATCH)

    def __iter__(self):
        order = torch.randperm(len(self.items), generator=torch.Generator().manual_seed(self.epoch)).tolist()
        self.epoch += 1
        yield from spdl_batches(order, self.load, self.collate, self.threads)


def spdl_batches(order: list[int], load, collate, threads: int, batch: int = BATCH):
    """The batches of an ``spdl.pipeline`` pipeline: ``load(index)`` of each index of ``order`` in
    ``threads`` threads, ``batch`` samples at a time put together by ``collate``."""
    from spdl.pipeline import PipelineBuilder

    pipeline = (
        PipelineBuilder()
        .add_source(order)
        .pipe(load, concurrency=threads)
        .aggregate(batch)
        .pipe(collate)
        .add_sink(3)
        .build(num_threads=threads + 1)
    )
    with pipeline.auto_stop():
        yield from pipeline


def spdl_available() -> bool:
    """Whether SPDL and FFmpeg's libraries are installed (the SPDL row is left out otherwise)."""
    try:
        import spdl.pipeline  # noqa: F401
        from spdl.io.lib import _libspdl

        _libspdl.make_demuxer  # noqa: B018 - loads FFmpeg's libraries, which spdl.io imports lazily
    except (ImportError, OSError, RuntimeError):
        return False
    return True


# packer ---------------------------------------------------------------------------------------------
def packer_convert(src: Path, out: Path, codec: str, workers: int, resize: str = "max", size: int = MAX_SIDE) -> float:
    """Seconds of ``packer convert`` (a fresh process, as users run it) of ``src`` into an npy output."""
    start = time.perf_counter()
    sizing = ["--size", str(size)] if resize != "none" else []
    subprocess.run(
        [
            sys.executable,
            "-m",
            "packer",
            "convert",
            str(src),
            "-f",
            "npy",
            "-o",
            str(out),
            "--overwrite",
            "--resize",
            resize,
            *sizing,
            "--codec",
            codec,
            "--quality",
            "90",
            "--workers",
            str(workers),
            "-q",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def stored_images(out: Path) -> Iterator[tuple[str, bytes]]:
    """``(key, stored image bytes)`` of every sample of the output ``out``, in stored order."""
    from packer.spec.manifest import read_manifest
    from packer.spec.registry import FORMATS
    from packer.spec.sample_layout import SampleLayout

    m = read_manifest(out)
    layout = SampleLayout.from_manifest(m)
    for shard in m.shards:
        for s in FORMATS[m.format].scan(out, shard, layout):
            yield s.key, bytes(s.encoded)


def source_identical(src: Path, out: Path) -> str:
    """How many stored images of a ``--codec source`` output hash equal to their source files."""
    import hashlib

    same = total = 0
    for key, data in stored_images(out):
        same += hashlib.sha256(data).digest() == hashlib.sha256((src / key).read_bytes()).digest()
        total += 1
    return f"{same} of {total}"


def source_costs(items: list[tuple[str, int]], count: int = 500) -> dict:
    """CPU ms per photograph, in this process, of what each conversion does to a file's bytes: the
    ``--codec source`` check of a kept JPEG (``source_codec.keep``), its 1/8-scale decode alone (the
    part that entropy-decodes the whole file), and the default preprocessing (shorter side to 224,
    centre crop, with the statistics' histogram): the ceiling of the two conversions' ratio."""
    import simplejpeg

    from packer.config import PreprocessConfig
    from packer.pixels import preprocess, source_codec

    datas = [Path(p).read_bytes() for p, _ in items[:count]]
    kept = PreprocessConfig(size=None, resize="none", mode="RGB", mean=None, std=None)
    default = PreprocessConfig(size=(SIZE, SIZE), resize="shorter-crop", mode="RGB", mean=None, std=None)

    def eighth(data: bytes) -> None:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        simplejpeg.decode_jpeg(data, colorspace="RGBX", min_height=-(-height // 8), min_width=-(-width // 8))

    def ms(fn) -> float:
        fn(datas[0])
        start = time.process_time()
        for data in datas:
            fn(data)
        return (time.process_time() - start) / len(datas) * 1e3

    return {
        "keep_ms": ms(lambda d: source_codec.keep(d, kept)),
        "eighth_decode_ms": ms(eighth),
        "default_ms": ms(
            lambda d: preprocess.finish_pixels(preprocess.decode(d, default, histogram=True).pixels, default)
        ),
    }


def crop_decode_costs(out: Path, count: int = 500) -> dict:
    """CPU ms per photograph, in this process, of decoding the stored JPEGs of the max-256 jpeg
    output ``out`` for a RandomResizedCrop(224) box: the whole file (what readers did before, and do
    for files without restart markers) against the MCUs under the box alone (``jpeg_region``), with
    the share of boxes cut (the rest need every MCU and are decoded whole)."""
    import simplejpeg

    from readers.augment.crops import Augment, RandomResizedCrop
    from readers.augment.jpeg_region import decode_region

    datas = [data for _, data in itertools.islice(stored_images(out), count)]
    augment = Augment(RandomResizedCrop(SIZE), False)
    boxes = []
    for i, data in enumerate(datas):
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        left, top, right, bottom = augment.placement(0, 1, i, height, width).box
        boxes.append((int(left), int(top), math.ceil(right), math.ceil(bottom)))

    def ms(fn) -> float:
        fn(0)
        start = time.process_time()
        for i in range(len(datas)):
            fn(i)
        return (time.process_time() - start) / len(datas) * 1e3

    return {
        "whole_ms": ms(lambda i: simplejpeg.decode_jpeg(datas[i], colorspace="RGB")),
        "region_ms": ms(
            lambda i: decode_region(datas[i], "RGB", boxes[i]) or simplejpeg.decode_jpeg(datas[i], colorspace="RGB")
        ),
        "cut": sum(decode_region(d, "RGB", b) is not None for d, b in zip(datas, boxes)) / len(datas),
    }


@contextlib.contextmanager
def whole_jpeg_decodes():
    """Readers made and iterated inside decode every stored JPEG whole, as they do a file without
    restart markers (an output of packer 0.9.1 or older): the baseline of the crop's region decode.
    DataLoader workers forked inside inherit it."""
    from readers.augment import render

    region = render._region
    render._region = lambda *args: None
    try:
        yield
    finally:
        render._region = region


def packer_loader(
    out: Path, workers: int, reduced_decode: bool = False, channels_last: bool = False, normalize: bool = True
):
    """packer's training-task loader of the output ``out``; ``normalize=False``: uint8 batches in the
    stored NHWC byte order, which ``make_loader(..., device="cuda")`` normalizes on the GPU."""
    from readers import RandomResizedCrop, make_loader, open_dataset

    crop = RandomResizedCrop(SIZE, reduced_decode=reduced_decode)
    ds = open_dataset(out, crop=crop, flip=True, normalize=normalize)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    return make_loader(ds, BATCH, num_workers=workers, memory_format=layout)


# FFCV (run in its own Python, --ffcv-side) ----------------------------------------------------------
def ffcv_side(src: Path, work: Path, workers: int, epochs: int) -> dict:
    """Write a .beton per write mode and read it through FFCV's training pipeline: {mode: {rate, bytes, convert_s}}."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage
    from ffcv.writer import DatasetWriter
    from PIL import Image

    items = items_of(src)

    class Photos:
        def __len__(self) -> int:
            return len(items)

        def __getitem__(self, i: int):
            with Image.open(items[i][0]) as img:
                return img.convert("RGB"), items[i][1]

    found: dict = {}
    for mode in ("raw", "jpg"):
        path = work / f"ffcv-{mode}.beton"
        start = time.perf_counter()
        DatasetWriter(
            str(path),
            {"image": RGBImageField(write_mode=mode, max_resolution=MAX_SIDE, jpeg_quality=90), "label": IntField()},
            num_workers=workers,
        ).from_indexed_dataset(Photos())
        seconds = time.perf_counter() - start
        mean, std = np.array(MEAN) * 255, np.array(STD) * 255
        found[mode] = {"bytes": du(path), "convert_s": seconds}
        for channels_last, os_cache in itertools.product((False, True), (False, True)):  # NCHW, NHWC memory
            loader = Loader(
                str(path),
                batch_size=BATCH,
                num_workers=workers,
                order=OrderOption.RANDOM,
                drop_last=False,
                os_cache=os_cache,
                pipelines={
                    "image": [
                        RandomResizedCropRGBImageDecoder((SIZE, SIZE)),
                        RandomHorizontalFlip(),
                        NormalizeImage(mean, std, np.float32),
                        ToTensor(),
                        ToTorchImage(channels_last=channels_last),
                    ],
                    "label": [IntDecoder(), ToTensor(), Squeeze()],
                },
            )
            images = next(iter(loader))[0]
            assert tuple(images.shape[1:]) == (3, SIZE, SIZE) and images.dtype == torch.float32, images.shape
            layout = torch.channels_last if channels_last else torch.contiguous_format
            assert images.is_contiguous(memory_format=layout)
            key = ("rate_channels_last" if channels_last else "rate") + ("_os_cache" if os_cache else "")
            found[mode][key] = timed(loader, epochs)
    return found


def median(values: list[float]) -> float:
    """The median of ``values`` (the mean of the middle two for an even count)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _host(record: dict | None = None):
    """This machine (or the one ``record`` describes) as a ``packer.advisor.host.Host``: imported here,
    since FFCV's side runs this file in a Python without packer."""
    from packer.advisor.host import Host, describe_host

    return describe_host() if record is None else Host.from_dict(record)


def run(args: argparse.Namespace, src: Path) -> dict:
    """Every form of the training task, measured in one run: ``--repeat`` rounds, each converting and
    reading every form once, packer's, FFCV's and the folder's reads taking turns, so that a change
    in the machine's load falls on all of them alike. Each row keeps every round's figures and
    their median (``rate``, ``convert_s``)."""
    items = items_of(src)
    work = args.work / "train"
    work.mkdir(parents=True, exist_ok=True)
    w, rounds = args.workers, max(1, args.repeat)
    results: dict = {
        "images": len(items),
        "workers": w,
        "epochs": args.epochs,
        "rounds": rounds,
        "rows": [],
        "machine": _host().to_dict(),
    }
    results["source_bytes"] = du(src)
    rows: dict[tuple[str, str], dict] = {}
    default_runs: list[float] = []

    def add(tool: str, stored: str, rate: float, nbytes: int, convert_s: float) -> None:
        row = rows.setdefault((tool, stored), {"tool": tool, "stored": stored, "rates": [], "convert_runs": []})
        row["rates"].append(rate)
        row["bytes"] = nbytes
        row["convert_runs"].append(convert_s)
        print(f"round {len(row['rates'])}: {tool} {stored}: {rate:.0f} samples/s", flush=True)

    for r in range(rounds):
        default = work / "npy-default"
        default_runs.append(packer_convert(src, default, "raw", w, "shorter-crop", SIZE))
        results["default_bytes"] = du(default)
        for resize, codec in (("max", "raw"), ("max", "jpeg"), ("none", "source")):
            out = work / f"npy-{resize}-{codec}"
            seconds = packer_convert(src, out, codec, w, resize)
            stored = f"max 256, {codec}" if resize == "max" else f"{resize}, {codec}"
            add("packer", stored, timed(packer_loader(out, w), args.epochs), du(out), seconds)
            if resize == "max":  # NHWC batches, against FFCV's default layout; and the GPU path's uint8
                rate = timed(packer_loader(out, w, channels_last=True), args.epochs)
                add("packer", f"{stored}, channels-last", rate, du(out), seconds)
                rate = timed(packer_loader(out, w, normalize=False), args.epochs)
                add("packer", f"{stored}, {UINT8}", rate, du(out), seconds)
            if codec == "jpeg":  # the same files decoded whole: what the region decode saves
                for layout, suffix in ((False, ""), (True, ", channels-last")):
                    with whole_jpeg_decodes():
                        rate = timed(packer_loader(out, w, channels_last=layout), args.epochs)
                    add("packer (whole decodes)", f"{stored}{suffix}", rate, du(out), seconds)
            if codec == "source":  # the photographs in full: a crop may be decoded at a reduced scale
                add(
                    "packer",
                    "none, source, reduced_decode",
                    timed(packer_loader(out, w, True), args.epochs),
                    du(out),
                    seconds,
                )
                if r == 0:
                    results["source_identical"] = source_identical(src, out)
        if args.ffcv_python:
            side = subprocess.run(
                [
                    args.ffcv_python,
                    __file__,
                    "--ffcv-side",
                    "--src",
                    str(src),
                    "--work",
                    str(work),
                    "--workers",
                    str(w),
                    "--epochs",
                    str(args.epochs),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            for mode, found in json.loads(side.stdout.strip().splitlines()[-1]).items():
                stored = f"max 256, {'jpeg' if mode == 'jpg' else 'raw'}"
                for tool, suffix in (("FFCV", ""), ("FFCV (os_cache)", "_os_cache")):
                    nbytes, seconds = found["bytes"], found["convert_s"]
                    add(tool, stored, found["rate" + suffix], nbytes, seconds)
                    add(tool, f"{stored}, channels-last", found["rate_channels_last" + suffix], nbytes, seconds)
        add(
            "folder (Pillow, torchvision-style)",
            "source files",
            timed(folder_loader(items, w), args.epochs),
            results["source_bytes"],
            0.0,
        )
        for threads in (w, 2 * w) if spdl_available() else ():
            rate = timed(SpdlTrainLoader(items, threads), args.epochs)
            add(f"SPDL folder pipeline ({threads} threads)", "source files", rate, results["source_bytes"], 0.0)
    results["source_costs"] = source_costs(items)
    results["crop_decode_costs"] = crop_decode_costs(work / "npy-max-jpeg")
    results["default_convert_runs"] = default_runs
    results["default_convert_s"] = median(default_runs)
    for row in rows.values():
        row["rate"] = median(row["rates"])
        row["convert_s"] = median(row["convert_runs"])
        results["rows"].append(row)
    return results


def markdown(results: dict) -> str:
    """The training-task table for docs/BENCHMARKS.md: medians over the rounds, and each ratio's
    lowest and highest over the rounds (rows measured in the same round compared)."""
    rows = results["rows"]
    ffcv: dict = {}  # per storage and layout, FFCV's faster memory manager (by median)
    for r in rows:
        if r["tool"].startswith("FFCV") and r["rate"] > ffcv.get(r["stored"], {"rate": -1.0})["rate"]:
            ffcv[r["stored"]] = r
    # "vs folder": against the fastest folder pipeline a user could pick (DataLoader or SPDL)
    folder = max((r for r in rows if r["tool"].startswith(("folder", "SPDL"))), key=lambda r: r["rate"])
    rounds = results.get("rounds", 1)
    lines = [
        _host(results["machine"]).line() if "machine" in results else "Host: not recorded",
        "",
        f"{results['images']} photographs, RandomResizedCrop(224) + flip, batches of {BATCH} (float32; uint8 "
        "where marked), "
        f"{results['workers']} workers, {results['epochs']} timed epochs after a warm-up, "
        f"{rounds} round{'s' if rounds > 1 else ''} (medians; ratios as median [lowest-highest] of the rounds)",
        "",
        f"vs folder: against the fastest folder pipeline here, {folder['tool']}",
        "",
        "vs FFCV: against FFCV's faster memory manager (process cache or os_cache) of the same storage and layout; "
        f'rows of {UINT8} (`normalize=False`: the batches `make_loader(..., device="cuda")` normalizes on the '
        "GPU) against FFCV's float32 channels-last batches (its default) of the same storage",
        "",
        "| tool | stored as | samples/s | vs folder | vs FFCV, same storage | storage MB | convert s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        peer = ffcv.get(_ffcv_peer(r["stored"])) if r["tool"] == "packer" else None
        vs_ffcv = _ratio(r, peer) if peer else ""
        lines.append(
            f"| {r['tool']} | {r['stored']} | {r['rate']:.0f} | {_ratio(r, folder)} | {vs_ffcv} | "
            f"{r['bytes'] / 2**20:.1f} | {r['convert_s']:.1f} |"
        )
    lines.append(
        f"| packer default (224 crops, raw) | shorter-crop 224 | | | | "
        f"{results['default_bytes'] / 2**20:.1f} | {results['default_convert_s']:.1f} |"
    )
    source = next((r for r in rows if r["stored"] == "none, source"), None)
    if source is not None:
        runs = list(
            zip(
                results.get("default_convert_runs", [results["default_convert_s"]]),
                source.get("convert_runs", [source["convert_s"]]),
            )
        )
        each = ", ".join(f"{d / s:.2f}x" for d, s in runs)
        lines += [
            "",
            f"`--resize none --codec source` converted in {source['convert_s']:.1f} s (median), "
            f"{results['default_convert_s'] / source['convert_s']:.2f}x the speed of the default "
            f"conversion (each round: {each}); stored images equal to their source files (SHA-256): "
            f"{results.get('source_identical')}",
        ]
    costs = results.get("source_costs")
    if costs:
        lines += [
            "",
            f"Per photograph, CPU in one process: `--codec source`'s check of a kept JPEG "
            f"{costs['keep_ms']:.3f} ms (its 1/8-scale decode alone {costs['eighth_decode_ms']:.3f} ms), "
            f"the default preprocessing {costs['default_ms']:.3f} ms: at most "
            f"{costs['default_ms'] / costs['keep_ms']:.2f}x from the per-file work",
        ]
    crops = results.get("crop_decode_costs")
    if crops:
        lines += [
            "",
            f"Per photograph, CPU in one process, decoding a stored max-256 JPEG for a RandomResizedCrop(224) "
            f"box: the whole file {crops['whole_ms']:.3f} ms, the MCUs under the box alone "
            f"{crops['region_ms']:.3f} ms ({crops['whole_ms'] / crops['region_ms']:.2f}x; "
            f"{crops['cut']:.0%} of the boxes cut, the rest decoded whole)",
        ]
    return "\n".join(lines)


def _ffcv_peer(stored: str) -> str:
    """The FFCV row a packer row of ``stored`` is compared with: the same storage and layout; for
    uint8 batches, FFCV's float32 channels-last ones (the GPU path against FFCV's default)."""
    suffix = f", {UINT8}"
    return stored[: -len(suffix)] + ", channels-last" if stored.endswith(suffix) else stored


def _ratio(row: dict, base: dict) -> str:
    """``row``'s median rate over ``base``'s, and with several rounds the lowest and highest of
    the per-round ratios."""
    text = f"{row['rate'] / base['rate']:.2f}x"
    pairs = list(zip(row.get("rates", []), base.get("rates", [])))
    if len(pairs) > 1 and row is not base:
        each = [a / b for a, b in pairs]
        text += f" [{min(each):.2f}-{max(each):.2f}]"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/packer-bench"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--ffcv-python", help="a Python with ffcv installed, to run FFCV's side of the task")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every conversion and read (medians kept)")
    parser.add_argument("--ffcv-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ffcv_side:
        print(json.dumps(ffcv_side(args.src, args.work, args.workers, args.epochs)))
        return
    torch.set_num_threads(1)
    results = run(args, args.src)
    (args.work / "train.json").write_text(json.dumps(results, indent=2))
    print(markdown(results))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
