"""The walk's pool (packer.process_pool): results in their tasks' order, an error raised where the
caller waits, a task whose process died run by the parent, and an end that never waits on a task."""

from __future__ import annotations

import os
import signal
import time

import pytest

from packer.process_pool import ProcessPool


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


def test_the_end_kills_processes_busy_with_long_tasks_at_once():
    pool = ProcessPool(2)
    running = [pool.submit(_sleep, 60) for _ in range(3)]
    pool.pump(0.2)
    started = time.perf_counter()
    pool.close()
    assert time.perf_counter() - started < 5
    assert all(task.ready() for task in running)


def test_a_ready_task_was_taken_in_without_get():
    with ProcessPool(1) as pool:
        task = pool.submit(_square, 4)
        deadline = time.perf_counter() + 10
        while not task.ready() and time.perf_counter() < deadline:
            task.wait(0.05)
        assert task.ready() and task.get()[0] == 16


def test_pool_processes_leave_ctrl_c_to_the_parent_and_end_on_sigterm():
    """Pool processes inherit the converter's handlers, which raise KeyboardInterrupt: one that did
    printed a traceback at the pool's end."""
    with ProcessPool(1) as pool:
        assert pool.submit(_handlers).get() == (signal.SIG_DFL, signal.SIG_IGN)
