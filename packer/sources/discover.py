"""Finding the samples: the walk's files (``packer.sources.walk``) as samples of single files or paired by stem,
labelled by class folders or a labels file (read by ``packer.sources.labels_file``), in deterministic order."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

import numpy as np

from packer.records import UNLABELLED, Skipped, SourceItem
from packer.sources.folder_stamps import FolderStamps
from packer.sources.item_table import IMAGES, PAIRED, SINGLE, ItemTable, LabelRuns, TableBuilder
from packer.sources.labels_file import read_labels_file
from packer.sources.record_blocks import RecordBlocks
from packer.sources.walk import (
    KIND_CODES,
    Listing,
    Walk,
    WalkWatcher,
    field_kind,
    is_image_name,
    is_litter,
    is_packer_folder,
    list_tree,
    utf8_name,
)
from packer.spec.class_map import extend_class_map
from packer.spec.errors import InputError
from packer.spec.source_kinds import FIELD_KINDS, IMAGE_EXTENSIONS


@dataclass
class Discovery:
    """What discovery found: the items to convert, in order, and everything left out.

    ``classes`` is None for unlabelled data. ``ignored`` counts files that are not used, by
    extension; ``skipped`` lists files (or paired samples) that cannot be used, with the reason.
    ``fields`` are the fields of every sample (``FIELD_KINDS``, in that order).
    """

    root: Path
    items: Sequence[SourceItem]
    """A list, or for a folder of single-field samples an ``ItemTable`` (no object per file)."""
    classes: Optional[list[str]]
    skipped: list[Skipped] = field(default_factory=list)
    ignored: dict[str, int] = field(default_factory=dict)
    fields: tuple[str, ...] = ("image",)
    labels_from: str = "folders"
    """Where the labels came from: ``folders`` (class folders, or none), ``file`` (``--labels``)."""
    places: Optional[dict[int, tuple]] = None
    """Sources that are containers (Parquet, saved datasets, tar shards; ``packer.sources.containers``):
    where each item's image is inside them, by item index. None for a folder of files."""
    folders: Optional[FolderStamps] = None
    """The folders the walk listed and their stamps (``packer.sources.folder_stamps``); None where no walk
    found the items (containers, splits of a discovery)."""


def discover(
    root: str | os.PathLike,
    labels_file: Optional[str | os.PathLike] = None,
    fields: Optional[Sequence[str]] = None,
    allow_missing: bool = False,
    classes: Optional[Sequence[str]] = None,
    add_classes: bool = False,
    processes: int = 1,
    on_walk: Optional["WalkWatcher"] = None,
) -> Discovery:
    """List the samples under ``root`` in sorted relative-path order, with their labels.

    ``processes`` may walk the root's subfolders in parallel once the walk takes a while (see
    ``PARALLEL_AFTER``); the result is the same. ``on_walk`` is told of the walk's progress as it
    goes (``WalkWatcher``).

    Top-level subfolders are classes (indices by sorted name) and deeper files belong to their
    top-level class. Without subfolders the samples are unlabelled. A ``labels_file`` (CSV of
    relative path and label) overrides the folder classes. A given class map ``classes`` (names in
    index order) decides the indices instead: a class it lacks is refused with its name, or with
    ``add_classes`` appended at its end (see ``packer.spec.class_map``).

    ``fields`` says what a sample is (see ``FIELD_KINDS``). One field: each file of that kind is a
    sample (images, or ``.txt`` texts). Several: files in one folder sharing a stem
    (``0001.jpg``, ``0001.txt``, ``0001.json``) are one sample, keyed by the stem; a sample
    missing a text or json file is skipped and reported, unless ``allow_missing`` stores that field
    empty (a missing image is always skipped). None finds the fields from the files: images when
    there are any, else texts, joined by every other kind that at least half of their stems have
    (``PAIRED_SHARE``), so that a stray sidecar file changes nothing.
    """
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"source folder {root} does not exist or is not a folder")
    listing, walk = list_tree(root, processes, on_walk)
    found = _samples_found(root, listing, walk, labels_file, fields, allow_missing, classes, add_classes)
    found.folders = walk.folders
    return found


def _samples_found(
    root: Path,
    listing: "Listing",
    walk: "Walk",
    labels_file: Optional[str | os.PathLike],
    fields: Optional[Sequence[str]],
    allow_missing: bool,
    classes: Optional[Sequence[str]],
    add_classes: bool,
) -> Discovery:
    """What ``discover`` finds in the files a walk listed (see there for the rules)."""
    ignored, by_kind, unlisted = dict(sorted(walk.ignored.items())), walk.by_kind, walk.problems
    if fields:
        chosen = tuple(f for f in FIELD_KINDS if f in fields)
    elif sum(1 for counts in by_kind if counts) < 2:  # one kind of file (or none): nothing to pair
        chosen = ("image",) if by_kind[KIND_CODES["image"]] else ("text",)
    else:
        chosen = _find_fields(listing.pairs())
    for code, counts in enumerate(by_kind):  # files of the kinds that are not fields are not used
        if FIELD_KINDS[code] not in chosen:
            for ext, n in counts.items():
                ignored[ext] = ignored.get(ext, 0) + n
    if len(chosen) == 1 and labels_file is None:
        return _single_field(root, listing, chosen[0], dict(sorted(ignored.items())), unlisted, classes, add_classes)
    files = listing.pairs()
    del listing
    samples, problems = _samples(files, chosen, allow_missing)
    unlisted += problems
    ignored = dict(sorted(ignored.items()))
    if labels_file is not None:
        found = _with_labels_file(root, samples, ignored, Path(labels_file), chosen, classes, add_classes)
        found.skipped[:0] = unlisted
        found.fields = chosen
        found.labels_from = "file"
        return found
    class_dirs = class_folders(root)
    base = _joinable(root)
    if not class_dirs:
        if classes is not None:
            raise InputError(
                f"--classes gives a class map, but {root} has no class folders (its samples are "
                "unlabelled); leave --classes out, or give the folder that holds the class folders"
            )
        items = _builder(base, chosen)
        for c in samples:
            items.add(c.key, UNLABELLED, c.files)
        return Discovery(root, items.build(), None, unlisted, ignored, chosen)
    if classes is not None:
        class_dirs = extend_class_map(classes, class_dirs, add_classes, str(root))
    class_index = {name: i for i, name in enumerate(class_dirs)}
    items = _builder(base, chosen)
    skipped: list[Skipped] = list(unlisted)
    for c in samples:
        top, slash, _ = c.key.partition("/")
        if not slash:
            skipped.append(Skipped(c.key, "not inside a class folder (the source has class subfolders)"))
            continue
        items.add(c.key, class_index[top], c.files)
    return Discovery(root, items.build(), class_dirs, skipped, ignored, chosen)


def _single_field(
    root: Path,
    listing: "Listing",
    field_: str,
    ignored: dict[str, int],
    unlisted: list[Skipped],
    classes: Optional[Sequence[str]],
    add_classes: bool,
) -> Discovery:
    """``discover`` of a tree whose samples are single files of field ``field_``, into an
    ``ItemTable`` over the walk's own buffers (no object per file; see ``discover`` for the rules)."""
    keep = np.frombuffer(listing.kinds, np.uint8) == KIND_CODES[field_]
    class_dirs = class_folders(root)
    labels = None
    skipped = list(unlisted)
    if not class_dirs and classes is not None:
        raise InputError(
            f"--classes gives a class map, but {root} has no class folders (its samples are "
            "unlabelled); leave --classes out, or give the folder that holds the class folders"
        )
    if class_dirs:
        if classes is not None:
            class_dirs = extend_class_map(classes, class_dirs, add_classes, str(root))
        labels = LabelRuns.of_spans(_class_spans(listing.paths, class_dirs), len(listing))
        for a, b, label in labels.spans():
            if label == UNLABELLED:
                for i in (np.flatnonzero(keep[a:b]) + a).tolist():
                    skipped.append(
                        Skipped(listing.rel(i), "not inside a class folder (the source has class subfolders)")
                    )
                keep[a:b] = False
    mode = IMAGES if field_ == "image" else SINGLE
    table = ItemTable(_joinable(root), listing.paths, labels, mode, (field_,))
    if not keep.all():
        table = table.kept(keep)
    return Discovery(root, table, class_dirs or None, skipped, ignored, (field_,))


def _class_spans(paths: RecordBlocks, class_dirs: list[str]) -> list[tuple[int, int, int]]:
    """(start, stop, class index) of each run of ``paths`` (sorted) inside one of ``class_dirs``.

    One pass over the blocks: a block whose first and last paths are in one folder is in it whole
    (the paths are sorted), so only the blocks where a folder ends are looked at path by path. A
    binary search per class decompressed ~20 blocks for each of them: seconds for 21,000 classes."""
    index = {name: i for i, name in enumerate(class_dirs)}
    spans: list[tuple[int, int, int]] = []
    run_top, run_start, at = None, 0, 0

    def top(path: str) -> Optional[str]:
        folder, slash, _ = path.partition("/")
        return folder if slash else None

    for b in range(paths.blocks):
        records = paths.block(b)
        first = top(records[0])
        if first is not None and first == run_top and top(records[-1]) == first:
            at += len(records)
            continue
        for path in records:
            folder = top(path)
            if folder != run_top:
                if run_top in index:
                    spans.append((run_start, at, index[run_top]))  # type: ignore[index]
                run_top, run_start = folder, at
            at += 1
    if run_top in index:
        spans.append((run_start, at, index[run_top]))  # type: ignore[index]
    return spans


def class_folders(root: str | os.PathLike) -> list[str]:
    """The class folders of ``root``, sorted: its subfolders but litter, names that are not UTF-8 and
    packer outputs."""
    return sorted(
        e.name
        for e in os.scandir(root)
        if not is_litter(e.name)
        and utf8_name(e.name)
        and e.is_dir(follow_symlinks=True)
        and not is_packer_folder(e.path)
    )


class _Candidate(NamedTuple):
    """A sample before labelling: its key and its files' relative paths, by field (a tuple: made
    once per file, and a frozen dataclass is several times slower to make)."""

    key: str
    files: tuple[tuple[str, str], ...]  # (field, relative path); empty tuple for an image-only sample
    rel: str  # the one file of a single-field sample, the first file of a paired one


def _builder(base: str, fields: tuple[str, ...]) -> TableBuilder:
    """A builder of the ``ItemTable`` of samples of ``fields`` under ``base`` (``_joinable`` of the
    root), to which each candidate's key, label and ``files`` are added."""
    return TableBuilder(base, PAIRED if len(fields) > 1 else IMAGES if fields == ("image",) else SINGLE, fields)


def _joinable(root: Path) -> str:
    """``root`` as a string that a relative path can be appended to: what ``os.path.join(root,
    rel)`` gives, without its cost per file."""
    return os.path.join(os.fspath(root), "")  # a separator at the end unless one is there (or "C:")


PAIRED_SHARE = 0.5
"""Share of the image stems (of the text stems, without images) that must have a partner file of a
kind for that kind to join the sample: a stray ``notes.txt`` or one annotation ``.json`` among
thousands of images must not turn an image folder into paired samples that all lack it."""


def _find_fields(files: list[tuple[str, str]]) -> tuple[str, ...]:
    """The fields of a tree whose fields were not given (see ``discover``): the main kind (images,
    else texts) plus each other kind that at least ``PAIRED_SHARE`` of its stems have."""
    present = {kind for _, kind in files}
    main = "image" if "image" in present else "text"
    if len(present) < 2:  # one kind of file: nothing to pair, no stems to compare
        return (main,)
    kinds: dict[tuple[str, str], set[str]] = {}
    for rel, kind in files:
        kinds.setdefault(_stem(rel), set()).add(kind)
    stems = [ks for ks in kinds.values() if main in ks]
    paired = {
        k for k in FIELD_KINDS if k != main and stems and sum(k in ks for ks in stems) >= PAIRED_SHARE * len(stems)
    }
    return tuple(f for f in FIELD_KINDS if f == main or f in paired)


def _stem(rel: str) -> tuple[str, str]:
    """(folder, name without its last extension) of a relative path: the key files pair on."""
    folder, name = os.path.split(rel)
    return folder, os.path.splitext(name)[0]


def _samples(
    files: list[tuple[str, str]], fields: tuple[str, ...], allow_missing: bool
) -> tuple[list[_Candidate], list[Skipped]]:
    """Group the listed files of the kinds in ``fields`` into samples (the other files are counted as
    ignored by the caller); paired samples that cannot be used are returned as skipped."""
    used = [(kind, rel) for rel, kind in files if kind in fields]
    if len(fields) == 1:
        if fields == ("image",):
            return [_Candidate(rel, (), rel) for _, rel in used], []
        return [_Candidate(rel, ((kind, rel),), rel) for kind, rel in used], []
    groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for kind, rel in used:
        groups.setdefault(_stem(rel), []).append((kind, rel))
    samples: list[_Candidate] = []
    skipped: list[Skipped] = []
    for (folder, stem), members in groups.items():
        key = f"{folder}/{stem}" if folder else stem
        by_field: dict[str, list[str]] = {}
        for kind, rel in members:
            by_field.setdefault(kind, []).append(rel)
        doubled = [rels for rels in by_field.values() if len(rels) > 1]
        missing = [f for f in fields if f not in by_field]
        if doubled:
            names = ", ".join(os.path.basename(r) for r in doubled[0])
            skipped.append(Skipped(key, f"several files for one field share the stem: {names}; rename all but one"))
        elif missing and ("image" in missing or not allow_missing):
            have = ", ".join(os.path.basename(r) for _, r in members)
            hint = "" if "image" in missing else " (--allow-missing stores it empty)"
            skipped.append(Skipped(key, f"missing {' and '.join(missing)}: only {have}{hint}"))
        else:
            files_ = tuple((f, by_field[f][0]) for f in fields if f in by_field)
            samples.append(_Candidate(key, files_, files_[0][1]))
    samples.sort(key=lambda c: c.key)
    return samples, skipped


def prefix_samples(
    root: Path, listing: "Listing", stable: int, walk: "Walk", fields: Optional[Sequence[str]]
) -> Optional[Discovery]:
    """What ``discover`` (without a labels file or class map) would find in the first ``stable`` files
    of a walk under way (``WalkWatcher``), when its samples are single files: a prefix of what it
    finds in the whole tree unless a file listed later changes the fields (auto-detected) or the
    labels. None where the samples may be paired: several ``fields`` given, or, auto-detected, files
    of another kind seen so far that are at least ``PAIRED_SHARE`` of the main kind's (fewer cannot
    pair with enough stems; a stray ``notes.txt`` changes nothing)."""
    if fields:
        chosen = tuple(f for f in FIELD_KINDS if f in fields)
    else:
        counts = {FIELD_KINDS[code]: sum(n.values()) for code, n in enumerate(walk.by_kind)}
        main = "image" if counts["image"] or not counts["text"] else "text"
        if any(n >= PAIRED_SHARE * counts[main] for kind, n in counts.items() if kind != main and n):
            return None
        chosen = (main,)
    if len(chosen) != 1:
        return None
    prefix = Listing()
    prefix.extend_range(listing, 0, stable)
    return _single_field(root, prefix, chosen[0], {}, [], None, False)


def _with_labels_file(
    root: Path,
    samples: list[_Candidate],
    ignored: dict[str, int],
    labels_file: Path,
    fields: tuple[str, ...],
    given: Optional[Sequence[str]] = None,
    add_classes: bool = False,
) -> Discovery:
    """Label ``samples`` from a CSV whose paths name a sample's key or any of its files (the labels are
    names in the ``given`` class map, when there is one)."""
    known = {n for c in samples for n in (c.key, c.rel, *(rel for _, rel in c.files))}
    labels = read_labels_file(labels_file, known)
    names = sorted(set(labels.values()))
    if given is not None:
        if names and all(n.isdigit() for n in names) and not set(names) <= set(given):
            raise InputError(
                f"{labels_file} labels samples with class indices, but with --classes its labels must be "
                "class names of that map (an index would mean another class in each map)"
            )
        classes = extend_class_map(given, names, add_classes, str(labels_file))
        index = {n: i for i, n in enumerate(classes)}
    elif all(n.isdigit() for n in names):
        classes = [str(i) for i in range(max(int(n) for n in names) + 1)] if names else []
        index = {n: int(n) for n in names}
    else:
        classes = names
        index = {n: i for i, n in enumerate(names)}
    listed: set[str] = set()
    items = _builder(_joinable(root), fields)
    skipped: list[Skipped] = []
    for c in samples:
        names_of = [c.key, c.rel, *(rel for _, rel in c.files)]
        hit = next((n for n in names_of if n in labels), None)
        if hit is None:
            skipped.append(Skipped(c.key, f"no label in {labels_file.name}"))
            continue
        listed.update(n for n in names_of if n in labels)
        items.add(c.key, index[labels[hit]], c.files)
    for rel in sorted(set(labels) - listed):
        skipped.append(Skipped(rel, f"listed in {labels_file.name} but not found in the source folder"))
    return Discovery(root, items.build(), classes, skipped, ignored)


__all__ = [
    "Discovery",
    "discover",
    "is_image_name",
    "is_litter",
    "field_kind",
    "IMAGE_EXTENSIONS",
    "FIELD_KINDS",
    "UNLABELLED",
]
