"""Ctrl-C and SIGTERM during a command that writes an output: one way to stop for both."""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

from packer.system import clear_stop_request, request_stop


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Make Ctrl-C and SIGTERM raise KeyboardInterrupt inside the block; the earlier handlers come back after it.

    A batch scheduler's SIGTERM stops the run as Ctrl-C does, and Ctrl-C works even when the shell
    started packer in the background with SIGINT ignored. Catch the KeyboardInterrupt inside the
    block: a second signal while the command reports the first still stops it the same way.
    """
    clear_stop_request()
    previous = signal.signal(signal.SIGTERM, request_stop), signal.signal(signal.SIGINT, request_stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
