"""``packer convert SOURCE -o OUT --append``: the source files that OUT does not hold yet, as new shards.

OUT's shards are never rewritten: their files are hard-linked into the new version (LMDB files
copied, see ``packer.ops.combine``) under their own names, so their bytes and checksums stay, and a
reader opened before the append keeps reading the version it opened (its files are still there,
with the same names and SHA-256s). The new samples are converted exactly as a conversion would
(OUT's preprocessing, codec and class map; a class OUT lacks is refused unless ``add_classes``
appends it at the end), into shards named after their own content, after OUT's. The new version
replaces OUT in one rename once complete, under OUT's lock; an interrupted append leaves OUT as
it was. A sample is matched to OUT by its key (its relative path): files whose keys OUT holds are
not packed again; those modified since OUT was written, and OUT's keys no longer in SOURCE, are
reported. The manifest's ``history`` records each append (when, how many samples, which shards).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from packer import __version__
from packer.config import ConvertConfig, PreprocessConfig, ShardSize
from packer.ops.combine import cross_duplicates, differing, merged_stats
from packer.ops.convert import ConvertResult
from packer.output.assemble import class_counts, find_duplicates, merged_groups, shard_entries, source_counts
from packer.output.files import local_output
from packer.output.finish import content_tag
from packer.output.held_files import HeldFiles
from packer.output.image_hashes import (
    appended_name,
    gathered_looks,
    keys_in_output,
    keys_in_results,
    near_duplicates,
    read_hashes,
    write_hashes,
)
from packer.output.placed_shards import place_shard
from packer.pixels.stats import summarize
from packer.records import ShardResult, ShardStats, ShardTask, SourceItem
from packer.run.executor import DEFAULT_TIMEOUT, Executor, LocalExecutor, ProgressFn
from packer.run.plan import estimate_sample_bytes, plan_shards, shard_name
from packer.run.shard_job import ShardWork
from packer.run.staging import Staging
from packer.sources.discover import Discovery
from packer.sources.origin import checked, refuse_packer_output
from packer.spec.errors import ConfigError, InputError, ManifestError, OutputError
from packer.spec.file_stamp import FileStamp
from packer.spec.manifest import MANIFEST_NAME, Manifest, read_manifest
from packer.spec.sample_layout import ImageCodec, SampleLayout
from packer.spec.text import TextConfig
from packer.system import usable_cpus

log = logging.getLogger(__name__)

APPEND_BALANCED = 100
"""Least samples per new shard for which ``--shard-size auto`` splits an append over the workers."""


@dataclass
class AppendResult(ConvertResult):
    """A finished append: the new version of the output, the samples added, and what was reported."""

    added: int = 0
    changed: list[str] = field(default_factory=list)
    """Keys OUT holds whose source files were modified after OUT was written (not packed again)."""
    removed: list[str] = field(default_factory=list)
    """Keys OUT holds that are no longer in the source."""


def recorded_preprocess(manifest: Manifest) -> PreprocessConfig:
    """The preprocessing an output records, as PreprocessConfig reads it (what older packers left out
    read as what they did); a computed ``--normalize auto`` as the values it computed."""
    preprocess = dict(manifest.preprocess)
    norm = preprocess.get("normalize")
    if isinstance(norm, dict) and norm.get("auto"):
        preprocess["normalize"] = {"mean": norm["mean"], "std": norm["std"]}
    return PreprocessConfig.from_dict(preprocess)


def config_of(manifest: Manifest, shard_size: ShardSize, text: Optional[TextConfig] = None) -> ConvertConfig:
    """The conversion settings an output was written with (its preprocessing and codec), cutting new
    shards by ``shard_size``: what an append converts its new files with."""
    image = manifest.fields.get("image") or {}
    codec = ImageCodec(image.get("codec", "raw"), int(image.get("quality", 90)))
    return ConvertConfig(manifest.format, recorded_preprocess(manifest), shard_size, None, codec, text or TextConfig())


def append(
    source: str | os.PathLike,
    output: str | os.PathLike,
    config: ConvertConfig,
    *,
    labels_file: Optional[str | os.PathLike] = None,
    add_classes: bool = False,
    workers: Optional[int] = None,
    strict: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Optional[ProgressFn] = None,
    on_plan: Optional[Callable[[Discovery, list[ShardTask]], None]] = None,
    executor: Optional[Executor] = None,
) -> AppendResult:
    """Add the files of ``source`` that ``output`` does not hold yet (see the module). ``config`` must
    describe what ``output`` holds (``config_of(read_manifest(output), ...)`` does; its shard size
    cuts the new shards); ConfigError naming the first difference otherwise. ``labels_file``: the
    new files' labels, for an output labelled by a ``--labels`` file (required then)."""

    started = time.perf_counter()
    source, output = Path(source), local_output(output)
    read_manifest(output)  # a clear error now for a folder that is no output
    executor = executor or LocalExecutor(max(1, workers or usable_cpus()))
    with Staging(output) as staging:
        # Everything from here on under the lock: another append that finished meanwhile (a class
        # added, say) is what this one adds to.
        old = read_manifest(output)
        found, layout = _checked_source(source, output, config, old, labels_file, add_classes)
        result = _append_locked(
            source, staging, config, layout, old, found, strict, timeout, progress, on_plan, executor
        )
    result.seconds = time.perf_counter() - started
    return result


def _checked_source(
    source: Path,
    output: Path,
    config: ConvertConfig,
    old: Manifest,
    labels_file: Optional[str | os.PathLike],
    add_classes: bool,
) -> tuple[Discovery, SampleLayout]:
    """What discovery finds in ``source`` for ``output``, once every check passes, and the layout."""
    from packer.sources.discover import discover
    from packer.spec.splits_record import SPLITS_NAME

    splits = output.parent / SPLITS_NAME
    try:
        listed = json.loads(splits.read_text(encoding="utf-8")).get("splits") or {} if splits.is_file() else {}
    except (OSError, ValueError, AttributeError):
        listed = {}
    if output.name in listed:
        raise ConfigError(
            f"{output} is a split of the set in {output.parent} ({SPLITS_NAME}): appending to one split "
            "would change it apart from the others; convert the set again"
        )
    labelled_by_file = old.source.get("labels") == "file"
    if labelled_by_file and labels_file is None:
        raise ConfigError(
            f"{output} was labelled by a --labels file, not by class folders: pass --labels with the new files' labels"
        )
    if old.annotations is not None or any(f.kind_of.target for f in old.text_fields):
        raise ConfigError(
            f"{output} holds detection or segmentation targets: --append does not add to such outputs "
            "yet; convert the new images on their own and read both (readers.concat)"
        )
    if config.format != old.format:
        raise ConfigError(f"{output} is a {old.format} output: append to it with --format {old.format}")
    from packer.sources.containers import container_kind

    kind = container_kind(source)
    if kind is not None:  # what is new in a container is not a list of new files
        raise ConfigError(
            f"{source} is a {kind} container: --append adds the new files of a folder; convert the "
            f"container on its own and read both (readers.concat), or combine them (packer combine)"
        )
    if config.shuffle is not None:
        raise ConfigError("--shuffle with --append: new samples are added after the others, in sorted order")
    refuse_packer_output(source)
    if source.resolve() == output.resolve() or output.resolve() in source.resolve().parents:
        raise OutputError(f"{output} holds the source folder {source}; append from a folder outside it")
    try:
        found = discover(source, labels_file, config.text.fields, config.text.allow_missing, old.classes, add_classes)
    except InputError as e:  # the class map is the output's, not one given with --classes
        raise InputError(str(e).replace("the class map of --classes lacks", f"{output} lacks")) from None
    if (old.classes is None) != (found.classes is None):
        what = "unlabelled" if old.classes is None else "labelled"
        raise InputError(f"{output} is {what} and the samples of {source} are not: they cannot share one output")
    _check_preprocess(config, old, output)
    layout = SampleLayout.from_config(config, found.fields)
    old_layout = SampleLayout.from_manifest(old)
    if layout != old_layout:
        how = differing(layout.fields(), old_layout.fields())
        raise ConfigError(
            f"the samples of {source} would be stored otherwise than {output}'s ({how}): their text "
            "options (--fields, --tokenizer, --encoding, --allow-missing) must be those the output was "
            "converted with (packer info shows them)"
        )
    return found, layout


def _check_preprocess(config: ConvertConfig, old: Manifest, output: Path) -> None:
    """ConfigError naming the preprocessing options that differ from the output's."""
    # Both through PreprocessConfig, so that what older packers left out reads as what they did.
    mine = json.loads(json.dumps(config.preprocess.to_dict()))  # tuples as lists
    theirs = json.loads(json.dumps(recorded_preprocess(old).to_dict()))
    theirs["normalize"] = old.preprocess.get("normalize")
    norms = mine.pop("normalize", None), theirs.pop("normalize", None)
    auto = isinstance(norms[1], dict) and bool(norms[1].get("auto"))
    same_norm = norms[0] == norms[1] or (
        auto and (norms[0] == "auto" or (isinstance(norms[0], dict) and norms[0].get("mean") == norms[1]["mean"]))
    )
    keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if keys or not same_norm:
        shown = [f"{k}: {mine.get(k)!r} where {output} has {theirs.get(k)!r}" for k in keys[:3]]
        if not same_norm:
            shown.append(f"normalize: {norms[0]!r} where {output} has {norms[1]!r}")
        raise ConfigError(
            f"--append converts new files as {output} was converted, and these options differ: "
            + "; ".join(shown)
            + ". Leave them out to take the output's"
        )


def _append_locked(
    source: Path,
    staging: Staging,
    config: ConvertConfig,
    layout: SampleLayout,
    old: Manifest,
    found: Discovery,
    strict: bool,
    timeout: float,
    progress: Optional[ProgressFn],
    on_plan: Optional[Callable[[Discovery, list[ShardTask]], None]],
    executor: Executor,
) -> AppendResult:
    """The part of ``append`` that runs under the output's lock (``staging``)."""
    output = staging.output
    files = HeldFiles.of(output)  # OUT's shards: in its folder, or in the bucket it is in
    held: set[str] = set()
    for keys, _ in files.indexes(old, SampleLayout.from_manifest(old)):
        held.update(keys)
    written_at = FileStamp.at(output / MANIFEST_NAME).mtime_ns
    changed = sorted(it.relpath for it in found.items if it.relpath in held and _modified_after(it, written_at))
    # Removed: no longer in the source at all. A held file that discovery skipped is still there: a
    # --labels file listing only the new files' labels leaves the held ones out.
    present = {it.relpath for it in found.items} | {s.path for s in found.skipped}
    removed = sorted(held - present)
    base = _next_index(old)
    # A file skipped before (corrupt, or not labelled then) is tried again: fixed, it is packed now;
    # still bad, it is reported once, with today's reason. One the output holds is not reported.
    skipped_before = {s["path"] for s in old.skipped}
    fresh = [replace(it, index=base + n) for n, it in enumerate(it for it in found.items if it.relpath not in held)]
    skipped = [s for s in found.skipped if s.path not in skipped_before and s.path not in held]
    if changed:
        log.warning(
            "%d file(s) that %s holds were modified after it was written; they are not packed again: %s",
            len(changed),
            files.shown,
            ", ".join(changed[:5]),
        )
    if removed:
        log.warning(
            "%d sample(s) of %s are no longer in %s (kept in the output): %s",
            len(removed),
            files.shown,
            source,
            ", ".join(removed[:5]),
        )
    if not fresh:
        return AppendResult(output, old, 0.0, skipped, found.ignored, 0, 0, changed, removed)
    new_found = checked(
        Discovery(found.root, fresh, found.classes, skipped, found.ignored, found.fields), strict, config.text
    )
    first = len(old.shards)
    # --shard-size auto balances the new shards over the workers only where each would still hold
    # APPEND_BALANCED samples: a weekly append of a few files is one shard, not one per core.
    balance = max(1, min(executor.workers, len(new_found.items) // APPEND_BALANCED))
    tasks = [
        replace(t, name=shard_name(first + i))
        for i, t in enumerate(
            plan_shards(new_found.items, config.shard_size, estimate_sample_bytes(layout, new_found.items), balance)
        )
    ]
    if on_plan is not None:
        on_plan(new_found, tasks)
    staging.start()
    # A failure, Ctrl-C included, discards the new shards: OUT is untouched until publish renames
    # the new version into place, and an append is simply run again.
    with staging.writing(resumable=False) as stage:
        jobs = [ShardWork.of(config, layout, str(stage), strict).job(first + i, t) for i, t in enumerate(tasks)]
        results = executor.run(jobs, progress=progress, timeout=timeout, on_result=staging.on_result) if jobs else []
        if files.store is None:  # in a bucket they stay where they are, under the names the new manifest lists
            for shard in old.shards:  # under their own names: readers of the old version find them
                place_shard(stage, output, shard, shard.name, True)
        results = sorted(results, key=lambda r: r.name)
        results = staging.name_shards(results, [r.name for r in results], first)
        if not any(r.samples for r in results):  # every new file was bad: the output stays as it is
            staging.discard()
            bad = [s for r in results for s in r.skipped]
            return AppendResult(output, old, 0.0, bad, found.ignored, len(fresh), 0, changed, removed)
        manifest = _appended_manifest(files, stage, old, layout, new_found, results, config, changed, removed)
        staging.publish(manifest, overwrite=True)
    added = sum(r.samples for r in results)
    all_skipped = [*new_found.skipped, *(s for r in results for s in r.skipped)]  # this run's, not the output's
    return AppendResult(output, manifest, 0.0, all_skipped, found.ignored, len(fresh), added, changed, removed)


def _modified_after(item: SourceItem, when_ns: int) -> bool:
    """Whether any of the item's files was modified, or replaced, after ``when_ns`` (a time in ns):
    its change time too (``FileStamp.changed_at_ns``), since a copy that keeps the original's
    modification time (``cp -p``, ``rsync -a``, ``tar x``) sets that one back."""
    try:
        return any(FileStamp.at(p).changed_at_ns > when_ns for p in item.paths)
    except OSError:
        return False


def _next_index(old: Manifest) -> int:
    """The first sample index (wds KEY) no sample of ``old`` used."""
    last = [h["next_index"] for h in old.history if h.get("action") == "append" and "next_index" in h]
    return max([int(old.source.get("files", 0) or 0), old.samples, *last])


def _appended_manifest(
    files: HeldFiles,
    stage: Path,
    old: Manifest,
    layout: SampleLayout,
    found: Discovery,
    results: list[ShardResult],
    config: ConvertConfig,
    changed: list[str],
    removed: list[str],
) -> Manifest:
    """The output's manifest with the new shards after the old ones (see the module)."""
    classes = found.classes
    counts = class_counts(results, len(classes), list(old.class_counts or [])) if classes is not None else None
    new_shards = shard_entries(results, layout)
    new_stats = summarize(ShardStats.merged(r.stats for r in results), config.preprocess)
    probe = replace(old, stats=new_stats, samples=sum(s.samples for s in new_shards), shards=new_shards)
    stats = merged_stats([old, probe])
    # Samples stored with the same bytes as one OUT holds: compared through the stored bytes.
    across = cross_duplicates([files.root, stage], [old, probe], layout, [files, HeldFiles.of(files.root, stage)])
    duplicates = merged_groups(
        [
            *old.duplicates,
            *find_duplicates(results),
            *(sorted(key.split(":", 1)[1] for key in group) for group in across),
        ]
    )
    added = sum(s.samples for s in new_shards)
    entry = {
        "action": "append",
        "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "packer_version": __version__,
        "samples": added,
        "files": len(found.items) + len(found.skipped),
        "shards": [s.name for s in new_shards],
        "next_index": _next_index(old) + len(found.items),
        "changed": len(changed),
        "removed": len(removed),
        **(
            {"classes_added": (classes or [])[len(old.classes or []) :]}
            if classes and len(classes) > len(old.classes or [])
            else {}
        ),
    }
    counted = source_counts(found)
    tried = {it.relpath for it in found.items}
    retried = [s for s in old.skipped if s["path"] in tried]  # counted in the output's files already
    ignored = dict(old.source.get("ignored") or {})
    for ext, n in (counted.get("ignored") or {}).items():
        ignored[ext] = ignored.get(ext, 0) + n
    return replace(
        old,
        packer_version=__version__,
        samples=old.samples + added,
        classes=classes,
        class_counts=counts,
        shards=[*old.shards, *new_shards],
        stats=stats,
        duplicates=duplicates,
        skipped=[
            *(s for s in old.skipped if s["path"] not in tried),
            *(s.to_dict() for s in found.skipped),
            *(s.to_dict() for r in results for s in r.skipped),
        ],
        source={
            **old.source,
            "files": int(old.source.get("files", 0)) + counted["files"] - len(retried),
            "ignored": ignored,
        },
        history=[*old.history, entry],
        **_appended_hashes(files, stage, old, layout, results, config, duplicates),
    )


def _appended_hashes(
    files: HeldFiles,
    stage: Path,
    old: Manifest,
    layout: SampleLayout,
    results: list[ShardResult],
    config: ConvertConfig,
    duplicates: list[list[str]],
) -> dict:
    """The appended output's ``image_hashes`` and ``near_duplicates``: the output's hashes with the new
    samples' after them, written into ``stage``, searched again as a whole (at the distance the output
    was searched at). None for both where the output has none (an append never hashes half an output)."""
    none = {"image_hashes": None, "near_duplicates": None}
    new = gathered_looks(results) if config.image_hashes else None
    if old.image_hashes is None or new is None:
        if old.image_hashes is not None:
            log.warning("the new samples were not hashed: %s no longer lists near-duplicates", files.shown)
        return none
    entry = old.image_hashes
    try:
        with files.folder([(entry["path"], entry["bytes"], entry["sha256"])]) as folder:
            try:
                looks = np.concatenate([read_hashes(folder, old), new])
            except ManifestError as e:  # an older rule's, or a file changed since: as a local output's
                log.warning("near-duplicates not searched again: %s", str(e).replace(str(folder), files.shown))
                return none
    except (KeyError, TypeError) as e:
        log.warning("near-duplicates not searched again: %s's image_hashes entry is malformed (%s)", files.shown, e)
        return none
    distance = int((old.near_duplicates or {}).get("distance", config.dup_distance))
    in_output, in_results = keys_in_output(files, old, layout), keys_in_results(results, old.samples)

    def keys_at(indices: Sequence[int]) -> dict[int, str]:
        earlier = [i for i in indices if i < old.samples]
        return {**in_output(earlier), **in_results([i for i in indices if i >= old.samples])}

    return {
        "image_hashes": write_hashes(stage, looks, appended_name(content_tag([r for r in results if r.samples]))),
        "near_duplicates": near_duplicates(looks, distance, duplicates, keys_at),
    }


__all__ = ["append", "AppendResult", "config_of"]
