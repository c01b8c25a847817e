"""What the machine offers this process: usable CPU cores, and holding back stop signals."""

from __future__ import annotations

import contextlib
import gc
import math
import multiprocessing as mp
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Iterator


def process_context():
    """The multiprocessing context packer starts its processes with (shard workers, the walk's pool).

    Linux: fork, as DataLoader does by default. Children start at once with packer's code already
    imported, and, unlike spawn and forkserver, they do not re-run the caller's main module, so a
    script that calls packer.convert() without an `if __name__ == "__main__"` guard still works.
    The children run only packer's own code and share no lock with the parent. Elsewhere (macOS,
    Windows), fork is unsafe: spawn."""
    return mp.get_context("fork" if sys.platform == "linux" else "spawn")


def usable_cpus() -> int:
    """Cores this process may use: CPU affinity, capped by a cgroup CPU quota (containers)."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        count = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def _cgroup_quota() -> float | None:
    try:
        text = Path("/sys/fs/cgroup/cpu.max").read_text().split()  # cgroup v2: "max 100000" or "200000 100000"
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())  # cgroup v1
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        if quota > 0 and period > 0:
            return quota / period
    except (OSError, ValueError):
        pass
    return None


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


_stop_requested = False
_raised = 0  # stops raised so far (a signal sent again is not once one was raised since)
_held = 0  # depth of stop_signals_held blocks this process is in


def request_stop(signum: int, frame: object) -> None:
    """Handler for Ctrl-C and SIGTERM (the CLI installs it): note the request, raise KeyboardInterrupt.

    Inside ``stop_signals_held`` it only notes the request, which the block raises on its way out. A
    signal that arrives just before the block blocks it has its Python handler run at the next
    chance, which can be inside one of fork's at-fork hooks (logging's lock release), where a raise
    is printed as "Exception ignored" with a traceback and dropped.
    """
    global _stop_requested
    _stop_requested = True
    if _held:
        return
    if _where_raising_is_dropped(frame):
        # a raise there is printed as "Exception ignored" and lost: the signal is sent again a moment
        # later, when the interrupted call (a multiprocessing finalizer freeing shared memory) is over
        timer = threading.Timer(REDELIVER_SECONDS, _send_again, (signum, _raised))
        timer.daemon = True
        timer.start()
        return
    _raise_stop()


def _raise_stop() -> None:
    global _raised
    _raised += 1
    raise KeyboardInterrupt


REDELIVER_SECONDS = 0.05
"""How long a stop signal that came during a call whose exceptions Python drops waits to come again."""


def _send_again(signum: int, raised: int) -> None:
    """Stop again (``signum`` came first), if the stop is still pending under ``request_stop``:
    not once a stop was raised since (``raised``: the count then; a held block's end, a signal
    since), nor once the command that installed the handler has ended (the signal would then reach
    whatever handler came back)."""
    if _raised == raised and _stop_requested and signal.getsignal(signal.SIGINT) is request_stop:
        # SIGINT, whatever came first: a real signal wakes a main thread blocked on a lock or a read,
        # and should the command restore the handlers meanwhile, Python's own raises, never kills
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


_FINALIZERS = ("multiprocessing/util.py", "/weakref.py")
"""The modules whose ``__call__`` runs a finalizer: ``multiprocessing.util.Finalize`` (which frees
shared memory blocks) and ``weakref.finalize``."""
_collecting = 0  # the garbage collections running now (``_track_collections``)


def _track_collections(phase: str, info: dict) -> None:
    global _collecting
    _collecting = max(0, _collecting + (1 if phase == "start" else -1))


gc.callbacks.append(_track_collections)


def _where_raising_is_dropped(frame: object) -> bool:
    """Whether the code ``frame`` is in runs inside a call whose exceptions Python prints and drops:
    a garbage collection (whose weak reference callbacks and finalizers run in whatever code it
    interrupted), a ``__del__``, or a finalizer (``_FINALIZERS``, run when an object's last
    reference goes)."""
    if _collecting:
        return True
    while frame is not None:
        code = frame.f_code  # type: ignore[attr-defined]
        if code.co_name == "__del__":
            return True
        if code.co_name in ("__call__", "_run_finalizers") and code.co_filename.replace(os.sep, "/").endswith(
            _FINALIZERS
        ):
            return True
        frame = frame.f_back  # type: ignore[attr-defined]
    return False


def clear_stop_request() -> None:
    """Forget an earlier stop request (a new command starts)."""
    global _stop_requested
    _stop_requested = False


def _raise_lost_stop() -> None:
    global _stop_requested
    if _stop_requested:
        _stop_requested = False
        _raise_stop()


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back for the block; they are delivered right after it.

    For steps that must not be cut in two: forking a worker (a signal landing in fork's at-fork
    handlers raises KeyboardInterrupt where Python ignores it) and the renames of a publish. A
    stop requested through ``request_stop`` whose KeyboardInterrupt was dropped inside the block is
    raised when the block ends.
    """
    global _held
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    _held += 1  # first: a handler that runs from here on, even before the mask is set, only notes the stop
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            yield
        except KeyboardInterrupt:
            clear_stop_request()  # the interrupt itself leaves the block: nothing was lost
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    finally:
        _held -= 1
    _raise_lost_stop()


def release_stop_signals() -> None:
    """In a child forked under ``stop_signals_held``: take the inherited block off again."""
    global _held
    _held = 0  # the child is in none of its parent's blocks
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def as_child_process(ignore_ctrl_c: bool = True) -> None:
    """First thing in a process the converter forks (a shard worker, a probe, the walk's pool): end
    quietly on SIGTERM (not with the converter's handler, which raises KeyboardInterrupt and printed
    its traceback when a child started as the run was interrupted was terminated), leave Ctrl-C to
    the parent with ``ignore_ctrl_c``, die with the parent, and take off the hold on stop signals
    under which the parent forked (``stop_signals_held``)."""
    if ignore_ctrl_c:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent()
    release_stop_signals()


def die_with_parent() -> None:
    """Linux: have the kernel kill this process the moment its parent dies (even by SIGKILL, even
    while a decoder hangs). Elsewhere the per-file check in ``worker.run_shard_process`` and the
    walk pool's idle check do the job."""
    if sys.platform != "linux":
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    parent = mp.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # it died before the request took effect
        os._exit(1)
