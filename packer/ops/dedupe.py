"""``--drop-duplicates``: of each group of near-duplicate images, the first (by key) is kept and the
others are left out as skipped files, with the key they repeat; in a split set, so are the images
of a later split that nearly duplicate one of an earlier split (leakage).

The images are compared by the hashes the workers took of the pixels they stored
(``packer.pixels.looks``), so what is dropped is what ``report.txt`` would have listed. Those are
known once every shard is written: the shards that hold a dropped image are then written again
without it, by the same workers and executor (a shard is the unit of everything else: its
checksums, statistics and class counts come out exact, and a file that crashes the decoder is
handled as in the first pass). That costs the writing of those shards a second time.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Sequence

from packer.output.files import forget_record
from packer.output.image_hashes import gathered_looks, keys_in_output, keys_in_results, read_hashes
from packer.output.near_duplicates import cross_matches, near_groups
from packer.recorded_columns import in_memory
from packer.records import ShardResult, ShardTask, Skipped
from packer.run.executor import Executor
from packer.run.shard_job import ShardJob
from packer.spec.errors import InputError
from packer.spec.manifest import read_manifest
from packer.spec.sample_layout import SampleLayout

log = logging.getLogger(__name__)

REASON = "near-duplicate"
"""The kind a dropped image's skip reason starts with (``packer.output.report.reason_kind``)."""


def near_copies(results: Sequence[ShardResult], distance: int, earlier: Sequence[Path] = ()) -> dict[str, str]:
    """The keys to leave out, each with its reason: all but the first key of each group of
    near-duplicates among ``results``' images, and those that nearly duplicate an image of an
    ``earlier`` output (the splits converted before this one)."""
    looks = gathered_looks(results)
    if looks is None:
        raise InputError("--drop-duplicates compares the images' hashes, and these shards have none")
    keys_at = keys_in_results(results)
    dropped: dict[str, str] = {}
    groups = near_groups(looks, distance)
    key_of = keys_at([i for g in groups for i in g]) if groups else {}
    for group in groups:
        first, *others = sorted(key_of[i] for i in group)
        for key in others:
            dropped[key] = f"{REASON}: of {first} (image hashes within {distance} bits; --drop-duplicates)"
    for root in earlier:
        manifest = read_manifest(root)
        pairs = cross_matches(looks, read_hashes(root, manifest), distance)
        if not len(pairs):
            continue
        mine = keys_at(pairs[:, 0].tolist())
        theirs = keys_in_output(root, manifest, SampleLayout.from_manifest(manifest))(pairs[:, 1].tolist())
        for i, j in pairs.tolist():
            dropped.setdefault(
                mine[i], f"{REASON}: of {root.name}/{theirs[j]}, in an earlier split (--drop-duplicates)"
            )
    return dropped


def without_near_copies(
    results: list[ShardResult],
    jobs: Sequence[ShardJob],
    remake: Callable[[int, ShardTask], ShardJob],
    executor: Executor,
    distance: int,
    earlier: Sequence[Path] = (),
    timeout: Optional[float] = None,
    on_result: Optional[Callable[[ShardJob, ShardResult], None]] = None,
) -> list[ShardResult]:
    """``results`` with the near-duplicates left out (``near_copies``): each shard that holds one is
    written again from its task less those items (``remake(number, task)``: the job of shard
    ``number`` for the smaller task, its targets and container places included), the dropped keys
    added to its skipped files. ``on_result``: the executor's, for each shard written again (the
    staging's: a bucket output's shard goes up again, replacing the one uploaded first)."""
    dropped = near_copies(results, distance, earlier)
    if not dropped:
        return results
    by_name = {job.task.name: job for job in jobs}
    again: list[ShardJob] = []
    for r in results:
        if r.samples and any(key in dropped for key in in_memory(r.keys)):
            job = by_name[r.name]
            kept = [item for item in job.task.items if item.relpath not in dropped]
            # The record of the whole shard goes first and the smaller one gets none: a run
            # interrupted from here on writes the shard whole again on --resume, then drops again
            # (a record of the smaller shard would be kept, its dropped images listed nowhere).
            forget_record(Path(job.directory), job.task.name)
            again.append(replace(remake(job.number, replace(job.task, items=kept)), record=False))
    log.info("--drop-duplicates: %d image(s) left out; %d shard(s) written again", len(dropped), len(again))
    options = {} if timeout is None else {"timeout": timeout}
    fresh = {r.name: r for r in executor.run(again, on_result=on_result, **options)}
    out = []
    for r in results:
        if r.name not in fresh:
            out.append(r)
            continue
        job = by_name[r.name]
        left = [Skipped(item.relpath, dropped[item.relpath]) for item in job.task.items if item.relpath in dropped]
        new = fresh[r.name]
        new.skipped = [*new.skipped, *left]
        out.append(new)
    return out


__all__ = ["REASON", "near_copies", "without_near_copies"]
