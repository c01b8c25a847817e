"""One definition of "has this file changed": a file's ``os.stat`` fields that tell one version of it
from the next, and every form in which the converter and the readers record or compare them.

A write to a file changes its size or modification time; a copy that keeps the modification time
(``cp -p``, ``rsync -a``, ``tar x``) or a replacement changes its change time, which no tool sets
back, and a replacement (a new file renamed into place) its inode. The device number tells files of
two filesystems apart, but not across machines: a Ray node numbers the staging folder's filesystem
its own way, and NFS clients number one mount differently.

The forms below are stored on disk by runs in progress (staging folders kept for ``--resume``): each
keeps its fields, order and text exactly, so that a record written by any earlier packer is read and
compared as it was. Readers import this module: it imports nothing of packer, and nothing heavy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

MISSING_FOLDER_RECORD = (-1, -1, -1, -1)
"""``FileStamp.as_folder_record`` of a folder that could not be read (it must still be unreadable)."""

MISSING_SOURCE_TEXT = "missing"
"""``FileStamp.as_source_text`` of a source file that is gone (or cannot be stat'ed)."""


def stat_or_none(path: str | os.PathLike) -> Optional[os.stat_result]:
    """``os.stat(path)`` (links followed), None when it fails: a missing file, a broken link, no access."""
    try:
        return os.stat(path)
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class FileStamp:
    """A file's size, modification and change times (ns), inode and device, as ``os.stat`` gave them
    (links followed). Equal stamps mean the same file, unchanged."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStamp:
        """The stamp of an ``os.stat`` result the caller already took."""
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)

    @classmethod
    def at(cls, path: str | os.PathLike) -> FileStamp:
        """The stamp of the file at ``path`` now (OSError when it cannot be stat'ed)."""
        return cls.of(os.stat(path))

    @classmethod
    def at_or_none(cls, path: str | os.PathLike) -> Optional[FileStamp]:
        """The stamp of the file at ``path`` now, None when it cannot be stat'ed (missing, a broken link,
        no access)."""
        st = stat_or_none(path)
        return None if st is None else cls.of(st)

    # Named subsets, for comparisons that leave a field out on purpose.

    @property
    def changed_at_ns(self) -> int:
        """The later of the modification and change times: when the file was last written or replaced
        (a copy that keeps the modification time still moves the change time)."""
        return max(self.mtime_ns, self.ctime_ns)

    def which_file(self) -> tuple[int, int]:
        """(device, inode): which file this is, whatever its contents (the walk's guard against a
        folder met twice through symbolic links)."""
        return (self.device, self.inode)

    def without_device(self) -> tuple[int, int, int, int]:
        """(size, mtime_ns, ctime_ns, inode): the stamp where a record may have been written on another
        machine (a Ray node) or through another mount (NFS clients number one mount differently), so
        its device number is not comparable; within one filesystem the inode still tells files apart."""
        return (self.size, self.mtime_ns, self.ctime_ns, self.inode)

    def reader_identity(self) -> tuple[int, int, int, int]:
        """(device, inode, size, mtime_ns): a readers' in-memory key for one version of an output's
        file (its manifest, a shard checked once, an LMDB environment shared by datasets). The change
        time is left out: linking a file into another output (``packer combine``, ``--append``)
        changes it, not the file's bytes. Never stored on disk."""
        return (self.device, self.inode, self.size, self.mtime_ns)

    def same_file_without_device(self, record: object) -> bool:
        """Whether ``record``, an ``as_shard_file_record`` read back, stamps this very file: all but its
        device, which ``without_device`` leaves out. False for anything else (a damaged record)."""
        return (
            isinstance(record, list)
            and len(record) == 5
            and all(type(v) is int for v in record)
            and tuple(record[:4]) == self.without_device()
        )

    # The forms stored on disk, each exactly as earlier packers wrote it.

    def as_folder_record(self) -> tuple[int, int, int, int]:
        """(device, inode, mtime_ns, ctime_ns): one folder's row of ``folder_stamps.npy`` in a saved
        discovery (``packer.sources.folder_stamps``; ``MISSING_FOLDER_RECORD`` for an unreadable folder). Its
        size is left out: a folder's size says nothing its modification time does not."""
        return (self.device, self.inode, self.mtime_ns, self.ctime_ns)

    def as_shard_file_record(self) -> list[int]:
        """[size, mtime_ns, ctime_ns, inode, device]: a shard file's stamp in its shard record
        (``NAME.done.json``'s ``file_stamps`` in the staging folder; ``[]`` for a file that is gone).
        --resume compares it with ``same_file_without_device``."""
        return [self.size, self.mtime_ns, self.ctime_ns, self.inode, self.device]

    def as_side_file_record(self) -> list[int]:
        """[size, mtime_ns, ctime_ns, inode]: a shard record's side file's stamp (``NAME.done.json``'s
        ``samples_file``, ``packer.output.shard_samples``), compared whole; ``without_device``, as the worker
        that wrote it may have run on another machine than the parent reading it."""
        return list(self.without_device())

    def as_labels_file_record(self, path: str) -> list:
        """[path, size, mtime_ns, ctime_ns, inode]: the ``--labels`` file at ``path`` in the options of a
        saved discovery (``discovery.json``, ``packer.sources.saved_discovery``; ``[path]`` where it cannot be
        stat'ed), compared whole; ``without_device``, like the run's other records."""
        return [path, *self.without_device()]

    def as_source_text(self) -> str:
        """``size:mtime_ns:ctime_ns:inode``: a source file's stamp as hashed into its shard's sources
        digest (``ShardResult.sources`` in the shard record) and into the plan fingerprint
        (``.packer-plan.json``); ``MISSING_SOURCE_TEXT`` for a file that is gone. ``without_device``:
        the workers stamping the files may run on other machines."""
        return "%d:%d:%d:%d" % self.without_device()

    def as_annotations_line(self, relpath: str) -> bytes:
        """``relpath\\0size\\0mtime_ns\\0``: one file's line in the digest of an annotations folder
        (``Annotations.digest``, in the plan fingerprint). Only size and modification time: a folder
        copied with its times kept (``cp -p``, ``rsync -a``) digests the same, and the fingerprints of
        staging folders already written must not change."""
        return f"{relpath}\0{self.size}\0{self.mtime_ns}\0".encode()
