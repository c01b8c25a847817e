"""Shards uploaded to a bucket while the conversion runs, so the output never has to fit on the local disk.

``packer convert SRC -o s3://bucket/prefix`` writes into a local folder (``packer.cli.remote_output``)
and registers a ``ShardUploads`` for it (``streaming``). Every ``Staging`` of an output inside that
folder then hands each shard to it as the shard's worker finishes (``take``): each file is renamed
aside in the folder (a shard written again under its name, as an early start may, is another file),
put in the prefix as a part object of this run, ``PARTS/TOKEN-N/NAME`` (a name no output's file
has, one per upload), checked (``upload.put_checked``: its size and SHA-256), then deleted locally.
While ``AHEAD`` finished shards wait for their upload, the run waits, so the local disk holds the
shards being written (one a worker) and at most ``AHEAD`` more.

Once all are written, each shard's part is copied to its published name inside the store
(``move``: no byte goes through this machine again) and removed; ``finish`` waits for the last
uploads and copies and removes the parts no published shard came from (shards left without
samples, shards an early start wrote again). The manifests go up last
(``packer.output.upload.upload_output``): until then the prefix is not an output. A failure or an
interrupt before them removes every object this run wrote (``abandon``, with Ctrl-C and SIGTERM held
back), never one that was there before.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Optional

from packer.output import upload
from packer.output.upload import PARTS, UPLOADS, Destination, remove_object, store_errors
from packer.records import ShardResult
from packer.system import stop_signals_held

AHEAD = 2
"""Finished shards that may wait for their upload; the run waits while that many do."""
_SINKS: dict[Path, ShardUploads] = {}


class ShardUploads:
    """The uploads of one run into the reserved ``dest``, for outputs written inside ``local`` (see the module)."""

    def __init__(self, dest: Destination, local: Path, ahead: int = AHEAD) -> None:
        self.dest, self.local, self.ahead = dest, Path(local).absolute(), int(ahead)
        self.pool = ThreadPoolExecutor(UPLOADS, thread_name_prefix="packer-upload")
        self.uploads: dict[str, tuple[str, Future]] = {}
        """The latest part of each planned file not yet moved to its published name, and its upload,
        by the file's name under the prefix."""
        self.parts: dict[str, Future] = {}  # every part object of this run not yet removed, and its upload
        self._count = itertools.count()
        self.waiting: deque[list[Future]] = deque()  # each taken shard's uploads, oldest first
        self.sent: set[str] = set()  # every object this run wrote, by name under the prefix
        self.published: set[str] = set()
        """The published names the shards were moved to (``upload_output`` keeps them)."""
        self.bytes = 0  # uploaded and checked
        self.copies: list[Future] = []  # the copies to published names (``move``)
        self._lock = threading.Lock()

    def covers(self, output: Path) -> bool:
        """Whether ``output`` is written inside this run's local folder (its shards are uploaded here)."""
        output = Path(output).absolute()
        return output == self.local or self.local in output.parents

    def _name(self, output: Path, relpath: str) -> str:
        """The object name, under the prefix, of the file ``relpath`` of the output ``output``."""
        folder = Path(output).absolute().relative_to(self.local).as_posix()
        return relpath if folder == "." else f"{folder}/{relpath}"

    def take(self, output: Path, folder: Path, result: ShardResult) -> None:
        """Upload the files of the finished shard ``result`` (in the staging ``folder`` of ``output``) in
        the background; wait while ``ahead`` shards wait for theirs. OutputError when an upload failed."""
        futures = []
        for f in result.files:
            name, n = self._name(output, f.path), next(self._count)
            part = f"{PARTS}/{self.dest.token[:12]}-{n}/{name}"
            aside = Path(folder) / f".upload-{n}-{Path(f.path).name}"
            os.replace(Path(folder) / f.path, aside)  # a shard written again under its name is another file
            futures.append(self.pool.submit(self._upload, aside, part, f.sha256))
            self.uploads[name] = (part, futures[-1])
            with self._lock:  # _copy removes from it in the pool
                self.parts[part] = futures[-1]
        self.waiting.append(futures)
        while self.waiting and (len(self.waiting) >= self.ahead or all(u.done() for u in self.waiting[0])):
            for sent in self.waiting.popleft():
                sent.result()

    def _upload(self, path: Path, name: str, sha256: str) -> None:
        target = f"{self.dest.root}/{name}"
        with store_errors(self.dest.url):
            with self._lock:
                self.sent.add(name)  # before the upload: a failed one may have left an object
            size = path.stat().st_size
            upload.put_checked(self.dest.fs, path, target, self.dest.url, sha256)  # the worker's hash, not again
        path.unlink(missing_ok=True)  # in the bucket and checked: the local disk holds it no more
        with self._lock:
            self.bytes += size

    def holds(self, output: Path, relpath: str) -> bool:
        """Whether the file ``relpath`` of ``output``'s staging folder was taken for upload (and not moved)."""
        return self.covers(output) and self._name(output, relpath) in self.uploads

    def move(self, output: Path, old: str, new: str) -> None:
        """Give the uploaded file ``old`` of ``output`` its published name ``new`` (once its upload is
        done): copied inside the store in the background, checked by its size, the planned object
        removed. ``finish`` waits for the copies."""
        source, pending = self.uploads.pop(self._name(output, old))
        pending.result()  # here, not in the pool: a copy never waits on a queued upload
        target = self._name(output, new)
        self.copies.append(self.pool.submit(self._copy, source, target))

    def _copy(self, source: str, target: str) -> None:
        fs, root = self.dest.fs, self.dest.root
        with store_errors(self.dest.url):
            with self._lock:
                self.sent.add(target)  # before the copy: a failed one may have left an object
            fs.copy(f"{root}/{source}", f"{root}/{target}")
            size, copied = fs.info(f"{root}/{source}").get("size"), fs.info(f"{root}/{target}").get("size")
            if size != copied:
                raise OSError(f"{target} is {copied} bytes after its copy from {source}, not {size}")
            remove_object(fs, f"{root}/{source}")
        with self._lock:
            self.parts.pop(source, None)
            self.published.add(target)

    def finish(self) -> None:
        """Wait for the last uploads and copies (OutputError when one failed) and remove the planned
        objects that no published shard came from."""
        for copy in self.copies:
            copy.result()
        for part, pending in list(self.parts.items()):
            pending.result()
            with store_errors(self.dest.url):
                remove_object(self.dest.fs, f"{self.dest.root}/{part}")
            del self.parts[part]
        self.uploads.clear()
        self.pool.shutdown()

    def abandon(self) -> None:
        """After a failure or an interrupt: stop, and remove every object this run wrote that was not
        there before (the prefix as it was)."""
        with stop_signals_held():  # a second Ctrl-C must not leave half of the run's objects
            self.pool.shutdown(wait=True, cancel_futures=True)
            for name in sorted(self.sent - self.dest.before):
                try:
                    remove_object(self.dest.fs, f"{self.dest.root}/{name}")
                except Exception:  # noqa: BLE001 - best effort: a leftover is refused (no manifest) and replaced by --overwrite
                    pass


@contextlib.contextmanager
def streaming(uploads: ShardUploads) -> Iterator[ShardUploads]:
    """Hand the shards of every output written inside ``uploads.local`` to ``uploads`` for the block."""
    _SINKS[uploads.local] = uploads
    try:
        yield uploads
    finally:
        del _SINKS[uploads.local]


def sink_for(output: Path) -> Optional[ShardUploads]:
    """The ShardUploads that takes the shards of ``output``, if its conversion goes to a bucket."""
    return next((s for s in _SINKS.values() if s.covers(output)), None)


__all__ = ["ShardUploads", "streaming", "sink_for", "AHEAD"]
