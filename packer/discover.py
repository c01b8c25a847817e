"""Finding the source files: class folders, labels files, ignored litter, deterministic order."""

from __future__ import annotations

import csv
import json
import os
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator, NamedTuple, Optional, Protocol, Sequence

import numpy as np

from packer.class_map import extend_class_map
from packer.errors import InputError
from packer.file_stamp import FileStamp, stat_or_none
from packer.folder_stamps import FolderStamps
from packer.item_table import IMAGES, PAIRED, SINGLE, ItemTable, LabelRuns, TableBuilder
from packer.process_pool import ProcessPool
from packer.record_blocks import RecordBlocks
from packer.records import UNLABELLED, Skipped, SourceItem
from packer.source_kinds import FIELD_KINDS, IMAGE_EXTENSIONS, JSON_EXTENSIONS, TEXT_EXTENSIONS

OS_LITTER = frozenset({"thumbs.db", "desktop.ini", "ehthumbs.db", "__macosx", "$recycle.bin"})


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
    """Sources that are containers (Parquet, saved datasets, tar shards; ``packer.containers``):
    where each item's image is inside them, by item index. None for a folder of files."""
    folders: Optional[FolderStamps] = None
    """The folders the walk listed and their stamps (``packer.folder_stamps``); None where no walk
    found the items (containers, splits of a discovery)."""


def is_litter(name: str) -> bool:
    """True for hidden files and OS litter: dotfiles, AppleDouble ``._*``, Thumbs.db, desktop.ini,
    ``__MACOSX`` folders."""
    return name.startswith(".") or name.lower() in OS_LITTER


def is_packer_folder(path: str | os.PathLike) -> bool:
    """True for a packer output (its manifest.json is a packer manifest) or a folder of split outputs
    (its splits.json), never read as input or as a class: converting a folder twice with the output
    inside it must not add a class."""
    records = (("manifest.json", ("manifest_version", "shards")), ("splits.json", ("splits_version", "splits")))
    for name, keys in records:
        record = os.path.join(path, name)
        if not os.path.isfile(record):
            continue
        try:
            with open(record, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and all(k in data for k in keys):
            return True
    return False


def is_image_name(name: str) -> bool:
    """True when the extension is one packer reads as an image (case-insensitive)."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


_KIND_OF_EXTENSION = {
    **{ext: "json" for ext in JSON_EXTENSIONS},
    **{ext: "text" for ext in TEXT_EXTENSIONS},
    **{ext: "image" for ext in IMAGE_EXTENSIONS},
}


def field_kind(name: str) -> Optional[str]:
    """The field a file of this name fills (``image``, ``text``, ``json``), None for other files."""
    return _KIND_OF_EXTENSION.get(os.path.splitext(name)[1].lower())


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
    ``add_classes`` appended at its end (see ``packer.class_map``).

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
    listing, walk = _walk(root, processes, on_walk)
    found = _samples_found(root, listing, walk, labels_file, fields, allow_missing, classes, add_classes)
    found.folders = walk.folders
    return found


def _samples_found(
    root: Path,
    listing: "_Listing",
    walk: "_Walk",
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
        chosen = ("image",) if by_kind[_KIND_CODES["image"]] else ("text",)
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
    listing: "_Listing",
    field_: str,
    ignored: dict[str, int],
    unlisted: list[Skipped],
    classes: Optional[Sequence[str]],
    add_classes: bool,
) -> Discovery:
    """``discover`` of a tree whose samples are single files of field ``field_``, into an
    ``ItemTable`` over the walk's own buffers (no object per file; see ``discover`` for the rules)."""
    keep = np.frombuffer(listing.kinds, np.uint8) == _KIND_CODES[field_]
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
        if not is_litter(e.name) and _utf8(e.name) and e.is_dir(follow_symlinks=True) and not is_packer_folder(e.path)
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


_KIND_CODES = {kind: code for code, kind in enumerate(FIELD_KINDS)}
_CODE_OF_EXTENSION = {ext: _KIND_CODES[kind] for ext, kind in _KIND_OF_EXTENSION.items()}


class _Listing:
    """The files the walk found, in sorted path order, without an object per file: their relative
    POSIX paths in compressed blocks (``packer.record_blocks``), and each one's kind (its index in
    ``FIELD_KINDS``)."""

    def __init__(self) -> None:
        self.paths = RecordBlocks()
        self.kinds = bytearray()

    def __len__(self) -> int:
        return len(self.kinds)

    def rel(self, i: int) -> str:
        """The relative path of the ``i``-th file."""
        return self.paths.record(i)

    def pairs(self) -> list[tuple[str, str]]:
        """Every file as a (relative path, field kind) pair, in order (for the rarer paths that group
        files: paired samples, a labels file)."""
        return [(rel, FIELD_KINDS[k]) for rel, k in zip(self.paths, self.kinds)]

    def spliced(self, inserts: list[tuple[int, "_Listing"]]) -> "_Listing":
        """This listing with each of ``inserts`` (position, listing), in position order, put in at its position."""
        if not inserts:
            return self
        out, done = _Listing(), 0
        for at, part in [*inserts, (len(self), None)]:
            out._extend(self, done, at)
            if part is not None:
                out._extend(part, 0, len(part))
            done = at
        return out

    def extend(self, other: "_Listing") -> None:
        """Append every file of ``other``."""
        self._extend(other, 0, len(other))

    def _extend(self, other: "_Listing", a: int, b: int) -> None:
        self.paths.extend(other.paths, a, b)
        self.kinds += other.kinds[a:b]


class _Walk:
    """What one walk keeps besides the files: the folders it has listed (device and inode), other files
    counted by extension, each kind's files counted by extension, what could not be listed or named,
    and each listed folder's stamps."""

    def __init__(self) -> None:
        self.seen: set[tuple[int, int]] = set()
        self.ignored: Counter[str] = Counter()
        self.by_kind: list[Counter[str]] = [Counter() for _ in FIELD_KINDS]
        self.problems: list[Skipped] = []
        self.folders = FolderStamps()


WATCH_WAIT = 0.05
"""Seconds the walk waits for its pool's next subfolder before telling its ``WalkWatcher`` again."""

PARALLEL_AFTER = 0.25
"""Seconds of walking the root's first subfolders in this process after which the remaining ones
are walked by a pool of processes (when discovery may use more than one): a small tree never pays
for starting them, a large one walks its subfolders on every core."""


class WalkWatcher(Protocol):
    """What discovery tells of a walk under way (``packer.early_start`` starts shards from it), often:
    at every folder it finishes, and while it waits for its pool."""

    def __call__(self, root: Path, listing: "_Listing", stable: int, walk: "_Walk") -> None:
        """``listing``: the files listed so far under ``root`` (it grows); its first ``stable`` are
        those of the finished listing, in its order (the walk adds nothing before them, and no file
        of a symlinked folder, which are spliced in at the end); ``walk``: the rest it saw so far."""
        ...


def prefix_samples(
    root: Path, listing: "_Listing", stable: int, walk: "_Walk", fields: Optional[Sequence[str]]
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
    prefix = _Listing()
    prefix._extend(listing, 0, stable)
    return _single_field(root, prefix, chosen[0], {}, [], None, False)


def _walk(root: Path, processes: int = 1, on_walk: Optional[WalkWatcher] = None) -> tuple[_Listing, _Walk]:
    """All image, text and json files under root in sorted relative-path order (a ``_Listing``), and
    the rest of what the walk saw (``_Walk``: other files, each kind's files by extension, which
    discovery reports as ignored when that kind is not a field, what could not be listed or named,
    in sorted order of their paths).

    Each folder's entries are walked in sorted order of their paths (a folder's name sorts with a
    ``/`` after it), so the files come out sorted with no list of them all to sort. Iterative (no
    recursion limit on deep trees). Symlinked folders are followed, each real folder at most once,
    and only after every folder reachable without one: a folder reachable both ways is found
    under its real path, and a symlink loop ends. With ``processes`` > 1, the root's subfolders
    left after ``PARALLEL_AFTER`` seconds are walked by that many processes, to the same result.
    Paths are plain strings (pathlib objects per file made discovery several times slower, and the
    workers wait for it).
    """
    walk = _Walk()
    watch = None if on_walk is None else (lambda listing, stable: on_walk(root, listing, stable, walk))
    try:
        listing = _walk_tree(os.fspath(root), "", walk, processes, watch)
    except _Overlap:  # a folder reachable by two real paths (a bind mount) in two subfolders: walk in order
        walk = _Walk()
        listing = _walk_tree(os.fspath(root), "", walk)
    walk.problems.sort(key=lambda s: s.path)
    return listing, walk


class _Overlap(Exception):
    """Processes walking two subfolders both listed one folder: the walk starts again in one process."""


def _walk_tree(
    folder: str,
    rel_dir: str,
    walk: _Walk,
    processes: int = 1,
    watch: Optional[Callable[["_Listing", int], None]] = None,
) -> _Listing:
    """The files under ``folder`` (whose relative path is ``rel_dir``) as ``_walk`` finds them: its real
    folders first (subfolders of it in a pool of ``processes`` once walking them takes long), then
    its symlinked ones, each spliced in at its place. ``watch(listing, stable)``: see ``WalkWatcher``."""
    return _with_linked(*_walk_top(folder, rel_dir, walk, processes, watch), walk)


def _walk_top(
    folder: str,
    rel_dir: str,
    walk: _Walk,
    processes: int,
    watch: Optional[Callable[["_Listing", int], None]] = None,
) -> tuple[_Listing, list[tuple[int, str, str]]]:
    """The files under the real folders of ``folder``, and its symlinked folders by their position
    (see ``_walk_tree``). Subfolders walked by the pool are added in order as soon as they and all
    before them are done, so the parent holds little more than the listing itself."""
    entries = _entries(folder, rel_dir, walk)
    out = _Listing()
    linked: list[tuple[int, str, str]] = []

    def watched(first_link: Optional[int]) -> None:  # the files before any symlinked folder are final
        stops = [len(out)] + ([linked[0][0]] if linked else []) + ([first_link] if first_link is not None else [])
        watch(out, min(stops))  # type: ignore[misc]

    seen = None if watch is None else watched
    folders_left = sum(e[3] is _FOLDER for e in entries) if processes > 1 else 0
    if folders_left < 2:
        return out, _walk_real(out, [iter(entries)], walk, seen)
    queue: deque = deque()  # the pool's results, and listings of the entries between them, not yet in out
    started, pool, alone = time.perf_counter(), None, False
    try:
        for entry in entries:
            if entry[3] is _FOLDER:
                if pool is None and not alone and folders_left > 1 and time.perf_counter() - started > PARALLEL_AFTER:
                    try:
                        pool = ProcessPool(processes)
                    except OSError:  # no fork (no memory for one): the walk goes on in this process
                        alone = True
                folders_left -= 1
                if pool is not None:
                    queue.append(pool.submit(_walk_subfolder, entry[2], entry[1]))
                    _flush(queue, out, linked, walk, wait=False)
                    continue
            if not queue:
                linked += _walk_real(out, [iter([entry])], walk, seen)
                continue
            if not isinstance(queue[-1], tuple):
                queue.append((_Listing(), []))
            segment, links = queue[-1]
            links += _walk_real(segment, [iter([entry])], walk)
        while seen is not None and queue and not isinstance(queue[0], tuple):
            _flush(queue, out, linked, walk, wait=False)  # told of each subfolder as it joins the listing
            seen(None)
            if queue and not isinstance(queue[0], tuple):
                queue[0].wait(WATCH_WAIT)
        _flush(queue, out, linked, walk, wait=True)
    finally:
        if pool is not None:
            pool.close()
    return out, linked


def _flush(queue: deque, out: _Listing, linked: list[tuple[int, str, str]], walk: _Walk, wait: bool) -> None:
    """Move the done head of ``queue`` into ``out`` (and its symlinked folders into ``linked``, by
    their position there): every item with ``wait``, else those done before the first that is not
    (a listing of entries is done once something follows it)."""
    while queue:
        head = queue[0]
        if isinstance(head, tuple):
            if not wait and len(queue) == 1:
                return
            listing, links = head
        elif wait or head.ready():
            listing, links = _merged(head.get(), walk)
        else:
            return
        queue.popleft()
        base = len(out)
        out.extend(listing)
        linked += [(base + at, path, rel) for at, path, rel in links]


def _with_linked(out: _Listing, linked: list[tuple[int, str, str]], walk: _Walk) -> _Listing:
    """``out`` with the files of each of its symlinked folders ``linked`` (position, path, relative
    path) spliced in, and those of the symlinked folders inside them: walked in order, each one's
    own symlinked folders before the next, without recursion (a chain of them may be deep)."""
    frames: list[list] = [[out, linked, 0, [], 0]]  # listing, its links, the next one, inserts, its position
    while True:
        frame = frames[-1]
        listing, links, i, inserts, at = frame
        if i < len(links):
            frame[2] = i + 1
            position, path, rel = links[i]
            sub = _Listing()
            frames.append([sub, _walk_real(sub, [iter(_entries(path, rel, walk))], walk), 0, [], position])
            continue
        frames.pop()
        done = listing.spliced([(p, part) for p, part in inserts if len(part)])
        if not frames:
            return done
        frames[-1][3].append((at, done))


def _walk_real(
    out: _Listing, stack: list[Iterator[tuple]], walk: _Walk, watch: Optional[Callable[[Optional[int]], None]] = None
) -> list[tuple[int, str, str]]:
    """Walk the entries of ``stack`` (an iterator of entries per folder, ``_entries``' tuples) and the
    real folders among them into ``out``; return the symlinked folders met, by their position in
    ``out`` (walked after every real folder). ``watch`` is called as each folder is done, with the
    position of the first symlinked folder met (None before one)."""
    add, kinds = out.paths.add, out.kinds
    ignored, by_kind = walk.ignored, walk.by_kind
    linked: list[tuple[int, str, str]] = []
    while stack:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
            if watch is not None:
                watch(linked[0][0] if linked else None)
            continue
        _, rel, path, code = entry
        if code is _FOLDER:
            stack.append(iter(_entries(path, rel, walk)))
        elif code is _LINKED_FOLDER:
            linked.append((len(kinds), path, rel))
        elif code is _OTHER:
            ignored[path] += 1  # for other files, the entry's path field holds the extension
        else:
            add(rel.encode("utf-8"))
            kinds.append(code)
            by_kind[code][path] += 1
    return linked


def _walk_subfolder(folder: str, rel: str) -> tuple:
    """In a pool's process: the real folders under ``folder`` walked as ``_walk_real`` does, returned
    as plain buffers and counts with the symlinked folders met."""
    walk = _Walk()
    out = _Listing()
    linked = _walk_real(out, [iter(_entries(folder, rel, walk))], walk)
    stamps = walk.folders
    return (
        out.paths,
        out.kinds,
        linked,
        walk.seen,
        walk.ignored,
        walk.by_kind,
        walk.problems,
        (stamps.blob, stamps.ends, stamps.stamps),
    )


def _merged(result: tuple, walk: _Walk) -> tuple[_Listing, list[tuple[int, str, str]]]:
    """A pool's ``_walk_subfolder`` result added into ``walk``: its listing, and its symlinked folders."""
    paths, kinds, linked, seen, ignored, by_kind, problems, (fblob, fends, fstamps) = result
    if not seen.isdisjoint(walk.seen):
        raise _Overlap()
    walk.seen |= seen
    walk.ignored.update(ignored)
    for mine, theirs in zip(walk.by_kind, by_kind):
        mine.update(theirs)
    walk.problems += problems
    walk.folders.extend(fblob, fends, fstamps)
    out = _Listing()
    out.paths, out.kinds = paths, kinds
    return out, linked


_FOLDER, _LINKED_FOLDER, _OTHER = "folder", "linked folder", "other"


def _entries(folder: str, rel_dir: str, walk: _Walk) -> list[tuple]:
    """The entries of one folder in sorted path order, as (sort key, relative path, path or
    extension, kind): a kind code for a file of a field kind (with its extension), ``_OTHER`` for
    another file (with its extension), ``_FOLDER`` or ``_LINKED_FOLDER`` (with its path). Empty for
    a folder already walked (by its device and inode) or one that cannot be read (reported).

    Whatever decides what the walk lists is stamped into ``walk.folders`` (``packer.folder_stamps``):
    each folder met, walked or not (a symlink to one already walked may later point elsewhere), each
    packer output left out (it stops being one when its manifest goes), each broken symlink (it may
    come to point at a folder)."""
    prefix = rel_dir + "/" if rel_dir else ""
    problems = walk.problems
    stamp = None
    try:
        stamp = FileStamp.at(folder)
        walk.folders.add(rel_dir, stamp)
        if stamp.which_file() in walk.seen:
            return []
        walk.seen.add(stamp.which_file())
        listed = list(os.scandir(folder))
    except OSError as e:
        if stamp is None:
            walk.folders.add(rel_dir, None)
        problems.append(Skipped(prefix or "/", f"cannot read folder: {e.strerror or e}"))
        return []
    entries = []
    for entry in listed:
        name = entry.name
        if is_litter(name):
            continue
        rel = prefix + name
        if not _utf8(name):  # the folder's own name was checked when it was listed
            shown = os.fsencode(rel).decode("utf-8", "backslashreplace")
            problems.append(Skipped(shown, "file name is not valid UTF-8; rename it"))
            continue
        try:
            is_dir = entry.is_dir(follow_symlinks=True)
        except OSError:
            is_dir = False
        if is_dir:
            if not is_packer_folder(entry.path):
                entries.append((name + "/", rel, entry.path, _LINKED_FOLDER if entry.is_symlink() else _FOLDER))
            else:
                walk.folders.add(rel, FileStamp.at_or_none(entry.path))
            continue
        if entry.is_symlink() and stat_or_none(entry.path) is None:
            walk.folders.add(rel, None)
        dot = name.rfind(".")  # os.path.splitext's extension: the name does not start with a dot
        ext = name[dot:].lower() if dot > 0 else ""
        code = _CODE_OF_EXTENSION.get(ext)
        entries.append((name, rel, ext or "(no extension)", _OTHER if code is None else code))
    entries.sort(key=lambda e: e[0])
    return entries


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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


__all__ = [
    "Discovery",
    "discover",
    "read_labels_file",
    "is_image_name",
    "is_litter",
    "field_kind",
    "IMAGE_EXTENSIONS",
    "FIELD_KINDS",
    "UNLABELLED",
]
