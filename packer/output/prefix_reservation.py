"""A prefix checked and reserved before a run writes into it (``packer.output.upload`` uploads).

``reserve`` comes first, before any conversion work: it checks the prefix and takes its lock
(``packer.output.prefix_lock``). Another run's lock younger than ``LOCK_LEASE`` (by the store's own
clock) refuses the run, unless it names this machine and a process that is gone (a killed run); the
lock is created with the store's exclusive create where the backend offers it (S3: ``If-None-Match``),
so two runs cannot both take it, and a thread renews it while the run lasts. An output there is
replaced only with ``overwrite``; objects that are not packer's (not named as packer names its
files, or a ``manifest.json`` that is not a packer manifest) are refused, never removed; an
interrupted conversion's (its records under ``STATE``: ``packer.output.resume_records``) are
continued with ``resume`` or replaced (a split conversion's nodes' only with ``overwrite``); other
leftovers of packer's names without a manifest are replaced only with ``overwrite``. A running
``--num-nodes`` node's lease (``NODE_LEASE``) refuses the run too.

``reserve_node`` checks the prefix for one node of a split conversion and takes that node's lease,
not the prefix's lock: the nodes write into the prefix at once, and ``packer merge`` takes the lock.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from typing import Any, Optional

from packer.output.files import PLAN_RECORD
from packer.output.object_checks import checks_sums
from packer.output.prefix_lock import (
    LOCK_LEASE,
    LOCK_NAME,
    TAKEOVER_SETTLE,
    holder_is_gone,
    lock_age,
    lock_token,
    read_lock,
    release,
    renew,
    write_lock,
)
from packer.output.replaced_files import REPLACED, roll_back
from packer.output.upload import (
    OWN_NAME,
    PARTS,
    STATE,
    Destination,
    filesystem,
    names_under,
    remove_objects,
    store_errors,
)
from packer.spec.errors import ManifestError, OutputError
from packer.spec.manifest import MANIFEST_NAME, parse_manifest
from packer.spec.splits_record import SPLITS_NAME

log = logging.getLogger(__name__)

NODE_LEASE = f"{PARTS}/nodes/rank-{{rank}}.lock"
"""The lease a running ``--num-nodes`` node holds on the prefix (a lock object, renewed as the
prefix's lock is): a merge, a conversion and the same rank elsewhere wait for it."""
_NODE_LEASE = re.compile(r"\.packer-parts/nodes/rank-(\d+)\.lock")


def reserve(url: str, overwrite: bool, resume: bool = False, append: bool = False) -> Destination:
    """Check ``url`` and take its lock (see the module); OutputError saying what to do otherwise.
    ``resume``: an interrupted conversion's objects there (its records under ``STATE``) are to be
    continued; without it they are replaced, as a local run discards an unfinished one. ``append``:
    the output there is added to (``--append``), so there must be one, and a split set is not one."""
    fs, root = filesystem(url)
    with store_errors(url):
        names = names_under(fs, root)
        replacing = LOCK_NAME in names  # a dead run's lock, replaced below (its token: ``dead``)
        dead = None
        if replacing:
            names.discard(LOCK_NAME)
            busy = f"another conversion is writing {url}"
            lock = _dead_lock(fs, root, url, busy, ", or remove the lock object if that run died")
            dead = (lock or {}).get("token")
        _refuse_foreign(names, url)
        leases = sorted(found.group(0, 1) for found in map(_NODE_LEASE.fullmatch, names) if found)
        for lease, rank in leases:  # a node running, or a dead one's
            busy = f"node {rank} of a conversion split over nodes is writing {url}"
            _dead_lock(
                fs, root, url, busy, " (packer merge once every node has ended), or remove it if that node died", lease
            )
        whole = _check_manifests(fs, root, names, url)
        interrupted = any(n.startswith(f"{STATE}/") for n in names)
        if append and MANIFEST_NAME not in names:
            what = "a split set: append to one split's output" if whole else "no packer output (no manifest.json)"
            raise OutputError(f"{url} holds {what}; --append adds to an existing output")
        if whole and not overwrite and not append:
            replacing_run = interrupted and not resume  # a --resume (or a merge) is told --overwrite alone
            again = " (with --resume, to continue the interrupted conversion that replaces it)" if replacing_run else ""
            raise OutputError(f"{url} already holds a packer output; pass --overwrite to replace it{again}")
        scratch = all(n.startswith(f"{PARTS}/") for n in names)  # a run's parts, which no output lists
        if names and not whole and not overwrite and not interrupted and not scratch:
            raise OutputError(
                f"{url} holds the files of an upload that did not finish (no manifest.json): pass --overwrite "
                "to replace them"
            )
        if interrupted and not resume:
            nodes = _split_over(fs, root, names)
            if nodes and not overwrite:  # nodes may be writing still: their work goes only when asked
                raise OutputError(
                    f"{url} holds the shards of a conversion split over {nodes} nodes (under {PARTS}/): run "
                    f"packer merge {url} once every node is done, or pass --overwrite to discard them"
                )
            log.warning("discarding the unfinished conversion into %s (pass --resume to continue it)", url)
        token = uuid.uuid4().hex
        dest = Destination(url, fs, root, token, overwrite, names)
        if interrupted:
            dest.interrupted_shards = _published_by_interrupted_run(fs, root, names)
        if not replacing:
            write_lock(fs, root, token, exclusive=True, url=url)
        else:  # read again just before it is replaced, and read back a moment after: of two, the later goes on
            if lock_token(fs, root) != dead:
                raise OutputError(f"another conversion took the lock of {url} just now; wait for it")
            try:
                write_lock(fs, root, token, exclusive=False, url=url)
                time.sleep(TAKEOVER_SETTLE)
            except BaseException:
                release(dest)  # an interrupt here: the lock goes with the run
                raise
            if lock_token(fs, root) != token:
                raise OutputError(f"another conversion took the lock of {url} just now; wait for it")
        if any(n.startswith(f"{REPLACED}/") for n in names):
            try:
                roll_back(fs, root, names, url, lambda paths: remove_objects(fs, paths))
            except BaseException:
                release(dest)
                raise
    return _renewed(dest)


def reserve_node(url: str, overwrite: bool, rank: int) -> Destination:
    """Check ``url`` for node ``rank`` of a conversion split with ``--num-nodes`` (``packer.ops.nodes``),
    whose nodes write into the prefix at once, and take the node's lease (``NODE_LEASE``, renewed
    while it runs; ``release`` lets go of it): not the prefix's lock, which ``packer merge`` takes.
    A conversion or a merge holding that lock refuses the node, as the same rank's live lease does,
    and objects that are not packer's; an output there does without ``overwrite`` (the merge
    replaces it). OutputError saying what to do."""
    fs, root = filesystem(url)
    with store_errors(url):
        names = names_under(fs, root)
        if LOCK_NAME in names:
            _dead_lock(fs, root, url, f"a conversion or a merge is writing {url}", " before starting the nodes")
            names.discard(LOCK_NAME)
        _refuse_foreign(names, url)
        if _check_manifests(fs, root, names, url) and not overwrite:
            raise OutputError(
                f"{url} already holds a packer output; pass --overwrite to every node (packer merge --overwrite "
                "then replaces it)"
            )
        lease = NODE_LEASE.format(rank=rank)
        if lease in names:
            _dead_lock(
                fs,
                root,
                url,
                f"node {rank} is already running into {url}",
                " (each --node-rank runs once at a time)",
                lease,
            )
        dest = Destination(url, fs, root, uuid.uuid4().hex, overwrite, names, lock=lease)
        write_lock(fs, root, dest.token, exclusive=lease not in names, url=url, name=lease)
    return _renewed(dest)


def _refuse_foreign(names: set[str], url: str) -> None:
    """OutputError when the prefix ``url`` holds objects ``names`` of which some are not packer's."""
    foreign = sorted(n for n in names if not OWN_NAME.fullmatch(n))
    if foreign:
        shown = ", ".join(foreign[:3]) + (" ..." if len(foreign) > 3 else "")
        raise OutputError(f"{url} holds objects that are not packer's ({shown}): refusing to write there")


def _renewed(dest: Destination) -> Destination:
    """``dest``, its lock (or lease) renewed by a thread of its own until ``release``; asked first
    whether the store checks the SHA-256 sent with each upload (``object_checks.checks_sums``: how
    every upload of the run is checked)."""
    try:
        with store_errors(dest.url):
            checks_sums(dest.fs, dest.root)
    except BaseException:
        release(dest)
        raise
    dest._renewer = threading.Thread(target=renew, args=(dest,), name="packer-lock", daemon=True)
    dest._renewer.start()
    return dest


def _split_over(fs: Any, root: str, names: set[str]) -> int:
    """The nodes of a conversion split with ``--num-nodes`` whose plan the prefix's records hold (0:
    none; an interrupted single run's plan, or none readable)."""
    for name in sorted(n for n in names if n.startswith(f"{STATE}/") and n.endswith(f"/{PLAN_RECORD}")):
        try:
            return int((json.loads(fs.cat_file(f"{root}/{name}")).get("split") or {}).get("nodes") or 0)
        except (ValueError, TypeError, AttributeError, OSError):
            continue
    return 0


def _dead_lock(fs: Any, root: str, url: str, busy: str, then: str, name: str = LOCK_NAME) -> Optional[dict]:
    """The lock object ``name`` of the prefix ``url``, which must be a dead run's (renewed longer than
    ``LOCK_LEASE`` ago, or its holder gone from this machine); OutputError saying ``busy`` and to wait
    ``then`` otherwise."""
    lock, age = read_lock(fs, root, name), lock_age(fs, root, name)
    if age <= LOCK_LEASE and not holder_is_gone(lock):
        raise OutputError(f"{busy} (its lock {url}/{name} was renewed {age:.0f} s ago); wait for it{then}")
    return lock


def _published_by_interrupted_run(fs: Any, root: str, before: set[str]) -> set[str]:
    """The published names interrupted runs gave their shards: each run lists them under ``STATE``
    before it copies a shard to one (``packer.output.shard_uploads``). This run replaces those runs,
    and removes the names its own outputs do not list."""
    names = set()
    for name in before:
        if name.startswith(f"{STATE}/published-") and name.count("/") == 2:
            try:
                listed = json.loads(fs.cat_file(f"{root}/{name}"))
                names.update(n for n in listed if isinstance(n, str) and OWN_NAME.fullmatch(n))
            except (ValueError, TypeError, FileNotFoundError):
                pass  # not a list this packer wrote: nothing of it is taken for a shard
    return names


def _check_manifests(fs: Any, root: str, names: set[str], url: str) -> bool:
    """Whether an output (or a split set) is there; OutputError when its manifest is not packer's."""
    wanted = [MANIFEST_NAME] if MANIFEST_NAME in names else []
    if SPLITS_NAME in names:
        try:
            wanted += [f"{s}/{MANIFEST_NAME}" for s in json.loads(fs.cat_file(f"{root}/{SPLITS_NAME}"))["splits"]]
        except (ValueError, KeyError, TypeError) as e:
            raise OutputError(f"{url}/{SPLITS_NAME} is not packer's ({e}): refusing to write there") from None
    for name in wanted:
        try:
            parse_manifest(fs.cat_file(f"{root}/{name}").decode("utf-8"), f"{url}/{name}")
        except (ManifestError, UnicodeDecodeError, FileNotFoundError) as e:
            raise OutputError(f"{url}/{name} is not a packer manifest ({e}): refusing to write there") from None
    return bool(wanted)


__all__ = ["reserve", "reserve_node", "NODE_LEASE"]
