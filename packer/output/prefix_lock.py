"""The lock object of a prefix that a conversion writes (``packer.output.prefix_reservation.reserve`` takes it):
``LOCK_NAME`` holds the run's token, host, boot and process; another run's lock renewed within
``LOCK_LEASE`` (by the store's clock) refuses a run, unless it names this machine and a process
that is gone (a killed run). A run renews its own every ``RENEW_EVERY`` seconds, checks it is still
its own before its manifests go up, and removes it at its end (``release``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from packer.spec.errors import OutputError

if TYPE_CHECKING:
    from packer.output.upload import Destination

LOCK_NAME = ".packer-lock"
LOCK_LEASE = 3600.0
"""Seconds a lock holds off other runs since it was last renewed; an older one is a dead run's."""
TAKEOVER_SETTLE = 1.0
"""Seconds a run that replaced a dead run's lock waits before reading it back (see ``reserve``)."""
RENEW_EVERY = 300.0
"""Seconds between renewals of a run's own lock."""


def release(dest: "Destination") -> None:
    """Stop renewing the lock (or a node's lease, ``dest.lock``) and remove it, if it is still this run's."""
    dest._stop.set()
    if dest._renewer is not None:
        dest._renewer.join()
    try:
        if lock_token(dest.fs, dest.root, dest.lock) == dest.token:
            dest.fs.rm_file(f"{dest.root}/{dest.lock}")
    except Exception:  # noqa: BLE001 - a lock left behind is refused for an hour, never a wrong output
        pass


def write_lock(fs: Any, root: str, token: str, exclusive: bool, url: str, name: str = LOCK_NAME) -> None:
    """Write the lock object ``name`` (the prefix's, or a node's lease) with ``token`` and what tells
    this process apart; ``exclusive``: only where none is (OutputError when one is)."""
    ids = {**this_machine(), "pid": os.getpid(), "started": process_start(os.getpid())}
    data = json.dumps({"token": token, **ids}).encode()
    path = f"{root}/{name}"
    if not exclusive:  # a dead run's lock, replaced
        fs.pipe_file(path, data)
        return
    try:
        fs.pipe_file(path, data, mode="create")  # S3's If-None-Match: one of two racing runs wins
    except FileExistsError:
        raise OutputError(f"another conversion took the lock of {url} just now; wait for it") from None
    except TypeError:  # a backend without exclusive create: the check above and this write can race
        fs.pipe_file(path, data)


def renew(dest: "Destination") -> None:
    """Rewrite the lock every ``RENEW_EVERY`` seconds while the run lasts (its age is the store's clock)."""
    while not dest._stop.wait(RENEW_EVERY):
        try:
            if lock_token(dest.fs, dest.root, dest.lock) == dest.token:
                write_lock(dest.fs, dest.root, dest.token, exclusive=False, url=dest.url, name=dest.lock)
        except Exception:  # noqa: BLE001 - checked again before the manifests go up
            pass


def check_own_lock(dest: "Destination") -> None:
    if lock_token(dest.fs, dest.root) != dest.token:
        raise OutputError(
            f"{dest.url}: this run's lock was taken over by another run; nothing of this run is kept there"
        )


def lock_token(fs: Any, root: str, name: str = LOCK_NAME) -> Optional[str]:
    return (read_lock(fs, root, name) or {}).get("token")


def read_lock(fs: Any, root: str, name: str = LOCK_NAME) -> Optional[dict]:
    """The lock object ``name`` under ``root`` as written (``write_lock``), None when it is gone or unreadable."""
    try:
        lock = json.loads(fs.cat_file(f"{root}/{name}"))
    except (OSError, ValueError):
        return None
    return lock if isinstance(lock, dict) else None


def holder_is_gone(lock: Optional[dict]) -> bool:
    """Whether ``lock`` is a run's of this machine (the same boot and process namespace) whose process
    is gone (a killed conversion: ``--resume`` then need not wait for its lease). A lock of another
    machine or container, or one that does not say, is never taken for a dead run's before its
    lease ends."""
    if not lock:
        return False
    here = this_machine()
    if not here["boot"] or not here["pidns"] or {k: lock.get(k) for k in here} != here:
        return False
    try:
        return process_start(int(lock["pid"])) != lock.get("started")  # gone, or its pid another's now
    except (KeyError, TypeError, ValueError):
        return False


def this_machine() -> dict:
    """What tells this machine's processes apart from another's sharing its host name (a container)."""
    ids = {"host": socket.gethostname(), "boot": None, "pidns": None}
    with contextlib.suppress(OSError):
        ids["boot"] = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        ids["pidns"] = os.readlink("/proc/self/ns/pid")
    return ids


def process_start(pid: int) -> Optional[int]:
    """The start time of the process ``pid`` (clock ticks since boot), None when there is none."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def lock_age(fs: Any, root: str, name: str = LOCK_NAME) -> float:
    """Seconds since the lock object ``name`` under ``root`` was last written, by the store's clock where it says."""
    try:
        written = fs.modified(f"{root}/{name}")
        if written.tzinfo is None:
            written = written.replace(tzinfo=timezone.utc)
        return (datetime.now(timezone.utc) - written).total_seconds()
    except (OSError, NotImplementedError, AttributeError, ValueError):
        return LOCK_LEASE + 1  # unreadable: treated as a dead run's


__all__ = ["LOCK_NAME", "LOCK_LEASE", "TAKEOVER_SETTLE", "RENEW_EVERY", "release", "write_lock", "renew"]
