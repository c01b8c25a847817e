"""readers.compiled: the compiled loops' jit compiles without the GIL or bounds checks, and caches."""

from __future__ import annotations

import numpy as np

from readers.compiled import jit


@jit
def _total(values: np.ndarray) -> int:
    total = 0
    for v in values:
        total += v
    return total


def test_jit_compiles_without_the_gil_or_bounds_checks_and_caches_on_disk():
    assert _total(np.arange(10)) == 45
    options = _total.targetoptions
    assert options["nogil"] and options["nopython"] and not options["boundscheck"]
    assert type(_total._cache).__name__ == "FunctionCache"  # on disk, not numba's no-op cache
