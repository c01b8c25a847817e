"""Shards uploaded to a bucket while the conversion runs, so the output never has to fit on the local disk.

``packer convert SRC -o s3://bucket/prefix`` writes into a local folder (``packer.cli.remote_output``)
and registers a ``ShardUploads`` for it (``streaming``). Every ``Staging`` of an output inside that
folder then hands each shard to it as the shard's worker finishes (``take``): its files are put under
their planned names in the prefix (``shard-NNNNN.EXT``), each checked (``upload.put_checked``: its
size and SHA-256), then deleted locally. While more than ``AHEAD`` finished shards wait for their upload, the
run waits, so the local disk holds the shards being written (one a worker) and at most ``AHEAD`` more.

Once all are written, the shards are given their published names (``packer.output.finish``) by a
copy inside the store (``move``: no byte goes through this machine again) and their planned objects
removed; ``finish`` waits for the last uploads and removes planned objects no published shard came
from (shards left without samples, shards an early start wrote again). The manifests go up last
(``packer.output.upload.upload_output``): until then the prefix is not an output. A failure or an
interrupt before them removes every object this run wrote (``abandon``), never one that was there
before.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Optional

from packer.output import upload
from packer.output.upload import UPLOADS, Destination, remove_object, store_errors
from packer.records import ShardResult

AHEAD = 2
"""Finished shards that may wait for their upload before the run waits for them."""
_SINKS: dict[Path, ShardUploads] = {}


class ShardUploads:
    """The uploads of one run into the reserved ``dest``, for outputs written inside ``local`` (see the module)."""

    def __init__(self, dest: Destination, local: Path, ahead: int = AHEAD) -> None:
        self.dest, self.local, self.ahead = dest, Path(local).absolute(), int(ahead)
        self.pool = ThreadPoolExecutor(UPLOADS, thread_name_prefix="packer-upload")
        self.uploads: dict[str, Future] = {}
        """Planned objects not yet moved to their published names, by name under the prefix."""
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
        the background; wait while more than ``ahead`` shards wait for theirs. OutputError when an
        upload failed."""
        futures = []
        for f in result.files:
            name = self._name(output, f.path)
            futures.append(self.pool.submit(self._upload, Path(folder) / f.path, name))
            self.uploads[name] = futures[-1]
        self.waiting.append(futures)
        while self.waiting and (len(self.waiting) > self.ahead or all(u.done() for u in self.waiting[0])):
            for sent in self.waiting.popleft():
                sent.result()

    def _upload(self, path: Path, name: str) -> None:
        target = f"{self.dest.root}/{name}"
        with store_errors(self.dest.url):
            with self._lock:
                self.sent.add(name)  # before the upload: a failed one may have left an object
            try:
                size = path.stat().st_size
                upload.put_checked(self.dest.fs, path, target, self.dest.url)
            except FileNotFoundError:  # removed locally meanwhile: a shard without samples, never published
                return
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
        source, target = self._name(output, old), self._name(output, new)
        self.uploads.pop(source).result()  # here, not in the pool: a copy never waits on a queued upload
        self.copies.append(self.pool.submit(self._copy, source, target))

    def _copy(self, source: str, target: str) -> None:
        fs, root = self.dest.fs, self.dest.root
        with store_errors(self.dest.url):
            fs.copy(f"{root}/{source}", f"{root}/{target}")
            with self._lock:
                self.sent.add(target)
            size, copied = fs.info(f"{root}/{source}").get("size"), fs.info(f"{root}/{target}").get("size")
            if size != copied:
                raise OSError(f"{target} is {copied} bytes after its copy from {source}, not {size}")
            remove_object(fs, f"{root}/{source}")
        self.published.add(target)

    def finish(self) -> None:
        """Wait for the last uploads and copies (OutputError when one failed) and remove the planned
        objects that no published shard came from."""
        for copy in self.copies:
            copy.result()
        for name, pending in list(self.uploads.items()):
            pending.result()
            with store_errors(self.dest.url):
                remove_object(self.dest.fs, f"{self.dest.root}/{name}")
            del self.uploads[name]
        self.pool.shutdown()

    def abandon(self) -> None:
        """After a failure or an interrupt: stop, and remove every object this run wrote that was not
        there before (the prefix as it was)."""
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
