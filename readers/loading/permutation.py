"""A seeded random permutation of ``range(n)`` that is evaluated where it is needed, never built.

An epoch's shuffle of 10^8 samples as a list (``torch.randperm(n).tolist()``) is several GB and
seconds per epoch in every rank's main process, before the first batch. ``Permutation`` instead maps
any position to its index in constant memory: a keyed Feistel network on the smallest power of four
at or above ``n`` (a bijection of that domain), with cycle walking (positions that land at or past
``n`` are mapped again until they fall inside, which keeps it a bijection of ``range(n)``). Six
rounds of the splitmix64 finalizer mix well enough for training (tests/test_permutation.py compares
it with ``numpy``'s shuffle), though not uniformly over all n! orders, which small sizes show (a
power of four is only ever evenly permuted; each of 5 elements lands unevenly): below
``MATERIALIZED_BELOW`` elements the order is ``numpy``'s own seeded permutation, made whole (at most
512 KB).

The order is a function of the key alone: the same on every rank, in every process and on every
platform (only 64-bit integer arithmetic), so workers, ranks and resumed runs agree without
sharing it.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 6
MATERIALIZED_BELOW = 1 << 16
_MASK64 = (1 << 64) - 1
_C1, _C2, _GOLDEN = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0x9E3779B97F4A7C15


def splitmix64(x: int) -> int:
    """The splitmix64 output for state ``x`` (a Python int, taken modulo 2^64)."""
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * _C1) & _MASK64
    x = ((x ^ (x >> 27)) * _C2) & _MASK64
    return x ^ (x >> 31)


def _mix(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on uint64 arrays (numpy's uint64 products wrap modulo 2^64)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_C1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_C2)
    return x ^ (x >> np.uint64(31))


class Permutation:
    """The permutation of ``range(n)`` keyed by ``key`` (any int); ``p[positions]`` gives the indices
    at those positions (an int64 array for an array, an int for an int)."""

    def __init__(self, n: int, key: int, materialized_below: int = MATERIALIZED_BELOW) -> None:
        if n < 0:
            raise ValueError(f"a permutation of {n} elements")
        self.n = int(n)
        self._table = None
        if self.n < materialized_below:
            self._table = np.random.default_rng(int(key) & _MASK64).permutation(self.n).astype(np.int64)
        half = 1
        while (1 << (2 * half)) < self.n:
            half += 1
        self._half = np.uint64(half)
        self._low = np.uint64((1 << half) - 1)
        keys, state = [], int(key) & _MASK64
        for _ in range(ROUNDS):
            state = splitmix64(state)
            keys.append(np.uint64(state))
        self._keys = keys

    def __len__(self) -> int:
        return self.n

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._low
        for k in self._keys:
            left, right = right, left ^ (_mix(right ^ k) & self._low)
        return (left << self._half) | right

    def __getitem__(self, positions):
        scalar = np.ndim(positions) == 0
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        if pos.size and (pos.min() < 0 or pos.max() >= self.n):
            raise IndexError(f"positions outside a permutation of {self.n}")
        if self._table is not None:
            out = self._table[pos]
            return int(out[0]) if scalar else out.reshape(np.shape(positions))
        x = self._encrypt(pos.astype(np.uint64))
        n = np.uint64(self.n)
        outside = np.flatnonzero(x >= n)
        while outside.size:  # cycle walking: on average under 3 more rounds for a domain under 4n
            x[outside] = self._encrypt(x[outside])
            outside = outside[x[outside] >= n]
        out = x.astype(np.int64)
        return int(out[0]) if scalar else out.reshape(np.shape(positions))

    def take(self, start: int, stop: int) -> np.ndarray:
        """The indices at positions ``start`` to ``stop`` (a slice of the permuted order)."""
        return self[np.arange(start, stop, dtype=np.int64)]


__all__ = ["Permutation", "splitmix64"]
