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

Which samples each split holds is planned in ``packer.ops.split_plans``; this module writes them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from packer.config import ConvertConfig
from packer.ops.convert import ConvertResult, convert
from packer.ops.split_plans import plan_splits
from packer.output.files import check_output, discard, is_packer_output, local_output, remove_tree, staging_dir
from packer.output.image_hashes import leaks_between
from packer.records import ShardTask
from packer.run.executor import DEFAULT_TIMEOUT, Executor, ProgressFn
from packer.run.job import ConvertJob, Selection
from packer.run.resume import plan_fingerprint
from packer.run.staging import Staging
from packer.sources.discover import Discovery
from packer.sources.origin import checked
from packer.spec.class_map import class_map_digest, quoted, read_class_file
from packer.spec.errors import InputError, ManifestError, OutputError
from packer.spec.listed_files import sha256_of
from packer.spec.manifest import MANIFEST_NAME, read_manifest
from packer.spec.splits_record import SPLITS_NAME, SplitsRecord, read_splits, write_splits

log = logging.getLogger(__name__)


@dataclass
class SplitsResult:
    """The outcome of ``convert_splits``: the record written, and each split's conversion (None for a
    split that ``--resume`` kept as it was)."""

    output: Path
    record: SplitsRecord
    results: dict[str, Optional[ConvertResult]]
    seconds: float = 0.0
    leaks: dict[tuple[str, str], list[tuple[str, str]]] = field(default_factory=dict)
    """Images of a later split that nearly duplicate images of an earlier one: (later, earlier) ->
    the pairs of keys (``packer.output.image_hashes.leaks_between``)."""


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
    folders; see ``split_plans.stratified_split``) into one output per split under ``output``, sharing one class
    map (see the module docstring). ``on_split(name)`` is called as each split begins; the other
    arguments are ``packer.ops.convert.convert``'s, for every split.
    """
    started = time.perf_counter()
    source, output = Path(source), local_output(output)
    chosen = Selection(labels_file, classes, add_classes)
    ConvertJob(source, output, config, chosen, resume=resume, executor=executor, splits=True).validate()
    parts, common, origin, roots = plan_splits(source, config, fractions, seed, classes, add_classes, labels_file)
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
        if set_lock.sink is not None:  # a bucket's: kept only where the interrupted run's shards are all there
            kept = {name for name in kept if set_lock.sink.published_whole(output / name)}
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
        _keep(set_lock, output)
        results: dict[str, Optional[ConvertResult]] = {}
        for name, d in parts.items():
            if name in kept:
                log.info("--resume: split %s is finished and unchanged; kept", name)
                discard(staging_dir(output / name))  # a bucket run's records of it, restored: not to be published
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
                drop_against=[output / name for name in results] if config.drop_duplicates else (),
            )
            results[name] = result
            record.splits[name]["samples"] = result.manifest.samples
            record.splits[name]["manifest_sha256"] = sha256_of(target / MANIFEST_NAME)
            write_splits(output, record)
            _keep(set_lock, output, name)
        if previous is not None:
            for name in previous.splits.keys() - parts.keys():  # splits of the set replaced that this one lacks
                if is_packer_output(output / name):
                    remove_tree(output / name)
        record.complete = True
        write_splits(output, record)
        leaks = split_leaks(output, list(parts), config) if config.image_hashes else {}
    finally:
        set_lock.release()
    return SplitsResult(output, record, results, time.perf_counter() - started, leaks)


def _keep(staging: Staging, output: Path, finished: Optional[str] = None) -> None:
    """For a set converted into a bucket: mirror its record, and the files of the split ``finished``
    just now (its shards are in the bucket already), for the set's ``--resume``
    (``ShardUploads.keep_finished``)."""
    if staging.sink is None:
        return
    files, published = [output / SPLITS_NAME], []
    if finished is not None:
        split = output / finished
        files += sorted(p for p in split.iterdir() if p.is_file() and not p.name.startswith("shard-"))
        shards = read_manifest(split).shards
        published = [staging.sink.object_name(split, f.path) for shard in shards for f in shard.files]
    staging.sink.keep_finished(files, published, output / finished if finished is not None else None)


def split_leaks(output: Path, names: list[str], config: ConvertConfig) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """For each split and each split before it, the images of the later one that nearly duplicate an
    image of the earlier (by their perceptual hashes, within ``config.dup_distance`` bits)."""
    found = {}
    for n, later in enumerate(names):
        for earlier in names[:n]:
            try:
                pairs = leaks_between(output / later, output / earlier, config.dup_distance)
            except ManifestError as e:  # a split without hashes (kept by --resume from an older packer)
                log.warning("leakage between %s and %s not searched: %s", later, earlier, e)
                continue
            if pairs:
                found[(later, earlier)] = pairs
    return found


def describe_leaks(result: SplitsResult, listed: int = 5, shown: Optional[str] = None) -> list[str]:
    """Lines saying which images of a later split nearly duplicate images of an earlier one, ``listed``
    pairs each; ``shown``: the set as the user knows it (a bucket's URL), by default its folder."""
    where = shown or str(result.output)
    hint = f"`packer info {where}`" if where == str(result.output) else "`packer info` of a local copy"
    lines = []
    for (later, earlier), pairs in result.leaks.items():
        named = "; ".join(f"{later}/{a} ~ {earlier}/{b}" for a, b in pairs[:listed])
        more = f"; and {len(pairs) - listed} more pair(s)" if len(pairs) > listed else ""
        lines.append(
            f"leakage: {len({a for a, _ in pairs})} image(s) of {later} nearly duplicate images of {earlier} "
            f"({hint} lists them all): {named}{more}"
        )
    return lines


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
    "SplitsResult",
    "read_class_map",
    "convert_splits",
    "describe_missing",
]
