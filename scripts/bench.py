"""packer's benchmark: conversion and read throughput of every format and codec, as ratios measured in one run.

    python scripts/bench.py                       # 3,000 generated ImageNet-like JPEGs, 2 workers
    python scripts/bench.py --peers               # also WebDataset, LitData, MosaicML Streaming
    python scripts/bench.py --src ~/images --formats npy,lmdb --codecs raw,jpeg --out results/
    python scripts/bench.py --detection-check     # conversion with COCO boxes against the same images without
    python scripts/bench.py --grow-check          # repack, combine and append against a fresh conversion
    python scripts/bench.py --plot-from docs/images/bench.json --plot docs/images/bench.png   # a run's chart again

For each format and codec: conversion images/s (ratio to the bare decode+resize floor), output
bytes, peak memory of the converter (largest process), and read samples/s of shuffled batches of
64 through ``readers.make_loader`` for float32 (normalized) and uint8 batches at 0 and N workers
(ratio to a plain-folder DataLoader that decodes each file per sample, and, where SPDL is
installed, to the faster of it and SPDL's thread-based folder pipeline, ``SpdlFolder``), with the
peak memory of the reading processes (PSS: shared pages counted once). ``--peers`` runs the same task through the
peers installed (``pip install -e .[bench]``; see scripts/bench_peers.py). Writes ``bench.json``
(with the host, the date and the commit), ``bench.md`` and the chart (matplotlib, when installed;
``--plot``, default ``bench.png``) into ``--out``.

The machines are shared and noisy: compare ratios from one run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import shutil
import subprocess
import sys
import time
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from packer.advisor import FolderDataset, PeakMemory  # noqa: E402
from packer.advisor.host import Host, describe_host  # noqa: E402
from packer.config import PreprocessConfig  # noqa: E402
from packer.pixels.preprocess import keep_image_memory, load_image  # noqa: E402
from packer.sources.discover import discover  # noqa: E402
from packer.spec.registry import FORMAT_NAMES  # noqa: E402
from packer.system import usable_cpus  # noqa: E402
from readers import make_loader, open_dataset  # noqa: E402

BATCH = 64


def make_images(out: Path, count: int) -> None:
    """``count`` ImageNet-like JPEGs (500x375 and 375x500, quality 90) in 10 classes, cut from the
    photographs in sample_data/images with random crops and noise, so that no two are alike."""
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


def load(path: str, size: int = 224) -> np.ndarray:
    """Bare decode + resize as hand-written scripts and the peers' users do it, with Pillow alone:
    torchvision's image loader (``Image.open(path).convert("RGB")``: the whole JPEG decoded), then
    torchvision's ``Resize(size)`` and ``CenterCrop(size)`` as they act on a PIL image (the shorter
    side to ``size``, the longer to ``int(size * long / short)``, bilinear; the crop at offsets
    rounded half to even), packer's default geometry. On the benchmark's JPEGs (RGB, no EXIF
    orientation) the same pixels as packer with ``reduced_decode=False``, without packer's own
    decoder (which reads plain JPEGs through libjpeg-turbo's TurboJPEG API, ~9% faster than
    Image.open)."""
    with Image.open(path) as img:
        img = img.convert("RGB")
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_w, new_h = (size, int(size * long / short)) if w <= h else (int(size * long / short), size)
    if (new_w, new_h) != (w, h):
        img = img.resize((new_w, new_h), Image.Resampling.BILINEAR)
    left, top = int(round((new_w - size) / 2.0)), int(round((new_h - size) / 2.0))
    return np.asarray(img.crop((left, top, left + size, top + size)))


def load_packer(path: str) -> np.ndarray:
    """packer's own decode + resize with the default options: JPEGs scaled while decoding (packer.pixels.jpeg).
    ``floor`` runs it in processes set up as packer's workers (``preprocess.keep_image_memory``)."""
    return load_image(path, PreprocessConfig())


def _decode_all(fn: Callable[[str], np.ndarray], paths: list[str]) -> int:
    for p in paths:
        fn(p)
    return len(paths)


def floor(paths: list[str], workers: int, fn: Callable[[str], np.ndarray] = load) -> float:
    """Images/s of ``fn`` (bare decode + resize, no writing) in ``workers`` processes."""
    setup = keep_image_memory if fn is load_packer else None
    start = time.perf_counter()
    with get_context("fork").Pool(workers, initializer=setup) as pool:
        done = sum(pool.map(partial(_decode_all, fn), [paths[k::workers] for k in range(workers)]))
    return done / (time.perf_counter() - start)


def read_rate(make: Callable[[], object], epochs: int) -> tuple[float, int]:
    """(samples/s, peak PSS bytes) over ``epochs`` epochs after one warm-up epoch, loader start included
    in the warm-up only (persistent workers). Memory is sampled during the warm-up epoch only: reading
    /proc/PID/smaps_rollup of processes that map large files costs enough CPU to slow the reads."""
    from bench_train import count_rate

    with PeakMemory() as mem:
        loader = make()
        for _ in loader:
            pass
    rate = count_rate(loader, epochs)
    del loader
    return rate, mem.peak


def timed_pairs(
    run: Callable[[], dict], items: list, workers: int, repeat: int, own: Optional[Callable[[str], np.ndarray]] = None
) -> dict:
    """Run a conversion ``repeat`` times, each right after floor measurements, and keep medians.

    Shared machines drift in speed by tens of percent within a minute: a ratio is only meaningful
    between neighbouring measurements, and the median of several pairs is what is reported.
    ``ratio`` is to the floor of ``load`` (Pillow's full decode: what the peers and hand-written
    scripts do); ``own_ratio`` to the floor of the tool's own decode ``own`` (packer: reduced JPEG
    decoding), i.e. what writing costs it. ``cpu_ratio`` is the own floor's CPU seconds over the
    conversion's for the same images (median): the share of the conversion's work that is
    decoding, unaffected by a neighbour slowing the clock (but blind to waiting on the disk). The
    peak memory is the largest total PSS of the conversion's processes over all runs.
    """
    paths = [p for p, _ in items]
    own = own or load
    floors, owns, rates, ratios, own_ratios, peaks, cpu = [], [], [], [], [], [], []
    for _ in range(repeat):
        if own is not load:
            floors.append(floor(paths, workers))
        before = _cpu_seconds()
        owns.append(floor(paths, workers, own))
        middle = _cpu_seconds()
        if own is load:
            floors.append(owns[-1])
        # The converter's processes, not this benchmark's; sampled rarely, as its CPU counts in the ratio.
        with PeakMemory(children_only=True, every=0.5) as mem:
            c = run()
        cpu.append((middle - before) / (_cpu_seconds() - middle))
        rates.append(len(items) / c["seconds"])
        ratios.append(rates[-1] / floors[-1])
        own_ratios.append(rates[-1] / owns[-1])
        peaks.append(mem.peak)
    c.update(
        floor=float(np.median(floors)),
        own_floor=float(np.median(owns)),
        images_per_s=float(np.median(rates)),
        ratio=float(np.median(ratios)),
        ratios=ratios,
        own_ratio=float(np.median(own_ratios)),
        peak_pss=max(peaks),
        cpu_ratio=float(np.median(cpu)),
    )
    return c


def _cpu_seconds() -> float:
    """CPU seconds used so far by this process and its finished children (the work, whatever the wall clock)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def convert_subprocess(
    src: Path, out: Path, fmt: str, codec: str, workers: int, annotations: Optional[Path] = None
) -> dict:
    """Run one conversion in a fresh process (imports not timed); its seconds and output bytes
    (``annotations``: a COCO file whose boxes the conversion carries, packer.targets.detection)."""
    detection = f"DetectionConfig({str(annotations)!r}, coords='stored')" if annotations else "None"
    code = (
        "import sys, time, json; from packer import ConvertConfig, convert; "
        "from packer.config import DetectionConfig, ImageCodec; "
        f"cfg = ConvertConfig({fmt!r}, codec=ImageCodec({codec!r}), detection={detection}); "
        "t = time.perf_counter(); r = convert(sys.argv[1], sys.argv[2], cfg, workers=int(sys.argv[3])); "
        "print(json.dumps({'seconds': time.perf_counter() - t, 'samples': r.manifest.samples}))"
    )
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(src), str(out), str(workers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    text = proc.stdout.read() if proc.stdout else b""
    if proc.wait():
        raise RuntimeError(f"conversion to {fmt}/{codec} failed (status {proc.returncode})")
    result = json.loads(text)
    result["bytes"] = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return result


def packer_loader(root: Path, dtype: str, workers: int):
    """make_loader over a packer output, what users of packer write (tar shards: 1000-sample shuffle buffer)."""
    return make_loader(open_dataset(root, normalize=dtype == "float32"), BATCH, num_workers=workers)


def plain_loader(items: list[tuple[str, int]], dtype: str, workers: int):
    """The baseline without conversion: decode, resize (and normalize for float32) each file every epoch."""
    return DataLoader(
        FolderDataset(items, PreprocessConfig(), normalize=dtype == "float32"),
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )


class SpdlFolder:
    """The classification task's folder pipeline through SPDL, Meta's thread-based loader (issue 42:
    "N x the folder" is against the best folder loader a user could pick): each epoch a
    ``spdl.pipeline`` pipeline whose ``threads`` threads demux and decode each JPEG with FFmpeg,
    resized as ``load`` does (the shorter side to 224, bilinear) and center-cropped by an FFmpeg
    filter graph, made a CHW tensor (normalized float32, or uint8) in the same thread, batched by
    ``BATCH``, in a shuffled order. Threads need no worker processes: its decoding releases the GIL."""

    def __init__(self, items: list[tuple[str, int]], dtype: str, threads: int, size: int = 224) -> None:
        self.items, self.threads, self.size, self.epoch = items, threads, size, 0
        self.normalize = dtype == "float32"
        self.mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        self.std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def load(self, index: int) -> tuple[torch.Tensor, int]:
        import spdl.io

        path, label = self.items[index]
        packets = spdl.io.demux_image(path)
        w, h, size = packets.width, packets.height, self.size
        new_w, new_h = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
        left, top = int(round((new_w - size) / 2.0)), int(round((new_h - size) / 2.0))
        graph = f"scale={new_w}:{new_h}:flags=bilinear,crop={size}:{size}:{left}:{top},format=rgb24"
        frames = spdl.io.decode_packets(packets, filter_desc=graph)
        x = torch.from_numpy(spdl.io.to_numpy(spdl.io.convert_frames(frames))).permute(2, 0, 1)
        if self.normalize:
            x = (x.float().div_(255) - self.mean) / self.std
        return x, label

    def collate(self, samples: list) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])

    def __iter__(self):
        from bench_train import spdl_batches

        order = torch.randperm(len(self.items), generator=torch.Generator().manual_seed(self.epoch)).tolist()
        self.epoch += 1
        yield from spdl_batches(order, self.load, self.collate, self.threads, BATCH)


def spdl_rates(items: list[tuple[str, int]], workers: int, epochs: int) -> Optional[dict]:
    """The classification reads through ``SpdlFolder`` with one thread ("0") and with ``workers`` and
    twice as many threads (the better as "N"), float32 and uint8; None where SPDL is not installed."""
    from bench_train import spdl_available

    if not spdl_available():
        return None
    rates: dict = {}
    for dtype in ("float32", "uint8"):
        rates[f"{dtype}/0"] = read_rate(partial(SpdlFolder, items, dtype, 1), epochs)[0]
        found = {t: read_rate(partial(SpdlFolder, items, dtype, t), epochs)[0] for t in (workers, 2 * workers)}
        best = max(found, key=found.get)
        rates[f"{dtype}/N"], rates[f"{dtype}/N_threads"] = found[best], best
    return rates


def markdown(results: dict) -> str:
    """The results as Markdown tables."""
    m = results["machine"]
    lines = [
        f"{Host.from_dict(m).line()}; Python {m['python']}, torch {m['torch']}; "
        f"{results['images']} JPEGs, {results['workers']} workers, batches of {BATCH}.",
        "",
        f"Conversion floor (bare decode+resize, {results['workers']} processes, no writing) at the start: "
        f"{results['floor']:.0f} images/s with Pillow's full decode (what the peers and hand-written scripts "
        f"do), {results['own_floor']:.0f} with packer's own decoding (JPEGs scaled while decoding). "
        f"Conversions: median of {results['repeat']} runs, each ratio to the floors measured right before it "
        "(× floor: to the full decode; × own: to the tool's own decode, what writing costs, on the wall clock "
        "and in CPU seconds); peak memory = largest total PSS of all the conversion's processes.",
        "",
        "| tool | format/codec | convert img/s | × floor | × own | × own (CPU) | output MB "
        "| convert peak MB | float32 0w | float32 Nw | uint8 0w | uint8 Nw | read peak MB |",
        "|" + "---|" * 13,
    ]
    base = results["plain"]
    lines.append(
        f"| plain folder | - | - | - | - | - | - | - | {base['float32/0']:.0f} | {base['float32/N']:.0f} | "
        f"{base['uint8/0']:.0f} | {base['uint8/N']:.0f} | {base['peak'] / 2**20:.0f} |"
    )
    spdl = results.get("spdl")
    if spdl:
        cells = [f"{spdl[k]:.0f} ({spdl[k] / base[k]:.1f}x)" for k in ("float32/0", "float32/N", "uint8/0", "uint8/N")]
        lines.append("| SPDL folder pipeline (threads) | - | - | - | - | - | - | - | " + " | ".join(cells) + " | - |")
    for row in results["rows"]:
        c = row.get("convert", {})
        rate = c.get("images_per_s")
        r = row["read"]
        cells = [
            f"{r[k]:.0f} ({r[k] / base[k]:.1f}x)" if r.get(k) else "-"
            for k in ("float32/0", "float32/N", "uint8/0", "uint8/N")
        ]
        lines.append(
            f"| {row['tool']} | {row['format']} | {rate:.0f} | {c['ratio']:.2f} | {c.get('own_ratio', c['ratio']):.2f} "
            f"| {c.get('cpu_ratio', 0):.2f} | "
            f"{c.get('bytes', 0) / 2**20:.0f} | {c.get('peak_pss', 0) / 2**20:.0f} | "
            + " | ".join(cells)
            + f" | {r.get('peak', 0) / 2**20:.0f} |"
            if rate
            else f"| {row['tool']} | {row['format']} | - | - | - | - | - | - | " + " | ".join(cells) + " | - |"
        )
    lines += [
        "",
        "Read figures are samples/s, with the ratio to the plain folder; Nw = "
        f"{results['workers']} DataLoader workers, 0w = reading in the main process"
        + (
            f" (SPDL: 1 thread, and the better of {results['workers']} and {2 * results['workers']} threads)."
            if spdl
            else "."
        ),
    ]
    if spdl:
        lines += ["", *best_folder_lines(results)]
    return "\n".join(lines) + "\n"


def best_folder_lines(results: dict) -> list[str]:
    """Each packer row's reads against the faster folder pipeline (the plain DataLoader one, or SPDL's),
    key by key: "N x the folder" as issue 42 states it."""
    base, spdl = results["plain"], results.get("spdl") or {}
    keys = ("float32/0", "float32/N", "uint8/0", "uint8/N")
    best = {k: max(base[k], spdl.get(k, 0)) for k in keys}
    lines = [
        "Against the faster folder pipeline of the two, each read: "
        + ", ".join(f"{k} {best[k]:.0f} ({'SPDL' if spdl.get(k, 0) > base[k] else 'plain'})" for k in keys)
        + ".",
        "",
        "| packer | " + " | ".join(keys) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    for row in results["rows"]:
        if row["tool"] == "packer":
            r = row["read"]
            lines.append(f"| {row['format']} | " + " | ".join(f"{r[k] / best[k]:.1f}x" for k in keys) + " |")
    return lines


def _commit() -> Optional[str]:
    """The checkout's commit (short), with ``+changes`` when files differ from it; None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    except OSError:
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def chart(results: dict, path: Path) -> bool:
    """A bar chart of conversion and float32/uint8 read rates; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows, m = results["rows"], results["machine"]
    names = [f"{r['tool']}\n{r['format']}" for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(min(16, max(10, 0.6 * len(rows) * 3)), 4.5))
    panels = [
        (
            "convert images/s",
            [r.get("convert", {}).get("images_per_s", 0) for r in rows],
            results["floor"],
            "decode floor",
        ),
        (
            "float32 samples/s, N workers",
            [r["read"].get("float32/N", 0) for r in rows],
            results["plain"]["float32/N"],
            "plain folder",
        ),
        (
            "uint8 samples/s, N workers",
            [r["read"].get("uint8/N", 0) for r in rows],
            results["plain"]["uint8/N"],
            "plain folder",
        ),
    ]
    for ax, (title, values, line, label) in zip(axes, panels):
        colors = ["tab:blue" if r["tool"] == "packer" else "tab:gray" for r in rows]
        ax.bar(range(len(values)), values, color=colors)
        ax.axhline(line, color="tab:red", linestyle="--", label=label)
        ax.set_xticks(range(len(values)), names, rotation=60, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    when = ", ".join(str(results[k]) for k in ("date", "commit") if results.get(k))
    fig.suptitle(
        f"packer bench: {results['images']} images, {results['workers']} workers; {m['cpu']}, {m['cores']} cores, "
        f"{m.get('simd', 'SIMD not recorded')}" + (f"; {when}" if when else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def draft_check(count: int = 12) -> None:
    """Speed and pixel difference of reduced JPEG decoding (packer.pixels.jpeg) against a full decode, to
    224x224, on JPEGs (quality 90) made from the sample photographs at 2000x1500 and 500x375."""
    import io

    from packer.pixels.preprocess import decode

    photos = sorted((ROOT / "sample_data" / "images").glob("*/*"))[:count]
    for size in ((2000, 1500), (500, 375)):
        data = []
        for p in photos:
            buf = io.BytesIO()
            Image.open(p).convert("RGB").resize(size, Image.BICUBIC).save(buf, "JPEG", quality=90)
            data.append(buf.getvalue())
        rates, pixels = {}, {}
        for reduced in (False, True, False, True):  # twice each, the second kept: warm caches, fair to both
            cfg = PreprocessConfig(reduced_decode=reduced)
            start = time.perf_counter()
            pixels[reduced] = [decode(d, cfg).pixels.astype(np.int16) for d in data * 8]
            rates[reduced] = 8 * len(data) / (time.perf_counter() - start)
        diff = np.concatenate([np.abs(a - b).ravel() for a, b in zip(pixels[True], pixels[False])])
        print(
            f"reduced JPEG decode, {len(data)} photographs {size[0]}x{size[1]} -> 224x224: {rates[True]:.0f} vs "
            f"{rates[False]:.0f} images/s ({rates[True] / rates[False]:.2f}x); |difference| mean {diff.mean():.2f}, "
            f"{(diff <= 1).mean():.1%} within 1 level, 99th percentile {np.percentile(diff, 99):.0f}, max "
            f"{diff.max()} (0..255 levels)",
            flush=True,
        )


def write_boxes(src: Path, path: Path, per_image: int = 6, seed: int = 0) -> int:
    """A COCO instances file for the images under ``src``: ``per_image`` random boxes on each, in 20
    categories, on the stored pixel grid. Returns the number of boxes."""
    rng = np.random.default_rng(seed)
    images, annotations = [], []
    for i, item in enumerate(discover(src).items):
        with Image.open(item.path) as img:
            w, h = img.size
        images.append({"id": i, "file_name": item.relpath, "width": w, "height": h})
        for _ in range(per_image):
            bw, bh = rng.uniform(0.05, 0.5) * w, rng.uniform(0.05, 0.5) * h
            x, y = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            annotations.append(
                {
                    "id": len(annotations),
                    "image_id": i,
                    "category_id": int(rng.integers(20)),
                    "bbox": [x, y, bw, bh],
                    "area": bw * bh,
                    "iscrowd": 0,
                }
            )
    categories = [{"id": k, "name": f"class{k:02d}"} for k in range(20)]
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return len(annotations)


def detection_check(src: Path, work: Path, workers: int, repeat: int, fmt: str = "npy") -> None:
    """Conversion of ``src`` with COCO boxes (``write_boxes``) against the same images without, in
    alternating pairs (ratios between neighbours; the median kept): what carrying boxes costs."""
    boxes = write_boxes(src, work / "boxes.json")
    plain, boxed, cpu_plain, cpu_boxed = [], [], [], []
    for _ in range(repeat):
        for seconds, cpu, coco in ((plain, cpu_plain, None), (boxed, cpu_boxed, work / "boxes.json")):
            before = _cpu_seconds()
            seconds.append(convert_subprocess(src, work / "out", fmt, "raw", workers, coco)["seconds"])
            cpu.append(_cpu_seconds() - before)  # the conversion's processes: its whole work, whatever the clock
    ratios = [p / b for p, b in zip(plain, boxed)]
    cpu_ratios = [b / p for p, b in zip(cpu_plain, cpu_boxed)]
    n = len(discover(src).items)
    print(
        f"detection check, {n} images, {boxes} COCO boxes, {fmt}, {workers} workers: with boxes "
        f"{n / float(np.median(boxed)):.0f} images/s, without {n / float(np.median(plain)):.0f} images/s; speed with "
        f"boxes / without: median {float(np.median(ratios)):.1%} (pairs {', '.join(f'{r:.1%}' for r in ratios)}); "
        f"CPU seconds with / without (imports included): median {float(np.median(cpu_ratios)):.1%} "
        f"(pairs {', '.join(f'{r:.1%}' for r in cpu_ratios)})",
        flush=True,
    )


def _packer_cli(*args: str) -> float:
    """Seconds of one ``packer`` command in a fresh process (imports included, as a user runs it)."""
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "packer", *args, "-q"],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t


def grow_check(src: Path, work: Path, workers: int, repeat: int, fmt: str = "lmdb") -> None:
    """Repack, combine and append against a fresh conversion of the same images, each run as the
    ``packer`` command (imports included), in rounds (medians kept): repack ``fmt`` -> npy and wds,
    combine the two halves' outputs into one, append the second half to the first half's output."""
    halves = [work / "grow-a", work / "grow-b"]
    files = sorted(p for p in src.rglob("*") if p.is_file())
    for half in halves:
        shutil.rmtree(half, ignore_errors=True)
    for n, path in enumerate(files):
        target = halves[n % 2] / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(path.resolve())
    both = work / "grow-both"
    shutil.rmtree(both, ignore_errors=True)
    for path in files:
        (both / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
        (both / path.relative_to(src)).symlink_to(path.resolve())
    j = str(workers)
    times: dict[str, list[float]] = {k: [] for k in ("fresh", "repack-npy", "repack-wds", "combine", "append")}
    for _ in range(repeat):
        out = {k: work / f"grow-{k}-out" for k in ("fresh", "a", "b", "npy", "wds", "combined", "appended")}
        for path in out.values():
            shutil.rmtree(path, ignore_errors=True)
        times["fresh"].append(_packer_cli("convert", str(both), "-f", fmt, "-o", str(out["fresh"]), "-j", j))
        times["repack-npy"].append(
            _packer_cli("convert", str(out["fresh"]), "-f", "npy", "-o", str(out["npy"]), "-j", j)
        )
        times["repack-wds"].append(
            _packer_cli("convert", str(out["fresh"]), "-f", "wds", "-o", str(out["wds"]), "-j", j)
        )
        _packer_cli("convert", str(halves[0]), "-f", fmt, "-o", str(out["a"]), "-j", j)
        _packer_cli("convert", str(halves[1]), "-f", fmt, "-o", str(out["b"]), "-j", j)
        times["combine"].append(
            _packer_cli("combine", str(out["a"]), str(out["b"]), "-o", str(out["combined"]), "-j", j)
        )
        shutil.copytree(out["a"], out["appended"])
        times["append"].append(
            _packer_cli("convert", str(both), "-f", fmt, "-o", str(out["appended"]), "--append", "-j", j)
        )
    fresh = float(np.median(times["fresh"]))
    print(
        f"grow check, {len(files)} images, {fmt}, {workers} workers, {repeat} rounds, median seconds of the packer "
        f"command (imports included): fresh conversion {fresh:.2f} s",
        flush=True,
    )
    for key, what in (
        ("repack-npy", f"repack {fmt} -> npy"),
        ("repack-wds", f"repack {fmt} -> wds"),
        ("combine", "combine the two halves"),
        ("append", "append the second half to the first"),
    ):
        t = float(np.median(times[key]))
        print(f"  {what}: {t:.2f} s, {fresh / t:.1f}x the fresh conversion's speed", flush=True)


def memory_check(root: Path, workers: int) -> None:
    """Peak PSS (all processes) of one epoch through make_loader with ``workers`` workers, reading an
    output from its files and with ``in_memory=True`` (one shared copy, not one per worker)."""
    size = sum(f.bytes for shard in open_dataset(root).manifest.shards for f in shard.files)
    for in_memory in (False, True):
        with PeakMemory() as mem:
            loader = make_loader(open_dataset(root, in_memory=in_memory), BATCH, num_workers=workers)
            for _ in loader:
                pass
            del loader
        print(
            f"in_memory={in_memory}: peak PSS {mem.peak / 2**20:.0f} MB with {workers} workers "
            f"(output {size / 2**20:.0f} MB)",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=3000, help="JPEGs to generate (ignored with --src)")
    parser.add_argument("--src", type=Path, help="a folder of images to use instead of generated ones")
    parser.add_argument("--workers", type=int, default=min(2, usable_cpus()))
    parser.add_argument("--formats", default=",".join(FORMAT_NAMES))
    parser.add_argument("--codecs", default="raw,jpeg")
    parser.add_argument("--epochs", type=int, default=2, help="timed read epochs (after one warm-up)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="floor + conversion pairs per output; with --train-check, rounds of every conversion "
        "and read (medians kept)",
    )
    parser.add_argument("--peers", action="store_true", help="also run WebDataset, LitData, Streaming if installed")
    parser.add_argument(
        "--memory-check",
        type=Path,
        metavar="OUT",
        help="only measure the memory of reading OUT with and without in_memory=True, then exit",
    )
    parser.add_argument(
        "--draft-check", action="store_true", help="only measure reduced JPEG decoding against a full decode, then exit"
    )
    parser.add_argument(
        "--detection-check",
        action="store_true",
        help="only measure conversion with COCO boxes against the same images without, then exit",
    )
    parser.add_argument(
        "--grow-check",
        action="store_true",
        help="repack, combine and append against a fresh conversion of the same images",
    )
    parser.add_argument(
        "--train-check",
        action="store_true",
        help="only run the training task (random-resized crops + flips into batches; bench_train.py)",
    )
    parser.add_argument("--ffcv-python", help="with --train-check: a Python with ffcv installed, to run FFCV too")
    parser.add_argument(
        "--tokens",
        action="store_true",
        help="only run the token-block benchmark (a corpus packed with --pack, against the tokenizer floor and "
        "LitData; bench_tokens.py, whose own options it takes after --)",
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/packer-bench"))
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for bench.json, bench.md, bench.png")
    parser.add_argument("--plot", type=Path, help="where the chart goes  [default: OUT/bench.png]")
    parser.add_argument(
        "--plot-from",
        type=Path,
        metavar="BENCH_JSON",
        help="only draw the chart (--plot) of a recorded run's bench.json, then exit",
    )
    args, more = parser.parse_known_args()
    if args.plot_from is not None:
        drawn = args.plot or args.out / "bench.png"
        if not chart(json.loads(args.plot_from.read_text()), drawn):
            parser.error("--plot-from draws with matplotlib: pip install matplotlib")
        print(f"wrote {drawn}")
        return
    if args.tokens:
        import bench_tokens

        bench_tokens.run(
            bench_tokens.parser().parse_args(
                ["--work", str(args.work / "tokens"), "--workers", str(args.workers), *more]
            )
        )
        return
    if more:
        parser.error(f"unrecognized arguments: {' '.join(more)}")
    if args.draft_check:
        draft_check()
        return
    if args.memory_check:
        memory_check(args.memory_check, args.workers)
        return
    torch.set_num_threads(1)  # every tool normalizes in the main process alike (see bench_peers.py)
    src = args.src or args.work / "images"
    if args.src is None and (not src.is_dir() or len(discover(src).items) != args.images):
        shutil.rmtree(src, ignore_errors=True)
        print(f"generating {args.images} JPEGs in {src}", flush=True)
        make_images(src, args.images)
    if args.detection_check:
        detection_check(src, args.work, args.workers, max(args.repeat, 5))
        return
    if args.grow_check:
        grow_check(src, args.work, args.workers, args.repeat)
        return
    if args.train_check:
        import bench_train

        results = bench_train.run(args, src)
        (args.work / "train.json").write_text(json.dumps(results, indent=2))
        print(bench_train.markdown(results))
        return
    listing = discover(src)
    items = [(i.path, max(i.label, 0)) for i in listing.items]
    n, w = len(items), args.workers
    results: dict = {
        "images": n,
        "workers": w,
        "repeat": args.repeat,
        "rows": [],
        "machine": {**describe_host().to_dict(), "python": platform.python_version(), "torch": torch.__version__},
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "commit": _commit(),
    }
    results["floor"] = floor([p for p, _ in items], w)
    results["own_floor"] = floor([p for p, _ in items], w, load_packer)
    print(
        f"floor: {results['floor']:.0f} images/s with Pillow's full decode, {results['own_floor']:.0f} with "
        "packer's reduced decoding",
        flush=True,
    )
    plain: dict = {}
    for dtype in ("float32", "uint8"):
        for workers, key in ((0, "0"), (w, "N")):
            plain[f"{dtype}/{key}"], peak = read_rate(partial(plain_loader, items, dtype, workers), 1)
            plain["peak"] = max(plain.get("peak", 0), peak)
    results["plain"] = plain
    print(f"plain folder: {plain}", flush=True)
    for codec in args.codecs.split(","):
        for fmt in args.formats.split(","):
            out = args.work / f"{fmt}-{codec}"
            c = timed_pairs(lambda: convert_subprocess(src, out, fmt, codec, w), items, w, args.repeat, load_packer)
            row = {"tool": "packer", "format": f"{fmt}/{codec}", "convert": c, "read": {}}
            for dtype in ("float32", "uint8"):
                for workers, key in ((0, "0"), (w, "N")):
                    rate, peak = read_rate(partial(packer_loader, out, dtype, workers), args.epochs)
                    row["read"][f"{dtype}/{key}"] = rate
                    row["read"]["peak"] = max(row["read"].get("peak", 0), peak)
            results["rows"].append(row)
            print(
                f"{fmt}/{codec}: convert {c['images_per_s']:.0f}/s (median {c['ratio']:.0%} of the floor measured "
                f"just before, runs {', '.join(f'{r:.0%}' for r in c['ratios'])}; {c['own_ratio']:.0%} of packer's "
                f"own decode floor), {c['bytes'] / 2**20:.0f} MB; "
                f"reads {row['read']}",
                flush=True,
            )
    # after packer's reads: SPDL's import installs a handler that prints a stack trace in every process
    # forked after it that is ended by SIGTERM (the loaders' workers)
    results["spdl"] = spdl_rates(items, w, 1)
    print(f"SPDL folder pipeline: {results['spdl'] or 'not installed (pip install spdl)'}", flush=True)
    if args.peers:
        run_peers(args, items, results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(results, indent=2))
    (args.out / "bench.md").write_text(markdown(results))
    drawn = args.plot or args.out / "bench.png"
    drew = chart(results, drawn)
    print(markdown(results))
    print(
        f"wrote {args.out / 'bench.json'}, {args.out / 'bench.md'}"
        + (f", {drawn}" if drew else " (no chart: pip install matplotlib)")
    )


def run_peers(args: argparse.Namespace, items: list[tuple[str, int]], results: dict) -> None:
    """The same conversion and reads through each installed peer (scripts/bench_peers.py)."""
    import bench_peers

    for peer, version in bench_peers.available_peers().items():
        if version is None:
            print(f"{peer}: not installed (pip install -e .[bench])", flush=True)
            continue
        out = args.work / f"peer-{peer}"
        c = timed_pairs(
            lambda: bench_peers.peer_convert(peer, items, out, args.workers, load), items, args.workers, args.repeat
        )
        row = {"tool": f"{peer} {version}", "format": "npy bytes", "convert": c, "read": {}}
        for dtype in ("float32", "uint8"):
            for workers, key in ((0, "0"), (args.workers, "N")):
                with PeakMemory() as mem:  # the warm-up only, as in read_rate
                    bench_peers.peer_read(peer, out, batch_size=BATCH, workers=workers, dtype=dtype, epochs=1)
                r = bench_peers.peer_read(peer, out, batch_size=BATCH, workers=workers, dtype=dtype, epochs=args.epochs)
                row["read"][f"{dtype}/{key}"] = r["samples"] / r["seconds"]
                row["read"]["peak"] = max(row["read"].get("peak", 0), mem.peak)
        results["rows"].append(row)
        print(f"{peer}: convert {c['images_per_s']:.0f}/s; reads {row['read']}", flush=True)


if __name__ == "__main__":
    main()
