"""Walking a source tree: every image, text and json file under a folder in sorted path order, and
what else the walk saw (litter, other files, folders it could not list), without an object per file.
Symlinked folders are followed once each; a large tree's subfolders are walked by a pool of processes.
``packer.sources.discover`` turns the listing into samples.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter, deque
from pathlib import Path
from typing import Callable, Iterator, Optional, Protocol

from packer.records import Skipped
from packer.sources.folder_stamps import FolderStamps
from packer.sources.process_pool import ProcessPool
from packer.sources.record_blocks import RecordBlocks
from packer.spec.file_stamp import FileStamp, stat_or_none
from packer.spec.source_kinds import FIELD_KINDS, IMAGE_EXTENSIONS, JSON_EXTENSIONS, TEXT_EXTENSIONS

OS_LITTER = frozenset({"thumbs.db", "desktop.ini", "ehthumbs.db", "__macosx", "$recycle.bin"})


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


KIND_CODES = {kind: code for code, kind in enumerate(FIELD_KINDS)}
_CODE_OF_EXTENSION = {ext: KIND_CODES[kind] for ext, kind in _KIND_OF_EXTENSION.items()}


class Listing:
    """The files the walk found, in sorted path order, without an object per file: their relative
    POSIX paths in compressed blocks (``packer.sources.record_blocks``), and each one's kind (its index in
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

    def spliced(self, inserts: list[tuple[int, "Listing"]]) -> "Listing":
        """This listing with each of ``inserts`` (position, listing), in position order, put in at its position."""
        if not inserts:
            return self
        out, done = Listing(), 0
        for at, part in [*inserts, (len(self), None)]:
            out.extend_range(self, done, at)
            if part is not None:
                out.extend_range(part, 0, len(part))
            done = at
        return out

    def extend(self, other: "Listing") -> None:
        """Append every file of ``other``."""
        self.extend_range(other, 0, len(other))

    def extend_range(self, other: "Listing", a: int, b: int) -> None:
        """Append files ``a`` to ``b`` (excluded) of ``other``."""
        self.paths.extend(other.paths, a, b)
        self.kinds += other.kinds[a:b]


class Walk:
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
    """What discovery tells of a walk under way (``packer.run.early_start`` starts shards from it), often:
    at every folder it finishes, and while it waits for its pool."""

    def __call__(self, root: Path, listing: "Listing", stable: int, walk: "Walk") -> None:
        """``listing``: the files listed so far under ``root`` (it grows); its first ``stable`` are
        those of the finished listing, in its order (the walk adds nothing before them, and no file
        of a symlinked folder, which are spliced in at the end); ``walk``: the rest it saw so far."""
        ...


def list_tree(root: Path, processes: int = 1, on_walk: Optional[WalkWatcher] = None) -> tuple[Listing, Walk]:
    """All image, text and json files under root in sorted relative-path order (a ``Listing``), and
    the rest of what the walk saw (``Walk``: other files, each kind's files by extension, which
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
    walk = Walk()
    watch = None if on_walk is None else (lambda listing, stable: on_walk(root, listing, stable, walk))
    try:
        listing = _walk_tree(os.fspath(root), "", walk, processes, watch)
    except _Overlap:  # a folder reachable by two real paths (a bind mount) in two subfolders: walk in order
        walk = Walk()
        listing = _walk_tree(os.fspath(root), "", walk)
    walk.problems.sort(key=lambda s: s.path)
    return listing, walk


class _Overlap(Exception):
    """Processes walking two subfolders both listed one folder: the walk starts again in one process."""


def _walk_tree(
    folder: str,
    rel_dir: str,
    walk: Walk,
    processes: int = 1,
    watch: Optional[Callable[["Listing", int], None]] = None,
) -> Listing:
    """The files under ``folder`` (whose relative path is ``rel_dir``) as ``_walk`` finds them: its real
    folders first (subfolders of it in a pool of ``processes`` once walking them takes long), then
    its symlinked ones, each spliced in at its place. ``watch(listing, stable)``: see ``WalkWatcher``."""
    return _with_linked(*_walk_top(folder, rel_dir, walk, processes, watch), walk)


def _walk_top(
    folder: str,
    rel_dir: str,
    walk: Walk,
    processes: int,
    watch: Optional[Callable[["Listing", int], None]] = None,
) -> tuple[Listing, list[tuple[int, str, str]]]:
    """The files under the real folders of ``folder``, and its symlinked folders by their position
    (see ``_walk_tree``). Subfolders walked by the pool are added in order as soon as they and all
    before them are done, so the parent holds little more than the listing itself."""
    entries = _entries(folder, rel_dir, walk)
    out = Listing()
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
                queue.append((Listing(), []))
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


def _flush(queue: deque, out: Listing, linked: list[tuple[int, str, str]], walk: Walk, wait: bool) -> None:
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


def _with_linked(out: Listing, linked: list[tuple[int, str, str]], walk: Walk) -> Listing:
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
            sub = Listing()
            frames.append([sub, _walk_real(sub, [iter(_entries(path, rel, walk))], walk), 0, [], position])
            continue
        frames.pop()
        done = listing.spliced([(p, part) for p, part in inserts if len(part)])
        if not frames:
            return done
        frames[-1][3].append((at, done))


def _walk_real(
    out: Listing, stack: list[Iterator[tuple]], walk: Walk, watch: Optional[Callable[[Optional[int]], None]] = None
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
    walk = Walk()
    out = Listing()
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


def _merged(result: tuple, walk: Walk) -> tuple[Listing, list[tuple[int, str, str]]]:
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
    out = Listing()
    out.paths, out.kinds = paths, kinds
    return out, linked


_FOLDER, _LINKED_FOLDER, _OTHER = "folder", "linked folder", "other"


def _entries(folder: str, rel_dir: str, walk: Walk) -> list[tuple]:
    """The entries of one folder in sorted path order, as (sort key, relative path, path or
    extension, kind): a kind code for a file of a field kind (with its extension), ``_OTHER`` for
    another file (with its extension), ``_FOLDER`` or ``_LINKED_FOLDER`` (with its path). Empty for
    a folder already walked (by its device and inode) or one that cannot be read (reported).

    Whatever decides what the walk lists is stamped into ``walk.folders`` (``packer.sources.folder_stamps``):
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
        if not utf8_name(name):  # the folder's own name was checked when it was listed
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


def utf8_name(name: str) -> bool:
    """Whether ``name`` (as the OS gave it) can be written as UTF-8 (a name of undecodable bytes cannot)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
