"""What the near-duplicate search finds and costs (issue 44): how far changed copies' hashes move,
image hashing in a conversion, the search among a million hashes, and a contact sheet.

- **Copies**: the bits between each image's hashes and a changed copy's (``image_copies.CHANGES``:
  resized, JPEG quality 60, brightened, cropped 5%, all four), and between different images, for
  the sample photographs and 200 generated photograph-like images.

- **Hashing**: ``packer convert`` of the bench photographs (``bench.py``'s generated 500x375 JPEGs) with
  the image hashes (the default) against ``--no-image-hashes``, alternating, each a fresh ``packer``
  process; once with the default preprocessing, once with ``--resize none --codec source`` (kept
  JPEGs, hashed from a scaled decode, shorter side 40 or more). Wall time and CPU seconds of the
  conversion's processes.
- **Share**: the same conversions run by this process (``packer.convert``), with the workers'
  ``LooksBatch`` and ``write_shard`` timed inside them: the share of each shard's time spent
  hashing. The A/B above carries the host's noise (a pair's ratio moves by 5-10% on a shared VM);
  this one counts the hashing alone.
- **Search**: ``near_groups`` over N generated images' hashes (random, one in a
  hundred a changed copy of another), at the default distance.
- **Sheet**: ``packer preview OUT -o sheet.png`` of 64 samples of an LMDB output, a fresh process
  (imports included, as a user runs it).

Usage: ``python scripts/bench_looks.py [--images 2000] [--repeat 3] [--hashes 1000000] [--work DIR]``.
Prints the host line and a table; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench import make_images  # noqa: E402 - scripts/ is not a package
from image_copies import CHANGES, textured  # noqa: E402

from packer.advisor.host import describe_host  # noqa: E402
from packer.config import DUP_DISTANCE  # noqa: E402
from packer.output.near_duplicates import near_groups, popcount  # noqa: E402
from packer.pixels.looks import image_looks  # noqa: E402


def _children_cpu() -> float:
    """CPU seconds of this process's finished children."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def packer(*args: str) -> tuple[float, float]:
    """Wall and CPU seconds of one ``packer`` command in a fresh process."""
    cpu, started = _children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "packer", *args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started, _children_cpu() - cpu


def hashing(src: Path, work: Path, repeat: int, workers: int) -> list[dict]:
    """Conversions with and without the image hashes, alternating, ``repeat`` pairs per preprocessing."""
    rows = []
    for name, options in (("default", []), ("--resize none --codec source", ["--resize", "none", "--codec", "source"])):
        timings: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for round_ in range(repeat):
            for hashed in (True, False) if round_ % 2 == 0 else (False, True):
                out = work / "out"
                shutil.rmtree(out, ignore_errors=True)
                extra = [] if hashed else ["--no-image-hashes"]
                command = ["convert", str(src), "-f", "npy", "-o", str(out), "-q", "-j", str(workers)]
                timings[hashed].append(packer(*command, *options, *extra))
        wall = [a[0] / b[0] for a, b in zip(timings[True], timings[False])]
        cpu = [a[1] / b[1] for a, b in zip(timings[True], timings[False])]
        rows.append(
            {
                "preprocessing": name,
                "with": float(np.median([t[0] for t in timings[True]])),
                "without": float(np.median([t[0] for t in timings[False]])),
                "wall": wall,
                "cpu": cpu,
            }
        )
    return rows


def hashing_share(src: Path, work: Path, workers: int) -> list[dict]:
    """The share of the workers' shard time spent hashing, per preprocessing (see the docstring)."""
    import os
    import tempfile

    import packer.run.worker as worker
    from packer import ConvertConfig, PreprocessConfig, convert
    from packer.pixels.looks import LooksBatch
    from packer.spec.sample_layout import ImageCodec

    spent = [0.0]
    timed = {name: getattr(LooksBatch, name) for name in ("add", "table")}

    def timing(method):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started

        return wrapper

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "shards.txt"
        write_shard = worker.write_shard

        def shard(*args, **kwargs):
            spent[0], started = 0.0, time.perf_counter()
            try:
                return write_shard(*args, **kwargs)
            finally:  # forked workers: each appends its own line
                with open(log, "a") as f:
                    f.write(f"{os.getpid()} {spent[0]} {time.perf_counter() - started}\n")

        rows = []
        source = {"preprocess": PreprocessConfig(resize="none"), "codec": ImageCodec("source")}
        for name, options in (("default", {}), ("--resize none --codec source", source)):
            for method in timed:
                setattr(LooksBatch, method, timing(timed[method]))
            worker.write_shard = shard
            try:
                out = work / "share"
                shutil.rmtree(out, ignore_errors=True)
                log.write_text("")
                convert(src, out, ConvertConfig("npy", **options), workers=workers)
            finally:
                worker.write_shard = write_shard
                for method, original in timed.items():
                    setattr(LooksBatch, method, original)
            lines = [line.split() for line in log.read_text().splitlines()]
            hashing, total = sum(float(h) for _, h, _ in lines), sum(float(t) for *_, t in lines)
            rows.append({"preprocessing": name, "shards": len(lines), "hashing": hashing, "shard": total})
        return rows


def generated_hashes(count: int, seed: int = 0) -> np.ndarray:
    """``count`` images' hashes: random, one in a hundred remade as a copy of another (its own hash one
    of the other's six with up to 4 bits flipped)."""
    rng = np.random.default_rng(seed)
    looks = rng.integers(0, 2**64, (count, 6), dtype=np.uint64, endpoint=False)
    copies = np.arange(0, count, 100)
    originals = rng.integers(0, count, len(copies))
    flips = np.zeros(len(copies), np.uint64)
    for _ in range(4):
        flips |= np.uint64(1) << rng.integers(0, 64, len(copies)).astype(np.uint64)
    looks[copies, 0] = looks[originals, rng.integers(0, 6, len(copies))] ^ flips
    return looks


def search(count: int, repeat: int) -> dict:
    """Seconds of the near-duplicate search among ``count`` generated images' hashes (median of ``repeat``)."""
    looks = generated_hashes(count)
    seconds, found = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        found = len(near_groups(looks, DUP_DISTANCE))
        seconds.append(time.perf_counter() - started)
    return {"hashes": count, "seconds": seconds, "groups": found}


def apart(a: np.ndarray, b: np.ndarray) -> int:
    """The bits at which two images' hashes match: each one's own hash against the other's six."""
    return int(min(popcount(a[0] ^ b).min(), popcount(b[0] ^ a).min()))


def copies(images: list[np.ndarray]) -> dict:
    """For each change, the bits between every image and its changed copy; and between different images."""
    own = [image_looks(p) for p in images]
    found = {name: [apart(h, image_looks(change(p))) for p, h in zip(images, own)] for name, change in CHANGES.items()}
    found["different images"] = [apart(own[i], own[j]) for i in range(len(own)) for j in range(i)]
    return found


def photographs() -> list[np.ndarray]:
    """The sample photographs, upright, RGB."""
    from PIL import Image, ImageOps

    return [
        np.asarray(ImageOps.exif_transpose(Image.open(p)).convert("RGB"))
        for p in sorted((ROOT / "sample_data" / "images").glob("*/*"))
    ]


def sheet(src: Path, work: Path, repeat: int) -> list[float]:
    """Seconds of ``packer preview`` drawing 64 samples of an LMDB output, imports included."""
    out = work / "lmdb"
    shutil.rmtree(out, ignore_errors=True)
    packer("convert", str(src), "-f", "lmdb", "-o", str(out), "-q")
    return [packer("preview", str(out), "-o", str(work / "sheet.png"))[0] for _ in range(repeat)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hashes", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/packer-bench-looks"))
    args = parser.parse_args()
    src = args.work / f"images-{args.images}"
    if not src.is_dir():
        make_images(src, args.images)
    print(describe_host().line(), flush=True)
    print("\n| images | change | bits apart: max | within 4 bits | median |")
    print("|---|---|---:|---:|---:|")
    for name, images in (
        ("sample photographs", photographs()),
        ("generated", [textured(seed, seed % 4) for seed in range(200)]),
    ):
        for change, bits in copies(images).items():
            within = sum(b <= DUP_DISTANCE for b in bits) / len(bits)
            worst = f"{max(bits)} (min {min(bits)})" if change == "different images" else str(max(bits))
            print(
                f"| {name} ({len(images)}) | {change} | {worst} | {within:.1%} | {float(np.median(bits)):.0f} |",
                flush=True,
            )
    print(f"\n{args.images} photographs, npy, {args.workers} workers, {args.repeat} pairs alternating\n")
    print("| preprocessing | with hashes s | without s | wall with / without | CPU with / without |")
    print("|---|---:|---:|---:|---:|")
    for row in hashing(src, args.work, args.repeat, args.workers):
        print(
            f"| {row['preprocessing']} | {row['with']:.2f} | {row['without']:.2f} | "
            f"{float(np.median(row['wall'])):.3f} ({', '.join(f'{r:.3f}' for r in row['wall'])}) | "
            f"{float(np.median(row['cpu'])):.3f} ({', '.join(f'{r:.3f}' for r in row['cpu'])}) |",
            flush=True,
        )
    print("\n| preprocessing | shards | workers' seconds hashing | of their shard time | over the rest |")
    print("|---|---:|---:|---:|---:|")
    for row in hashing_share(src, args.work, args.workers):
        share = row["hashing"] / row["shard"]
        print(
            f"| {row['preprocessing']} | {row['shards']} | {row['hashing']:.3f} | {share:.1%} | "
            f"{row['hashing'] / (row['shard'] - row['hashing']):.1%} |",
            flush=True,
        )
    found = search(args.hashes, args.repeat)
    print(
        f"\nsearch among {found['hashes']:,} generated images' hashes at distance {DUP_DISTANCE}: "
        f"{', '.join(f'{s:.2f}' for s in found['seconds'])} s ({found['groups']:,} groups)",
        flush=True,
    )
    seconds = sheet(src, args.work, args.repeat)
    shown = ", ".join(f"{s:.2f}" for s in seconds)
    print(f"packer preview of 64 samples of an LMDB output, imports included: {shown} s")


if __name__ == "__main__":
    main()
