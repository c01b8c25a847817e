"""Reading a labels file (``--labels``): a CSV of ``relative path,label`` rows, its header row told
apart from a sample's row."""

from __future__ import annotations

import csv
from pathlib import Path, PurePosixPath
from typing import Optional

from packer.sources.walk import field_kind
from packer.spec.errors import InputError


def read_labels_file(path: Path, known: Optional[set[str]] = None) -> dict[str, str]:
    """Read a CSV of ``relative path,label`` rows.

    A first row whose path has no image, text or json extension (``path,label``, ``file_name,label``)
    is a header, unless it is one of the ``known`` sample keys (paired samples are named by their
    shared stem, ``cats/0001``).
    """
    if not path.is_file():
        raise InputError(f"labels file {path} does not exist")
    try:
        return _read_labels_rows(path, known or set())
    except UnicodeDecodeError as e:
        raise InputError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None


def _read_labels_rows(path: Path, known: set[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    with open(path, newline="", encoding="utf-8-sig") as f:
        for lineno, row in enumerate(csv.reader(f), start=1):
            if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                continue
            if len(row) < 2:
                raise InputError(f"{path}:{lineno}: expected 'relative path,label', got {row!r}")
            rel, label = row[0].strip(), row[1].strip()
            if not labels and field_kind(rel) is None and rel not in known:
                continue  # the header row
            rel = PurePosixPath(rel.replace("\\", "/")).as_posix()
            if rel in labels and labels[rel] != label:
                raise InputError(f"{path}:{lineno}: {rel} is listed twice with different labels")
            labels[rel] = label
    return labels
