"""Where an output is built and how it is published: never half-written, never clobbered by accident.

A conversion writes into a hidden staging folder beside the output and renames it into place only
after the manifest, the last file, is written. Without a manifest a folder is not an output.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from packer.errors import OutputError
from packer.manifest import MANIFEST_NAME

STAGING_MARK = ".packer-staging"


def check_output(output: Path, overwrite: bool) -> None:
    """Refuse an output location that would lose data; called before any work starts."""
    if not output.exists():
        if output.parent.exists() and not output.parent.is_dir():
            raise OutputError(f"cannot create {output}: {output.parent} is not a folder")
        return
    if not output.is_dir():
        raise OutputError(f"{output} exists and is not a folder; choose another output path")
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


def publish(stage: Path, output: Path) -> None:
    """Move a finished staging folder into place as ``output`` (replacing an old output)."""
    (stage / STAGING_MARK).unlink()
    old = None
    if output.exists():
        if any(output.iterdir()):
            old = output.parent / f".{output.name}.packer-old"
            if old.exists():
                shutil.rmtree(old)
            os.rename(output, old)
        else:
            output.rmdir()
    os.rename(stage, output)
    if old is not None:
        shutil.rmtree(old)


def discard(stage: Path) -> None:
    """Remove a staging folder after a failed run (only if packer made it)."""
    if (stage / STAGING_MARK).is_file():
        shutil.rmtree(stage, ignore_errors=True)
