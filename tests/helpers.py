"""Shared test helpers that are not fixtures: waiting for writers to go quiet, and telling a clean CLI error
from a crash."""

from __future__ import annotations

import time
from pathlib import Path

from click.testing import Result


def quiet_after(stage: Path, seconds: float = 1.5) -> bool:
    """True when no file in ``stage`` changes for ``seconds`` (no worker still writing)."""
    def snapshot():
        return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in stage.iterdir()}
    before = snapshot()
    time.sleep(seconds)
    return snapshot() == before


def exited_cleanly(result: Result) -> bool:
    """True when a ``CliRunner`` run ended by exiting (a message and an exit code), not by an uncaught
    exception. ``CliRunner`` catches exceptions and keeps their traceback out of ``result.output``,
    so checking the output for "Traceback" can never fail."""
    return result.exception is None or isinstance(result.exception, SystemExit)
