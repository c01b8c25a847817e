"""Check the GPU paths of the readers on a machine with CUDA, in one short run.

    python scripts/gpu_check.py [--images 2000] [--workers 8] [--out gpu_check.json]

Converts generated images (npy and wds) and a small text corpus, then checks, for
``make_loader(..., device="cuda")``:

- batches arrive on the GPU, float32, normalized on the GPU from uint8 (the workers send uint8;
  ``pin_memory`` is on) and equal to the CPU loader's batches of the same order (up to float
  rounding);
- ``BatchNormalize`` on CUDA equals the numpy CPU path;
- tar shards (wds) and padded text batches (``pad_collate`` dicts) land on the GPU too;
- throughput of float32 batches: GPU normalization vs CPU normalization in the workers, and with
  ``non_blocking`` copies overlapping the next batch;
- ``decode="device"``: random-resized crops of a JPEG output decoded by nvJPEG (torchvision) on the
  GPU, within a level of the workers' crops on average (the largest difference reported), and both
  decodes' samples/s with 2 and ``--workers``
  workers (the faster one should be the default: see readers/augment/device_decode.py).

Prints a JSON report and writes it to ``--out``; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def make_images(root: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(n):
        small = rng.integers(0, 256, size=(24, 32, 3), dtype=np.uint8)
        path = root / f"c{i % 4}" / f"{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(small).resize((320, 240), Image.BILINEAR).save(path, quality=90)


def rate(loader, epochs: int = 2) -> float:
    """Samples/s over ``epochs`` passes after a warm-up pass, synchronizing at the end."""
    for _ in loader:
        pass
    n, start = 0, time.perf_counter()
    for _ in range(epochs):
        for images, labels, *_ in loader:
            n += len(labels)
            images.sum()  # use the batch, as a training step would
    torch.cuda.synchronize()
    return n / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from packer import ConvertConfig, PreprocessConfig, convert
    from packer.advisor.host import describe_host
    from packer.config import ImageCodec
    from readers import BatchNormalize, RandomResizedCrop, make_loader, open_dataset

    report: dict = {"torch": torch.__version__, "cuda": torch.cuda.is_available(), "host": describe_host().to_dict()}
    failures: list[str] = []

    def check(name: str, ok: bool, detail: object = None) -> None:
        report.setdefault("checks", {})[name] = {"ok": bool(ok), "detail": detail}
        if not ok:
            failures.append(name)

    if not torch.cuda.is_available():
        print(json.dumps(report))
        return 1
    report["device"] = torch.cuda.get_device_name(0)
    work = Path(tempfile.mkdtemp(prefix="packer-gpu-"))
    src = work / "images"
    make_images(src, args.images)
    pre = PreprocessConfig(size=(224, 224))
    outs = {
        fmt: convert(src, work / fmt, ConvertConfig(fmt, pre), workers=args.workers).output for fmt in ("npy", "wds")
    }

    ds = open_dataset(outs["npy"])
    gpu = make_loader(ds, 64, device="cuda", seed=3, num_workers=args.workers)
    cpu = make_loader(ds, 64, seed=3, num_workers=args.workers)
    check("pin_memory on with device=cuda", gpu.loader.pin_memory is True, gpu.loader.pin_memory)
    check("uint8 through the workers", gpu.dataset.convert.normalize is None and gpu.normalize is not None)
    worst, batches = 0.0, 0
    for (gi, gl), (ci, cl) in zip(gpu, cpu):
        assert gi.is_cuda and gl.is_cuda
        if gi.dtype != torch.float32 or not gi.is_contiguous() or not torch.equal(gl.cpu(), cl):
            check("gpu batch dtype, layout and labels", False, (str(gi.dtype), gi.is_contiguous()))
            break
        worst = max(worst, float((gi.cpu() - ci).abs().max()))
        batches += 1
    check(
        "gpu batches equal cpu batches (max abs diff < 1e-5)",
        worst < 1e-5 and batches == len(cpu),
        {"max_abs_diff": worst, "batches": batches},
    )

    norm = BatchNormalize(ds.manifest)
    x = torch.randint(0, 256, (8, 3, 224, 224), dtype=torch.uint8)
    diff = float((norm(x.cuda()).cpu() - norm(x)).abs().max())
    check("BatchNormalize cuda == cpu", diff < 1e-5, diff)

    wds = make_loader(open_dataset(outs["wds"]), 64, device="cuda", num_workers=min(args.workers, 4))
    seen = 0
    for images, labels in wds:
        assert images.is_cuda and images.dtype == torch.float32
        seen += len(labels)
    check("wds batches on the gpu, every sample once", seen == args.images, seen)

    texts = work / "texts"
    for i in range(200):
        (texts / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (texts / f"c{i % 2}" / f"{i:04d}.txt").write_text("word " * (1 + i % 37))
    tds = open_dataset(convert(texts, work / "texts-npy", ConvertConfig("npy"), workers=2).output)
    tb = next(iter(make_loader(tds, 16, device="cuda", num_workers=2)))
    check("text batches: labels on the gpu, texts as lists", tb["labels"].is_cuda and len(tb["texts"]) == 16)

    report["float32 samples/s, 64 per batch"] = {
        "normalized on the gpu (uint8 pinned, non_blocking)": rate(gpu),
        "normalized in the workers, then copied": rate(
            _CpuThenCopy(make_loader(ds, 64, num_workers=args.workers, pin_memory=True))
        ),
    }
    # decode="device": the JPEG crops of a training read decoded by nvJPEG on the GPU, against the workers
    jpeg = convert(
        src,
        work / "npy-jpeg",
        ConvertConfig("npy", PreprocessConfig(resize="max", size=(256, 256)), codec=ImageCodec("jpeg")),
        workers=args.workers,
    ).output
    crops = open_dataset(jpeg, crop=RandomResizedCrop(224), flip=True)
    on_gpu = make_loader(crops, 64, device="cuda", seed=5, num_workers=args.workers, decode="device")
    in_workers = make_loader(crops, 64, device="cuda", seed=5, num_workers=args.workers)
    worst, mean, batches = 0.0, 0.0, 0
    for (gi, gl), (wi, wl) in zip(on_gpu, in_workers):
        if not (gi.is_cuda and gi.dtype == torch.float32 and torch.equal(gl, wl)):
            check("decode=device: float32 batches on the gpu, labels equal", False, (str(gi.device), str(gi.dtype)))
            break
        levels = (gi - wi).abs() * 255 * 0.225  # in levels (ImageNet's smallest std: an upper bound)
        worst, mean, batches = max(worst, float(levels.max())), mean + float(levels.mean()), batches + 1
    # torchvision bounds nvJPEG against libjpeg-turbo by the mean difference, not the largest: so do we
    check(
        "decode=device crops within a level of the workers' on average (nvJPEG vs libjpeg-turbo)",
        mean / max(batches, 1) <= 1 and batches == len(in_workers),
        {"mean_levels": mean / max(batches, 1), "max_levels": worst, "batches": batches},
    )
    # The same batch with each crop's MCUs spliced (the default) and with the whole files: a box moved
    # wrongly onto its part would be many levels off; nvJPEG may pick another backend by size, so a
    # level is the bound here too
    check(
        "decode=device: the MCUs of each crop give nvJPEG's crops of the whole files",
        *_splice_gap(crops, device="cuda", seed=5, num_workers=0, decode="device"),
    )
    report["RandomResizedCrop(224) + flip from max-256 jpeg, float32 samples/s on the gpu"] = {
        f"decode={where}, {w} workers": rate(make_loader(crops, 64, device="cuda", seed=5, num_workers=w, decode=where))
        for w in sorted({2, args.workers})
        for where in ("workers", "device")
    }

    report["failures"] = failures
    text = json.dumps(report, indent=1, default=str)
    print(text)
    args.out.write_text(text)
    return 1 if failures else 0


def _splice_gap(dataset, **options) -> tuple[bool, dict]:
    """Whether the first batch of ``make_loader(dataset, 64, **options)`` (in-process: ``num_workers=0``)
    is within a level on average of the same batch made from whole JPEG files, and the levels apart."""
    from readers import make_loader
    from readers.augment import jpeg_region

    spliced = next(iter(make_loader(dataset, 64, **options)))[0]
    splice, jpeg_region.splice = jpeg_region.splice, lambda *args: None
    try:
        whole = next(iter(make_loader(dataset, 64, **options)))[0]
    finally:
        jpeg_region.splice = splice
    levels = (spliced.float() - whole.float()).abs() * 255 * 0.225  # ImageNet's smallest std: an upper bound
    return float(levels.mean()) <= 1, {"mean_levels": float(levels.mean()), "max_levels": float(levels.max())}


class _CpuThenCopy:
    """A loader without device (float32 made by the workers), each batch then copied to the GPU."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __iter__(self):
        for images, labels in self.loader:
            yield images.to("cuda", non_blocking=True), labels.to("cuda", non_blocking=True)


if __name__ == "__main__":
    sys.exit(main())
