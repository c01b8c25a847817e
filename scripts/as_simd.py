"""Run a command with the libraries' SIMD dispatch capped at a level, to measure on an AVX-512 host
what the kernels of an AVX2-only host give (torch, numpy, OpenCV, numba; ``packer.advisor.host``).

    python scripts/as_simd.py avx2 python scripts/bench.py --train-check --images 2000

It caps the kernels only: the host's caches, memory and clocks stay its own, so a figure measured so
is an AVX2 figure of this host, not of another host. Every benchmark's host line says when it ran
capped.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packer.advisor.host import SIMD_CAPS  # noqa: E402


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in SIMD_CAPS:
        levels = ", ".join(SIMD_CAPS)
        sys.exit(f"usage: python scripts/as_simd.py LEVEL COMMAND [ARGS...]   (LEVEL: {levels})")
    os.environ.update(SIMD_CAPS[argv[0]])
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
