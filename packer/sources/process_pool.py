"""A small pool of processes whose end can never hang its parent: the walk hands it subfolders.

``multiprocessing.Pool`` runs three threads in the parent and shares one task pipe, with its locks,
among its processes; ``terminate()`` joins those threads, and it hung the walk (in CI, and on 0.8.x)
once the processes were gone. Here each process has a pipe of its own and holds one task at a time,
the parent takes results in whenever it asks (no thread), and the pool ends by killing its processes.
A process that dies, or whose task raises, gives its task back: the parent runs it itself, so an
error is raised where the caller waits, with its own traceback, and nothing is lost.
"""

from __future__ import annotations

import os
from collections import deque
from multiprocessing import connection
from typing import Any, Callable, Optional

from packer.system import as_child_process, process_context, stop_signals_held

ORPHAN_CHECK = 1.0
"""Seconds an idle pool process waits for a task before it checks that its parent still lives (a
parent killed outright never sends the end)."""


class Pending:
    """A task handed to a ``ProcessPool``: ``ready``, ``wait`` and ``get`` as ``AsyncResult``'s."""

    def __init__(self, pool: "ProcessPool", fn: Callable[..., Any], args: tuple) -> None:
        self._pool, self.fn, self.args = pool, fn, args
        self._done, self._here, self._value = False, False, None

    def ready(self) -> bool:
        """Whether ``get`` returns without waiting on a process (results that came are taken in)."""
        if not self._done:
            self._pool.pump(0)
        return self._done

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for this or another task of the pool to end."""
        if not self._done:
            self._pool.pump(timeout)

    def get(self) -> Any:
        """The task's result, once its process sent it; run here if its process could not."""
        while not self._done:
            self._pool.pump(None)
        if self._here:  # raised in the process, or the process died: the error (if any) is raised here
            self._value = self.fn(*self.args)
            self._here = False
        return self._value

    def _finish(self, value: Any, here: bool = False) -> None:
        self._done, self._here, self._value = True, here, value


class ProcessPool:
    """``processes`` processes (``system.process_context``) that run the tasks given to ``submit`` in
    their order, one at a time each. Pool processes leave Ctrl-C to the parent and end on SIGTERM.
    Use it as a context manager: its end kills the processes, whatever they are doing."""

    def __init__(self, processes: int) -> None:
        context = process_context()
        self._workers: list[tuple[Any, Any]] = []
        self._idle: list[tuple[Any, Any]] = []
        self._busy: dict[Any, tuple[tuple[Any, Any], Pending]] = {}
        self._waiting: deque[Pending] = deque()
        forked = context.get_start_method() == "fork"
        try:
            for _ in range(max(1, processes)):
                mine, theirs = context.Pipe()
                # A forked process inherits this process's ends of every pipe, its own one's included:
                # it closes them, else a send to a parent killed outright would wait forever.
                inherited = [conn for _, conn in self._workers] + [mine] if forked else []
                process = context.Process(target=_serve, args=(theirs, os.getpid(), inherited), daemon=True)
                with stop_signals_held():  # a Ctrl-C landing in fork's handlers would be dropped
                    process.start()
                theirs.close()  # the process holds the only other end: its death reads as an end here
                self._workers.append((process, mine))
                self._idle.append((process, mine))
        except BaseException:  # a fork refused (no memory), or Ctrl-C: no process left behind
            self.close()
            raise

    def submit(self, fn: Callable[..., Any], *args: Any) -> Pending:
        """Run ``fn(*args)`` in a pool process (``fn`` and the arguments must pickle)."""
        task = Pending(self, fn, args)
        self._waiting.append(task)
        self._hand_out()
        return task

    def pump(self, timeout: Optional[float]) -> None:
        """Take in the results that came, waiting up to ``timeout`` seconds (None: as long as it takes)
        for one when none has, and hand waiting tasks to the processes freed."""
        if self._busy:
            for conn in connection.wait(list(self._busy), timeout):
                worker, task = self._busy.pop(conn)
                try:
                    ok, value = conn.recv()
                except (EOFError, OSError):  # the process died (killed, out of memory): its task is run here
                    self._retire(worker)
                    task._finish(None, here=True)
                    continue
                self._idle.append(worker)
                task._finish(value, here=not ok)
        self._hand_out()

    def close(self) -> None:
        """Kill the pool's processes and wait for them (a killed process ends at once)."""
        for process, conn in self._workers:
            if process.exitcode is None:
                process.kill()
        for process, conn in self._workers:
            process.join()
            conn.close()
        for task in list(self._waiting) + [task for _, task in self._busy.values()]:
            task._finish(None, here=True)
        self._workers, self._idle, self._busy, self._waiting = [], [], {}, deque()

    def __enter__(self) -> "ProcessPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _hand_out(self) -> None:
        while self._waiting and self._idle:
            worker = self._idle.pop()
            task = self._waiting.popleft()
            try:
                worker[1].send((task.fn, task.args))
            except (OSError, EOFError):  # the process died while idle
                self._retire(worker)
                self._waiting.appendleft(task)
                continue
            self._busy[worker[1]] = (worker, task)
        if not self._idle and not self._busy:  # every process died: the parent runs what is left
            while self._waiting:
                self._waiting.popleft()._finish(None, here=True)

    def _retire(self, worker: tuple[Any, Any]) -> None:
        process, conn = worker
        self._workers.remove(worker)
        process.join()
        conn.close()


def _serve(conn: Any, parent: int, inherited: list) -> None:
    """A pool process: run each task received and send back (True, result), or (False, None) when it
    raised (the parent runs it again itself, to raise the error there); end on the end of the pipe,
    or with the parent (``inherited``: the parent's pipe ends a fork copied, closed here)."""
    as_child_process()  # killed with the parent, also while busy with a long task
    for end in inherited:
        end.close()
    if os.getppid() != parent:  # it died before that took effect
        return
    while True:
        while not conn.poll(ORPHAN_CHECK):
            if os.getppid() != parent:
                return
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = (True, fn(*args))
        except Exception:
            reply = (False, None)
        try:
            conn.send(reply)
        except (OSError, EOFError):  # the parent is gone
            return
        except Exception:  # a result that does not pickle: the parent runs the task itself
            conn.send((False, None))
