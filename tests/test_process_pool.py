"""The walk's pool (packer.sources.process_pool): results in their tasks' order, an error raised where the
caller waits, a task whose process died run by the parent, and an end that never waits on a task."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from helpers import process_alive, wait_for

from packer.sources.process_pool import ProcessPool


def _square(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def _fail(message: str) -> None:
    raise ValueError(message)


def _die_in_pool(parent: int) -> int:
    if os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return 7


def _sleep(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def _mark_and_sleep(marker: str, seconds: float) -> int:
    Path(marker).touch()
    return _sleep(seconds)


def _handlers() -> tuple:
    return signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)


def test_tasks_run_in_the_pools_processes_and_their_results_keep_the_order():
    with ProcessPool(2) as pool:
        tasks = [pool.submit(_square, x) for x in range(20)]
        results = [task.get() for task in tasks]
    assert [value for value, _ in results] == [x * x for x in range(20)]
    assert len({pid for _, pid in results}) == 2 and os.getpid() not in {pid for _, pid in results}


def test_a_task_that_raises_raises_its_own_error_where_the_caller_waits():
    with ProcessPool(1) as pool:
        failed, after = pool.submit(_fail, "bad folder"), pool.submit(_square, 3)
        with pytest.raises(ValueError, match="bad folder"):
            failed.get()
        assert after.get()[0] == 9  # the process goes on with the next task


def test_a_task_whose_process_died_is_run_by_the_parent():
    with ProcessPool(2) as pool:
        tasks = [pool.submit(_die_in_pool, os.getpid()) for _ in range(4)]
        assert [task.get() for task in tasks] == [7] * 4  # both processes died: the parent ran them all


def test_the_end_kills_processes_busy_with_long_tasks_at_once(tmp_path):
    pool = ProcessPool(2)
    processes = [process for process, _ in pool._workers]
    running = [pool.submit(_mark_and_sleep, str(tmp_path / f"task{i}"), 60) for i in range(3)]
    wait_for(lambda: len(list(tmp_path.iterdir())) == 2, "the pool's processes never started their tasks")
    pool.close()
    # Killed, not waited for: a process let run to its task's end would exit with 0, a minute later.
    assert [process.exitcode for process in processes] == [-signal.SIGKILL] * 2
    assert all(task.ready() for task in running) and len(running) == 3


def test_a_ready_task_was_taken_in_without_get():
    with ProcessPool(1) as pool:
        task = pool.submit(_square, 4)
        deadline = time.monotonic() + 120  # a safety net for a hang, not a measure of speed
        while not task.ready() and time.monotonic() < deadline:
            task.wait(0.05)
        assert task.ready() and task.get()[0] == 16


def test_pool_processes_leave_ctrl_c_to_the_parent_and_end_on_sigterm():
    """Pool processes inherit the converter's handlers, which raise KeyboardInterrupt: one that did
    printed a traceback at the pool's end."""
    with ProcessPool(1) as pool:
        assert pool.submit(_handlers).get() == (signal.SIG_DFL, signal.SIG_IGN)


def _big(n: int) -> bytes:
    return b"x" * n


_ORPHAN = """
import os, signal, sys, time
from packer.sources.process_pool import ProcessPool
def busy(marker):
    open(marker, "w").close()
    time.sleep(3600)
pool = ProcessPool(2)
tasks = [pool.submit(busy, sys.argv[1]), pool.submit(bytes, 8 << 20)]  # one busy, one blocked sending 8 MB
while not os.path.exists(sys.argv[1]) or not any(conn.poll() for _, conn in pool._workers):
    time.sleep(0.01)  # both at work: the marker made, the 8 MB on their way
print(" ".join(str(p.pid) for p, _ in pool._workers), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_pool_processes_do_not_outlive_a_parent_killed_outright(tmp_path):
    """A process busy with a task, or blocked sending a result larger than the pipe holds, ends
    with its parent: the fork's copies of the parent's pipe ends are closed, and the kernel kills
    it when the parent dies."""
    import subprocess
    import sys

    code = [sys.executable, "-c", _ORPHAN, str(tmp_path / "busy")]
    done = subprocess.run(code, capture_output=True, text=True, timeout=120)
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2, done.stderr
    try:
        # Left alive, the busy one would sleep for an hour and the other wait forever: 120 s only
        # ends a test whose processes outlive their parent.
        wait_for(lambda: not any(map(process_alive, pids)), "pool processes outlived their parent")
    finally:
        for pid in filter(process_alive, pids):  # none, unless the test failed
            os.kill(pid, signal.SIGKILL)


def test_a_fork_refused_leaves_no_process_and_the_walk_goes_on_alone(tmp_path, monkeypatch):
    import packer.sources.discover
    import packer.sources.walk
    from packer.sources.discover import discover
    from packer.system import process_context

    context = process_context()
    started: list = []
    real_start = type(context.Process(target=int)).start

    def start(self):
        if started:
            raise OSError(12, "Cannot allocate memory")
        real_start(self)
        started.append(self)

    monkeypatch.setattr(type(context.Process(target=int)), "start", start)
    with pytest.raises(OSError):
        ProcessPool(2)
    assert started and started[0].exitcode is not None  # the first one was killed and waited for
    for name in ["a/1.png", "b/2.png", "c/3.png"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setattr(packer.sources.walk, "PARALLEL_AFTER", 0.0)
    started.clear()
    found = discover(tmp_path, processes=2)
    assert [it.relpath for it in found.items] == ["a/1.png", "b/2.png", "c/3.png"]
