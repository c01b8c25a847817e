"""The discovery of a run, kept on disk in its staging folder: read back by ``--resume`` instead of
walking the source again.

An interrupted run used to walk the whole tree again before it could tell which shards it had
finished, the longest part of its start at 10^8 files. The saved discovery holds the items (an ``ItemTable``'s
buffers), what the walk left out, and the stamps of every folder it listed
(``packer.sources.folder_stamps``): while no folder changed, the tree holds the same files under the same
names, and the saved items are what a walk would find. Files whose contents changed are found per
shard, by the stamps each worker records (``packer.run.resume``). Saving is an optimisation: a run
that cannot save (a full disk) only warns, and a saved discovery that cannot be read means a walk.

Layout (``SAVED_DIR`` in the staging folder; never published): ``discovery.json`` (version, root,
the options that decide discovery, classes, fields, skipped and ignored files, counts, each other
file's SHA-256, checked before any is read; ASCII JSON,
so paths that are not UTF-8 survive), ``keys.bin`` (the records' compressed blocks, as
``packer.sources.record_blocks`` describes them), ``key_block_ends.npy`` and ``key_block_rows.npy`` (int64,
one per block: its end in ``keys.bin``, the records up to its end), ``labels.npy`` (int32, one per
item) or ``label_starts.npy`` (int64) and ``label_values.npy`` (int32) for labels in runs (both
absent for unlabelled items), ``indices.npy`` (int64, when the items are not numbered 0 to N - 1),
``folders.bin``/``folder_ends.npy``/``folder_stamps.npy``. ``discovery.json`` is removed before
the rest is written and written last, so a folder without it, or with parts of another, is ignored.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from packer.output.files import SAVED_DISCOVERY as SAVED_DIR
from packer.records import Skipped
from packer.sources.discover import Discovery
from packer.sources.folder_stamps import FolderStamps
from packer.sources.item_table import ItemTable, LabelRuns
from packer.sources.record_blocks import RecordBlocks
from packer.spec.file_stamp import FileStamp
from packer.spec.listed_files import sha256_of

log = logging.getLogger(__name__)

SAVED_VERSION = 2
"""2: the records in compressed blocks and labels in runs (1: flat records and offsets, never read now)."""


def discovery_options(
    labels_file: Optional[str | os.PathLike],
    fields: Optional[Sequence[str]],
    allow_missing: bool,
    classes: Optional[Sequence[str]],
    add_classes: bool,
) -> dict:
    """What decides a discovery besides the tree: a saved one is used only under the same options
    (and the same labels file: its path and stamp)."""
    labels = None
    if labels_file is not None:
        path = os.path.abspath(labels_file)
        stamp = FileStamp.at_or_none(path)
        labels = [path] if stamp is None else stamp.as_labels_file_record(path)
    return {
        "labels_file": labels,
        "fields": list(fields) if fields else None,
        "allow_missing": bool(allow_missing),
        "classes": list(classes) if classes is not None else None,
        "add_classes": bool(add_classes),
    }


def can_save(found: Discovery) -> bool:
    """True for a discovery a walk made into an ``ItemTable`` (a folder source, not a container)."""
    return isinstance(found.items, ItemTable) and found.folders is not None and found.places is None


def save(stage: Path, found: Discovery, options: dict) -> None:
    """Write ``found`` (``can_save``) into ``stage`` for --resume; a failure is logged and the partial
    folder removed (the run goes on: saving only spares a later resume its walk)."""
    folder = stage / SAVED_DIR
    try:
        _write(folder, found, options)
    except (OSError, ValueError) as e:
        log.warning(
            "cannot save the discovery in %s (%s); a --resume of this run will walk %s again",
            folder,
            e.strerror if isinstance(e, OSError) and e.strerror else e,
            found.root,
        )
        shutil.rmtree(folder, ignore_errors=True)


def _write(folder: Path, found: Discovery, options: dict) -> None:
    table = found.items
    assert isinstance(table, ItemTable) and found.folders is not None
    folder.mkdir(exist_ok=True)
    (folder / "discovery.json").unlink(missing_ok=True)  # what follows belongs to no saved discovery until it is back
    if table.rows is not None or table.indices is not None:
        table = table.compact()
    data, ends, rows = table.records.arrays()
    (folder / "keys.bin").write_bytes(data)
    np.save(folder / "key_block_ends.npy", ends)
    np.save(folder / "key_block_rows.npy", rows)
    for name in ("labels.npy", "label_starts.npy", "label_values.npy", "offsets.npy"):
        (folder / name).unlink(missing_ok=True)
    if isinstance(table.labels, LabelRuns):
        np.save(folder / "label_starts.npy", table.labels.starts)
        np.save(folder / "label_values.npy", table.labels.values)
    elif table.labels is not None:
        np.save(folder / "labels.npy", np.asarray(table.labels, np.int32))
    (folder / "indices.npy").unlink(missing_ok=True)
    if table.indices is not None:
        np.save(folder / "indices.npy", np.asarray(table.indices, np.int64))
    blob, ends, stamps = found.folders.arrays()
    (folder / "folders.bin").write_bytes(blob.tobytes())
    np.save(folder / "folder_ends.npy", ends)
    np.save(folder / "folder_stamps.npy", stamps)
    written = sorted(p.name for p in folder.iterdir() if p.name in _PARTS)
    record = {
        "version": SAVED_VERSION,
        "root": os.path.abspath(found.root),
        "mode": table.mode,
        "fields": list(found.fields),
        "item_fields": list(table.fields),
        "classes": found.classes,
        "skipped": [s.to_dict() for s in found.skipped],
        "ignored": found.ignored,
        "labels_from": found.labels_from,
        "options": options,
        "items": len(table),
        "walked_at_ns": found.folders.walked_at_ns,
        "labels": None if table.labels is None else "runs" if isinstance(table.labels, LabelRuns) else "array",
        "indices": table.indices is not None,
        "sha256": {name: sha256_of(folder / name) for name in written},
    }
    tmp = folder / "discovery.json.tmp"
    tmp.write_text(json.dumps(record), encoding="ascii")  # \u escapes keep surrogates of non-UTF-8 paths
    os.replace(tmp, folder / "discovery.json")


def load(stage: Path, source: Path, options: dict) -> Optional[Discovery]:
    """The discovery saved in ``stage`` for ``source`` under ``options``, if its tree has not changed
    since (every folder as stamped); None otherwise (the caller walks again), with the reason logged."""
    folder = stage / SAVED_DIR
    try:
        record = json.loads((folder / "discovery.json").read_text(encoding="ascii"))
        if not isinstance(record, dict) or record.get("version") != SAVED_VERSION:
            return None
        if record.get("root") != os.path.abspath(source) or record.get("options") != options:
            log.info(
                "--resume: the source or its discovery options differ from the interrupted run's; walking it again"
            )
            return None
        for name, digest in record["sha256"].items():
            if name not in _PARTS or sha256_of(folder / name) != digest:
                raise ValueError(f"{name} is not the file that was saved (its SHA-256 differs)")
        stamps = FolderStamps.from_arrays(
            int(record["walked_at_ns"]),
            np.fromfile(folder / "folders.bin", np.uint8),
            np.load(folder / "folder_ends.npy"),
            np.load(folder / "folder_stamps.npy"),
        )
        changed = stamps.first_change(source)
        if changed is not None:
            log.info(
                "--resume: %s changed since the interrupted run (or too close to its walk to tell); walking %s again",
                changed,
                source,
            )
            return None
        found = _read(folder, record, source)
    except Exception as e:  # noqa: BLE001 - a saved discovery that cannot be read only means a walk
        log.info("--resume: the saved discovery in %s cannot be read (%s); walking %s again", folder, e, source)
        return None
    found.folders = stamps
    log.info(
        "--resume: %d samples as the interrupted run found them (no folder under %s changed)", len(found.items), source
    )
    return found


_PARTS = frozenset(
    {
        "keys.bin",
        "key_block_ends.npy",
        "key_block_rows.npy",
        "labels.npy",
        "label_starts.npy",
        "label_values.npy",
        "indices.npy",
        "folders.bin",
        "folder_ends.npy",
        "folder_stamps.npy",
    }
)
"""The files of a saved discovery, each checked against its SHA-256 before it is read: a damaged
block of paths would fail to decompress in the middle of the run, a damaged label be read as
another class."""


def _read(folder: Path, record: dict, root: Path) -> Discovery:
    """The discovery of a saved ``record``, its paths under ``root`` as given now (ValueError if damaged)."""
    n = int(record["items"])
    records = RecordBlocks.from_arrays(
        (folder / "keys.bin").read_bytes(),
        np.load(folder / "key_block_ends.npy"),
        np.load(folder / "key_block_rows.npy"),
    )
    labels = None
    if record["labels"] == "runs":
        labels = LabelRuns(np.load(folder / "label_starts.npy"), np.load(folder / "label_values.npy"), n)
    elif record["labels"] == "array":
        labels = np.load(folder / "labels.npy")
        if labels.dtype != np.int32:
            raise ValueError("its labels are not int32")
    indices = np.load(folder / "indices.npy") if record["indices"] else None
    if len(records) != n:
        raise ValueError("its arrays do not match")
    base = os.path.join(os.fspath(root), "")  # never the first run's: it may have named the source otherwise
    table = ItemTable(base, records, labels, str(record["mode"]), tuple(record["item_fields"]), indices)
    return Discovery(
        root,
        table,
        record["classes"],
        [Skipped(s["path"], s["reason"]) for s in record["skipped"]],
        dict(record["ignored"]),
        tuple(record["fields"]),
        str(record["labels_from"]),
    )
