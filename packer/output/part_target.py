"""Where a worker on another machine puts the files of the shard it wrote, when the output goes to a
bucket: the run's part objects, ``PARTS/TOKEN-N/NAME`` (``packer.output.shard_uploads``).

A conversion into a bucket writes its shards into a local folder of the driver, and the driver
uploads each shard as it finishes. A Ray task on another node cannot see that folder: it writes its
shard into a folder of its own node, uploads the files as parts of the run with ``put_parts``
(each checked: its size and SHA-256), deletes them, and returns the shard's result with the part of
each file (``ShardResult.parts``). The driver then records the shard as one it uploaded itself
(``ShardUploads.take_uploaded``): the parts are given their published names, and the manifest goes
up last, as in any conversion into a bucket.

The node reads the store's settings and credentials the usual way, from its own environment
(``AWS_*`` variables, profiles, an instance role): nothing secret travels with a task.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from packer.output import upload
from packer.output.object_checks import checks_sums
from packer.output.upload import PARTS, filesystem, store_errors
from packer.records import ShardResult

OWN_PART = re.compile(rf"{re.escape(PARTS)}/[0-9a-f]{{12}}-\d+/.+")
"""A part's name, as ``part_name`` gives it (and ``upload.OWN_NAME`` allows)."""


def part_name(token: str, number: int, name: str) -> str:
    """The part object, under the prefix, of the file ``name`` (under the prefix too): the ``number``-th
    upload of the run ``token`` (its first 12 characters)."""
    return f"{PARTS}/{token[:12]}-{number}/{name}"


@dataclass(frozen=True)
class PartTarget:
    """The run's parts of one output in the bucket: plain values, sent with each task.

    ``url``: the prefix reserved for the run; ``token``: the run's lock token (its parts are named by
    its first 12 characters); ``folder``: the output's folder under the prefix ("" for the prefix
    itself, ``train`` for a split of a set)."""

    url: str
    token: str
    folder: str = ""

    def object_name(self, relpath: str) -> str:
        """The name, under the prefix, of the file ``relpath`` of the output."""
        return f"{self.folder}/{relpath}" if self.folder else relpath

    def put_parts(
        self, directory: Path, result: ShardResult, stopped: Optional[Callable[[], bool]] = None
    ) -> Optional[dict[str, str]]:
        """Upload the files of the shard ``result`` (written in ``directory``) as parts of the run, each
        checked, and delete them; the part of each file, by the file's path. None when ``stopped()``
        says the run was stopped before every file went (the parts put so far stay: the run's end
        removes them). OutputError naming the URL when an upload fails."""
        fs, root = filesystem(self.url)
        with store_errors(self.url):
            checks_sums(fs, root)  # once a process: how each upload is checked, as the driver's are
        parts: dict[str, str] = {}
        for f in result.files:
            if stopped is not None and stopped():
                return None
            # a random number: tasks on many nodes name their parts without asking the driver, and a
            # retried task's parts are never the first attempt's
            part = part_name(self.token, secrets.randbelow(10**12), self.object_name(f.path))
            path = Path(directory) / f.path
            with store_errors(self.url):
                upload.put_checked(fs, path, f"{root}/{part}", self.url, f.sha256)
            path.unlink()
            parts[f.path] = part
        return parts


__all__ = ["OWN_PART", "PartTarget", "part_name"]
