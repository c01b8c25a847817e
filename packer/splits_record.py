"""``splits.json``: the record that ties the split outputs of one conversion together.

Kept apart from ``packer.dataset_splits`` (which converts) so that readers can check a split they
open against it without importing the converter.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from packer.class_map import class_map_digest
from packer.errors import ManifestError

SPLITS_NAME = "splits.json"
SPLITS_VERSION = 1


@dataclass
class SplitsRecord:
    """The content of ``splits.json``: the class map and the split outputs of one conversion.

    ``splits`` maps each split's name (its folder) to ``{"samples", "manifest_sha256",
    "fingerprint"}``, in the order they were written; ``manifest_sha256`` is None until that split is
    finished. ``origin`` says how the splits were made (``{"kind": "folders"}`` or ``{"kind":
    "random", "fractions": ..., "seed": ...}``); ``missing`` lists, per split, the classes of the map
    it has no sample of.
    """

    classes: Optional[list[str]]
    splits: dict[str, dict]
    origin: dict
    missing: dict[str, list[str]] = field(default_factory=dict)
    complete: bool = False

    @property
    def class_map_sha256(self) -> Optional[str]:
        """The digest of the shared class map (``packer.class_map.class_map_digest``)."""
        return class_map_digest(self.classes)

    def to_dict(self) -> dict:
        """JSON-ready form, keys in a fixed order."""
        return {"splits_version": SPLITS_VERSION, "complete": self.complete, "classes": self.classes,
                "class_map_sha256": self.class_map_sha256, "origin": self.origin, "splits": self.splits,
                "missing": self.missing}

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "SplitsRecord":
        """Parse and check ``splits.json``; ManifestError names ``where`` and what is wrong."""
        try:
            if int(d["splits_version"]) > SPLITS_VERSION:
                raise ManifestError(f"{where} was written by a newer packer (splits version {d['splits_version']}); "
                                    "upgrade packer to read it")
            record = cls(d["classes"], dict(d["splits"]), dict(d["origin"]), dict(d.get("missing", {})),
                         bool(d["complete"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"{where} is not a valid packer splits record (bad or missing entry: {e})") from None
        if d.get("class_map_sha256") != record.class_map_sha256:
            raise ManifestError(f"{where}: the class map does not match its recorded digest; the file is damaged")
        return record


def read_splits(folder: str | os.PathLike) -> SplitsRecord:
    """The ``splits.json`` of ``folder``; ManifestError when it is missing or damaged."""
    path = Path(folder) / SPLITS_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(f"{folder} has no {SPLITS_NAME}: it is not a folder of packer splits") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError(f"{path} cannot be read: {e}") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ManifestError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path} is not a packer splits record")
    return SplitsRecord.from_dict(data, str(path))


def check_split_member(root: str | os.PathLike, manifest_digest: Optional[str]) -> None:
    """Refuse (ManifestError) to read ``root`` when it is a split of a set whose ``splits.json`` says the set
    is unfinished, or names another manifest for it (it was replaced on its own): its labels might not
    match the other splits'. A split moved out of its folder, or a folder that is no split, passes."""
    root = Path(root)
    record_path = root.parent / SPLITS_NAME
    if not record_path.is_file():
        return
    record = read_splits(root.parent)
    entry = record.splits.get(root.name)
    if entry is None:
        return
    if not record.complete:
        raise ManifestError(f"{root} is a split of an unfinished conversion into {root.parent} (its {SPLITS_NAME} "
                            "is not complete): its class map may not be the other splits'; run that conversion "
                            "again (with --resume to keep the finished splits)")
    if manifest_digest is not None and entry.get("manifest_sha256") != manifest_digest:
        raise ManifestError(f"{root} was replaced after the splits of {root.parent} were written (its manifest is "
                            f"not the one {SPLITS_NAME} records): convert the splits again together")


def write_splits(folder: Path, record: SplitsRecord) -> None:
    """Write ``splits.json`` atomically (a reader sees the old record or the new one)."""
    path = folder / SPLITS_NAME
    tmp = folder / f".{SPLITS_NAME}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record.to_dict(), f, indent=1, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def is_splits_folder(folder: str | os.PathLike) -> bool:
    """True when ``folder`` holds a ``splits.json`` (a folder of split outputs)."""
    return (Path(folder) / SPLITS_NAME).is_file()


def splits_problems(folder: str | os.PathLike, record: SplitsRecord) -> list[str]:
    """What is wrong with a folder of splits as a set: unfinished, a split missing or replaced on its own,
    a class map that is not the shared one. Empty when the set is whole (each split's own files are
    ``packer verify``'s to check)."""
    from packer.manifest import MANIFEST_NAME, read_manifest, sha256_of

    folder = Path(folder)
    problems = []
    if not record.complete:
        problems.append(f"the conversion of these splits did not finish ({SPLITS_NAME} is not complete); run it "
                        "again with --resume")
    for name, entry in record.splits.items():
        manifest = folder / name / MANIFEST_NAME
        if not manifest.is_file():
            problems.append(f"split {name} is missing (no {folder / name / MANIFEST_NAME})")
            continue
        if entry.get("manifest_sha256") is not None and sha256_of(manifest) != entry["manifest_sha256"]:
            problems.append(f"split {name} was replaced after the splits were written (its manifest is not the one "
                            f"{SPLITS_NAME} records)")
        classes = read_manifest(folder / name).classes
        if classes is not None and classes != record.classes:
            problems.append(f"split {name} has another class map than {SPLITS_NAME} records")
    return problems
