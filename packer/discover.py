"""Finding the source files: class folders, labels files, ignored litter, deterministic order."""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Optional

from packer.errors import InputError
from packer.records import UNLABELLED, Skipped, SourceItem

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
OS_LITTER = frozenset({"thumbs.db", "desktop.ini", "ehthumbs.db", "__macosx", "$recycle.bin"})



@dataclass
class Discovery:
    """What discovery found: the items to convert, in order, and everything left out.

    ``classes`` is None for unlabelled data. ``ignored`` counts files that are not images, by
    extension; ``skipped`` lists image files that cannot be used, with the reason.
    """

    root: Path
    items: list[SourceItem]
    classes: Optional[list[str]]
    skipped: list[Skipped] = field(default_factory=list)
    ignored: dict[str, int] = field(default_factory=dict)


def is_litter(name: str) -> bool:
    """True for hidden files and OS litter: dotfiles, AppleDouble ``._*``, Thumbs.db, desktop.ini,
    ``__MACOSX`` folders."""
    return name.startswith(".") or name.lower() in OS_LITTER


def is_packer_folder(path: str | os.PathLike) -> bool:
    """True for a packer output (its manifest.json is a packer manifest), never read as input or as a
    class: converting a folder twice with the output inside it must not add a class."""
    manifest = os.path.join(path, "manifest.json")
    if not os.path.isfile(manifest):
        return False
    try:
        with open(manifest, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "manifest_version" in data and "shards" in data


def is_image_name(name: str) -> bool:
    """True when the extension is one packer reads as an image (case-insensitive)."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def discover(root: str | os.PathLike, labels_file: Optional[str | os.PathLike] = None) -> Discovery:
    """List the image files under ``root`` in sorted relative-path order, with their labels.

    Top-level subfolders are classes (indices by sorted name) and deeper files belong to their
    top-level class. Without subfolders the samples are unlabelled. A ``labels_file`` (CSV of
    relative path and label) overrides the folder classes.
    """
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"source folder {root} does not exist or is not a folder")
    files, ignored, unlisted = _walk(root)
    if labels_file is not None:
        found = _with_labels_file(root, files, ignored, Path(labels_file))
        found.skipped[:0] = unlisted
        return found
    class_dirs = sorted(
        e.name for e in os.scandir(root)
        if not is_litter(e.name) and _utf8(e.name) and e.is_dir(follow_symlinks=True) and not is_packer_folder(e.path)
    )
    if not class_dirs:
        items = [SourceItem(i, str(root / rel), rel) for i, rel in enumerate(files)]
        return Discovery(root, items, None, unlisted, ignored)
    class_index = {name: i for i, name in enumerate(class_dirs)}
    items: list[SourceItem] = []
    skipped: list[Skipped] = list(unlisted)
    for rel in files:
        top = PurePosixPath(rel).parts[0]
        if len(PurePosixPath(rel).parts) == 1:
            skipped.append(Skipped(rel, "not inside a class folder (the source has class subfolders)"))
            continue
        items.append(SourceItem(len(items), str(root / rel), rel, class_index[top]))
    return Discovery(root, items, class_dirs, skipped, ignored)


def _walk(root: Path) -> tuple[list[str], dict[str, int], list[Skipped]]:
    """All image files under root as sorted POSIX relative paths, ignored files by extension, and
    what could not be listed or named.

    Iterative (no recursion limit on deep trees) and in sorted order, real folders before symlinks
    to folders; symlinked folders are followed, each real folder at most once, so a symlink loop
    ends and a folder reachable twice is always found under the same path.
    """
    found: list[str] = []
    ignored: Counter[str] = Counter()
    problems: list[Skipped] = []
    seen: set[tuple[int, int]] = set()
    stack: list[Path] = [root]
    while stack:
        folder = stack.pop()
        rel_dir = folder.relative_to(root)
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            problems.append(Skipped(_posix(rel_dir) + "/", f"cannot read folder: {e.strerror or e}"))
            continue
        subfolders = []
        for entry in entries:
            if is_litter(entry.name):
                continue
            rel = _posix(rel_dir / entry.name)
            if not _utf8(rel):
                shown = os.fsencode(rel).decode("utf-8", "backslashreplace")
                problems.append(Skipped(shown, "file name is not valid UTF-8; rename it"))
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError:
                is_dir = False
            if is_dir:
                if not is_packer_folder(entry.path):
                    subfolders.append((entry.is_symlink(), entry.name))
            elif is_image_name(entry.name):
                found.append(rel)
            else:
                ignored[os.path.splitext(entry.name)[1].lower() or "(no extension)"] += 1
        # Pushed in reverse so that they are walked in sorted order, real folders first.
        stack.extend(folder / name for _, name in sorted(subfolders, reverse=True))
    found.sort()
    return found, dict(sorted(ignored.items())), problems


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _posix(path: Path) -> str:
    text = path.as_posix()
    return "" if text == "." else text


def _with_labels_file(root: Path, files: list[str], ignored: dict[str, int], labels_file: Path) -> Discovery:
    labels = read_labels_file(labels_file)
    names = sorted(set(labels.values()))
    if all(n.isdigit() for n in names):
        classes = [str(i) for i in range(max(int(n) for n in names) + 1)] if names else []
        index = {n: int(n) for n in names}
    else:
        classes = names
        index = {n: i for i, n in enumerate(names)}
    present = set(files)
    items: list[SourceItem] = []
    skipped: list[Skipped] = []
    for rel in files:
        if rel in labels:
            items.append(SourceItem(len(items), str(root / rel), rel, index[labels[rel]]))
        else:
            skipped.append(Skipped(rel, f"no label in {labels_file.name}"))
    for rel in sorted(set(labels) - present):
        skipped.append(Skipped(rel, f"listed in {labels_file.name} but not found in the source folder"))
    return Discovery(root, items, classes, skipped, ignored)


def read_labels_file(path: Path) -> dict[str, str]:
    """Read a CSV of ``relative path,label`` rows.

    A first row whose path has no image extension (``path,label``, ``file_name,label``) is a header.
    """
    if not path.is_file():
        raise InputError(f"labels file {path} does not exist")
    try:
        return _read_labels_rows(path)
    except UnicodeDecodeError as e:
        raise InputError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None


def _read_labels_rows(path: Path) -> dict[str, str]:
    labels: dict[str, str] = {}
    with open(path, newline="", encoding="utf-8-sig") as f:
        for lineno, row in enumerate(csv.reader(f), start=1):
            if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                continue
            if len(row) < 2:
                raise InputError(f"{path}:{lineno}: expected 'relative path,label', got {row!r}")
            rel, label = row[0].strip(), row[1].strip()
            if not labels and not is_image_name(rel):
                continue  # the header row
            rel = PurePosixPath(rel.replace("\\", "/")).as_posix()
            if rel in labels and labels[rel] != label:
                raise InputError(f"{path}:{lineno}: {rel} is listed twice with different labels")
            labels[rel] = label
    return labels


__all__ = ["Discovery", "discover", "read_labels_file", "is_image_name", "is_litter", "IMAGE_EXTENSIONS", "UNLABELLED"]
