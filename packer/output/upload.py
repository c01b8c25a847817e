"""An output written to object storage (``packer convert SRC -o s3://bucket/prefix``): a finished local
output uploaded under a URL so that no reader ever takes it for a whole output before it is one.

The prefix is checked and its lock taken first, before any conversion work
(``packer.output.prefix_reservation``: ``reserve``, and ``reserve_node`` for a split conversion's nodes).
``upload_output`` then puts the shard files not uploaded while the conversion ran in parallel, each
checked (``put_checked``), then the other files of each output (``report.txt``, other loaders'
shard lists), then each ``manifest.json`` and last a split set's ``splits.json``: a prefix without
its manifest is never an output, and a wds shard list never names a shard not yet uploaded. A
failure before the manifests puts back the files the run replaced (an ``--overwrite``'s or an
append's report, hashes and shard lists, fetched before each was replaced) and removes what the run
uploaded (the prefix is as it was); a run killed there, where no handler runs, is rolled back by the
next run into the prefix from copies kept in the store (``REPLACED``); after them, the replaced
output's own objects that the new one does not list (with ``overwrite``; else an interrupted
run's at the top of the prefix) and every run's parts and records are removed, and the uploads in
parts a killed run never completed are aborted.
``release`` lets go of the lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from packer.output.multipart import UNSUPPORTED, abort_unfinished
from packer.output.object_checks import check_uploaded, holds, put_checked
from packer.output.prefix_lock import (
    LOCK_LEASE,
    LOCK_NAME,
    check_own_lock,
)
from packer.output.replaced_files import ReplacedFiles
from packer.spec.errors import DAMAGED_IN_STORE, ManifestError, OutputError, damaged_in_store, store_refusal
from packer.spec.listed_files import sha256_of
from packer.spec.locations import store_error_reason
from packer.spec.manifest import MANIFEST_NAME, parse_manifest
from packer.spec.splits_record import SPLITS_NAME
from packer.system import stop_signals_held

log = logging.getLogger(__name__)

UPLOADS = 4
"""Files uploaded at once."""
PARTS = ".packer-parts"
"""The folder of a prefix where a conversion puts its shards as they finish, before their published
names (``packer.output.shard_uploads``): ``PARTS/TOKEN-N/NAME``, and the records ``--resume`` reads
(``PARTS/state/...``). Removed once the manifest is up."""
STATE = f"{PARTS}/state"
"""Where a conversion keeps the records ``--resume`` reads (``packer.output.resume_records``)."""
OWN_NAME = re.compile(
    r"(\.packer-parts/[0-9a-f]{12}-\d+/)?([A-Za-z0-9._-]+/)?(shard-\d{5}(-[0-9a-f]{12})?\.[A-Za-z0-9._-]+|"
    r"report\.txt|shardindex\.json|manifest\.json|splits\.json|image_hashes(-[0-9a-f]{12})?\.npy)|\.packer-parts/state/[A-Za-z0-9._/-]+"
    r"|\.packer-parts/nodes/rank-\d+\.lock"
    r"|\.packer-parts/checksum-probe"
    r"|\.packer-parts/replaced/([A-Za-z0-9._-]+/)?(report\.txt|shardindex\.json|manifest\.json|splits\.json|"
    r"image_hashes(-[0-9a-f]{12})?\.npy)"
)
"""The names packer gives the files of an output (and of a split set's outputs, one folder down),
and the parts and records of a conversion's shards (``PARTS``), and the probe object of
``object_checks.checks_sums``."""


@dataclass
class Destination:
    """A prefix reserved for one upload: its filesystem and path, the run's lock token, and the
    objects of the output there before (packer's own: what ``overwrite`` may remove)."""

    url: str
    fs: Any
    root: str
    token: str
    overwrite: bool
    before: set[str]
    published: bool = False
    """Whether the manifests are up: the output is whole there (``upload_output``)."""
    lock: str = LOCK_NAME
    """The lock object this run holds and renews: the prefix's, or a ``--num-nodes`` node's lease
    (``packer.output.prefix_reservation.NODE_LEASE``)."""
    interrupted_shards: set[str] = field(default_factory=set)
    """The published names interrupted runs gave their shards (``_published_by_interrupted_run``), read
    before this run lists its own: removed once this run is published, unless it lists them."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _renewer: Optional[threading.Thread] = None


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path in it; OutputError when no backend can write it."""
    scheme = url.split("://")[0]
    try:
        import fsspec

        fs, root = fsspec.core.url_to_fs(url)
    except ImportError as e:
        extra = {"gs": "gcs", "gcs": "gcs"}.get(scheme, "s3")
        raise OutputError(
            f"writing {url} needs fsspec's backend for it: {e} (pip install 'packer-datasets[{extra}]')"
        ) from None
    except ValueError as e:
        raise OutputError(f"cannot write {url}: {e}") from None
    return fs, root.rstrip("/")


def fetch_output(dest: Destination, local: Path, before: Path) -> Path:
    """For an append to the output at ``dest``: its manifest into the folder ``local`` (with the time
    the store last modified it: the append compares the sources' times with it), the ``splits.json``
    of the prefix above into ``local``'s parent (a split is refused, as a local one is), and the
    manifest as it was into ``before`` (an append that adds nothing leaves the prefix untouched).
    Returns ``before``."""
    fs, root = dest.fs, dest.root
    local.mkdir(parents=True, exist_ok=True)  # a resumed token append: kept from the run before
    before.mkdir(parents=True, exist_ok=True)
    with store_errors(dest.url):
        fs.get_file(f"{root}/{MANIFEST_NAME}", str(before / MANIFEST_NAME))
        shutil.copyfile(before / MANIFEST_NAME, local / MANIFEST_NAME)
        modified = fs.modified(f"{root}/{MANIFEST_NAME}").timestamp()
        if modified == int(modified):  # a store's whole seconds (S3's): a file of that second is not newer
            modified += 1
        os.utime(local / MANIFEST_NAME, (modified, modified))
        parent = root.rsplit("/", 1)[0] if "/" in root else ""
        if parent and fs.isfile(f"{parent}/{SPLITS_NAME}"):
            fs.get_file(f"{parent}/{SPLITS_NAME}", str(local.parent / SPLITS_NAME))
    return before


def upload_output(
    local: Path,
    dest: Destination,
    progress: Optional[Callable[[int], None]] = None,
    streamed: frozenset[str] = frozenset(),
    abandon: Optional[Callable[[bool], None]] = None,
) -> int:
    """Upload the finished output (or split set) in ``local`` to the reserved ``dest`` (see the module);
    returns the bytes uploaded. ``progress`` gets each file's bytes once it is uploaded and checked.
    ``streamed``: the names of the shard files already in the prefix, uploaded and checked as the
    conversion ran (``packer.output.shard_uploads``); removed with the rest when this fails, and then
    ``abandon(interrupted)`` is called (``ShardUploads.abandon``: the run's parts and records).
    The files of the output there that this upload writes again (an ``--overwrite``'s or an
    append's report, shard lists, image hashes) are copied in the store first
    (``packer.output.replaced_files``), and put back when this fails before the manifests."""
    fs, root = dest.fs, dest.root
    files = sorted(p for p in local.rglob("*") if p.is_file())
    relative = {p: p.relative_to(local).as_posix() for p in files}
    shards = [p for p in files if p.name.startswith("shard-")]
    last = (MANIFEST_NAME, SPLITS_NAME)
    others = [p for p in files if p not in shards and p.name not in last]
    manifests = sorted((p for p in files if p.name in last), key=lambda p: (last.index(p.name), relative[p]))
    sent: list[str] = []
    replaced = ReplacedFiles(fs, root, dest.before, sent)

    def put(path: Path) -> int:
        target = f"{root}/{relative[path]}"
        if relative[path] in dest.before and not path.name.startswith("shard-"):
            replaced.keep(relative[path])  # put back if this fails; never a shard: each run's have own names
        sent.append(relative[path])  # before the upload: a failed one may have left an object
        put_checked(fs, path, target, dest.url)
        if progress is not None:
            progress(path.stat().st_size)
        return path.stat().st_size

    def undo(e: BaseException) -> None:
        """The prefix as it was: what this run replaced put back (the manifest first), then nothing of
        this run's left. Where something cannot be put back, this run's objects stay: the manifest
        there may list them."""
        with stop_signals_held():  # a second Ctrl-C must not leave half of it done
            if not replaced.put_back(dest.url):
                return
            left = (set(sent) | streamed) - dest.before
            remove_objects(fs, [f"{root}/{name}" for name in sorted(left)])
            if abandon is not None:
                abandon(isinstance(e, KeyboardInterrupt))

    with store_errors(dest.url):
        try:
            with ThreadPoolExecutor(UPLOADS) as pool:
                size = sum(pool.map(put, shards))
            size += sum(put(p) for p in others)
            check_own_lock(dest)  # a run that lost its lock must not make its output the live one
        except BaseException as e:
            undo(e)
            raise
    with stop_signals_held():  # Ctrl-C waits for the output to be whole, and the leftovers gone
        with store_errors(dest.url):
            for n, path in enumerate(manifests):  # one by one, after every other file: the output appears whole
                try:
                    size += put(path)
                except BaseException as e:
                    if _stored(fs, f"{root}/{relative[path]}", path):  # stored, the answer lost: it is up
                        size += path.stat().st_size
                        continue
                    if n == 0:  # none is up: the prefix is put back as it was
                        undo(e)
                    raise
        dest.published = True
        # with --overwrite, the replaced output's own objects, now unlisted; else an interrupted run's
        # at the top (the objects of an output one folder down are not this run's); the parts and
        # records of every run, the records first (parts without them are only scratch)
        try:
            listed = set(relative.values()) | streamed | _listed_by_manifests(manifests, relative)
            old = {n for n in dest.before if dest.overwrite or "/" not in n} | names_under(fs, f"{root}/{PARTS}", root)
            old |= dest.interrupted_shards
            gone = sorted(old - listed, key=lambda n: (not n.startswith(f"{STATE}/"), n))
            remove_objects(fs, [f"{root}/{name}" for name in gone])
        except Exception as e:  # noqa: BLE001 - the output is whole; what is left is removed by the next run
            log.warning(
                "%s is published, but objects the new output does not list could not be removed (%s); "
                "the next conversion into it removes them",
                dest.url,
                e,
            )
        try:
            abort_unfinished(fs, f"{root}/{PARTS}")  # a killed run's uploads in parts, never completed
        except PermissionError as e:  # credentials without the right to list them (least privilege): no harm done
            log.debug("%s: uploads in parts a killed run left were not looked for (%s)", dest.url, e)
        except Exception as e:  # noqa: BLE001 - the output is whole; the next publish tries again
            # a killed run leaves its records under PARTS, where any upload in parts it left would be
            _abort_failed(dest.url, e, any(n.startswith(f"{PARTS}/") for n in dest.before))
    return size


def _abort_failed(url: str, error: Exception, left_parts: bool) -> None:
    """Say that the uploads in parts a killed run may have left could not be aborted: a warning where
    the store failed, or where an interrupted run had left objects in the prefix (``left_parts``); a
    note (``-v``) where the store does not list such uploads at all (it answers ``NotImplemented``)
    and no run was interrupted there, which would otherwise be said after every conversion into it."""
    if isinstance(error, OSError) and store_refusal(error) in UNSUPPORTED:
        said = (
            "%s: the store does not list unfinished uploads in parts (%s), so packer cannot abort those a "
            "killed run may have left; a lifecycle rule of the bucket (AbortIncompleteMultipartUpload) removes them"
        )
        (log.warning if left_parts else log.info)(said, url, store_refusal(error))
        return
    log.warning("%s is published, but uploads in parts a killed run left could not be aborted (%s)", url, error)


def _stored(fs: Any, target: str, path: Path) -> bool:
    """Whether the object ``target`` holds the file ``path`` (whose upload failed, or seemed to)."""
    try:
        return holds(fs, target, path.stat().st_size, sha256_of(path))
    except Exception:  # noqa: BLE001 - the store cannot say: not stored, as far as this run knows
        return False


def _listed_by_manifests(manifests: list[Path], relative: dict[Path, str]) -> set[str]:
    """The names under the prefix of the shard files the uploaded ``manifests`` list: an appended
    output's earlier shards, which stay in the prefix and are not uploaded again."""
    listed = set()
    for path in manifests:
        if path.name != MANIFEST_NAME:
            continue
        folder = relative[path][: -len(MANIFEST_NAME)]  # "" or "split/"
        manifest = parse_manifest(path.read_text(encoding="utf-8"), str(path))
        listed.update(f"{folder}{f.path}" for shard in manifest.shards for f in shard.files)
    return listed


@contextlib.contextmanager
def store_errors(url: str) -> Iterator[None]:
    """The backends' errors as OutputErrors naming the URL (credentials: which settings are read)."""
    try:
        yield
    except OutputError:
        raise
    except (OSError, ValueError, ManifestError) as e:
        raise OutputError(f"cannot write {url}: {e}") from None
    except Exception as e:  # noqa: BLE001 - botocore's NoCredentialsError, google.auth's, ...
        if damaged_in_store(e):  # an object read there (a manifest, a lock, a record)
            raise OutputError(
                f"cannot write {url}: an object there {DAMAGED_IN_STORE}; run packer verify {url}, or remove "
                "the object (pass --overwrite where it is the output's)"
            ) from None
        reason = store_error_reason(e, url)  # no credentials, an endpoint that does not answer, ...
        if reason is None:
            raise
        raise OutputError(f"cannot write {url}: {reason}") from None


def remove_objects(fs: Any, paths: list[str]) -> None:
    """Remove the objects ``paths`` of ``fs``, in as few requests as the backend allows (S3: a
    thousand a request); those already gone are no error."""
    if not paths:
        return
    try:
        fs.rm(paths)
    except FileNotFoundError:
        for path in paths:
            remove_object(fs, path)


def remove_object(fs: Any, path: str) -> None:
    """Remove the object ``path`` of ``fs``; one already gone is no error."""
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        pass


def names_under(fs: Any, root: str, relative_to: Optional[str] = None) -> set[str]:
    """The objects under ``root``, relative to it (or to ``relative_to``, a folder above it), as the
    store has them now (not a cached listing)."""
    fs.invalidate_cache(root)
    try:
        found = fs.find(root)
    except FileNotFoundError:
        return set()
    prefix = (relative_to or root) + "/"
    return {p[len(prefix) :] for p in found if p.startswith(prefix)}


__all__ = [
    "Destination",
    "filesystem",
    "names_under",
    "upload_output",
    "fetch_output",
    "check_uploaded",
    "put_checked",
    "holds",
    "remove_object",
    "remove_objects",
    "store_errors",
    "LOCK_NAME",
    "LOCK_LEASE",
]
