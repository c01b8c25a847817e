"""Train/val/test splits converted as one: one output per split, one class map shared by all.

A source whose top-level folders are all split names (``train``, ``val``, ...), each holding class
folders, becomes ``OUT/train``, ``OUT/val``, ...; ``--split train=0.9,val=0.1`` cuts one class-folder
tree into such outputs instead (stratified, seeded). Either way every split is labelled with the
same class map, the sorted union of all splits' class names (or the one ``--classes`` gives), so a
label means the same class in each, even when a split lacks some classes.

``OUT/splits.json`` ties the outputs together: the class map, the splits with their manifests'
SHA-256, and whether the set is complete. It is written first (incomplete) and last (complete), so a
reader of ``OUT/val`` can tell a finished set from an interrupted or half-replaced one
(``check_split_member``), and ``--resume`` keeps the splits already written when their options and
source files are unchanged.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

from packer.config import ConvertConfig
from packer.ops.convert import ConvertResult, convert
from packer.output.files import check_output, is_packer_output, remove_tree, staging_dir
from packer.records import ShardTask, Skipped
from packer.run.executor import DEFAULT_TIMEOUT, Executor, ProgressFn
from packer.run.job import ConvertJob, Selection
from packer.run.resume import plan_fingerprint
from packer.run.staging import Staging
from packer.sources.containers import container_kind
from packer.sources.discover import Discovery, class_folders, discover
from packer.sources.origin import checked
from packer.sources.walk import field_kind, is_litter
from packer.spec.class_map import class_map_digest, extend_class_map, quoted, read_class_file
from packer.spec.errors import ConfigError, InputError, ManifestError, OutputError
from packer.spec.manifest import MANIFEST_NAME, read_manifest, sha256_of
from packer.spec.splits_record import SPLITS_NAME, SplitsRecord, read_splits, split_name_problem, write_splits

log = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "val", "valid", "validation", "test")
"""Top-level folder names (any case) that make a source a set of splits."""


@dataclass
class SplitsResult:
    """The outcome of ``convert_splits``: the record written, and each split's conversion (None for a
    split that ``--resume`` kept as it was)."""

    output: Path
    record: SplitsRecord
    results: dict[str, Optional[ConvertResult]]
    seconds: float = 0.0


def is_split_name(name: str) -> bool:
    """True for the folder names that mark splits (``SPLIT_NAMES``, any case)."""
    return name.lower() in SPLIT_NAMES


def split_folders(root: str | os.PathLike) -> Optional[list[str]]:
    """The split folders of ``root`` when every top-level folder is a split name (train first, then the
    order of ``SPLIT_NAMES``); None for an ordinary source. InputError when folders named like splits
    sit beside others: labelling samples by split name would be wrong data, guessing the other way too."""
    folders = class_folders(root)
    named = [f for f in folders if is_split_name(f)]
    if not named:
        return None
    if len(named) < len(folders):
        others = [f for f in folders if not is_split_name(f)]
        raise InputError(
            f"{root} has folders named like splits ({quoted(named)}) beside other folders "
            f"({quoted(others)}): move those into the splits (or away), or pass --no-splits if all of "
            "them are classes"
        )
    lowered = [f.lower() for f in named]
    if len(set(lowered)) < len(lowered):
        raise InputError(f"{root} has split folders that differ only in case ({quoted(named)}); rename one")
    return sorted(named, key=lambda f: (SPLIT_NAMES.index(f.lower()), f))


def parse_split_spec(text: str) -> list[tuple[str, float]]:
    """``train=0.9,val=0.1`` as ``[("train", 0.9), ("val", 0.1)]``; ConfigError unless every name is a
    folder name given once (in any case) and the fractions are positive and add up to 1."""
    parts: list[tuple[str, float]] = []
    for piece in text.split(","):
        name, eq, value = piece.strip().partition("=")
        name = name.strip()
        try:
            fraction = float(value) if eq else math.nan
        except ValueError:
            fraction = math.nan
        problem = split_name_problem(name)
        if problem or not (0 < fraction <= 1):
            raise ConfigError(
                f"--split {text!r}: expected NAME=FRACTION pairs such as train=0.9,val=0.1 (fractions "
                f"above 0; {problem or 'names of letters, digits, .,_ and -'}), got {piece.strip()!r}"
            )
        if name.lower() in (n.lower() for n, _ in parts):
            raise ConfigError(f"--split {text!r}: {name} is named twice (split names differ in more than case)")
        parts.append((name, fraction))
    if len(parts) < 2:
        raise ConfigError(f"--split {text!r}: name at least two splits (e.g. train=0.9,val=0.1)")
    total = sum(f for _, f in parts)
    if abs(total - 1) > 1e-6:
        raise ConfigError(f"--split {text!r}: the fractions add up to {total:g}, not 1")
    return parts


def split_counts(n: int, fractions: Sequence[float], owed: Optional[list[float]] = None) -> list[int]:
    """``n`` samples shared out by ``fractions`` (summing to 1), each within one sample of its exact share.

    The samples left over after each split takes the whole part of its share go, one each, to splits
    whose share has a fraction left, those furthest below their share first: of this class alone, or
    (``owed``, updated here: each split's exact share minus what it got, summed over the classes
    shared out before) over all classes, so that many small classes still give each split its share
    of the whole. Ties go to the earlier split.
    """
    exact = [n * f for f in fractions]
    counts = [math.floor(x) for x in exact]
    behind = owed if owed is not None else [0.0] * len(fractions)
    for i, x in enumerate(exact):
        behind[i] += x - counts[i]
    short = [i for i, x in enumerate(exact) if x > counts[i]]  # only these may take one more: the bound holds
    for i in sorted(short, key=lambda i: (-behind[i], i))[: n - sum(counts)]:
        counts[i] += 1
        behind[i] -= 1
    return counts


def stratified_split(found: Discovery, spec: Sequence[tuple[str, float]], seed: int) -> dict[str, Discovery]:
    """``found`` cut into the splits of ``spec``: within each class (all samples when unlabelled) the
    samples are ordered by a seeded hash of their key and shared out by ``split_counts``, class after
    class. The same seed and files give the same splits on any machine (adding files may move others).
    Each split keeps the sorted order and the class map; the files discovery skipped or ignored are
    reported with the first split."""
    by_label: dict[int, list] = {}
    for item in found.items:
        by_label.setdefault(item.label, []).append(item)
    members: dict[str, list] = {name: [] for name, _ in spec}
    fractions = [f for _, f in spec]
    owed = [0.0] * len(spec)
    for label in sorted(by_label):
        items = sorted(by_label[label], key=lambda it: _draw(seed, it.relpath))
        start = 0
        for (name, _), count in zip(spec, split_counts(len(items), fractions, owed)):
            members[name] += items[start : start + count]
            start += count
    parts = {}
    for i, (name, _) in enumerate(spec):
        items = sorted(members[name], key=lambda it: it.index)
        parts[name] = replace(
            found,
            items=[replace(it, index=j) for j, it in enumerate(items)],
            skipped=list(found.skipped) if i == 0 else [],
            ignored=dict(found.ignored) if i == 0 else {},
        )
    return parts


def _draw(seed: int, key: str) -> bytes:
    return hashlib.sha256(f"{seed}\0{key}".encode("utf-8", "surrogateescape")).digest()


def read_class_map(path: str | os.PathLike) -> list[str]:
    """The class map in ``path``: a packer output's, a folder of splits', or a text file of one class name
    per line (``packer.spec.class_map.read_class_file``). InputError says what is wrong."""
    path = Path(path)
    return _from_output(path) if path.is_dir() else read_class_file(path)


def _from_output(folder: Path) -> list[str]:
    if (folder / SPLITS_NAME).is_file():
        record = read_splits(folder)
        if not record.complete:
            raise InputError(f"--classes {folder} is an unfinished conversion of splits; finish it (--resume) first")
        classes = record.classes
    elif (folder / MANIFEST_NAME).is_file():
        m = read_manifest(folder)
        classes = m.classes if m.annotations is None else m.annotations.get("categories")  # detection: categories
    else:
        raise InputError(
            f"--classes {folder} is a folder but not a packer output (no {MANIFEST_NAME}); give a "
            "packer output or a text file of class names"
        )
    if classes is None:
        raise InputError(f"--classes {folder} is an unlabelled packer output: it has no class map")
    return list(classes)


def folder_splits(
    source: Path, names: Sequence[str], config: ConvertConfig, classes: Optional[Sequence[str]], add_classes: bool
) -> tuple[dict[str, Discovery], Optional[list[str]]]:
    """Each split folder discovered, labelled with the common class map (``classes`` extended, or the
    sorted union of the splits' class names); the map. Unlabelled splits (no class folders) stay so."""
    text = config.text
    found = {name: discover(source / name, None, text.fields, text.allow_missing) for name in names}
    union = sorted({c for d in found.values() if d.classes is not None for c in d.classes})
    labelled = [d for d in found.values() if d.classes is not None]
    if not labelled:
        if classes is not None:
            raise InputError(f"--classes gives a class map, but no split of {source} has class folders")
        return found, None
    common = extend_class_map(classes, union, add_classes, str(source)) if classes is not None else union
    index = {name: i for i, name in enumerate(common)}
    for name, d in found.items():
        if d.classes is not None:
            old = d.classes
            d.items = [replace(it, label=index[old[it.label]]) for it in d.items]
            d.classes = list(common)
    return found, list(common)


def convert_splits(
    source: str | os.PathLike,
    output: str | os.PathLike,
    config: ConvertConfig,
    *,
    fractions: Optional[Sequence[tuple[str, float]]] = None,
    seed: int = 0,
    classes: Optional[Sequence[str]] = None,
    add_classes: bool = False,
    labels_file: Optional[str | os.PathLike] = None,
    workers: Optional[int] = None,
    overwrite: bool = False,
    strict: bool = False,
    resume: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Optional[ProgressFn] = None,
    on_plan: Optional[Callable] = None,
    on_split: Optional[Callable[[str], None]] = None,
    executor: Optional[Executor] = None,
) -> SplitsResult:
    """Convert ``source``'s split folders (or, with ``fractions``, a seeded stratified split of its class
    folders; see ``stratified_split``) into one output per split under ``output``, sharing one class
    map (see the module docstring). ``on_split(name)`` is called as each split begins; the other
    arguments are ``packer.ops.convert.convert``'s, for every split.
    """
    started = time.perf_counter()
    source, output = Path(source), Path(output)
    chosen = Selection(labels_file, classes, add_classes)
    ConvertJob(source, output, config, chosen, resume=resume, executor=executor, splits=True).validate()
    parts, common, origin, roots = _plan(source, config, fractions, seed, classes, add_classes, labels_file)
    missing = {name: _missing(d, common) for name, d in parts.items()}
    for name, absent in missing.items():
        if absent:
            log.warning(
                "split %s has no sample of %d class(es), which keep their indices: %s",
                name,
                len(absent),
                quoted(absent),
            )
    _check_parent(output, overwrite, resume, source)  # before the lock file is made beside it
    # The set's lock: no other run writes the set or one of its splits. The set is never published
    # by a rename, so there is nothing to repair; each split's own conversion repairs its folder.
    set_lock = Staging(output)
    try:
        set_lock.lock(repair=False)
        previous = _check_parent(output, overwrite, resume, source, warn=True)
        ours = {
            name
            for name in parts
            if previous is not None and name in previous.splits and is_packer_output(output / name)
        }
        for name, d in parts.items():  # every check of every split before anything is written
            check_output(output / name, overwrite or name in ours, roots[name])
            checked(d, strict, config.text)
        stamps = {name: _fingerprint(config, d, strict) for name, d in parts.items()}
        kept = _kept(output, previous, stamps) if resume else set()
        plan_workers = previous.workers if resume and previous is not None and previous.workers else workers
        record = SplitsRecord(
            common,
            {
                name: {"samples": len(d.items), "manifest_sha256": None, "fingerprint": stamps[name]}
                for name, d in parts.items()
            },
            origin,
            {n: m for n, m in missing.items() if m},
            workers=plan_workers,
            unlabelled=[n for n, d in parts.items() if d.classes is None and common is not None],
        )
        for name in kept:
            record.splits[name].update(
                samples=previous.splits[name]["samples"],  # type: ignore[union-attr]
                manifest_sha256=previous.splits[name]["manifest_sha256"],
            )  # type: ignore
        output.mkdir(parents=True, exist_ok=True)
        write_splits(output, record)  # from here on, readers refuse the splits until the set is complete
        results: dict[str, Optional[ConvertResult]] = {}
        for name, d in parts.items():
            if name in kept:
                log.info("--resume: split %s is finished and unchanged; kept", name)
                results[name] = None
                continue
            if on_split is not None:
                on_split(name)
            target = output / name
            result = convert(
                roots[name],
                target,
                config,
                workers=plan_workers,
                overwrite=overwrite or name in ours,
                strict=strict,
                resume=resume and staging_dir(target).exists(),
                timeout=timeout,
                progress=progress,
                on_plan=on_plan,
                executor=executor,
                discovery=d,
            )
            results[name] = result
            record.splits[name]["samples"] = result.manifest.samples
            record.splits[name]["manifest_sha256"] = sha256_of(target / MANIFEST_NAME)
            write_splits(output, record)
        if previous is not None:
            for name in previous.splits.keys() - parts.keys():  # splits of the set replaced that this one lacks
                if is_packer_output(output / name):
                    remove_tree(output / name)
        record.complete = True
        write_splits(output, record)
    finally:
        set_lock.release()
    return SplitsResult(output, record, results, time.perf_counter() - started)


def _plan(
    source: Path,
    config: ConvertConfig,
    fractions: Optional[Sequence[tuple[str, float]]],
    seed: int,
    classes: Optional[Sequence[str]],
    add_classes: bool,
    labels_file: Optional[str | os.PathLike],
) -> tuple[dict[str, Discovery], Optional[list[str]], dict, dict[str, Path]]:
    """The splits to write: ``(discovery of each, the shared class map, the record's origin, each one's
    source folder)``; InputError for a source that cannot be split so."""
    kind = container_kind(Path(source))
    if kind is not None:  # they would be walked as folders, and found to hold no samples
        raise InputError(
            f"{source} is a {kind} source: --split and split folders apply to folders of images; "
            "convert each split's files as an output of its own, with the same --classes"
        )
    if fractions is not None:
        found = discover(source, labels_file, config.text.fields, config.text.allow_missing, classes, add_classes)
        if not found.items and labels_file is not None and found.skipped:
            raise InputError(
                f"none of the {len(found.skipped)} samples under {source} is listed in {labels_file}; "
                "its paths must be relative to the source folder, e.g. 'cat/001.jpg'"
            )
        parts = stratified_split(found, fractions, seed)
        origin: dict = {"kind": "random", "fractions": dict(fractions), "seed": seed}
        roots = {name: source for name in parts}
        common = found.classes
    else:
        if labels_file is not None:
            raise ConfigError(
                "--labels with split folders: convert each split on its own with its --labels file "
                "and the same --classes"
            )
        names = split_folders(source)
        if not names:
            raise InputError(f"{source} has no split folders ({', '.join(SPLIT_NAMES)})")
        parts, common = folder_splits(source, names, config, classes, add_classes)
        stray = _beside_splits(source)
        if stray:  # in no split: reported with the first one's, as a folder's files outside any class are
            first = parts[names[0]]
            first.skipped[:0] = [
                Skipped(n, "beside the split folders, in none of them: move it into a split's class folder")
                for n in stray
            ]
        origin = {"kind": "folders"}
        roots = {name: source / name for name in parts}
    for name, d in parts.items():
        if not d.items and not d.skipped:
            raise InputError(
                f"split {name} of {source} would hold no samples"
                + (" (too few samples for its fraction)" if fractions is not None else "")
            )
    return parts, common, origin, roots


def _beside_splits(source: Path) -> list[str]:
    """The sample files (images, texts, json) at the top of a source of split folders, sorted."""
    try:
        entries = list(os.scandir(source))
    except OSError:
        return []
    return sorted(e.name for e in entries if not is_litter(e.name) and field_kind(e.name) is not None and e.is_file())


def _missing(found: Discovery, classes: Optional[Sequence[str]]) -> list[str]:
    if classes is None or found.classes is None:
        return []
    present = {it.label for it in found.items}
    return [name for i, name in enumerate(classes) if i not in present]


def _fingerprint(config: ConvertConfig, found: Discovery, strict: bool) -> str:
    """What decides a split's output: options, samples, labels, source file stamps and the class map."""
    plan = plan_fingerprint(config, [ShardTask("split", tuple(found.items))], strict, stamps=True)
    return hashlib.sha256(f"{plan}\0{class_map_digest(found.classes)}".encode()).hexdigest()


def _check_parent(
    output: Path, overwrite: bool, resume: bool, source: Path, warn: bool = False
) -> Optional[SplitsRecord]:
    """Refuse an ``output`` that splits may not be written into; the record of the splits already there
    (``warn``: say that an unfinished set is started over)."""
    if output.is_symlink() or (output.exists() and not output.is_dir()):
        raise OutputError(f"{output} exists and is not a folder; choose another output path")
    if output.parent.exists() and not output.parent.is_dir():
        raise OutputError(f"cannot create {output}: {output.parent} is not a folder")
    src, out = source.resolve(), output.resolve()
    if src == out or out in src.parents:
        raise OutputError(f"{output} holds the source folder {source}; choose an output outside it")
    if not output.exists() or not any(output.iterdir()):
        return None
    if (output / MANIFEST_NAME).exists():
        raise OutputError(
            f"{output} holds a single packer output; splits go into a folder of their own "
            f"(e.g. -o {output.parent / (output.name + '-splits')})"
        )
    if not (output / SPLITS_NAME).exists():
        raise OutputError(
            f"{output} is a non-empty folder that holds no packer splits; refusing to write into it. "
            "Choose another output path or empty it first."
        )
    previous = read_splits(output)
    if previous.complete and resume and not overwrite:
        raise OutputError(f"{output} is already complete: nothing to resume (pass --overwrite to convert again)")
    if previous.complete and not overwrite:
        raise OutputError(
            f"{output} already holds packer splits ({', '.join(previous.splits)}); pass --overwrite to replace them"
        )
    if warn and not previous.complete and not resume:
        log.warning("discarding the unfinished splits in %s (pass --resume to keep the finished ones)", output)
    return previous


def _kept(output: Path, previous: Optional[SplitsRecord], stamps: dict[str, str]) -> set[str]:
    """The splits an interrupted run finished that ``--resume`` keeps: same fingerprint, manifest unchanged."""
    if previous is None:
        return set()
    kept = set()
    for name, entry in previous.splits.items():
        manifest = output / name / MANIFEST_NAME
        if (
            name in stamps
            and entry.get("fingerprint") == stamps[name]
            and entry.get("manifest_sha256")
            and manifest.is_file()
            and sha256_of(manifest) == entry["manifest_sha256"]
        ):
            try:
                read_manifest(output / name)
            except ManifestError:
                continue
            kept.add(name)
    return kept


def describe_missing(record: SplitsRecord) -> list[str]:
    """One line per split that lacks classes of the map, for summaries."""
    return [
        f"split {name} has no sample of {len(absent)} class(es): {quoted(absent)}"
        for name, absent in record.missing.items()
    ]


__all__ = [
    "SPLIT_NAMES",
    "SplitsResult",
    "read_class_map",
    "convert_splits",
    "split_folders",
    "parse_split_spec",
    "split_counts",
    "stratified_split",
    "is_split_name",
    "describe_missing",
]
