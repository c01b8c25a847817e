"""Compare packer's stored pixels with torchvision's ImageFolder on your own folder.

    pip install torchvision          # beside the torch you train with
    python scripts/torchvision_parity.py IMAGE_FOLDER [--size 224] [--resize shorter-crop|shorter|stretch]
        [--crop 224]      # --resize shorter --size 256 --crop 224: Resize(256) + CenterCrop(224)

Converts IMAGE_FOLDER with packer (npy, uint8, twice: the default reduced JPEG decode and
``--full-decode``) into a temporary folder, reads every image with
``torchvision.datasets.ImageFolder`` and the transform packer's options stand for
(``Resize(N)`` + ``CenterCrop(N)`` for ``shorter-crop``, ``Resize(N)`` for ``shorter``,
``Resize((H, W))`` for ``stretch``, ``CenterCrop(M)`` after it for ``--crop M``, then
``PILToTensor``), and prints, per decode, how many images are identical and how far the others are
(mean and largest difference in 8-bit levels, PSNR). Images on which packer differs by design are
counted apart: an EXIF orientation other than 1 (packer turns the image upright, ImageFolder does
not) and transparency (packer composites it on ``--background``, ImageFolder's ``convert("RGB")``
drops the alpha channel).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image

from packer import ConvertConfig, PreprocessConfig, convert
from readers import open_dataset


def torchvision_transform(size: int, resize: str, crop: Optional[int] = None):
    """The torchvision transform that packer's ``--size size --resize resize [--crop crop]`` stands for."""
    from torchvision import transforms

    geometry = {
        "shorter-crop": [transforms.Resize(size), transforms.CenterCrop(size)],
        "shorter": [transforms.Resize(size)],
        "stretch": [transforms.Resize((size, size))],
    }[resize]
    if crop is not None:
        geometry.append(transforms.CenterCrop(crop))
    return transforms.Compose([*geometry, transforms.PILToTensor()])


def by_design(path: str) -> str:
    """Why packer's pixels differ from ImageFolder's for this file on purpose, or ``""``."""
    with Image.open(path) as img:
        if img.getexif().get(0x0112, 1) != 1:
            return "EXIF orientation"
        if img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info:
            return "transparency"
    return ""


def compare(folder: Path, size: int, resize: str, crop: Optional[int], full_decode: bool, work: Path) -> dict:
    """Figures of one packer conversion of ``folder`` against ImageFolder's pixels."""
    from torchvision.datasets import ImageFolder

    out = work / ("full" if full_decode else "reduced")
    pre = PreprocessConfig(
        size=(size, size),
        resize=resize,
        mean=None,
        std=None,
        reduced_decode=not full_decode,
        crop=(crop, crop) if crop else None,
    )
    convert(folder, out, ConvertConfig("npy", pre), workers=2)
    ours = {meta["key"]: image.numpy() for image, _, meta in open_dataset(out, normalize=False, return_meta=True)}
    theirs = ImageFolder(str(folder), transform=torchvision_transform(size, resize, crop))
    figures = {"identical": 0, "compared": 0, "by design": {}, "missing": 0, "diffs": [], "max": 0, "psnr": []}
    for index, (path, _) in enumerate(theirs.samples):
        key = Path(path).relative_to(folder).as_posix()
        if key not in ours:
            figures["missing"] += 1
            continue
        reason = by_design(path)
        if reason:
            figures["by design"][reason] = figures["by design"].get(reason, 0) + 1
            continue
        a = ours[key].astype(np.int64)  # C x H x W uint8: the stored pixels (normalize=False)
        b = theirs[index][0].numpy().astype(np.int64)
        diff = np.abs(a - b)
        figures["compared"] += 1
        figures["identical"] += int(not diff.any())
        figures["diffs"].append(float(diff.mean()))
        figures["max"] = max(figures["max"], int(diff.max()))
        mse = float((diff.astype(np.float64) ** 2).mean())
        figures["psnr"].append(math.inf if mse == 0 else 10 * math.log10(255**2 / mse))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="an ImageFolder tree: one subfolder per class")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--resize", choices=("shorter-crop", "shorter", "stretch"), default="shorter-crop")
    parser.add_argument("--crop", type=int, default=None, help="then the centre crop of this size")
    args = parser.parse_args()
    try:
        import torchvision
    except ImportError:
        sys.exit("this comparison needs torchvision: pip install torchvision (beside your torch)")
    print(
        f"packer against torchvision {torchvision.__version__} ImageFolder, {args.folder}, "
        f"--size {args.size} --resize {args.resize}" + (f" --crop {args.crop}" if args.crop else "")
    )
    with tempfile.TemporaryDirectory() as tmp:
        for full in (True, False):
            f = compare(args.folder.resolve(), args.size, args.resize, args.crop, full, Path(tmp))
            psnr = sorted(f["psnr"])
            median = psnr[len(psnr) // 2] if psnr else math.nan
            mean = sum(f["diffs"]) / len(f["diffs"]) if f["diffs"] else 0.0
            design = ", ".join(f"{n} {why}" for why, n in f["by design"].items()) or "none"
            print(
                f"{'--full-decode' if full else 'default decode'}: {f['identical']}/{f['compared']} identical; "
                f"mean {mean:.3f} levels, max {f['max']}, median PSNR {median:.1f} dB; "
                f"different by design: {design}; not packed: {f['missing']}"
            )


if __name__ == "__main__":
    main()
