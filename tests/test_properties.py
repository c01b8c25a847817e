"""Property-based round trips: random image sizes, colour modes, file types, resize modes, formats."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from conftest import FORMATS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from packer import ConvertConfig, PreprocessConfig, convert
from packer.pixels.preprocess import load_image
from readers import open_dataset

# (Pillow mode, file types that can hold it)
MODES = {
    "RGB": ["png", "jpeg", "bmp", "webp", "tiff"],
    "L": ["png", "jpeg", "bmp", "tiff", "gif"],
    "RGBA": ["png", "webp", "tiff"],
    "LA": ["png"],
    "P": ["png", "gif", "bmp"],
    "1": ["png", "bmp", "tiff"],
    "I;16": ["png", "tiff"],
    "CMYK": ["jpeg", "tiff"],
}


@st.composite
def images(draw):
    mode = draw(st.sampled_from(sorted(MODES)))
    filetype = draw(st.sampled_from(MODES[mode]))
    w, h = draw(st.integers(1, 70)), draw(st.integers(1, 70))
    seed = draw(st.integers(0, 2**16))
    return mode, filetype, w, h, seed


def make(path: Path, mode: str, filetype: str, w: int, h: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    if mode == "I;16":
        img = Image.fromarray(rng.integers(0, 65536, size=(h, w), dtype=np.uint16))
    else:
        img = Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).convert(mode)
    img.save(path, format=filetype.upper() if filetype != "jpeg" else "JPEG")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    files=st.lists(images(), min_size=1, max_size=4),
    fmt=st.sampled_from(FORMATS),
    resize=st.sampled_from(["shorter-crop", "stretch", "pad"]),
    size=st.tuples(st.integers(1, 40), st.integers(1, 40)),
    mode=st.sampled_from(["RGB", "L"]),
)
def test_any_image_round_trips_exactly(files, fmt, resize, size, mode):
    pre = PreprocessConfig(size=size, resize=resize, mode=mode)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for i, spec in enumerate(files):
            make(src / f"{i:02d}.{spec[1]}", *spec)
        out = Path(tmp) / "out"
        convert(src, out, ConvertConfig(fmt, pre), workers=1)
        ds = open_dataset(out, normalize=False, return_meta=True)
        got = list(ds) if fmt == "wds" else [ds[i] for i in range(len(ds))]
        assert len(got) == len(files)
        for image, label, meta in got:
            want = load_image(src / meta["key"], pre)
            assert want.shape == (size[1], size[0], 1 if mode == "L" else 3)
            assert np.array_equal(image.permute(1, 2, 0).numpy(), want)
            assert label == -1
