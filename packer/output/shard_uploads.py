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
(``move``: no byte goes through this machine again); ``finish`` waits for the last uploads, copies
and records. The manifests go up last (``packer.output.upload.upload_output``): until then the
prefix is not an output; then every part goes (those of shards left without samples, or that an
early start wrote again, too). A failure before them removes every object this run wrote
(``abandon``, with Ctrl-C and SIGTERM held back), never one that was there before.

``--resume``: the staging folders' records (the plan, and each finished shard's record with the part
objects its files went to) are mirrored in the store as they are written (``records``, a
``packer.output.resume_records.ResumeRecords``). An interrupt keeps the parts and records (a killed
run leaves them anyway); ``restore`` brings the records back into a new local folder, and
``finished`` keeps the recorded shards whose parts are still in the store with the recorded size and
SHA-256, so that they are moved to their published names as this run's own. The parts and records
of every run go once the manifest is up. As each split of a split set finishes, its manifest and
the set's record are mirrored too (``keep_finished``), and its published shards stay through an
interrupt.

Shards written elsewhere: a Ray task on another node uploads its shard itself as parts of the run
(``target``, ``packer.output.part_target``), and the driver takes it with ``take_uploaded``. A node of
a conversion split with ``--num-nodes`` (``shared``) mirrors its plan and records beside the other
nodes' and never removes theirs; ``packer merge`` then restores them all, as a ``--resume`` does.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Optional

from packer.output import upload
from packer.output.files import DONE_SUFFIX, finished_shards, record_shard
from packer.output.object_checks import copy_checked
from packer.output.part_target import OWN_PART, PartTarget, part_name
from packer.output.resume_records import PUBLISHED_PREFIX, RestoredParts, ResumeRecords
from packer.output.upload import (
    PARTS,
    STATE,
    UPLOADS,
    Destination,
    names_under,
    remove_objects,
    store_errors,
)
from packer.records import ShardResult
from packer.spec.errors import OutputError, PackerError
from packer.spec.manifest import read_manifest
from packer.system import stop_signals_held

KEPT = "kept"
"""The folder, beside the run's local output folder, where a token conversion's finished tokenizing
waits while its shards are uploaded (``set_aside``), for a ``--resume`` should the upload fail
(``packer.cli.run_folder``)."""
AHEAD = 2
"""Finished shards that may wait for their upload; the run waits while that many do."""
CHECKS = 16
"""Parts of an interrupted run checked at once by ``finished``."""
_SINKS: dict[Path, ShardUploads] = {}


class ShardUploads:
    """The uploads of one run into the reserved ``dest``, for outputs written inside ``local`` (see the module)."""

    def __init__(
        self, dest: Destination, local: Path, ahead: int = AHEAD, base: Optional[Path] = None, shared: bool = False
    ) -> None:
        self.dest, self.local, self.ahead = dest, Path(local).absolute(), int(ahead)
        self.shared = shared
        """A node of a conversion split with ``--num-nodes``: the other nodes' records share the prefix, so
        none is ever removed (not for a new plan, nor after a failure: ``abandon`` keeps what was done)."""
        self.base = Path(base).absolute() if base is not None else self.local.parent
        """The run's local folder, which holds ``local`` (``set_aside``)."""
        self.pool = ThreadPoolExecutor(UPLOADS, thread_name_prefix="packer-upload")
        self.uploads: dict[str, tuple[str, Future, int, str]] = {}
        """The latest part of each planned file not yet moved to its published name, its upload, its
        size and its SHA-256, by the file's name under the prefix."""
        self.sending: list[Future] = []  # every upload of this run (``finish`` waits for them)
        self._count = itertools.count()
        self.waiting: deque[list[Future]] = deque()  # each taken shard's uploads, oldest first
        self.sent: set[str] = set()  # every object this run wrote, by name under the prefix
        self.published: set[str] = set()
        """The published names the shards were moved to (``upload_output`` keeps them)."""
        self.bytes = 0  # uploaded and checked
        self.copies: list[Future] = []  # the copies to published names (``move``)
        self._lock = threading.Lock()
        self.records = ResumeRecords(dest, self.local, self._wrote, shared)
        """The records ``--resume`` reads, mirrored in the store (``packer.output.resume_records``)."""
        self.resumed: RestoredParts = {}  # what ``restore`` brought back
        self.intact: set[str] = set()  # the parts of ``resumed`` that the store holds as recorded
        self.checked: set[str] = set()  # the files of ``resumed`` whose parts the store was asked about
        self.moved: set[str] = set()  # every published name a shard was given (``move``)
        self.listed: set[str] = set()  # those the store's list of this run holds (``_list_published``)
        self._listing = threading.Lock()
        self.remote = False
        """Whether this run handed out where its parts go (``target``, which every run into a bucket
        does, for an executor whose workers write elsewhere): a failure then also lists the run's
        parts and removes those whose shards never came back."""
        self.kept_published: set[str] = set()
        """The published shards of a split set's finished splits (``keep_finished``): an interrupt keeps them."""

    def covers(self, output: Path) -> bool:
        """Whether ``output`` is written inside this run's local folder (its shards are uploaded here)."""
        output = Path(output).absolute()
        return output == self.local or self.local in output.parents

    def shown(self, output: Path) -> str:
        """The URL of ``output`` (a folder inside this run's local folder) in the bucket."""
        folder = self.object_name(output, "").rstrip("/")
        return self.dest.url.rstrip("/") + (f"/{folder}" if folder else "")

    def object_name(self, output: Path, relpath: str) -> str:
        """The object name, under the prefix, of the file ``relpath`` of the output ``output``."""
        folder = Path(output).absolute().relative_to(self.local).as_posix()
        return relpath if folder == "." else f"{folder}/{relpath}"

    def take(self, output: Path, folder: Path, result: ShardResult) -> None:
        """Upload the files of the finished shard ``result`` (in the staging ``folder`` of ``output``) in
        the background; wait while ``ahead`` shards wait for theirs. OutputError when an upload failed."""
        futures, parts = [], {}
        for f in result.files:
            name, n = self.object_name(output, f.path), next(self._count)
            part = part_name(self.dest.token, n, name)
            aside = Path(folder) / f".upload-{n}-{Path(f.path).name}"
            os.replace(Path(folder) / f.path, aside)  # a shard written again under its name is another file
            futures.append(self.pool.submit(self._upload, aside, part, f.sha256))
            self.uploads[name] = (part, futures[-1], f.bytes, f.sha256)
            self.sending.append(futures[-1])
            parts[f.path] = part
        self.records.keep_record(Path(folder) / f"{result.name}{DONE_SUFFIX}", parts, futures)
        self.waiting.append(futures)
        while self.waiting and (len(self.waiting) >= self.ahead or all(u.done() for u in self.waiting[0])):
            for sent in self.waiting.popleft():
                sent.result()

    def target(self, output: Path) -> PartTarget:
        """Where a worker on another machine puts the files of a shard of ``output`` (a folder inside
        this run's local folder) itself: this run's parts (``packer.output.part_target``). Shards
        whose files went there come back through ``take_uploaded``."""
        self.remote = True
        return PartTarget(self.dest.url, self.dest.token, self.object_name(output, "").rstrip("/"))

    def take_uploaded(self, output: Path, folder: Path, result: ShardResult, fingerprint: Optional[str] = None) -> None:
        """The finished shard ``result`` of ``output``, whose files a worker on another machine put in
        the store as this run's parts, each checked (``result.parts``, see ``target``): taken as a shard
        uploaded here. With ``fingerprint`` (the plan's: a shard --resume may keep), its record is
        written in the staging ``folder`` and mirrored, as its worker would have written it there."""
        done: Future = Future()
        done.set_result(None)
        own = f"{PARTS}/{self.dest.token[:12]}-"
        with self._lock:
            for f in result.files:
                part, name = result.parts.get(f.path, ""), self.object_name(output, f.path)
                if not (part.startswith(own) and OWN_PART.fullmatch(part) and part.endswith(f"/{name}")):
                    raise OutputError(f"{result.name}: {f.path} came back without a part of this run ({part!r})")
                self.sent.add(part)
                self.uploads[name] = (part, done, f.bytes, f.sha256)
                self.bytes += f.bytes
        if fingerprint is not None:
            record_shard(Path(folder), result, fingerprint=fingerprint or None)  # no file stamps: none is here
            self.records.keep_record(Path(folder) / f"{result.name}{DONE_SUFFIX}", dict(result.parts), [done])

    def _wrote(self, name: str) -> None:
        """``name`` (under the prefix) is about to be written by this run: a failure removes it."""
        with self._lock:
            self.sent.add(name)

    def _upload(self, path: Path, name: str, sha256: str) -> None:
        target = f"{self.dest.root}/{name}"
        with store_errors(self.dest.url):
            self._wrote(name)  # before the upload: a failed one may have left an object
            size = path.stat().st_size
            upload.put_checked(self.dest.fs, path, target, self.dest.url, sha256)  # the worker's hash, not again
        path.unlink(missing_ok=True)  # in the bucket and checked: the local disk holds it no more
        with self._lock:
            self.bytes += size

    def keep_finished(self, files: list[Path], published: list[str], finished: Optional[Path] = None) -> None:
        """Mirror ``files`` of the local folder (``ResumeRecords.keep_files``) once every upload and copy
        so far is done, so that ``--resume`` of a split set keeps the split ``finished``; ``published``
        (names under the prefix: its shards) then stay through an interrupt."""
        self.settle()
        with self._lock:
            self.kept_published.update(published)
        with stop_signals_held():
            self.records.keep_files(files, finished)

    def _list_published(self, target: str) -> None:
        """Have the list of the published names this run gave its shards so far, ``target`` among
        them, in the store before ``target`` is (one list a run, never another run's, rewritten
        whole: ``prefix_reservation._published_by_interrupted_run`` reads them all, and the next publish
        removes the names its output does not list). Copies made at once share one write."""
        with self._listing:
            if target in self.listed:
                return
            names = set(self.moved)
            name = f"{STATE}/{PUBLISHED_PREFIX}{self.dest.token[:12]}.json"
            with store_errors(self.dest.url):
                self._wrote(name)
                self.dest.fs.pipe_file(f"{self.dest.root}/{name}", json.dumps(sorted(names)).encode())
            self.listed |= names

    def published_whole(self, output: Path) -> bool:
        """Whether every shard file the manifest of the finished split ``output`` (restored) lists was
        in the store when this run began (the interrupted run that finished it published them)."""
        try:
            shards = read_manifest(output).shards
        except PackerError:
            return False
        return all(self.object_name(output, f.path) in self.dest.before for s in shards for f in s.files)

    def set_aside(self, path: Path, copy: bool = False) -> None:
        """Move (or ``copy``) the file ``path`` of the run's folder (``base``) into its ``KEPT``, under
        the same path: kept out of the output it is published with, and put back by a ``--resume``."""
        target = self.base / KEPT / Path(path).absolute().relative_to(self.base)
        target.parent.mkdir(parents=True, exist_ok=True)
        if copy:
            shutil.copyfile(path, target)
        else:
            os.replace(path, target)

    def restore(self) -> None:
        """Bring the records an interrupted run mirrored back into the local folder's parent
        (``ResumeRecords.restore``), and note the parts they name; ``finished`` checks those of the
        shards it is asked about (the size and the SHA-256 the store recorded, else read back)."""
        self.resumed = self.records.restore()

    def _check(self, wanted: set[str]) -> None:
        """Ask the store about the restored parts of the files ``wanted`` (names under the prefix) not
        asked about yet: those it holds as recorded join ``intact``."""
        todo = [self.resumed[n] for n in sorted(wanted - self.checked) if n in self.resumed]
        self.checked |= wanted
        fs, root = self.dest.fs, self.dest.root
        with ThreadPoolExecutor(CHECKS) as pool:  # a request each: at once, not one after another
            held = pool.map(lambda r: upload.holds(fs, f"{root}/{r[0]}", r[1], r[2]), todo)
            with store_errors(self.dest.url):
                self.intact |= {r[0] for r, ok in zip(todo, list(held)) if ok}

    def finished(self, output: Path, folder: Path, names: list[str]) -> dict[str, ShardResult]:
        """The shards of ``names`` restored (``restore``) whose parts the store holds as recorded (asked
        here, for these shards only: a node of a split conversion asks about its own, not every
        node's); they are moved to their published names as this run's own."""
        done: Future = Future()
        done.set_result(None)
        top, shards = self.object_name(output, ""), set(names)
        self._check({n for n in self.resumed if n.startswith(top) and _shard_of(n[len(top) :]) in shards})

        def intact(stage: Path, relpath: str, size: int, digest: str, stamp: object = None) -> bool:
            name = self.object_name(output, relpath)
            part, *recorded = self.resumed.get(name, ("", 0, ""))
            if part not in self.intact or recorded != [size, digest]:
                return False
            self.uploads[name] = (part, done, size, digest)
            return True

        return finished_shards(folder, names, intact)

    def holds(self, output: Path, relpath: str) -> bool:
        """Whether the file ``relpath`` of ``output``'s staging folder was taken for upload (and not moved)."""
        return self.covers(output) and self.object_name(output, relpath) in self.uploads

    def move(self, output: Path, old: str, new: str) -> None:
        """Give the uploaded file ``old`` of ``output`` its published name ``new`` (once its upload is
        done): copied inside the store in the background, and checked (``object_checks.copy_checked``);
        the part stays until the manifest is up. ``finish`` waits for the copies."""
        source, pending, size, sha256 = self.uploads.pop(self.object_name(output, old))
        pending.result()  # here, not in the pool: a copy never waits on a queued upload
        target = self.object_name(output, new)
        with self._lock:
            self.moved.add(target)
        self.copies.append(self.pool.submit(self._copy, source, target, size, sha256))

    def _copy(self, source: str, target: str, size: int, sha256: str) -> None:
        fs, root = self.dest.fs, self.dest.root
        self._list_published(target)  # first: a run killed after the copy leaves no shard no one knows of
        with store_errors(self.dest.url):
            self._wrote(target)  # before the copy: a failed one may have left an object
            copy_checked(fs, f"{root}/{source}", f"{root}/{target}", size, sha256)
        with self._lock:  # the part stays until the manifest is up: an interrupt here loses no shard
            self.published.add(target)

    def settle(self) -> None:
        """Wait for the uploads and the copies to published names made so far (OutputError when one
        failed): the shards given their names are then in the store under them."""
        for pending in [*self.sending, *self.copies]:
            pending.result()

    def finish(self) -> None:
        """Wait for the last uploads, copies and records (OutputError when one failed). The parts
        stay until the manifest is up (``upload_output`` removes them)."""
        for copy in self.copies:
            copy.result()
        self.records.wait()
        for pending in self.sending:
            pending.result()
        self.uploads.clear()
        self.pool.shutdown()
        self.records.stop(cancel=False)

    def abandon(self, resumable: bool = False) -> None:
        """After a failure or an interrupt: stop, and remove every object this run wrote that was not
        there before (the prefix as it was); ``resumable`` (an interrupt) keeps the parts and records
        of the finished shards for ``--resume``, where a plan was recorded (``resumable``), and
        otherwise leaves an earlier interrupted run's. A failure of a run that was not a --resume
        and had begun to replace an earlier interrupted run's records removes all of them (but the
        lists of published shards)."""
        resumable = resumable or self.shared  # a node keeps its finished shards for its next run, always
        failed, resumable = not resumable, resumable and self.records.resumable
        with stop_signals_held():  # a second Ctrl-C must not leave half of the run's objects
            self.pool.shutdown(wait=True, cancel_futures=True)  # a queued upload's shard is written again
            self.records.stop(cancel=not resumable)
            kept = (lambda n: n.startswith(f"{PARTS}/") or n in self.kept_published) if resumable else (lambda n: False)
            gone = [n for n in sorted(self.sent - self.dest.before) if not kept(n)]
            lists = f"{STATE}/{PUBLISHED_PREFIX}"  # kept: what the next publish removes of earlier runs
            touched = any(n.startswith(f"{STATE}/") and not n.startswith(lists) for n in self.sent)
            if failed and touched and not self.records.resuming:  # a run replacing an interrupted one's records
                # every record goes: this run replaced some, whose shards it removed (a --resume's are
                # kept: a split it finished and lost is not kept again, ``published_whole``)
                records = (self.sent | self.dest.before) - set(gone)
                gone += sorted(n for n in records if n.startswith(f"{STATE}/") and not n.startswith(lists))
            if failed and self.remote:  # parts put by workers elsewhere whose shards never came back
                gone += sorted(self._own_parts() - self.sent - set(gone))
            try:
                remove_objects(self.dest.fs, [f"{self.dest.root}/{name}" for name in gone])
            except Exception:  # noqa: BLE001 - best effort: a leftover is refused (no manifest) and replaced by --overwrite
                pass

    def _own_parts(self) -> set[str]:
        """The parts of this run the store holds now, by name under the prefix (none when it cannot say)."""
        own = f"{PARTS}/{self.dest.token[:12]}-"
        try:
            names = names_under(self.dest.fs, f"{self.dest.root}/{PARTS}", self.dest.root)
        except Exception:  # noqa: BLE001 - best effort, as the removal: the next publish removes them
            return set()
        return {n for n in names if n.startswith(own)}


def _shard_of(relpath: str) -> str:
    """The shard a file of an output's own folder belongs to (``shard-00003.tar``: ``shard-00003``);
    "" for a file one folder down (another output's)."""
    return "" if "/" in relpath else relpath.split(".", 1)[0]


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


__all__ = ["ShardUploads", "streaming", "sink_for", "AHEAD", "KEPT"]
