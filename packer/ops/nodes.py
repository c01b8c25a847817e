"""A conversion split statically over several machines (SLURM array jobs and other schedulers
without Ray), then merged into one output.

Every node runs the same ``packer convert`` command with its own ``--node-rank``: it discovers the
same files, makes the same shard plan and writes the shards ``rank, rank + nodes, ...`` of it into
the output's staging folder, which all nodes share (a filesystem every node sees). The first node
creates that folder with the plan record; the others join it only when their plan's fingerprint
(options, shard plan, every source file's size and times) is the same, so nodes started with other
options are refused before they write anything. Each finished shard gets its record (files and
SHA-256), as in a local run; a node run again redoes only its shards that have none.

``packer merge OUTPUT`` then checks that every planned shard is recorded and intact, writes the
manifest from the records and publishes the output exactly as a single run would: the result is
byte for byte that of one ``packer convert`` with ``-j`` set to nodes x workers per node.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Callable, Optional, Sequence

from packer.config import DUP_DISTANCE, ConvertConfig, ImageCodec, PreprocessConfig, ShardSize
from packer.ops.convert import ConvertResult
from packer.output.assemble import build_manifest, source_counts
from packer.output.files import STAGING_MARK, local_output, lock_file, remove_tree, write_plan
from packer.records import SOURCE_DIGEST, ShardResult, ShardTask, Skipped
from packer.run.executor import DEFAULT_TIMEOUT, Executor, LocalExecutor, ProgressFn
from packer.run.job import ConvertJob, Selection
from packer.run.plan import plan_tasks
from packer.run.resume import current_digests, current_hashes, plan_fingerprint
from packer.run.shard_job import ShardWork
from packer.run.staging import Staging, describe_os_error
from packer.sources.containers import job_for
from packer.sources.discover import Discovery
from packer.sources.origin import discover_checked
from packer.spec.errors import ConfigError, InputError, OutputError, PackerError
from packer.spec.sample_layout import SampleLayout
from packer.spec.text import TextConfig
from packer.system import usable_cpus

MISSING_SHOWN = 20  # missing shards named in merge's message


@dataclass(frozen=True)
class NodeSplit:
    """This machine's part of a split conversion: node ``rank`` of ``nodes`` writes every
    ``nodes``-th shard of the plan, starting with shard ``rank``."""

    nodes: int
    rank: int

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ConfigError(f"--num-nodes must be at least 1, got {self.nodes}")
        if not 0 <= self.rank < self.nodes:
            raise ConfigError(
                f"--node-rank must be 0 to {self.nodes - 1} with --num-nodes {self.nodes}, got {self.rank}"
            )

    def owner(self, shard: int) -> int:
        """The rank of the node that writes shard number ``shard``."""
        return shard % self.nodes


@dataclass
class NodeResult:
    """What one node's run did: its shards (``written`` now, ``kept`` from an earlier run of it)."""

    output: Path
    stage: Path
    node: NodeSplit
    shards: int
    total_shards: int
    written: int
    samples: int
    seconds: float = 0.0
    skipped: list[Skipped] = field(default_factory=list)
    processed: int = 0
    """Source files decoded by this run."""


def convert_node(
    source: str | os.PathLike,
    output: str | os.PathLike,
    config: ConvertConfig,
    node: NodeSplit,
    *,
    labels_file: Optional[str | os.PathLike] = None,
    workers: Optional[int] = None,
    overwrite: bool = False,
    strict: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Optional[ProgressFn] = None,
    on_plan: Optional[Callable[[Discovery, list[ShardTask]], None]] = None,
    executor: Optional[Executor] = None,
    classes: Optional[Sequence[str]] = None,
    add_classes: bool = False,
) -> NodeResult:
    """Write node ``node.rank``'s shards of the conversion of ``source`` into ``output``'s shared
    staging folder; ``merge(output)`` publishes the output once every node is done.

    Arguments as for ``packer.convert`` (``classes``: the class map, so every node labels alike);
    ``--shard-size auto`` balances for ``node.nodes`` x
    ``workers`` workers, so every node must be given the same ``workers`` (or an explicit shard
    size). ``on_plan`` gets this node's shards only. Errors leave the shared staging folder as it
    is (other nodes may be writing into it); running the node again continues it.
    """
    started = time.perf_counter()
    output = local_output(output)
    chosen = Selection(labels_file, classes, add_classes)
    ConvertJob(Path(source), output, config, chosen, strict=strict, nodes=node.nodes, executor=executor).validate()
    recorded = config_to_dict(config)
    if config_from_dict(recorded) != config:
        raise PackerError("this configuration cannot be recorded for packer merge; convert on one machine instead")
    found = discover_checked(source, output, labels_file, overwrite, strict, config.text, classes, add_classes)
    layout = SampleLayout.from_config(config, found.fields)
    executor = executor or LocalExecutor(max(1, workers or usable_cpus()))
    plan_workers = executor.workers * node.nodes
    shard_plan = plan_tasks(found, config, layout, plan_workers)
    tasks = shard_plan.tasks
    plan = {
        # Every file's stamp, as before per-shard stamps (single runs): a node that joins must see the
        # files the others saw, as merge publishes every node's shards without reading the sources.
        "fingerprint": plan_fingerprint(config, tasks, strict, stamps=True),
        "workers": plan_workers,
        "split": {
            "nodes": node.nodes,
            "shards": [t.name for t in tasks],
            "config": recorded,
            "source": str(Path(source).absolute()),
            "classes": found.classes,
            "skipped": [s.to_dict() for s in found.skipped],
            "counts": source_counts(found),
            "fields": list(found.fields),
            "fixed_samples": shard_plan.fixed_samples,
        },
    }
    locks = _lock_node(output, node)
    staging = Staging(output)  # shared with the other nodes, under the node locks: never locked alone
    try:
        stage = join_staging(staging, plan, node)
        staging.share_plan()
        work = ShardWork.of(config, layout, str(stage), strict)
        jobs = [
            work.job(
                i,
                t,
                container=job_for(found.places, t.items) if found.places is not None else None,
            )
            for i, t in enumerate(tasks)
            if node.owner(i) == node.rank
        ]
        finished = current_hashes(current_digests(staging.finished([j.task.name for j in jobs])))
        if on_plan is not None:
            on_plan(found, [j.task for j in jobs])
        with staging.writing(shared=True):
            todo, fresh = staging.run_unfinished(executor, jobs, finished, progress, timeout)
    except OSError as e:
        raise OutputError(f"cannot write into {staging.folder}: {describe_os_error(e)}") from None
    finally:
        _unlock_node(locks)
    results: list[ShardResult] = [*finished.values(), *fresh]
    return NodeResult(
        output,
        stage,
        node,
        len(jobs),
        len(tasks),
        len(fresh),
        sum(r.samples for r in results),
        time.perf_counter() - started,
        [s for r in fresh for s in r.skipped],
        sum(len(j.task.items) for j in todo),
    )


def join_staging(staging: Staging, plan: dict, node: NodeSplit) -> Path:
    """The shared staging folder of a split conversion: created with ``plan`` by the first node
    (made complete under a temporary name, then renamed, so no node ever sees it half made), or
    joined when it holds the same plan. OutputError when it holds another run."""
    output, stage = staging.output, staging.folder
    if not stage.exists():
        stage.parent.mkdir(parents=True, exist_ok=True)
        fresh = stage.parent / f"{stage.name}.new-{socket.gethostname()}-{os.getpid()}"
        fresh.mkdir()
        (fresh / STAGING_MARK).write_text("packer conversion in progress; this folder is not an output\n")
        write_plan(fresh, plan)
        try:
            os.rename(fresh, stage)
            return stage
        except OSError:  # another node was first: join its folder below
            remove_tree(fresh)
    recorded = staging.plan()
    if recorded is None:
        raise OutputError(
            f"{stage} exists but holds no packer plan; if no packer run uses it, remove it and start the nodes again"
        )
    theirs, mine = recorded.get("split"), plan["split"]
    if theirs is None:
        raise OutputError(
            f"{stage} holds an unfinished single-machine run of {output}: finish it with "
            "packer convert ... --resume, or remove that folder before starting the nodes"
        )
    if recorded.get("fingerprint") == plan["fingerprint"] and theirs.get("nodes") == mine["nodes"]:
        return stage
    if theirs.get("nodes") != mine["nodes"]:
        why = f"it is split over {theirs.get('nodes')} nodes, this node was started with --num-nodes {mine['nodes']}"
    elif recorded.get("workers") != plan["workers"]:
        why = (
            f"its --shard-size auto layout is balanced for {recorded.get('workers')} workers, this node's for "
            f"{plan['workers']}: give every node the same -j, or an explicit --shard-size"
        )
    else:
        why = (
            "its options or source files differ from this node's (every node must run the same command, only "
            "--node-rank differs, over the same files)"
        )
    raise OutputError(
        f"node {node.rank} cannot join the conversion in {stage}: {why}. If that run is stale, "
        "remove the folder and start every node again"
    )


def _lock_node(output: Path, node: NodeSplit) -> list[IO]:
    """Hold the output's lock shared with the other nodes (a single run or a merge of the same
    output then cannot start, nor can a node while one of them runs) and this rank's own lock
    exclusively (one run per rank). Open lock files; none where the platform has no ``fcntl``."""
    try:
        import fcntl
    except ImportError:  # Windows
        return []
    output.parent.mkdir(parents=True, exist_ok=True)
    handles = []
    for path, mode, busy in (
        (lock_file(output), fcntl.LOCK_SH, f"a single run or a merge of {output} is in progress; wait for it"),
        (
            output.parent / f".{output.name}.packer-lock-node{node.rank}",
            fcntl.LOCK_EX,
            f"node {node.rank} of {output} is already running; each --node-rank must run once at a time",
        ),
    ):
        handle = open(path, "a")
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            for h in handles:
                h.close()
            raise OutputError(busy) from None
        handles.append(handle)
    return handles


def _unlock_node(handles: list[IO]) -> None:
    """Release the node's locks; its own lock file is removed while still held, the shared one stays
    (another node may hold it)."""
    if len(handles) == 2:
        try:
            os.unlink(handles[1].name)
        except OSError:
            pass
    for handle in handles:
        handle.close()


def merge(output: str | os.PathLike, *, overwrite: bool = False) -> ConvertResult:
    """Publish a split conversion once every node is done: every planned shard must be recorded and
    intact (SHA-256); then the manifest is written and the output renamed into place as a single
    run does. OutputError naming the missing shards and their nodes otherwise."""
    started = time.perf_counter()
    output = local_output(output)
    with Staging(output) as staging, staging.writing(shared=True) as stage:  # a failed merge keeps every node's work
        plan = staging.plan()
        if plan is None or "split" not in plan:
            raise OutputError(
                f"no split conversion of {output} to merge ({stage} holds none): run packer convert "
                "with --num-nodes N --node-rank R on every node first"
            )
        split = plan["split"]
        names = split["shards"]
        finished = staging.finished(names)
        missing = [(i, name) for i, name in enumerate(names) if name not in finished]
        if missing:
            nodes = NodeSplit(split["nodes"], 0)
            shown = ", ".join(f"{name} (node {nodes.owner(i)})" for i, name in missing[:MISSING_SHOWN])
            more = f" and {len(missing) - MISSING_SHOWN} more" if len(missing) > MISSING_SHOWN else ""
            raise OutputError(
                f"{len(missing)} of {len(names)} shards are missing or damaged in {stage}: "
                f"{shown}{more}. Run node(s) {_owners(nodes, missing)} again (each redoes only "
                "its missing shards), then merge"
            )
        older = [(i, name) for i, name in enumerate(names) if finished[name].digest != SOURCE_DIGEST]
        if older and len(older) < len(names):
            # Digests of two kinds cannot be compared for the duplicate report; all of one kind can.
            raise OutputError(
                f"{len(older)} of {len(names)} shards in {stage} were recorded by an older packer, "
                f"whose source digests this one's cannot be compared with: run node(s) "
                f"{_owners(NodeSplit(split['nodes'], 0), older)} again with this packer (each "
                "writes those shards again), then merge"
            )
        config = config_from_dict(split["config"])
        layout = SampleLayout.from_config(config, tuple(split.get("fields", ["image"])))
        source = Path(split["source"])
        found = Discovery(
            source,
            [],
            split["classes"],
            [Skipped(s["path"], s["reason"]) for s in split["skipped"]],
            split["counts"]["ignored"],
        )
        results = [finished[name] for name in names]
        if not any(r.samples for r in results):
            raise InputError(f"no image in {source} could be packed: every file was skipped (see {stage})")
        results = staging.name_shards(results, names)
        manifest = build_manifest(
            config,
            layout,
            found,
            results,
            plan["workers"],
            scratch=stage,
            fixed_samples=split.get("fixed_samples"),
            stage=stage,
        )
        manifest.source = split["counts"]  # discovery's item count, which the nodes recorded
        staging.publish(manifest, overwrite=overwrite, source=source)
    skipped = [Skipped(s["path"], s["reason"]) for s in manifest.skipped]
    return ConvertResult(output, manifest, time.perf_counter() - started, skipped, found.ignored, 0)


def _owners(nodes: NodeSplit, shards: list[tuple[int, str]]) -> str:
    """The ranks of the nodes that write ``shards`` ((position, name) in the plan), as a message lists them."""
    return ", ".join(map(str, sorted({nodes.owner(i) for i, _ in shards})))


def config_to_dict(config: ConvertConfig) -> dict:
    """JSON-ready form of a conversion's options, as recorded for ``merge``."""
    return {
        "format": config.format,
        "preprocess": config.preprocess.to_dict(),
        "shard_size": {"samples": config.shard_size.samples, "bytes": config.shard_size.bytes},
        "shuffle": config.shuffle,
        "codec": {"name": config.codec.name, "quality": config.codec.quality},
        "text": {**asdict(config.text), "fields": list(config.text.fields) if config.text.fields else None},
        "image_hashes": config.image_hashes,
        "dup_distance": config.dup_distance,
    }


def config_from_dict(d: dict) -> ConvertConfig:
    """Inverse of ``config_to_dict``."""
    text = dict(d.get("text") or {})
    if text.get("fields"):
        text["fields"] = tuple(text["fields"])
    return ConvertConfig(
        d["format"],
        PreprocessConfig.from_dict(d["preprocess"]),
        ShardSize(**d["shard_size"]),
        d["shuffle"],
        ImageCodec(**d["codec"]),
        TextConfig(**text),
        image_hashes=bool(d.get("image_hashes", True)),  # records of packers before the hashes: the default
        dup_distance=int(d.get("dup_distance", DUP_DISTANCE)),
    )
