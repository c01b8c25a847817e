"""The discovery of a run, kept on disk in its staging folder: read back by ``--resume`` instead of
walking the source again, and memory-mapped by the run itself so that its items leave the heap.

A walk of 10^8 files takes minutes, and an interrupted run used to walk the whole tree again before
it could tell which shards it had finished. The saved discovery holds the items (an ``ItemTable``'s
buffers), what the walk left out, and the stamps of every folder it listed
(``packer.folder_stamps``): while no folder changed, the tree holds the same files under the same
names, and the saved items are what a walk would find. Files whose contents changed are found per
shard, by the stamps each worker records (``packer.resume``).

Layout (``SAVED_DIR`` in the staging folder; never published): ``discovery.json`` (version, root,
the options that decide discovery, classes, fields, skipped and ignored files, counts),
``keys.bin`` (the records, UTF-8, back to back), ``offsets.npy`` (int64, N + 1), ``labels.npy``
(int32, absent for unlabelled items), ``folders.bin``/``folder_ends.npy``/``folder_stamps.npy``.
The JSON is written last, so a folder without it is ignored.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from packer.discover import Discovery
from packer.folder_stamps import FolderStamps
from packer.item_table import ItemTable
from packer.output import SAVED_DISCOVERY as SAVED_DIR
from packer.records import Skipped

log = logging.getLogger(__name__)

SAVED_VERSION = 1


def discovery_options(labels_file: Optional[str | os.PathLike], fields: Optional[Sequence[str]], allow_missing: bool,
                      classes: Optional[Sequence[str]], add_classes: bool) -> dict:
    """What decides a discovery besides the tree: a saved one is used only under the same options
    (and the same labels file: its path and stamp)."""
    labels = None
    if labels_file is not None:
        path = os.path.abspath(labels_file)
        try:
            st = os.stat(path)
            labels = [path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        except OSError:
            labels = [path]
    return {"labels_file": labels, "fields": list(fields) if fields else None, "allow_missing": bool(allow_missing),
            "classes": list(classes) if classes is not None else None, "add_classes": bool(add_classes)}


def can_save(found: Discovery) -> bool:
    """True for a discovery a walk made into an ``ItemTable`` (a folder source, not a container)."""
    return isinstance(found.items, ItemTable) and found.folders is not None and found.places is None


def save(stage: Path, found: Discovery, options: dict) -> None:
    """Write ``found`` (``can_save``) into ``stage``, then put in its ``items`` the same items mapped
    from there: every reference to ``found`` sees them, and the buffers the walk filled leave the
    heap (workers forked later share the file's pages instead of inheriting a copy)."""
    folder = stage / SAVED_DIR
    folder.mkdir(exist_ok=True)
    table = found.items
    assert isinstance(table, ItemTable) and found.folders is not None
    if table.rows is not None or table.indices is not None:
        table = table.compact()
    with open(folder / "keys.bin", "wb") as f:
        f.write(table.blob)
    np.save(folder / "offsets.npy", np.asarray(table.offsets, np.int64))
    if table.labels is not None:
        np.save(folder / "labels.npy", np.asarray(table.labels, np.int32))
    blob, ends, stamps = found.folders.arrays()
    with open(folder / "folders.bin", "wb") as f:
        f.write(blob.tobytes())
    np.save(folder / "folder_ends.npy", ends)
    np.save(folder / "folder_stamps.npy", stamps)
    record = {
        "version": SAVED_VERSION, "root": os.path.abspath(found.root), "base": table.base, "mode": table.mode,
        "fields": list(found.fields), "item_fields": list(table.fields), "classes": found.classes,
        "skipped": [s.to_dict() for s in found.skipped], "ignored": found.ignored, "labels_from": found.labels_from,
        "options": options, "items": len(table), "walked_at_ns": found.folders.walked_at_ns,
        "indices": table.indices is not None,
    }
    if table.indices is not None:
        np.save(folder / "indices.npy", np.asarray(table.indices, np.int64))
    tmp = folder / "discovery.json.tmp"
    tmp.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, folder / "discovery.json")
    loaded = _load(folder, record, Path(found.root))
    if loaded is not None:
        found.items = loaded.items


def load(stage: Path, source: Path, options: dict) -> Optional[Discovery]:
    """The discovery saved in ``stage`` for ``source`` under ``options``, if its tree has not changed
    since (every folder as stamped); None otherwise (the caller walks again), with the reason logged."""
    folder = stage / SAVED_DIR
    try:
        record = json.loads((folder / "discovery.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != SAVED_VERSION:
        return None
    if record.get("root") != os.path.abspath(source) or record.get("options") != options:
        log.info("--resume: the source or its discovery options differ from the interrupted run's; walking it again")
        return None
    try:
        stamps = FolderStamps.from_arrays(int(record["walked_at_ns"]), np.fromfile(folder / "folders.bin", np.uint8),
                                          np.load(folder / "folder_ends.npy"), np.load(folder / "folder_stamps.npy"))
    except (OSError, ValueError, KeyError):
        return None
    changed = stamps.first_change(source)
    if changed is not None:
        log.info("--resume: %s changed since the interrupted run (or too close to its walk to tell); walking %s "
                 "again", changed, source)
        return None
    found = _load(folder, record, source)
    if found is not None:
        found.folders = stamps
        log.info("--resume: %d samples as the interrupted run found them (no folder under %s changed)",
                 len(found.items), source)
    return found


def _load(folder: Path, record: dict, root: Path) -> Optional[Discovery]:
    """The discovery of a saved ``record`` with its items mapped from ``folder``; None if damaged."""
    try:
        offsets = np.load(folder / "offsets.npy", mmap_mode="r")
        n = int(record["items"])
        labels = np.load(folder / "labels.npy", mmap_mode="r") if (folder / "labels.npy").exists() else None
        indices = np.load(folder / "indices.npy", mmap_mode="r") if record.get("indices") else None
        blob = _mapped(folder / "keys.bin")
        if (offsets.shape != (n + 1,) or int(offsets[-1]) != len(blob) or (labels is not None and labels.shape != (n,))
                or (indices is not None and indices.shape != (n,))):
            return None
        table = ItemTable(str(record["base"]), blob, offsets, labels, str(record["mode"]),
                          tuple(record["item_fields"]), indices)
        return Discovery(root, table, record["classes"], [Skipped(s["path"], s["reason"]) for s in record["skipped"]],
                         dict(record["ignored"]), tuple(record["fields"]), str(record["labels_from"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _mapped(path: Path) -> bytes | mmap.mmap:
    """The file's bytes, mapped read-only (an empty file: empty bytes, which cannot be mapped)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0 or os.name == "nt":  # Windows cannot delete a mapped file
            return f.read()
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
