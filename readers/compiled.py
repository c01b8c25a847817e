"""How packer's compiled loops (numba) are compiled: on first call, cached on disk where numba finds
a place, so that DataLoader workers load them instead of compiling them."""

from __future__ import annotations

from typing import Callable, TypeVar

import numba

F = TypeVar("F", bound=Callable)


def jit(function: F) -> F:
    """``function`` compiled by numba (no Python objects, the GIL released, no bounds checks) on first
    call, cached next to its module or in the user's cache folder; compiled in each process where
    numba finds nowhere to cache (a read-only install and home)."""
    try:
        return numba.njit(cache=True, nogil=True, boundscheck=False)(function)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return numba.njit(nogil=True, boundscheck=False)(function)


__all__ = ["jit"]
