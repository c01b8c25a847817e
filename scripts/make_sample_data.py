"""Rebuild ``sample_data/images`` from scikit-image's CC0 / public-domain photographs.

Usage: ``python scripts/make_sample_data.py SKIMAGE_DATA_DIR [OUT]`` where SKIMAGE_DATA_DIR is the
``skimage/data`` folder of a scikit-image wheel (``pip download --no-deps scikit-image`` and unzip).
Crops are chosen by a fixed seed, so the output is the same every time.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from PIL import Image

CLASSES = {
    "cat": ["chelsea.png"],
    "coffee": ["coffee.png"],
    "space": ["astronaut.png", "rocket.jpg", "hubble_deep_field.jpg"],
    "texture": ["brick.png", "grass.png", "gravel.png"],
}
PER_CLASS = 10


def main(src: Path, out: Path) -> None:
    """Write PER_CLASS crops of each class's photographs, as JPEG and (every fourth) PNG."""
    rng = random.Random(1234)
    for cls, names in CLASSES.items():
        folder = out / cls
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(PER_CLASS):
            name = names[i % len(names)]
            img = Image.open(src / name)
            w, h = img.size
            cw = rng.randint(min(w, h) // 2, min(w, h))
            ch = max(32, min(h, int(cw * rng.uniform(0.6, 1.4))))
            cw = min(cw, w)
            x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
            crop = img.crop((x, y, x + cw, y + ch))
            scale = rng.uniform(0.45, 0.8)
            crop = crop.resize((max(32, int(cw * scale)), max(32, int(ch * scale))), Image.BILINEAR)
            stem = f"{cls}_{i:02d}"
            if i % 4 == 3:
                crop.save(folder / f"{stem}.png", optimize=True)
            else:
                crop.save(folder / f"{stem}.jpg", quality=85)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) > 2 else "sample_data/images"))
