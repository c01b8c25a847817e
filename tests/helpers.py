"""Shared test helpers that are not fixtures: waiting for writers to go quiet."""

from __future__ import annotations

import time
from pathlib import Path


def quiet_after(stage: Path, seconds: float = 1.5) -> bool:
    """True when no file in ``stage`` changes for ``seconds`` (no worker still writing)."""
    def snapshot():
        return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in stage.iterdir()}
    before = snapshot()
    time.sleep(seconds)
    return snapshot() == before
