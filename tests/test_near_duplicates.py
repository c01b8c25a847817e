"""packer.output.near_duplicates: the indexed search finds exactly the pairs a comparison of every
pair finds, at every distance."""

from __future__ import annotations

import numpy as np
import pytest

from packer.output import near_duplicates as nd
from packer.output.near_duplicates import cross_matches, groups_of, near_groups, near_pairs, popcount
from packer.pixels.looks import FLAT


def random_looks(rng: np.random.Generator, count: int) -> np.ndarray:
    return rng.integers(0, 2**64, (count, 6), dtype=np.uint64, endpoint=False)


def planted(rng: np.random.Generator, count: int = 1500) -> np.ndarray:
    """Random hashes, with one image in ten remade as a copy of another: its own hash one of the
    other's six with 0 to 9 bits flipped."""
    looks = random_looks(rng, count)
    for copy in range(0, count, 10):
        original = int(rng.integers(0, count))
        flips = rng.choice(64, size=int(rng.integers(0, 10)), replace=False)
        looks[copy, 0] = looks[original, int(rng.integers(0, 6))] ^ np.uint64(sum(1 << int(b) for b in flips))
    return looks


def compared_all(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The distance of every image of ``first`` to every image of ``second`` (own hash against all six, both ways)."""
    best = np.full((len(first), len(second)), 64)
    for k in range(first.shape[1]):
        best = np.minimum(best, popcount(first[:, :1] ^ second[None, :, k]).astype(int))
        best = np.minimum(best, popcount(first[:, k][:, None] ^ second[None, :, 0]).astype(int))
    return best


@pytest.mark.parametrize("distance", [0, 1, 2, 4, 5, 6, 8])
def test_near_pairs_are_those_of_a_full_comparison(distance):
    looks = planted(np.random.default_rng(distance))
    full = compared_all(looks, looks)
    i, j = np.nonzero(np.triu(full <= distance, 1))
    expected = np.stack([i, j], axis=1)
    found = near_pairs(looks, distance)
    assert len(expected) > 20
    assert np.array_equal(found, expected)


def test_the_search_is_done_in_batches(monkeypatch):
    monkeypatch.setattr(nd, "_BATCH", 64)
    looks = planted(np.random.default_rng(3), 700)
    full = compared_all(looks, looks)
    i, j = np.nonzero(np.triu(full <= 4, 1))
    assert np.array_equal(near_pairs(looks, 4), np.stack([i, j], axis=1))


def test_identical_and_empty_sets():
    same = np.tile(np.arange(1, 7, dtype=np.uint64), (5, 1))
    assert near_pairs(same, 0).tolist() == [[a, b] for a in range(5) for b in range(a + 1, 5)]
    assert near_pairs(same[:1], 4).shape == (0, 2)
    assert near_pairs(np.zeros((0, 6), np.uint64), 4).shape == (0, 2)
    assert cross_matches(same, np.zeros((0, 6), np.uint64), 4).shape == (0, 2)


def test_images_of_one_colour_are_no_ones_near_duplicates():
    looks = planted(np.random.default_rng(5), 300)
    looks[[3, 50, 120, 121]] = FLAT  # four images of one colour each: hashes with nothing to compare
    found = near_pairs(looks, 6)
    assert not np.isin(found, [3, 50, 120, 121]).any()
    rest = np.setdiff1d(np.arange(300), [3, 50, 120, 121])
    full = compared_all(looks[rest], looks[rest])
    i, j = np.nonzero(np.triu(full <= 6, 1))
    assert np.array_equal(found, rest[np.stack([i, j], axis=1)])
    assert not np.isin(cross_matches(looks[:150], looks[150:], 6)[:, 0], [3, 50, 120, 121]).any()


def test_groups_join_chains_and_keep_apart_the_rest():
    pairs = np.array([[9, 3], [3, 5], [1, 2], [7, 8], [8, 9]])
    assert groups_of(pairs) == [[1, 2], [3, 5, 7, 8, 9]]
    assert groups_of(np.zeros((0, 2), np.int64)) == []
    long_chain = np.stack([np.arange(999, 0, -1), np.arange(998, -1, -1)], axis=1)
    assert groups_of(long_chain) == [list(range(1000))]


def test_popcount_without_numpy_bitwise_count(monkeypatch):
    values = np.random.default_rng(0).integers(0, 2**64, 1000, dtype=np.uint64, endpoint=False)
    expected = [bin(int(v)).count("1") for v in values]
    assert popcount(values).tolist() == expected
    monkeypatch.delattr(np, "bitwise_count", raising=False)
    assert popcount(values).tolist() == expected


def with_identical_blocks(rng: np.random.Generator) -> np.ndarray:
    """``planted`` hashes, with blocks of images whose hashes are all one image's (a placeholder
    scraped many times), and some whose own hash is shared but not their windows'."""
    looks = planted(rng, 900)
    looks[100:160] = looks[7]
    looks[300:340] = looks[300]
    looks[500:505, 0] = looks[501, 0]  # one own hash, five sets of windows
    looks[600:650] = looks[40]  # joins the group of image 40, if it has one
    return looks


@pytest.mark.parametrize("distance", [0, 2, 4, 6])
def test_groups_are_those_of_the_pairs_however_many_copies(monkeypatch, distance):
    looks = with_identical_blocks(np.random.default_rng(20 + distance))
    expected = groups_of(near_pairs(looks, distance))
    monkeypatch.setattr(nd, "_CANDIDATES", 50)  # slices of candidates, and pairs folded into stars
    assert near_groups(looks, distance) == expected
    assert any(len(g) >= 60 for g in expected)


@pytest.mark.parametrize("distance", [0, 4, 7])
def test_cross_matches_give_each_image_its_first_match(monkeypatch, distance):
    rng = np.random.default_rng(40 + distance)
    first, second = with_identical_blocks(rng), with_identical_blocks(rng)
    second[:200] = first[200:400]  # copies across the two
    monkeypatch.setattr(nd, "_CANDIDATES", 64)
    full = compared_all(first, second) <= distance
    full[first[:, 0] == FLAT] = False
    full[:, second[:, 0] == FLAT] = False
    i = np.flatnonzero(full.any(axis=1))
    expected = np.stack([i, full[i].argmax(axis=1)], axis=1)
    assert np.array_equal(cross_matches(first, second, distance), expected)
