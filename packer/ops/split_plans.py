"""Which samples each split holds (``plan_splits``): the split folders of a source (``split_folders``)
or one class-folder tree cut by ``--split`` (``parse_split_spec``, ``stratified_split``), every split
labelled with one class map. ``packer.ops.splits`` converts them."""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

from packer.config import ConvertConfig
from packer.records import Skipped
from packer.sources.containers import container_kind
from packer.sources.discover import Discovery, class_folders, discover
from packer.sources.walk import field_kind, is_litter
from packer.spec.class_map import extend_class_map, quoted
from packer.spec.errors import ConfigError, InputError
from packer.spec.splits_record import split_name_problem

SPLIT_NAMES = ("train", "val", "valid", "validation", "test")
"""Top-level folder names (any case) that make a source a set of splits."""


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


def plan_splits(
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
