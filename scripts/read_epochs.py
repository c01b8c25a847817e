"""Samples/s of make_loader over one packer output, epoch by epoch: a quick A/B of two versions.

    PYTHONPATH=/path/to/checkout-a python scripts/read_epochs.py OUTPUT --dtype uint8 --workers 2
    PYTHONPATH=/path/to/checkout-b python scripts/read_epochs.py OUTPUT --dtype uint8 --workers 2

Run the two versions alternately, on the same output, a few times each: on a shared machine the
spread between runs of one version is often as large as a difference worth finding. The first
epoch includes the workers' start; compare the later ones. Prints which checkout's ``readers``
ran, so a wrong PYTHONPATH is seen at once.
"""

from __future__ import annotations

import argparse
import time

import readers
from packer.advisor.host import describe_host
from readers import make_loader, open_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument(
        "--dtype",
        choices=("float32", "uint8"),
        default="float32",
        help="float32: normalized batches; uint8: the stored pixels",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    loader = make_loader(
        open_dataset(args.output, normalize=args.dtype == "float32"), args.batch_size, num_workers=args.workers
    )
    rates = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        start, samples = time.perf_counter(), 0
        for batch in loader:
            samples += len(batch[1])
        rates.append(samples / (time.perf_counter() - start))
    print(describe_host().line())
    print(
        f"{readers.__file__}: {args.output} {args.dtype} {args.workers}w: "
        + ", ".join(f"{r:,.0f}" for r in rates)
        + " samples/s"
    )


if __name__ == "__main__":
    main()
