"""The README's pictures, made again from the project itself (never drawn by hand):

- ``docs/images/sample_data.png``: ``packer preview`` of ``sample_data/images`` packed as LMDB, all
  40 samples with their class names, as the readers return them.
- ``docs/images/bench.png``: the chart of the benchmark run recorded in ``docs/images/bench.json``
  (``scripts/bench.py --plot-from``), which names its host, date and commit. A new run replaces that
  record first: ``python scripts/bench.py --peers --codecs raw --out docs/images`` (with the bench
  extra installed), then this script.

Usage: ``python scripts/docs_images.py [--out docs/images]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parent.parent


def packer(*args: str) -> None:
    """Run one ``packer`` command as a user would."""
    subprocess.run([sys.executable, "-m", "packer", *args], check=True, cwd=ROOT)


def sample_sheet(out: Path) -> Path:
    """The contact sheet of sample_data/images, packed as LMDB in a temporary folder."""
    sheet = out / "sample_data.png"
    with tempfile.TemporaryDirectory(prefix="packer-docs-") as tmp:
        packed = Path(tmp) / "lmdb"
        packer("convert", str(ROOT / "sample_data" / "images"), "-f", "lmdb", "-o", str(packed), "-q")
        packer("preview", str(packed), "-o", str(sheet), "--grid", "8x5", "--tile", "96")
    with Image.open(sheet) as picture:  # preview writes fast; the repository keeps the smaller file
        picture.load()
        picture.save(sheet, format="PNG", optimize=True)
    return sheet


def bench_chart(out: Path) -> Path:
    """The chart of the recorded benchmark run (out/bench.json)."""
    chart = out / "bench.png"
    record = out / "bench.json"
    command = [sys.executable, str(ROOT / "scripts" / "bench.py"), "--plot-from", str(record), "--plot", str(chart)]
    subprocess.run(command, check=True, cwd=ROOT)
    return chart


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"wrote {sample_sheet(args.out)}")
    if (args.out / "bench.json").is_file():
        print(f"wrote {bench_chart(args.out)}")
    else:
        print(f"no {args.out / 'bench.json'}: run scripts/bench.py --peers --out {args.out} first", file=sys.stderr)


if __name__ == "__main__":
    main()
