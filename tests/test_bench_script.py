"""scripts/bench.py: the baseline the peers and the floor run is Pillow alone, on the same task as packer."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import write_image

from packer import jpeg
from packer.config import PreprocessConfig
from packer.preprocess import load_image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import bench  # noqa: E402


@pytest.mark.parametrize("size, mode", [((500, 375), "RGB"), ((375, 500), "RGB"), ((333, 250), "L")])
def test_peer_load_gives_packers_full_decode_pixels_without_packers_decoder(tmp_path, monkeypatch, size, mode):
    path = write_image(tmp_path / "x.jpg", size, mode, seed=sum(size), quality=90)
    expected = load_image(path, PreprocessConfig(reduced_decode=False))

    def refuse(*args, **kwargs):
        raise AssertionError("the peers' baseline went through packer's libjpeg-turbo decoder")

    monkeypatch.setattr(jpeg.simplejpeg, "decode_jpeg", refuse)
    got = bench.load(str(path))
    assert got.dtype == np.uint8 and got.shape == (224, 224, 3)
    assert np.array_equal(got, expected)
