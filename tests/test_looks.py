"""packer.pixels.looks: perceptual hashes that stay put under resizing, re-encoding, brightening and
small crops, and tell apart different images of one kind."""

from __future__ import annotations

import itertools

import cv2
import numpy as np
import pytest
from helpers import cropped, resized, textured
from image_copies import CHANGES

from packer.output.near_duplicates import popcount
from packer.pixels.looks import FLAT, HALVE_FROM, LOOKS, LooksBatch, _plan, image_looks


def nearest(a: np.ndarray, b: np.ndarray) -> int:
    """The distance at which two images' hashes match: one's own hash against any of the other's."""
    return int(min(popcount(a[0] ^ b).min(), popcount(b[0] ^ a).min()))


@pytest.fixture(scope="module")
def images() -> list[np.ndarray]:
    return [textured(seed, seed % 4) for seed in range(200)]


@pytest.fixture(scope="module")
def looks(images) -> list[np.ndarray]:
    return [image_looks(p) for p in images]


@pytest.mark.parametrize("copy", sorted(set(CHANGES) - {"all four"}))
def test_a_changed_copy_stays_within_the_default_distance(images, looks, copy):
    distances = [nearest(own, image_looks(CHANGES[copy](p))) for p, own in zip(images, looks)]
    assert max(distances) <= 4, np.bincount(distances)


def test_a_copy_changed_all_four_ways_stays_close(images, looks):
    distances = [nearest(own, image_looks(CHANGES["all four"](p))) for p, own in zip(images, looks)]
    # the changes add up: all within 8 bits (one of 200 at 8), and at the default distance (4) all
    # but a few
    assert max(distances) <= 8, np.bincount(distances)
    assert sum(d <= 4 for d in distances) >= 0.97 * len(distances), np.bincount(distances)


def test_different_images_of_one_kind_are_far_apart(looks):
    same_kind = [nearest(looks[i], looks[j]) for i, j in itertools.combinations(range(len(looks)), 2) if i % 4 == j % 4]
    assert len(same_kind) == 4 * 50 * 49 // 2
    assert min(same_kind) > 8


def test_a_crop_is_caught_by_a_window_not_by_the_whole_hash(images, looks):
    # 5% off a corner moves the whole image's hash by about as much as a different image; the
    # window trimmed at that corner is what matches (the reason each image has five of them)
    whole = [int(popcount(own[0] ^ image_looks(cropped(p))[0])) for p, own in zip(images, looks)]
    assert np.mean(whole) > 4
    windowed = [int(popcount(own[1:] ^ image_looks(cropped(p))[0]).min()) for p, own in zip(images, looks)]
    assert np.mean(windowed) < np.mean(whole) / 2


def test_hashes_are_uint64_with_half_their_bits_set(looks):
    table = np.stack(looks)
    assert table.dtype == np.uint64 and table.shape == (200, LOOKS)
    # the 63 coefficients besides the mean split at their median (31 above), and the mean is above it
    assert set(popcount(table).ravel().tolist()) == {32}
    assert len(np.unique(table[:, 0])) == 200


def test_any_channel_layout_and_dtype_hash_alike(images):
    rgb = images[0]
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    reference = image_looks(rgb)
    assert np.array_equal(image_looks(gray), reference)
    assert np.array_equal(image_looks(gray[:, :, None]), reference)
    assert np.array_equal(image_looks(np.dstack([rgb, np.full(gray.shape, 255, np.uint8)])), reference)
    assert nearest(image_looks(rgb.astype(np.uint16) * 257), reference) <= 2
    assert nearest(image_looks(rgb.astype(np.float64) / 255), reference) <= 2
    assert np.array_equal(image_looks(rgb), reference)  # the same pixels, the same hashes


@pytest.mark.parametrize("value", [0, 1, 128, 255])
@pytest.mark.parametrize("size", [(40, 50), (255, 257), (1023, 767), (1, 1), (3, 50), (129, 4000)])
def test_an_image_of_one_colour_has_no_shape_to_hash(value, size):
    # halvings that leave out an odd pixel stretch the grid's last cell: the cosines are integrated
    # over the cells exactly, so a constant still projects on the mean alone
    assert image_looks(np.full((*size, 3), value, np.uint8)).tolist() == [FLAT] * LOOKS
    assert image_looks(np.full((40, 50), value / 255, np.float32)).tolist() == [FLAT] * LOOKS
    ramp = np.tile(np.arange(50, dtype=np.uint8), (40, 1))  # the faintest shape is still a shape
    assert popcount(image_looks(ramp)).tolist() == [32] * LOOKS


def test_large_and_small_images_are_hashed_from_grids_of_64_to_127_cells():
    large = textured(7, 0, 1500, 2000)
    small = resized(large, 0.1)
    plan = _plan(1500, 2000)
    assert [h for h, *_ in plan.halvings] == [750, 375, 187, 93] and plan.halvings[-1][1] == 125
    assert plan.rows.shape == (32, 93) and plan.columns.shape == (125, 32)
    assert _plan(150, 200).halvings == ((75, 100, 2, 2),)
    assert _plan(40, 1000).halvings == ((40, 500, 1, 2), (40, 250, 1, 2), (40, 125, 1, 2))  # each side alone
    assert _plan(HALVE_FROM - 1, 50).halvings == ()
    assert nearest(image_looks(large), image_looks(small)) <= 4
    tiny = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert image_looks(tiny).shape == (LOOKS,)


def test_an_odd_last_pixel_left_out_by_a_halving_is_stood_for(images):
    # 255 rows halve to 127 cells standing for 127.5: the basis stretches the last cell instead of
    # shifting the frame, so an image one row short hashes like itself
    image = resized(images[3], 1.2)[:256]
    assert nearest(image_looks(image), image_looks(image[:255])) <= 2
    assert _plan(255, 100).rows[0].sum() == pytest.approx(127.5)


def test_a_batch_hashes_as_one_image_at_a_time(images):
    batch = LooksBatch()
    shown = images[:5] + [np.full((30, 40, 3), 9, np.uint8), resized(images[5], 1.7)] + images[6:] + images[:60]
    for image in shown:
        batch.add(image)
    table = batch.table()
    assert table.shape == (len(shown), LOOKS) == (261, 6) and table.dtype == np.uint64  # more than a BATCH
    assert np.array_equal(table, np.stack([image_looks(p) for p in shown]))
    assert table[5].tolist() == [FLAT] * LOOKS
    assert LooksBatch().table().shape == (0, LOOKS)


FLAT_AREAS = """
import sys
import numpy as np
from packer.pixels.looks import image_looks

shapes = [((30, 40), [(2, 3, 15, 20), (18, 5, 36, 25)]), ((75, 45), [(10, 15, 35, 45)]), ((40, 60), [(0, 0, 60, 40)]),
          ((64, 64), [(16, 16, 48, 48)]), ((31, 77), [(0, 5, 20, 30), (40, 0, 77, 31)])]
for (h, w), rects in shapes:
    pixels = np.full((h, w, 3), 40, np.uint8)
    for n, (x0, y0, x1, y1) in enumerate(rects):
        pixels[y0:y1, x0:x1] = (200, 30 + 60 * n, 90)
    sys.stdout.write(" ".join(f"{v:016x}" for v in image_looks(pixels)) + "\\n")
"""


def test_images_of_flat_areas_hash_alike_whatever_blas_kernel_the_host_runs():
    """The hashes of one output must not depend on the host: OpenBLAS picks its kernel (and so the
    order it sums in) by the CPU, and images of flat areas, whose coefficients are equal or zero,
    hashed differently on an AVX2 host and an AVX-512 one. OPENBLAS_CORETYPE picks the kernels of
    older CPUs on this one."""
    import os
    import subprocess
    import sys

    def hashes(core: str | None) -> str:
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
        if core:
            env["OPENBLAS_CORETYPE"] = core
        return subprocess.run(
            [sys.executable, "-c", FLAT_AREAS], env=env, capture_output=True, text=True, check=True
        ).stdout

    own = hashes(None)
    assert len(own.split()) == 5 * LOOKS
    assert hashes("Prescott") == own and hashes("Sandybridge") == own
