"""Where an output is built and how it is published: never half-written, never clobbered by accident.

A conversion writes into a hidden staging folder beside the output and renames it into place only
after the manifest, the last file, is written. Without a manifest a folder is not an output.
The staging folder also keeps what ``--resume`` needs: the plan's fingerprint and a record of each
finished shard (its files' SHA-256), so an interrupted run continues where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import IO, Callable, Optional

from packer.output.shard_samples import SAMPLES_FILE, SAMPLES_SUFFIX, write_samples
from packer.records import ShardResult
from packer.spec.errors import ConfigError, OutputError, PackerError
from packer.spec.file_stamp import FileStamp
from packer.spec.listed_files import sha256_of
from packer.spec.locations import names_url
from packer.spec.manifest import MANIFEST_NAME, read_manifest
from packer.spec.registry import get_format
from packer.system import stop_signals_held

STAGING_MARK = ".packer-staging"
PLAN_RECORD = ".packer-plan.json"
SAVED_DISCOVERY = ".packer-discovery"
"""The folder of the run's saved discovery (``packer.sources.saved_discovery``); removed on publishing."""
SCRATCH_PREFIX = ".packer-scratch-"
"""Folders of passing scratch files in the staging folder (the duplicate search's buckets); any
left by a killed run are removed on publishing."""
DONE_SUFFIX = ".done.json"
RENAMED_SUFFIX = ".renamed.json"
"""Beside a shard's record once ``packer.output.finish`` renamed its files: the new name and paths, a few
bytes, where rewriting the record (every sample's key and digest) cost time per file after the
workers (docs/BENCHMARKS.md, the scale benchmark)."""


def local_output(output: str | os.PathLike) -> Path:
    """``output`` as the local folder an output is written to; ConfigError for a URL or a ``pipe:``
    command, which would otherwise become a local folder named ``s3:`` with nothing in the bucket."""
    text = os.fspath(output)
    if isinstance(text, str) and names_url(text):
        raise ConfigError(
            f"{text} is not a local folder: packer writes outputs to a local folder here (the command "
            "packer convert SRC -o s3://bucket/prefix uploads one; or upload a folder, e.g. aws s3 cp "
            "--recursive OUT s3://bucket/prefix); readers stream wds shards from s3:// and gs:// URLs"
        )
    return Path(output)


def check_output(output: Path, overwrite: bool, source: Optional[Path] = None) -> None:
    """Refuse an output location that would lose data; called before any work and again at publish.

    Only a folder holding a valid packer manifest and nothing but that output's own files is
    replaced, and only with ``overwrite``; never a folder that holds the source.
    """
    if output.is_symlink():
        raise OutputError(f"{output} is a symbolic link; give the real output path ({output.resolve()})")
    if source is not None:
        src, out = source.resolve(), output.resolve()
        if src == out or out in src.parents:
            raise OutputError(f"{output} holds the source folder {source}; choose an output outside it")
    if not output.exists():
        if output.parent.exists() and not output.parent.is_dir():
            raise OutputError(f"cannot create {output}: {output.parent} is not a folder")
        return
    if not output.is_dir():
        raise OutputError(f"{output} exists and is not a folder; choose another output path")
    if os.path.ismount(output):
        raise OutputError(
            f"{output} is a mount point, which cannot be replaced; write to a folder inside it "
            f"(e.g. -o {output / 'packed'})"
        )
    if not any(output.iterdir()):
        return
    if not is_packer_output(output):
        raise OutputError(
            f"{output} is a non-empty folder that is not a packer output; refusing to replace it. "
            "Choose another output path or empty it first."
        )
    if not overwrite:
        raise OutputError(f"{output} already holds a packer output; pass --overwrite to replace it")


def is_packer_output(folder: Path) -> bool:
    """True when ``folder`` holds a valid packer manifest and only the files that output consists of."""
    try:
        manifest = read_manifest(folder)
    except PackerError:
        return False
    own = {MANIFEST_NAME, "report.txt", STAGING_MARK} | {f.path for s in manifest.shards for f in s.files}
    own |= set(get_format(manifest.format).files_of_output(manifest)) | set(manifest.side_files)
    own |= {f"{name}-lock" for name in own if name.endswith(".lmdb")}  # left by LMDB's own tools (see verify)
    return all(entry.name in own for entry in folder.iterdir())


STAGING_SUFFIX = ".packer-partial"
"""The end of a staging folder's name (``staging_dir``)."""


def staging_dir(output: Path) -> Path:
    """The staging folder of ``output``: hidden, beside it, on the same filesystem."""
    return output.parent / f".{output.name}{STAGING_SUFFIX}"


def _old_dir(output: Path) -> Path:
    return output.parent / f".{output.name}.packer-old"


def lock_output(output: Path) -> Optional[IO]:
    """Take the lock of ``output`` for this whole run; OutputError if another run holds it.

    The lock file (``.NAME.packer-lock`` beside the output) outlives the staging folder, so no two
    runs ever share, replace or publish the same output. A killed run releases it with its process.
    Returns the open lock file (None where the platform has no ``fcntl``).
    """
    try:
        import fcntl
    except ImportError:  # Windows
        return None
    output.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock_file(output), "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise OutputError(f"another packer run is writing {output}; wait for it to finish or stop it") from None
    return handle


def lock_file(output: Path) -> Path:
    """The lock file of ``output``: hidden, beside it (see ``lock_output``)."""
    return output.parent / f".{output.name}.packer-lock"


def release_output(output: Path, handle: Optional[IO]) -> None:
    """Remove the lock file (while still holding it) and release the lock."""
    if handle is None:
        return
    try:
        os.unlink(handle.name)
    except OSError:
        pass
    handle.close()


def recover(output: Path) -> None:
    """Repair what a run killed in the middle of publishing left: restore or remove the old output."""
    old = _old_dir(output)
    if not old.exists():
        return
    if not output.exists() and is_packer_output(old):
        os.rename(old, output)  # the new output never arrived: the old one comes back
    elif is_packer_output(old) or not any(old.iterdir()):
        remove_tree(old)
    else:
        raise OutputError(f"{old} is left from an earlier run but is not a packer output; move it away")


def start_staging(output: Path) -> Path:
    """Create an empty staging folder, removing a stale one left by an interrupted run."""
    stage = staging_dir(output)
    stage.parent.mkdir(parents=True, exist_ok=True)
    if stage.exists():
        if not (stage / STAGING_MARK).is_file():
            raise OutputError(f"{stage} exists but was not made by packer; move it away and run again")
        remove_tree(stage)
    stage.mkdir()
    (stage / STAGING_MARK).write_text("packer conversion in progress; this folder is not an output\n")
    return stage


def remove_tree(folder: Path) -> None:
    """Delete a folder of packer's: renamed to a trash name first, so an interruption midway never
    leaves a half-deleted folder that looks like something else."""
    trash = folder.parent / f".{folder.name}.packer-trash-{os.getpid()}"
    os.rename(folder, trash)
    shutil.rmtree(trash, ignore_errors=True)


def write_plan(stage: Path, plan: dict) -> None:
    """Record the plan (fingerprint and worker count) that ``--resume`` must find unchanged."""
    _write_json(stage / PLAN_RECORD, plan)


def read_plan(stage: Path) -> Optional[dict]:
    """The plan recorded in a staging folder left by an interrupted run, if there is one."""
    try:
        if not (stage / STAGING_MARK).is_file():
            return None
        return json.loads((stage / PLAN_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def record_shard(
    stage: Path, result: ShardResult, planned: Optional[str] = None, fingerprint: Optional[str] = None
) -> ShardResult:
    """Note a finished shard, written after its files are closed and hashed, under its ``planned``
    name (default: its own; ``packer.output.finish`` renames shards before publishing): its record and the
    record's side file of digests and labels (``packer.output.shard_samples``). Returns ``result`` with its
    per-sample columns left in them (``ShardResult.kept_in``). ``fingerprint``: that of the plan it
    was written for (``PLAN_OF_RECORD``)."""
    name = planned or result.name
    (stage / f"{name}{RENAMED_SUFFIX}").unlink(missing_ok=True)  # of an earlier version of the shard
    stamps = {f.path: _shard_file_record(stage / f.path) for f in result.files}
    record = stage / f"{name}{DONE_SUFFIX}"
    samples = write_samples(stage, name, result)
    _write_json(
        record,
        {
            **result.to_dict(),
            FILE_STAMPS: stamps,
            **({PLAN_OF_RECORD: fingerprint} if fingerprint else {}),
            **({SAMPLES_FILE: samples} if samples else {}),
        },
    )
    return result.kept_in(record, (str(stage / f"{name}{SAMPLES_SUFFIX}"), samples) if samples else ())


PLAN_OF_RECORD = "plan"
"""In a shard's record: the fingerprint of the plan its worker wrote it for. Workers record their own
shards, and a worker of an earlier run that outlived it (a Ray task on a node the driver lost touch
with) could record a shard in a staging folder a new run has made since: --resume keeps a record
only of the plan it resumes (records without one, of packers before 0.8.1, are kept as before)."""


FILE_STAMPS = "file_stamps"
"""In a shard's record: each of its files' stamp as it was recorded (``FileStamp.as_shard_file_record``).
--resume keeps a file whose stamp is unchanged without reading it again for its SHA-256 (a resume at
70% of a large output read 70% of it back); any write to a file changes its change time, which no
tool sets."""


def _shard_file_record(path: Path) -> list[int]:
    """``path``'s ``FileStamp.as_shard_file_record``, empty if it is gone."""
    stamp = FileStamp.at_or_none(path)
    return [] if stamp is None else stamp.as_shard_file_record()


def record_renamed(stage: Path, planned: str, result: ShardResult) -> None:
    """Note that the recorded shard ``planned`` is now ``result`` (its files renamed, or deleted for a
    shard without samples); ``finished_shards`` gives it so."""
    _write_json(stage / f"{planned}{RENAMED_SUFFIX}", {"name": result.name, "files": [f.path for f in result.files]})


def _rename_record(stage: Path, planned: str) -> Optional[dict]:
    """What ``record_renamed`` last noted of the shard ``planned``; None if it never was renamed."""
    try:
        return json.loads((stage / f"{planned}{RENAMED_SUFFIX}").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def forget_record(stage: Path, name: str) -> None:
    """Delete the record of shard ``name`` and its side file: the shard is written again otherwise
    than recorded, and --resume must write it whole, not keep it."""
    for suffix in (DONE_SUFFIX, SAMPLES_SUFFIX):
        (stage / f"{name}{suffix}").unlink(missing_ok=True)


def forget_renamed(stage: Path, planned: str) -> None:
    """Delete the files of the recorded shard ``planned`` under their published names, and its rename
    record: a shard that --resume writes again is written under its planned name, and its old files
    would be published beside the new ones."""
    try:
        paths = [str(p) for p in (_rename_record(stage, planned) or {}).get("files", [])]
    except (OSError, ValueError, TypeError, AttributeError):
        paths = []
    for path in paths:
        if "/" not in path and path.startswith("shard-"):  # a shard file of the stage, nothing else
            (stage / path).unlink(missing_ok=True)
    (stage / f"{planned}{RENAMED_SUFFIX}").unlink(missing_ok=True)


def _renamed(stage: Path, planned: str, result: ShardResult) -> ShardResult:
    """``result`` as ``record_renamed`` last left it (itself when it was never renamed)."""
    record = _rename_record(stage, planned)
    if record is None:
        return result
    paths = record["files"]
    if paths and len(paths) != len(result.files):
        raise ValueError(f"{planned}: its rename record does not match its files")
    return dataclasses.replace(
        result, name=record["name"], files=[dataclasses.replace(f, path=p) for f, p in zip(result.files, paths)]
    )


def finished_shards(
    stage: Path, names: list[str], intact: Optional[Callable[..., bool]] = None
) -> dict[str, ShardResult]:
    """Shards of an interrupted run whose record exists and whose files still match their SHA-256
    (as renamed by ``record_renamed``), their per-sample columns left in their records (``kept_in``).
    ``intact(stage, relpath, size, sha256, stamp)``: whether a recorded file holds what was recorded
    (default: the file in ``stage``; a bucket output's are in the store)."""
    intact = intact or _intact
    finished = {}
    plan = (read_plan(stage) or {}).get("fingerprint")
    for name in names:
        try:
            path = stage / f"{name}{DONE_SUFFIX}"
            record = json.loads(path.read_text(encoding="utf-8"))
            result = _renamed(stage, name, ShardResult.from_dict(record))
            stamps = record.get(FILE_STAMPS, {})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if PLAN_OF_RECORD in record and record[PLAN_OF_RECORD] != plan:
            continue  # written for another plan, by a worker of an earlier run
        if all(intact(stage, f.path, f.bytes, f.sha256, stamps.get(f.path)) for f in result.files):
            samples = record.get(SAMPLES_FILE)
            side = (str(stage / f"{name}{SAMPLES_SUFFIX}"), samples) if isinstance(samples, list) else ()
            finished[name] = result.kept_in(path, side)
    return finished


def _intact(stage: Path, relpath: str, size: int, digest: str, stamp: Optional[list] = None) -> bool:
    """The file holds what was recorded: its stamp is the recorded one, or else its SHA-256 is. The
    device number is not compared: a record written on another machine (a Ray node) holds that
    machine's, and NFS clients number one mount differently; the staging folder is one filesystem,
    and size, both times (the change time no tool sets) and inode still have to match
    (``FileStamp.same_file_without_device``)."""
    path = stage / relpath
    if stamp:
        now = FileStamp.at_or_none(path)
        if now is not None and now.same_file_without_device(stamp) and stamp[0] == size:
            return True
    return path.is_file() and path.stat().st_size == size and sha256_of(path) == digest


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def publish(stage: Path, output: Path, overwrite: bool, source: Optional[Path] = None) -> None:
    """Move a finished staging folder into place as ``output`` (replacing an old output).

    Checked again under the run's lock; the two renames happen with Ctrl-C and SIGTERM held
    back, and an old output is renamed back if the new one cannot take its place.
    """
    check_output(output, overwrite, source)
    if (stage / SAVED_DISCOVERY).is_dir():
        remove_tree(stage / SAVED_DISCOVERY)  # only ever for --resume: never published
    for scratch in stage.glob(f"{SCRATCH_PREFIX}*"):
        remove_tree(scratch)  # a killed run's (a Ctrl-C removes its own): never published
    old = _old_dir(output)
    with stop_signals_held():
        moved = False
        if output.exists() and any(output.iterdir()):
            os.rename(output, old)
            moved = True
        try:
            os.replace(stage, output)  # replaces an empty folder in one step
        except OSError:
            if moved:
                os.rename(old, output)
            raise
    records = [*output.glob(f"*{DONE_SUFFIX}"), *output.glob(f"*{RENAMED_SUFFIX}"), *output.glob(f"*{SAMPLES_SUFFIX}")]
    for record in [PLAN_RECORD, STAGING_MARK, *[p.name for p in records]]:
        (output / record).unlink(missing_ok=True)
    if moved:
        remove_tree(old)


def discard(stage: Path) -> None:
    """Remove a staging folder after a failed run (only if packer made it)."""
    if (stage / STAGING_MARK).is_file():
        remove_tree(stage)
