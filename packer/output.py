"""Where an output is built and how it is published: never half-written, never clobbered by accident.

A conversion writes into a hidden staging folder beside the output and renames it into place only
after the manifest, the last file, is written. Without a manifest a folder is not an output.
The staging folder also keeps what ``--resume`` needs: the plan's fingerprint and a record of each
finished shard (its files' SHA-256), so an interrupted run continues where it stopped.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import IO, Optional

from packer.errors import OutputError
from packer.manifest import MANIFEST_NAME, sha256_of
from packer.records import ShardResult

STAGING_MARK = ".packer-staging"
PLAN_RECORD = ".packer-plan.json"
DONE_SUFFIX = ".done.json"


def check_output(output: Path, overwrite: bool) -> None:
    """Refuse an output location that would lose data; called before any work starts."""
    if not output.exists():
        if output.parent.exists() and not output.parent.is_dir():
            raise OutputError(f"cannot create {output}: {output.parent} is not a folder")
        return
    if not output.is_dir():
        raise OutputError(f"{output} exists and is not a folder; choose another output path")
    if os.path.ismount(output):
        raise OutputError(f"{output} is a mount point, which cannot be replaced; write to a folder inside it "
                          f"(e.g. -o {output / 'packed'})")
    if not any(output.iterdir()):
        return
    if not (output / MANIFEST_NAME).is_file():
        raise OutputError(
            f"{output} is a non-empty folder that is not a packer output; refusing to replace it. "
            "Choose another output path or empty it first."
        )
    if not overwrite:
        raise OutputError(f"{output} already holds a packer output; pass --overwrite to replace it")


def staging_dir(output: Path) -> Path:
    """The staging folder of ``output``: hidden, beside it, on the same filesystem."""
    return output.parent / f".{output.name}.packer-partial"


def start_staging(output: Path) -> Path:
    """Create an empty staging folder, removing a stale one left by an interrupted run."""
    stage = staging_dir(output)
    stage.parent.mkdir(parents=True, exist_ok=True)
    if stage.exists():
        if not (stage / STAGING_MARK).is_file():
            raise OutputError(f"{stage} exists but was not made by packer; move it away and run again")
        shutil.rmtree(stage)
    stage.mkdir()
    (stage / STAGING_MARK).write_text("packer conversion in progress; this folder is not an output\n")
    return stage


def lock_staging(stage: Path) -> Optional[IO]:
    """Hold an exclusive lock on a staging folder for this run; OutputError if another run holds it.

    The lock goes with the process: a killed run releases it. Returns the open lock file, to keep
    open until the run ends (None where the platform has no ``fcntl``).
    """
    try:
        import fcntl
    except ImportError:  # Windows
        return None
    handle = open(stage / STAGING_MARK, "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise OutputError(f"another packer run is writing {stage}; wait for it to finish or stop it") from None
    return handle


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


def record_shard(stage: Path, result: ShardResult) -> None:
    """Note a finished shard, written after its files are closed and hashed."""
    _write_json(stage / f"{result.name}{DONE_SUFFIX}", result.to_dict())


def finished_shards(stage: Path, names: list[str]) -> dict[str, ShardResult]:
    """Shards of an interrupted run whose record exists and whose files still match their SHA-256."""
    finished = {}
    for name in names:
        try:
            result = ShardResult.from_dict(json.loads((stage / f"{name}{DONE_SUFFIX}").read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if all(_intact(stage, f.path, f.bytes, f.sha256) for f in result.files):
            finished[name] = result
    return finished


def _intact(stage: Path, relpath: str, size: int, digest: str) -> bool:
    path = stage / relpath
    return path.is_file() and path.stat().st_size == size and sha256_of(path) == digest


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def publish(stage: Path, output: Path) -> None:
    """Move a finished staging folder into place as ``output`` (replacing an old output).

    The staging mark goes only after the rename succeeded, so a failure here leaves a staging
    folder that the next run recognises and replaces.
    """
    for record in [stage / PLAN_RECORD, *stage.glob(f"*{DONE_SUFFIX}")]:
        record.unlink(missing_ok=True)
    old = None
    if output.exists() and any(output.iterdir()):
        old = output.parent / f".{output.name}.packer-old"
        if old.exists() and (old / MANIFEST_NAME).is_file():  # left by a run that died right here
            shutil.rmtree(old)
        os.rename(output, old)
    os.replace(stage, output)  # replaces an empty folder in one step
    (output / STAGING_MARK).unlink()
    if old is not None and (old / MANIFEST_NAME).is_file():
        shutil.rmtree(old)


def discard(stage: Path) -> None:
    """Remove a staging folder after a failed run (only if packer made it)."""
    if (stage / STAGING_MARK).is_file():
        shutil.rmtree(stage, ignore_errors=True)
