"""The files of an output in a bucket that a run writes again under their names before its manifest
goes up (an ``--overwrite``'s or an append's ``report.txt``, shard lists and image hashes; never a
shard: each run's shards have names of their own), kept as copies inside the store under
``REPLACED``, each folder's manifest first. A failure before the manifests puts them back
(``ReplacedFiles.put_back``); a run killed there, where no handler runs, is rolled back by the next
run into the prefix once it holds the lock (``roll_back``). The copies go with the run's parts."""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from packer.spec.manifest import MANIFEST_NAME
from packer.spec.splits_record import SPLITS_NAME

log = logging.getLogger(__name__)

REPLACED = ".packer-parts/replaced"
"""Where a run keeps its copies of the files it replaces (``packer.output.upload.PARTS``/replaced)."""
_MARKERS = (MANIFEST_NAME, SPLITS_NAME)


class ReplacedFiles:
    """The copies one run keeps of the files it replaces in the prefix ``root`` of ``fs``, whose
    objects were ``before``; each copy's name goes to ``sent`` (the run's objects, removed when it
    fails) before it is made."""

    def __init__(self, fs: Any, root: str, before: set[str], sent: list[str]) -> None:
        self.fs, self.root, self.before, self.sent = fs, root, before, sent
        self.kept: list[str] = []
        self._folders: set[str] = set()

    def keep(self, name: str) -> None:
        """Copy ``name`` under ``REPLACED`` before it is replaced, its folder's manifest (a split set's
        ``splits.json`` at the top) once before it: the copy the next run compares with the manifest
        there to tell whether this run's went up."""
        folder = folder_of(name)
        marker: Optional[str] = f"{folder}{MANIFEST_NAME}"
        if marker not in self.before:
            marker = SPLITS_NAME if not folder and SPLITS_NAME in self.before else None
        copies = [marker] if marker is not None and folder not in self._folders else []
        copies += [name] if name != marker else []
        for kept in copies:
            self.sent.append(f"{REPLACED}/{kept}")  # before the copy: a failed one may have left an object
            self.fs.cp_file(f"{self.root}/{kept}", f"{self.root}/{REPLACED}/{kept}")  # one object: no listing
            self.kept.append(kept)
        self._folders.add(folder)

    def put_back(self, url: str) -> bool:
        """Put back, from the copies, the files this run replaced, the manifest first; False (the
        file named) where one could not be."""
        written = set(self.sent)
        for name in sorted((n for n in self.kept if n in written), key=lambda n: (n != MANIFEST_NAME, n)):
            try:
                self.fs.cp_file(f"{self.root}/{REPLACED}/{name}", f"{self.root}/{name}")
            except Exception as e:  # noqa: BLE001 - the run's own error is the one raised
                log.error("%s/%s could not be put back as it was (%s): run the same command again", url, name, e)
                return False
        return True


def roll_back(fs: Any, root: str, names: set[str], url: str, remove: Callable[[list[str]], None]) -> None:
    """Put back the files a killed run kept under ``REPLACED`` where the manifest kept with them is
    still the folder's (the run died before its manifest went up), then remove the copies with
    ``remove(paths)`` (the manifests last: a run killed in here does the same again) and take them
    out of ``names``."""
    kept = sorted(n for n in names if n.startswith(f"{REPLACED}/"))
    relative = {n: n[len(REPLACED) + 1 :] for n in kept}
    markers = {r for r in relative.values() if r.rsplit("/", 1)[-1] in _MARKERS}
    for marker in markers:
        if marker not in names or fs.cat_file(f"{root}/{marker}") != fs.cat_file(f"{root}/{REPLACED}/{marker}"):
            continue  # the killed run's manifest is up (or the output is gone): its files are the output's
        for name, file in relative.items():
            if file != marker and folder_of(file) == folder_of(marker):
                fs.cp_file(f"{root}/{name}", f"{root}/{file}")
                log.warning("%s/%s put back as it was before a conversion killed before its manifest", url, file)
    remove([f"{root}/{n}" for n in kept if relative[n] not in markers])
    remove([f"{root}/{n}" for n in kept if relative[n] in markers])
    names.difference_update(kept)


def folder_of(name: str) -> str:
    """The folder of the output file ``name`` in its prefix: "" or "split/"."""
    return name.rsplit("/", 1)[0] + "/" if "/" in name else ""


__all__ = ["REPLACED", "ReplacedFiles", "roll_back", "folder_of"]
