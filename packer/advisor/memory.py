"""Memory of a process tree: PSS (proportional set size) read from ``/proc/PID/smaps_rollup``.

PSS splits each shared page between the processes that map it, so adding it up over a loader and
its workers counts a memory-mapped shard or a shared batch buffer once, not once per worker.
Linux only; elsewhere every figure is 0.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def pss(pid: int) -> int:
    """PSS bytes of one process, or 0 when it cannot be read (gone, another user's, not Linux)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants (DataLoader workers, converter workers), as found right now."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            try:
                todo.extend(int(c) for c in task.read_text().split())
            except (OSError, ValueError):
                pass
    return pids


class PeakMemory:
    """Largest total PSS of this process (unless ``children_only``) and its descendants, sampled
    every ``every`` seconds in a thread while the ``with`` block runs; ``peak`` holds it in bytes.

    Sampling is not free (the kernel walks each process's mappings; every 50 ms it measurably slowed
    reads of memory-mapped shards), so keep it rare in timed runs.
    """

    def __init__(self, children_only: bool = False, every: float = 0.05) -> None:
        self.peak = 0
        self.children_only, self.every = children_only, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "PeakMemory":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def sample(self) -> int:
        """Take one sample now (the ``with`` block also does at its start and end); the total PSS."""
        me = os.getpid()
        total = sum(pss(p) for p in process_tree(me) if not (self.children_only and p == me))
        self.peak = max(self.peak, total)
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()
