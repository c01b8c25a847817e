"""The local folder of a conversion into a bucket (``packer.cli.remote_output``): a few shards at a
time, an append's copy of the output's manifest, and a token conversion's tokenizing.

One folder per user, URL and endpoint under ``TMPDIR`` (``packer-upload-HASH``, mode 0700, refused
if another user's or a link), so that ``--resume`` of a token conversion finds the tokenizing an
interrupted run kept there: the corpus tokenized so far (``packer.tokens.progress``) outlives the
run in ``KEPT`` when it did not publish, wherever it stopped (tokenizing, packing or uploading:
``_pack`` sets the finished tokenizing aside there rather than deleting it while the shards are
uploaded, ``packer.output.shard_uploads.ShardUploads.set_aside``). Everything else goes when the
run ends. A run with
``--resume`` puts ``KEPT`` back where it was taken from; one without discards it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from packer.output.files import staging_dir
from packer.output.shard_uploads import KEPT
from packer.spec.errors import OutputError
from packer.tokens.progress import PROGRESS_NAME

ENDPOINTS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE")
"""Settings that make one URL another store: part of the folder's name."""


class RunFolder:
    """The local folder of one run into the bucket ``url`` (see the module)."""

    def __init__(self, url: str, resume: bool, node: str = "") -> None:
        user = os.getuid() if hasattr(os, "getuid") else 0
        where = "\0".join([str(user), url.rstrip("/"), *(os.environ.get(k, "") for k in ENDPOINTS)])
        where += f"\0{node}" if node else ""  # the nodes of a split conversion on one machine: one folder each
        name = f"packer-upload-{hashlib.sha256(where.encode()).hexdigest()[:16]}"
        self.path = (Path(tempfile.gettempdir()) / name).absolute()  # a relative TMPDIR: where it was when it began
        self._own(user)
        kept = self.path / KEPT
        if resume:  # a killed run's tokenizing is still in its staging folder: kept first, with the rest
            for record in list(self.path.rglob(PROGRESS_NAME)):
                if kept not in record.parents:
                    self.set_aside(record.parent)
        if resume and self.holds_tokenizing():
            for entry in self.path.iterdir():
                if entry.name != KEPT:
                    _remove(entry)
            for item in sorted(p for p in kept.rglob("*") if p.is_file()):
                target = self.path / item.relative_to(kept)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(item, target)
            shutil.rmtree(kept)
        else:
            for entry in self.path.iterdir():
                _remove(entry)

    def _own(self, user: int) -> None:
        """Make the folder (0700), or check the one there is this user's own folder."""
        try:
            self.path.mkdir(mode=0o700)
        except FileExistsError:
            pass
        found = os.lstat(self.path)
        if not stat.S_ISDIR(found.st_mode) or (hasattr(os, "getuid") and found.st_uid != user):
            raise OutputError(
                f"{self.path} is not a folder of this user's (a link, or another user's): remove it, or set "
                "TMPDIR to a folder of your own"
            )
        os.chmod(self.path, 0o700)

    def holds_tokenizing(self) -> bool:
        """Whether the folder keeps an unfinished token conversion's tokenizing."""
        return any((self.path / KEPT).rglob(PROGRESS_NAME))

    def set_aside(self, folder: Path) -> None:
        """Move the files of ``folder`` (in this one) into ``KEPT``, beside those set aside already
        (where ``--resume`` puts them back)."""
        for item in sorted(p for p in folder.rglob("*") if p.is_file()):
            target = self.path / KEPT / item.relative_to(self.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(item, target)

    def close(self, local: Path, published: bool) -> None:
        """The run into ``local`` (an output folder inside this one) has ended: keep a tokenizing it
        did not publish (in its staging folder, or set aside already), remove the rest."""
        stage = staging_dir(local)
        if published:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        if (stage / PROGRESS_NAME).is_file():
            self.set_aside(stage)
        if not self.holds_tokenizing():
            shutil.rmtree(self.path, ignore_errors=True)
            return
        for entry in self.path.iterdir():
            if entry.name != KEPT:
                _remove(entry)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


__all__ = ["RunFolder"]
