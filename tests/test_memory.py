"""PSS of a process tree: this process and its children are found and counted."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys

import pytest

from packer.advisor.memory import PeakMemory, process_tree, pss

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _hold(ready, done) -> None:
    block = bytearray(32 * 2**20)  # touched: resident, so it counts in PSS
    ready.set()
    done.wait(10)
    del block


def test_a_child_is_found_and_its_memory_counted():
    assert pss(os.getpid()) > 0 and pss(2**22 + 12345) == 0
    ctx = mp.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold, args=(ready, done))
    with PeakMemory(children_only=True, every=0.02) as children, PeakMemory(every=0.02) as everything:
        child.start()
        assert ready.wait(10)
        assert child.pid in process_tree(os.getpid())
        children.sample()
        everything.sample()
        done.set()
        child.join(10)
    assert children.peak >= 32 * 2**20
    assert everything.peak >= children.peak + pss(os.getpid()) // 2
