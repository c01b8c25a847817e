"""The records ``--resume`` reads of a run into a bucket, mirrored in the store as they are written.

A conversion into a bucket writes its staging folders' records locally, as any conversion does (the
plan, and each finished shard's record), and ``ResumeRecords`` mirrors them under ``STATE`` in the
prefix (``keep_plan``, ``keep_record``), each shard's record after its shard's uploads and its
folder's plan, one after another in a thread of their own. A shard's mirrored record names the part
object each of its files went to (``PARTS_OF_RECORD``). ``restore`` brings the records an
interrupted run mirrored back into a new local folder and returns the parts they name, which
``ShardUploads.finished`` checks before the run keeps their shards.

A split set's splits keep their records as a conversion does; as each split finishes, its manifest
(and the files made with it) and the set's record are mirrored too (``keep_files``), so that
``--resume`` keeps it whole. A node of a conversion split with ``--num-nodes`` (``shared``) shares
its plan with the other nodes' (created only where none is) and never removes their records.

Every object written is reported to ``wrote`` (the run's list of its objects, which a failure
removes: ``ShardUploads.abandon``): before it is written, but a node's shared plan, reported once
this node created it (another node's plan is never this run's to remove).
"""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

from packer.output.files import DONE_SUFFIX, FILE_STAMPS, PLAN_RECORD, STAGING_MARK, STAGING_SUFFIX, staging_dir
from packer.output.part_target import OWN_PART
from packer.output.shard_samples import SAMPLES_FILE
from packer.output.upload import OWN_NAME, PARTS, STATE, Destination, store_errors
from packer.spec.errors import OutputError
from packer.spec.manifest import MANIFEST_NAME
from packer.spec.splits_record import SPLITS_NAME

PUBLISHED_PREFIX = "published-"
"""Under ``STATE``: ``published-TOKEN.json``, the shards of a split set's finished splits that run
TOKEN published (``ShardUploads.keep_finished``)."""
PARTS_OF_RECORD = "parts"
"""In a mirrored shard record: the part object of each of its files, by the file's path."""

RestoredParts = dict[str, tuple[str, int, str]]
"""The part of each file an interrupted run uploaded and recorded, with the file's size and SHA-256
as recorded, by the file's name under the prefix."""


class ResumeRecords:
    """The mirrored records of one run into the reserved ``dest``, whose staging folders are inside
    ``local``'s parent (see the module)."""

    def __init__(self, dest: Destination, local: Path, wrote: Callable[[str], None], shared: bool = False) -> None:
        self.dest, self.local, self.wrote, self.shared = dest, Path(local).absolute(), wrote, shared
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="packer-records")  # in order, after the uploads
        self.kept: list[Future] = []  # the records' mirroring
        self.planned: set[Path] = set()  # the staging folders whose plan is mirrored
        self.deferred: dict[Path, list[tuple[Path, dict, list[Future]]]] = {}
        """Shards finished before their folder's plan was recorded (an early start's), mirrored with it."""
        self.restored: set[Path] = set()  # the staging folders whose records ``restore`` brought back
        self.resuming = False  # a --resume: ``restore`` was called

    @property
    def resumable(self) -> bool:
        """Whether a plan was mirrored: an interrupt then keeps the finished shards for --resume."""
        return bool(self.planned)

    def name(self, path: Path) -> str:
        """The object name, under the prefix, of the mirror of the local file ``path``."""
        return f"{STATE}/{Path(path).absolute().relative_to(self.local.parent).as_posix()}"

    def _put(self, path: Path, data: bytes, after: list[Future] = ()) -> None:
        """Put ``data`` as the mirror of the staging file ``path`` once the uploads ``after`` are done."""
        for sent in after:
            if sent.cancelled() or sent.exception() is not None:
                return  # that shard is not finished in the store; the run fails on it anyway
        name = self.name(path)
        with store_errors(self.dest.url):
            self.wrote(name)
            self.dest.fs.pipe_file(f"{self.dest.root}/{name}", data)

    def restart(self, folder: Path) -> None:
        """A new run in the staging ``folder``: the records mirrored of a run before go with its plan's
        (``keep_plan``), not before: until then an interrupt leaves them as they were."""
        self.planned.discard(Path(folder).absolute())
        self.deferred.pop(Path(folder).absolute(), None)

    def _clear(self, folder: Path) -> None:
        old = f"{self.dest.root}/{self.name(folder)}"
        with store_errors(self.dest.url):
            self.dest.fs.invalidate_cache(old)
            if self.dest.fs.exists(old):
                self.dest.fs.rm(old, recursive=True)

    def keep_plan(self, folder: Path) -> None:
        """Mirror the plan recorded in the staging ``folder``, then the records of the shards finished
        before it that are still there (an early start's ``settle`` deletes those of the shards it
        cancels). Only a
        conversion's plan (with a fingerprint, which --resume compares) is mirrored."""
        folder = Path(folder).absolute()
        try:
            plan = (folder / PLAN_RECORD).read_bytes()
            recorded = json.loads(plan)
            if not recorded.get("fingerprint") or recorded.get("operation") in ("pack", "pack-append"):
                return  # a token conversion's or append's: its shards have no records to resume from
        except (OSError, ValueError, AttributeError):
            return
        if self.shared:
            self._share_plan(folder, plan, recorded)
        else:
            if folder not in self.restored:  # a new run: the records of one before go with its plan
                self.kept.append(self.pool.submit(self._clear, folder))
            self.kept.append(self.pool.submit(self._put, folder / PLAN_RECORD, plan))
        self.planned.add(folder)
        for path, parts, uploads in self.deferred.pop(folder, []):
            self.keep_record(path, parts, uploads)

    def _share_plan(self, folder: Path, plan: bytes, recorded: dict) -> None:
        """A node's plan in the store, now: created there only where none is (S3's ``If-None-Match``), so
        that of nodes started at once, which found none, one plan wins; a node whose plan is not the
        one there is refused before it writes a shard. OutputError saying what to do."""
        name = self.name(folder / PLAN_RECORD)
        target = f"{self.dest.root}/{name}"
        fs = self.dest.fs
        with store_errors(self.dest.url):
            try:
                fs.pipe_file(target, plan, mode="create")
                self.wrote(name)  # this node's own: another node's plan is never the run's
                return
            except FileExistsError:
                pass
            except TypeError:  # a backend without exclusive create: its plan is written, then read back
                self.wrote(name)
                fs.pipe_file(target, plan)
            fs.invalidate_cache(target)
            try:
                theirs = json.loads(fs.cat_file(target))
            except ValueError:
                theirs = {}
        keys = ("fingerprint", "workers")
        if [theirs.get(k) for k in keys] != [recorded.get(k) for k in keys] or (theirs.get("split") or {}).get(
            "nodes"
        ) != (recorded.get("split") or {}).get("nodes"):
            where = f"{self.dest.url.rstrip('/')}/{PARTS}"
            raise OutputError(
                f"this node cannot join the conversion in {where}: another node recorded another plan there "
                "(other options, --num-nodes, -j or source files). Every node must run the same command, only "
                f"--node-rank differs; if that run is stale, remove {where} and start every node again"
            )

    def keep_record(self, path: Path, parts: dict[str, str], uploads: list[Future]) -> None:
        """Mirror the finished shard's record ``path`` with its files' ``parts``, after their
        ``uploads``; before its folder's plan is, the record waits for it (``keep_plan``)."""
        if path.parent.absolute() not in self.planned:
            self.deferred.setdefault(path.parent.absolute(), []).append((path, parts, uploads))
            return
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # not recorded (no --resume of it), or cancelled: written again by a resumed run
        for local_only in (FILE_STAMPS, SAMPLES_FILE):  # this machine's inodes, a side file not mirrored
            record.pop(local_only, None)
        data = json.dumps({**record, PARTS_OF_RECORD: parts}, ensure_ascii=False).encode()
        self.kept.append(self.pool.submit(self._put, path, data, uploads))

    def keep_files(self, files: list[Path], finished: Optional[Path] = None) -> None:
        """Mirror ``files`` of the local folder (a split set's ``splits.json``, the manifest of the
        split ``finished`` and the files made with it), the manifests last; then the records of the
        staging folder of ``finished`` go: --resume keeps the split, never writes it again."""
        # in this order, one after another: a record of the set naming the split as finished is up only
        # once its manifest is, and that only once the files made with it are
        last = (MANIFEST_NAME, SPLITS_NAME)
        ordered = sorted(files, key=lambda f: (f.name in last, last.index(f.name) if f.name in last else 0))
        for path in ordered:
            self.kept.append(self.pool.submit(self._put, path, path.read_bytes()))
        if finished is not None:
            self.kept.append(self.pool.submit(self._clear, staging_dir(finished)))

    def restore(self) -> RestoredParts:
        """Bring the records an interrupted run mirrored back into the local folder's parent (its
        staging folders, as that run left them); returns the parts they name."""
        fs, root = self.dest.fs, self.dest.root
        self.resuming = True
        parts: RestoredParts = {}
        with store_errors(self.dest.url):
            state = sorted(n[len(STATE) + 1 :] for n in self.dest.before if n.startswith(f"{STATE}/"))
            planned = {Path(n).parent for n in state if Path(n).name == PLAN_RECORD}
            wanted = {}
            for name in state:
                path = self.local.parent / name
                if name.startswith(PUBLISHED_PREFIX):
                    continue  # a run's list of its published shards: read by upload, not restored
                if Path(name).parent not in planned and _in_staging(name):
                    continue  # a shard record without its folder's plan: nothing to resume
                if self.local.parent.resolve() not in path.resolve().parents:
                    continue  # never outside the scratch folder, whatever a name says
                wanted[f"{root}/{STATE}/{name}"] = path
            fetched = fs.cat(list(wanted)) if wanted else {}  # at once (s3fs: concurrent requests)
            for key, path in wanted.items():
                data = fetched[key]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                if path.name == PLAN_RECORD:
                    (path.parent / STAGING_MARK).touch()
                    self.planned.add(path.parent.absolute())  # this run's records of it are mirrored at once
                    self.restored.add(path.parent.absolute())
                elif path.name.endswith(DONE_SUFFIX):
                    try:
                        record = json.loads(data)
                        for f in record["files"]:
                            part = record[PARTS_OF_RECORD][f["path"]]
                            if not (OWN_PART.fullmatch(part) and OWN_NAME.fullmatch(part)):
                                raise ValueError(f"not a part's name: {part}")
                            parts[part.split("/", 2)[2]] = (part, int(f["bytes"]), str(f["sha256"]))
                    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
                        continue  # not a record this packer wrote: its shard is written again
        return parts

    def wait(self) -> None:
        """Wait for the records mirrored so far (OutputError when one failed)."""
        for kept in self.kept:
            kept.result()

    def stop(self, cancel: bool) -> None:
        """Stop mirroring: wait for the record being written, and ``cancel`` those queued, or not."""
        self.pool.shutdown(wait=True, cancel_futures=cancel)


def _in_staging(name: str) -> bool:
    """Whether the mirrored record ``name`` is in a staging folder (a shard's record, or its plan),
    not one of a finished output's files."""
    return any(part.endswith(STAGING_SUFFIX) for part in Path(name).parts)


__all__ = ["ResumeRecords", "RestoredParts", "PUBLISHED_PREFIX", "PARTS_OF_RECORD"]
