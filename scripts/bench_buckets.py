"""Aspect-ratio buckets against the fixed-size random-resized-crop path, on the same outputs.

Photographs of many aspect ratios (cut from sample_data/images, 1:2.5 to 2.5:1, about 0.4 MP each)
are converted once with ``--resize max --size 512``, as raw pixels and as JPEG, then read as
shuffled float32 batches of 64 with a flip, in 2 workers, two ways taking turns in each round:

- ``RandomResizedCrop(224)``: ``open_dataset(out, crop=RandomResizedCrop(224), flip=True)``;
- buckets: ``make_loader(open_dataset(out, flip=True), 64, buckets=AspectBuckets.budget((224, 224),
  step=32, max_ratio=2.5))``, every image cropped to its bucket's ratio and resized to about 224 x 224
  pixels;
- padded buckets: the same buckets with ``fit="pad"``, every image resized whole into its bucket and
  padded.

Each rate is samples/s over ``--epochs`` epochs after one warm-up epoch, the median of ``--repeat``
rounds; the table also gives the share of the images' pixels the buckets' crops cut away next to
what centred square crops would cut, and the share of the padded batches' pixels that is padding
next to what padding each image to a square would add (``loader.describe()``).

    python scripts/bench_buckets.py --images 1200 --epochs 2 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from packer import ConvertConfig, PreprocessConfig, convert  # noqa: E402
from packer.advisor.host import describe_host  # noqa: E402
from packer.config import ImageCodec  # noqa: E402
from readers import AspectBuckets, RandomResizedCrop, make_loader, open_dataset  # noqa: E402


def make_images(out: Path, count: int) -> None:
    """``count`` JPEGs of aspect ratios drawn log-uniform in [1/2.5, 2.5], about 0.4 MP each, in 10 classes."""
    photos = [Image.open(p).convert("RGB") for p in sorted((ROOT / "sample_data" / "images").glob("*/*"))]
    rng = np.random.default_rng(0)
    for i in range(count):
        ratio = float(np.exp(rng.uniform(np.log(1 / 2.5), np.log(2.5))))
        w, h = int((400_000 * ratio) ** 0.5), int((400_000 / ratio) ** 0.5)
        img = photos[i % len(photos)].resize((w, h), Image.BICUBIC)
        folder = out / f"c{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        img.save(folder / f"{i:05d}.jpg", quality=90)


def rate(make, epochs: int) -> float:
    """Samples/s of the loader ``make()`` gives, over ``epochs`` epochs after a warm-up epoch."""
    loader = make()
    for _ in loader:
        pass
    start, n = time.perf_counter(), 0
    for _ in range(epochs):
        for images, _labels in loader:
            n += len(images)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1200)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/packer-bench-buckets"))
    args = parser.parse_args()
    src = args.work / "images"
    if not src.is_dir():
        make_images(src, args.images)
    buckets = AspectBuckets.budget((224, 224), step=32, max_ratio=2.5)
    padded = AspectBuckets(buckets.resolutions, fit="pad")
    rows = []
    for codec in ("raw", "jpeg"):
        out = args.work / f"npy-{codec}"
        if not out.is_dir():
            pre = PreprocessConfig(size=(512, 512), resize="max")
            convert(src, out, ConvertConfig("npy", pre, codec=ImageCodec(codec)), workers=args.workers)
        ways = {
            "RandomResizedCrop(224)": lambda: make_loader(
                open_dataset(out, crop=RandomResizedCrop(224), flip=True), 64, num_workers=args.workers
            ),
            "buckets": lambda: make_loader(open_dataset(out, flip=True), 64, buckets=buckets, num_workers=args.workers),
            "padded": lambda: make_loader(open_dataset(out, flip=True), 64, buckets=padded, num_workers=args.workers),
        }
        rates: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.repeat):
            for name, make in ways.items():
                rates[name].append(rate(make, args.epochs))
        about, pads = ways["buckets"]().describe(), ways["padded"]().describe()
        fixed = statistics.median(rates["RandomResizedCrop(224)"])
        row: dict = {"codec": codec, "rrc": fixed, "buckets_used": len(about["buckets"])}
        for name in ("buckets", "padded"):
            ratios = [b / f for b, f in zip(rates[name], rates["RandomResizedCrop(224)"])]
            row[name] = statistics.median(rates[name])
            row[f"{name}_ratio"] = row[name] / fixed
            row[f"{name}_range"] = [min(ratios), max(ratios)]
        for key in ("cropped_share", "square_crop_share"):
            row[key] = about[key]
        for key in ("padded_share", "square_pad_share"):
            row[key] = pads[key]
        rows.append(row)
    host = describe_host()
    print(f"{host.line()}; {args.workers} workers, {args.images} images")
    print(
        "| stored as | RandomResizedCrop(224) samples/s | buckets samples/s | buckets / RRC | padded buckets "
        "samples/s | padded / RRC | buckets used | pixels cropped by buckets | by square crops "
        "| padding in padded buckets | in padded squares |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| max 512, {r['codec']} | {r['rrc']:.0f} | {r['buckets']:.0f} | {r['buckets_ratio']:.2f}x "
            f"[{r['buckets_range'][0]:.2f}-{r['buckets_range'][1]:.2f}] | {r['padded']:.0f} "
            f"| {r['padded_ratio']:.2f}x [{r['padded_range'][0]:.2f}-{r['padded_range'][1]:.2f}] "
            f"| {r['buckets_used']} | {r['cropped_share']:.1%} | {r['square_crop_share']:.1%} "
            f"| {r['padded_share']:.1%} | {r['square_pad_share']:.1%} |"
        )
    (args.work / "buckets.json").write_text(json.dumps({"machine": host.to_dict(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
