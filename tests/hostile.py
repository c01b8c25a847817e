"""A hostile source folder, made in code: every kind of odd, broken or dangerous input we handle.

``make_hostile_corpus(root)`` writes it and returns what must happen to each file: ``GOOD`` files
must arrive as samples, the others must be skipped with a reason starting with the given text.
Use ``MAX_PIXELS`` as ``--max-pixels`` so that the decompression-bomb case is one.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image

GOOD = "ok"
MAX_PIXELS = 1_000_000


def _pattern(w: int, h: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(max(1, h // 4), max(1, w // 4), 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small).resize((w, h), Image.BILINEAR))


def _save(path: Path, img: Image.Image, **kw) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, **kw)


def make_hostile_corpus(root: Path) -> dict[str, str]:
    """Write the corpus under ``root``; return {relative path: GOOD or expected reason prefix}."""
    good, bad = root / "good", root / "bad"
    rgb = Image.fromarray(_pattern(48, 32))
    expect: dict[str, str] = {}

    def ok(rel: str) -> None:
        expect[rel] = GOOD

    _save(good / "upper.JPG", rgb, quality=90)
    ok("good/upper.JPG")
    _save(good / "png_named.jpg", rgb, format="PNG")
    ok("good/png_named.jpg")
    _save(good / "cmyk.jpg", rgb.convert("CMYK"), quality=90)
    ok("good/cmyk.jpg")
    gray16 = Image.fromarray((np.linspace(0, 65535, 40 * 30).reshape(30, 40)).astype(np.uint16))
    _save(good / "gray16.png", gray16)
    ok("good/gray16.png")
    _save(good / "onebit.png", rgb.convert("1"))
    ok("good/onebit.png")
    pal = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    _save(good / "palette_transparent.png", pal, transparency=0)
    ok("good/palette_transparent.png")
    rgba = rgb.convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize(rgb.size))
    _save(good / "rgba.png", rgba)
    ok("good/rgba.png")
    _save(good / "la.png", rgba.convert("LA"))
    ok("good/la.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    _save(good / "exif_rotated.jpg", rgb, exif=exif.tobytes(), quality=90)
    ok("good/exif_rotated.jpg")
    _save(good / "progressive.jpg", rgb, progressive=True, quality=90)
    ok("good/progressive.jpg")
    frames = [rgb.convert("P"), Image.fromarray(_pattern(48, 32, 1)).convert("P")]
    _save(good / "animated.gif", frames[0], save_all=True, append_images=frames[1:], duration=50)
    ok("good/animated.gif")
    _save(good / "multipage.tif", rgb, save_all=True, append_images=[rgb.rotate(90)])
    ok("good/multipage.tif")
    _save(good / "image.webp", rgb, quality=90)
    ok("good/image.webp")
    _save(good / "image.bmp", rgb)
    ok("good/image.bmp")
    _save(good / "tiny_1x1.png", Image.new("RGB", (1, 1), (200, 10, 10)))
    ok("good/tiny_1x1.png")
    _save(good / "wide_5000x10.png", Image.fromarray(_pattern(5000, 10)))
    ok("good/wide_5000x10.png")
    for seed, name in enumerate(("ünïcode näme.png", "-leading dash.png", "space name.png"), start=10):
        _save(good / name, Image.fromarray(_pattern(40, 40, seed)))
        ok(f"good/{name}")
    _save(good / "dup_a.png", Image.fromarray(_pattern(30, 20, 7)))
    (good / "dup_b.png").write_bytes((good / "dup_a.png").read_bytes())
    ok("good/dup_a.png")
    ok("good/dup_b.png")
    (good / "link.png").symlink_to(good / "image.bmp")
    ok("good/link.png")  # same bytes: a duplicate
    (good / "loop").symlink_to(root, target_is_directory=True)  # a symlink loop: must not hang

    full = io.BytesIO()
    rgb.save(full, "JPEG", quality=90)
    bad.mkdir(parents=True)
    (bad / "truncated.jpg").write_bytes(full.getvalue()[: len(full.getvalue()) // 2])
    expect["bad/truncated.jpg"] = "corrupt or truncated image"
    full = io.BytesIO()
    Image.fromarray(_pattern(64, 64, 3)).save(full, "PNG")
    (bad / "truncated.png").write_bytes(full.getvalue()[: len(full.getvalue()) // 2])
    expect["bad/truncated.png"] = "corrupt or truncated image"
    (bad / "zero.jpg").write_bytes(b"")
    expect["bad/zero.jpg"] = "empty file"
    (bad / "text.jpg").write_text("this is a text file with an image name\n" * 10)
    expect["bad/text.jpg"] = "not an image"
    _save(bad / "bomb.png", Image.new("L", (2000, 1000)))  # 2,000,000 pixels > MAX_PIXELS, a tiny file
    expect["bad/bomb.png"] = "too many pixels"
    (bad / "broken_link.png").symlink_to(bad / "does-not-exist.png")
    expect["bad/broken_link.png"] = "broken symbolic link"
    os.mkfifo(bad / "fifo.jpg")
    expect["bad/fifo.jpg"] = "not a regular file"

    (root / "empty_class").mkdir()
    (root / "good" / ".hidden.png").write_bytes(b"litter")
    (root / "good" / "._resource.png").write_bytes(b"litter")
    (root / "good" / "Thumbs.db").write_bytes(b"litter")
    (root / "good" / "readme.txt").write_text("not an image")
    return expect
