"""The normalize of the training path, alone: one 224 x 224 RGB uint8 crop to normalized float32.

A reader's worker writes each crop into its slot of a batch of 64 (38 MB) in a ring of batches, so
the slot is not in the cache: this times ``BatchNormalize.normalize_into`` writing that way (slots in
turn over ``--batches`` batches, 154 MB by default), for the two layouts a crop
comes in (HWC, as OpenCV's resize writes it when a crop is enlarged; planar, as torch's antialiased
resize writes it when one is shrunk) and the two layouts of the batch (NCHW, channels-last), beside
the physical floor (``np.copyto`` of the same 602 KB of float32 into the slot) and the other ways
measured before choosing (numpy's cast, multiply and add, three passes over the slot; numpy reading
across the layouts; torch's one-pass ``addcmul``: its values differ from the two-pass ones by a
rounding, and its threads contend with the workers'). ``normalize_into`` is one compiled pass
(``readers.datasets.normalize_kernel``), compiled before the rounds are timed; its plain loop (no
streamed stores: what a slot off a cache line gets) is timed beside it, writing one float past each
slot's start. Streamed stores do not read the lines they write, so they can go under ``np.copyto``.

    python scripts/bench_normalize.py            # about 10 s
    python scripts/bench_normalize.py --smoke    # a few rounds: that it runs (the tests do this)

Figures are ms a sample, the median of ``--rounds`` rounds of 640 samples, one thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from packer.advisor.host import describe_host  # noqa: E402
from readers.datasets.tensors import BatchNormalize  # noqa: E402

SIZE, BATCH = 224, 64
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


class _Manifest:
    """What BatchNormalize reads of a manifest: ImageNet's normalization."""

    preprocess = {"normalize": {"mean": MEAN, "std": STD}}


def crops() -> dict[str, np.ndarray]:
    """A 224 x 224 crop as each resize writes it: HWC (OpenCV), an HWC view of planar memory (torch)."""
    import cv2
    import torch.nn.functional as F

    rng = np.random.default_rng(0)
    small = rng.integers(0, 256, (180, 180, 3), dtype=np.uint8)
    large = torch.from_numpy(rng.integers(0, 256, (300, 300, 3), dtype=np.uint8)).permute(2, 0, 1)[None]
    shrunk = F.interpolate(large, size=(SIZE, SIZE), mode="bilinear", antialias=True, align_corners=False)
    return {
        "HWC (enlarged by OpenCV)": cv2.resize(small, (SIZE, SIZE), interpolation=cv2.INTER_LINEAR),
        "planar (shrunk by torch)": shrunk[0].permute(1, 2, 0).numpy(),
    }


def timed(write: Callable[[int], None], rounds: int, samples: int, slots: int) -> float:
    """Median ms a sample of ``write(slot)`` over ``rounds`` rounds of ``samples`` samples (``slots`` in turn)."""
    for i in range(slots):
        write(i)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for k in range(samples):
            write(k % slots)
        times.append((time.perf_counter() - start) / samples * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=4, help="batches of 64 slots written in turn (a ring)")
    parser.add_argument("--smoke", action="store_true", help="2 rounds of 64 samples into one batch: that it runs")
    args = parser.parse_args()
    rounds, samples, batches = (2, BATCH, 1) if args.smoke else (args.rounds, 10 * BATCH, max(1, args.batches))
    torch.set_num_threads(1)  # as in a DataLoader worker
    normalize = BatchNormalize(_Manifest())
    slots = batches * BATCH
    nchw = torch.empty((slots, 3, SIZE, SIZE)).numpy()
    nhwc = torch.empty((slots, SIZE, SIZE, 3)).numpy()
    flat = torch.empty(slots * 3 * SIZE * SIZE + 1).numpy()  # slots one float off a cache line
    off = [flat[1 + i * 3 * SIZE * SIZE :][: 3 * SIZE * SIZE].reshape(3, SIZE, SIZE) for i in range(slots)]
    floats = np.ones((3, SIZE, SIZE), np.float32)
    scale, bias = normalize._np_scale, normalize._np_bias
    tscale, tbias = torch.from_numpy(scale), torch.from_numpy(bias)

    def run(write: Callable[[int], None]) -> float:
        return timed(write, rounds, samples, slots)

    rows = [("np.copyto of the 602 KB float32 (one ordinary pass)", "", run(lambda i: np.copyto(nchw[i], floats)))]
    for name, hwc in crops().items():
        chw = hwc.transpose(2, 0, 1)

        def across(i: int, chw=chw) -> None:
            np.multiply(chw, scale, out=nchw[i], casting="unsafe")
            np.add(nchw[i], bias, out=nchw[i])

        def three_passes(i: int, chw=chw) -> None:  # cast, multiply, add: the way before normalize_kernel
            np.copyto(nchw[i], chw, casting="unsafe")
            np.multiply(nchw[i], scale, out=nchw[i])
            np.add(nchw[i], bias, out=nchw[i])

        def addcmul(i: int, chw=chw) -> None:
            torch.addcmul(tbias, torch.from_numpy(chw), tscale, out=torch.from_numpy(nchw[i]))

        rows += [
            (name, "NCHW: normalize_into (chosen)", run(lambda i, c=chw: normalize.normalize_into(c, nchw[i]))),
            (
                name,
                "NCHW: its plain loop (no streamed stores)",
                run(lambda i, c=chw: normalize.normalize_into(c, off[i])),
            ),
            (name, "NCHW: numpy cast, multiply, add", run(three_passes)),
            (name, "NCHW: numpy reading across", run(across)),
            (name, "NCHW: torch addcmul, one pass", run(addcmul)),
            (
                name,
                "channels-last: normalize_into (chosen)",
                run(lambda i, c=chw: normalize.normalize_into(c, nhwc[i].transpose(2, 0, 1))),
            ),
        ]
    print(describe_host().line())
    print(
        f"one {SIZE} x {SIZE} RGB crop into its slot of float32 batches of {BATCH}, {batches} batch(es) in turn, "
        "one thread; ms a sample"
    )
    print()
    print("| crop as | written as | ms a sample |")
    print("|---|---|---:|")
    for source, way, ms in rows:
        print(f"| {source} | {way} | {ms:.3f} |")


if __name__ == "__main__":
    main()
