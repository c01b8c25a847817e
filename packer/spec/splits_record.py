"""``splits.json``: the record that ties the split outputs of one conversion together.

Kept apart from ``packer.ops.splits`` (which converts) so that readers can check a split they
open against it without importing the converter.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from packer.spec.class_map import class_map_digest
from packer.spec.errors import ManifestError, OutputError

SPLITS_NAME = "splits.json"
SPLITS_VERSION = 1


@dataclass
class SplitsRecord:
    """The content of ``splits.json``: the class map and the split outputs of one conversion.

    ``splits`` maps each split's name (its folder) to ``{"samples", "manifest_sha256"}``, in the order
    they were written; ``manifest_sha256`` is None until that split is finished. While the set is
    unfinished, each entry also has the ``fingerprint`` that ``--resume`` compares, and ``workers``
    the worker count its shard layout was planned for (the complete record keeps neither: equal
    sources and options give an equal record). ``origin`` says how the splits were made
    (``{"kind": "folders"}`` or ``{"kind": "random", "fractions": ..., "seed": ...}``); ``missing``
    lists, per split, the classes of the map it has no sample of; ``unlabelled`` the split folders
    that hold images without class folders (a test set without labels), which have no class map.
    """

    classes: Optional[list[str]]
    splits: dict[str, dict]
    origin: dict
    missing: dict[str, list[str]] = field(default_factory=dict)
    complete: bool = False
    workers: Optional[int] = None
    unlabelled: list[str] = field(default_factory=list)

    @property
    def class_map_sha256(self) -> Optional[str]:
        """The digest of the shared class map (``packer.spec.class_map.class_map_digest``)."""
        return class_map_digest(self.classes)

    def to_dict(self) -> dict:
        """JSON-ready form, keys in a fixed order; what only --resume needs is left out once complete."""
        splits = {
            name: {k: v for k, v in entry.items() if not self.complete or k != "fingerprint"}
            for name, entry in self.splits.items()
        }
        return {
            "splits_version": SPLITS_VERSION,
            "complete": self.complete,
            "classes": self.classes,
            "class_map_sha256": self.class_map_sha256,
            "origin": self.origin,
            "splits": splits,
            "missing": self.missing,
            "unlabelled": self.unlabelled,
            **({} if self.complete or self.workers is None else {"workers": self.workers}),
        }

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "SplitsRecord":
        """Parse and check ``splits.json``; ManifestError names ``where`` and what is wrong (a split name that
        is not a plain folder name, an entry that is not a record, a damaged class map)."""
        try:
            if int(d["splits_version"]) > SPLITS_VERSION:
                raise ManifestError(
                    f"{where} was written by a newer packer (splits version {d['splits_version']}); "
                    "upgrade packer to read it"
                )
            workers = d.get("workers")
            record = cls(
                d["classes"],
                dict(d["splits"]),
                dict(d["origin"]),
                dict(d.get("missing", {})),
                bool(d["complete"]),
                int(workers) if workers is not None else None,
                [str(n) for n in d.get("unlabelled", [])],
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"{where} is not a valid packer splits record (bad or missing entry: {e})") from None
        for name, entry in record.splits.items():
            problem = split_name_problem(name)
            if problem or not isinstance(entry, dict) or not isinstance(entry.get("samples"), int):
                raise ManifestError(
                    f"{where}: split {name!r} is not a valid split ({problem or 'a bad entry'}); the file is damaged"
                )
            digest = entry.get("manifest_sha256")
            if digest is not None and not (isinstance(digest, str) and len(digest) == 64):
                raise ManifestError(f"{where}: split {name!r} has a bad manifest_sha256; the file is damaged")
        if record.origin.get("kind") not in ("folders", "random") or (
            record.origin["kind"] == "random" and not isinstance(record.origin.get("fractions"), dict)
        ):
            raise ManifestError(f"{where}: origin {record.origin!r} is not one packer writes; the file is damaged")
        if record.classes is not None and (
            not isinstance(record.classes, list) or not all(isinstance(c, str) for c in record.classes)
        ):
            raise ManifestError(f"{where}: classes must be a list of names; the file is damaged")
        if d.get("class_map_sha256") != record.class_map_sha256:
            raise ManifestError(f"{where}: the class map does not match its recorded digest; the file is damaged")
        return record


SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""What a split's name may be: it names a folder inside the output."""

RESERVED_NAMES = frozenset({"splits.json", "manifest.json", "report.txt"})


def split_name_problem(name: object) -> Optional[str]:
    """Why ``name`` cannot name a split (its folder in the output), or None."""
    if not isinstance(name, str) or not SPLIT_NAME.fullmatch(name):
        return "names are letters, digits, '.', '_' and '-', starting with a letter or digit"
    if name.lower() in RESERVED_NAMES:
        return f"{name} is the name of a file packer writes there"
    return None


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
    root = Path(root).resolve()  # "." inside a split, or a link to one, is that split
    record_path = root.parent / SPLITS_NAME
    if not record_path.is_file():
        return
    record = read_splits(root.parent)
    entry = record.splits.get(root.name)
    if entry is None:
        return
    if not record.complete:
        raise ManifestError(
            f"{root} is a split of an unfinished conversion into {root.parent} (its {SPLITS_NAME} "
            "is not complete): its class map may not be the other splits'; run that conversion "
            "again (with --resume to keep the finished splits)"
        )
    if manifest_digest is not None and entry.get("manifest_sha256") != manifest_digest:
        raise ManifestError(
            f"{root} was replaced after the splits of {root.parent} were written (its manifest is "
            f"not the one {SPLITS_NAME} records): convert the splits again together"
        )


def write_splits(folder: Path, record: SplitsRecord) -> None:
    """Write ``splits.json`` atomically (a reader sees the old record or the new one)."""
    path = folder / SPLITS_NAME
    tmp = folder / f".{SPLITS_NAME}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record.to_dict(), f, indent=1, ensure_ascii=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a crash
        finally:
            os.close(directory)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None


def is_splits_folder(folder: str | os.PathLike) -> bool:
    """True when ``folder`` holds a ``splits.json`` (a folder of split outputs)."""
    return (Path(folder) / SPLITS_NAME).is_file()


def splits_problems(folder: str | os.PathLike, record: SplitsRecord) -> list[str]:
    """What is wrong with a folder of splits as a set: unfinished, a split missing or replaced on its own,
    a class map that is not the shared one. Empty when the set is whole (each split's own files are
    ``packer verify``'s to check)."""
    from packer.spec.listed_files import sha256_of
    from packer.spec.manifest import MANIFEST_NAME, read_manifest

    folder = Path(folder)
    problems = []
    if not record.complete:
        problems.append(
            f"the conversion of these splits did not finish ({SPLITS_NAME} is not complete); run it again with --resume"
        )
    for name, entry in record.splits.items():
        manifest = folder / name / MANIFEST_NAME
        if not manifest.is_file():
            problems.append(f"split {name} is missing (no {folder / name / MANIFEST_NAME})")
            continue
        if entry.get("manifest_sha256") is not None and sha256_of(manifest) != entry["manifest_sha256"]:
            problems.append(
                f"split {name} was replaced after the splits were written (its manifest is not the one "
                f"{SPLITS_NAME} records)"
            )
        classes = read_manifest(folder / name).classes
        if classes != (None if name in record.unlabelled else record.classes):
            problems.append(f"split {name} has another class map than {SPLITS_NAME} records")
    return problems
