"""How well do make_loader's batches mix classes? Distinct classes per batch against an ideal shuffle.

    python scripts/shuffle_quality.py [--images 3000] [--classes 10] [--batch 64] [--workers 2]

Makes a labelled set whose classes are stored one after another (sorted order, the worst case for
streamed shards), converts it to every format, and also to wds with ``--shuffle 0`` (the seeded
global permutation written at conversion time). For each, it reads one epoch through
``readers.make_loader`` and reports the mean number of distinct classes per batch and the mean
total-variation distance between each batch's class histogram and the dataset's, next to the
same figures for batches cut from a uniformly random permutation (the ideal).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench import make_images  # noqa: E402

from packer import ConvertConfig, PreprocessConfig, convert  # noqa: E402
from packer.config import ShardSize  # noqa: E402
from packer.spec.registry import FORMAT_NAMES  # noqa: E402
from readers import make_loader, open_dataset  # noqa: E402


def mixing(batches: list[np.ndarray], classes: int) -> tuple[float, float]:
    """(mean distinct classes per batch, mean total-variation distance to the overall class mix)."""
    overall = np.bincount(np.concatenate(batches), minlength=classes) / sum(len(b) for b in batches)
    distinct = [len(np.unique(b)) for b in batches]
    tv = [0.5 * np.abs(np.bincount(b, minlength=classes) / len(b) - overall).sum() for b in batches]
    return float(np.mean(distinct)), float(np.mean(tv))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/packer-shuffle"))
    args = parser.parse_args()
    src = args.work / "images"
    if not src.is_dir():
        make_images(src, args.images)  # 10 classes, c0..c9; sorted storage puts each class in one run
    pre = PreprocessConfig(size=(32, 32))
    shard = ShardSize(samples=250)  # several shards per class, as a large dataset would have
    outputs = {fmt: ConvertConfig(fmt, pre, shard) for fmt in FORMAT_NAMES}
    outputs["wds --shuffle 0"] = ConvertConfig("wds", pre, shard, shuffle=0)
    rows = []
    for name, cfg in outputs.items():
        out = args.work / name.replace(" ", "")
        shutil.rmtree(out, ignore_errors=True)
        convert(src, out, cfg, workers=args.workers)
        ds = open_dataset(out)
        loader = make_loader(ds, args.batch, num_workers=args.workers, seed=1)
        batches = [labels.numpy() for _, labels in loader]
        classes = len(ds.classes)
        rows.append((name, *mixing(batches, classes)))
        labels = np.concatenate(batches)
    ideal = np.random.default_rng(0).permutation(labels)
    ideal_batches = [ideal[i : i + args.batch] for i in range(0, len(ideal), args.batch)]
    rows.append(("ideal (uniform permutation)", *mixing(ideal_batches, classes)))
    print(
        f"{len(labels)} samples, {classes} classes stored in sorted runs, batches of {args.batch}, "
        f"{args.workers} workers\n"
    )
    print("| reader | distinct classes per batch | distance to the class mix (TV) |\n|---|---|---|")
    for name, distinct, tv in rows:
        print(f"| {name} | {distinct:.2f} | {tv:.3f} |")


if __name__ == "__main__":
    main()
