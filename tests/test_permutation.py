"""readers.loading.permutation: a bijection of range(n) for every n, keyed, mixed like a uniform shuffle; small
sizes are numpy's own permutation."""

from __future__ import annotations

import numpy as np
import pytest

from readers.loading.permutation import MATERIALIZED_BELOW, Permutation


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 15, 16, 17, 255, 256, 257, 1000, 4**8 - 1, 4**8, 4**8 + 1])
@pytest.mark.parametrize("table", [0, MATERIALIZED_BELOW])
def test_every_index_once(n, table):
    got = Permutation(n, 11, materialized_below=table).take(0, n)
    assert got.dtype == np.int64
    assert np.array_equal(np.sort(got), np.arange(n))


def test_small_sizes_are_numpys_permutation():
    assert np.array_equal(Permutation(1000, 7).take(0, 1000), np.random.default_rng(7).permutation(1000))
    big = Permutation(MATERIALIZED_BELOW, 7)
    assert big._table is None and not np.array_equal(
        big.take(0, 100), np.random.default_rng(7).permutation(MATERIALIZED_BELOW)[:100]
    )


def test_keys_give_other_orders_and_the_same_key_the_same():
    for table in (0, MATERIALIZED_BELOW):
        a, b = (Permutation(1000, k, materialized_below=table).take(0, 1000) for k in (1, 2))
        assert not np.array_equal(a, b)
        again = Permutation(1000, 1, materialized_below=table)
        assert np.array_equal(a, again.take(0, 1000))
        assert again[7] == int(a[7]) and isinstance(again[7], int)  # an int position gives an int
        assert np.array_equal(again[np.array([[3, 4], [5, 6]])], a[[3, 4, 5, 6]].reshape(2, 2))
        with pytest.raises(IndexError):
            again[1000]


def test_the_order_is_fixed_across_versions():
    """The order is part of what a resumed run relies on: these values may only change with
    readers.loading.sampler.ORDER_VERSION."""
    assert Permutation(10, 1, materialized_below=0).take(0, 10).tolist() == [0, 6, 7, 2, 8, 5, 3, 4, 1, 9]
    assert Permutation(10**8, 123)[np.array([0, 1, 99_999_999])].tolist() == [65110971, 31360252, 9891489]


def test_mixed_like_a_uniform_shuffle():
    """Over 2,000 keys of a 64-element permutation: where each element lands is uniform (chi-square
    of the 64x64 position counts), neighbours stay neighbours as often as by chance, and fixed points
    average one; numpy's shuffle over the same number of draws is the yardstick."""
    n, trials = 64, 2000
    counts = np.zeros((n, n))
    fixed, adjacent = [], []
    for key in range(trials):
        p = Permutation(n, key, materialized_below=0).take(0, n)  # the Feistel network itself
        counts[np.arange(n), p] += 1
        fixed.append(int((p == np.arange(n)).sum()))
        adjacent.append(int((np.abs(np.diff(p)) == 1).sum()))
    expected = trials / n
    chi2 = ((counts - expected) ** 2 / expected).sum()
    dof = (n - 1) ** 2
    assert abs(chi2 - dof) < 5 * np.sqrt(2 * dof)  # within 5 standard deviations of its mean
    assert abs(np.mean(fixed) - 1.0) < 0.15
    rng = np.random.default_rng(0)
    ideal = [int((np.abs(np.diff(rng.permutation(n))) == 1).sum()) for _ in range(trials)]
    assert abs(np.mean(adjacent) - np.mean(ideal)) < 0.2  # both about 2 (n - 1) / n
