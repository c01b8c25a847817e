"""The files of one packer output as a reader sees them: its manifest, read once, and the identity
of the output it came from; each shard file checked before its first read in a process (inside the
output, of the recorded size, the structure checksum or SHA-256); ``check_unchanged`` refuses an
output replaced or removed since it was opened."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any, Optional

import numpy as np

from packer.spec.entries import FileEntry
from packer.spec.errors import ManifestError, PackerError
from packer.spec.file_stamp import FileStamp
from packer.spec.listed_files import sha256_of, unsafe_file
from packer.spec.manifest import MANIFEST_NAME, Manifest, ShardEntry, read_manifest
from packer.spec.registry import FORMATS, resolve
from readers.remote import ranges
from readers.remote.block_cache import BlockCache
from readers.remote.npy_ranges import RemoteArray
from readers.remote.range_requests import import_backend
from readers.remote.ranges import RangeSource, fetch_all
from readers.remote.urls import cached_copy, file_url, is_url, open_manifest

_CHECKED: set[tuple] = set()
"""Files this process has checked (``check_file``), by identity: each is checked once, not at each
open (an epoch of a wds output opens every shard again)."""


def output_identity(root: Any) -> Optional[tuple]:
    """What tells a local output apart from one written in its place later: its manifest's
    ``FileStamp.reader_identity``, device, inode, size and modification time (a new conversion
    replaces the folder, so all of them change). None for URLs; ``("missing",)`` when the manifest
    is gone."""
    if is_url(root):
        return None
    stamp = FileStamp.at_or_none(Path(root) / MANIFEST_NAME)
    return ("missing",) if stamp is None else stamp.reader_identity()


def manifest_sha256(root: Any) -> Optional[str]:
    """SHA-256 of a local output's manifest bytes (None for URLs, or when it cannot be read)."""
    if is_url(root):
        return None
    try:
        return sha256_of(Path(root) / MANIFEST_NAME)
    except OSError:
        return None


def check_file(path: Path, entry: FileEntry, verify: bool, structure: str) -> None:
    """Check a shard file before its first read in this process: its SHA-256 with ``verify``,
    else its structure checksum when the format records one (``structure`` names the function,
    see FormatSpec). ManifestError naming the file when it differs."""
    if not verify and (not structure or entry.structure_crc32 is None):
        return
    key = (str(path), *FileStamp.at(path).reader_identity(), verify)
    if key in _CHECKED or (not verify and key[:-1] + (True,) in _CHECKED):
        return
    if verify:
        if sha256_of(path) != entry.sha256:
            raise ManifestError(
                f"{path} has changed: its SHA-256 does not match the manifest; the output is "
                f"damaged, run packer verify {path.parent}"
            )
    elif resolve(structure)(path) != entry.structure_crc32:
        raise ManifestError(
            f"{path} is damaged where its library looks up records (its structure checksum does not "
            f"match the manifest): reading it could crash this process, so it is refused. Run "
            f"packer verify {path.parent}"
        )
    _CHECKED.add(key)


class OutputFiles:
    """One opened output: ``manifest``, the ``identity`` of its manifest file when it was read (None
    for URLs), its ``manifest_sha256``, and each shard file's manifest entry by path (``entries``).
    Plain data: it pickles to DataLoader workers, and holds no open file."""

    def __init__(
        self, root: Any, manifest: Manifest, identity: Optional[tuple], digest: Optional[str], verify: bool = False
    ) -> None:
        self.root, self.manifest, self.identity, self.manifest_sha256 = root, manifest, identity, digest
        self.verify = verify
        self.entries: dict[str, FileEntry] = {f.path: f for shard in manifest.shards for f in shard.files}
        self.url: Optional[str] = None
        """For an output read from a URL through a local cache (``through_cache``): its URL."""
        self.ranged = False
        """Whether the output's files are read by byte ranges from its URL (``read_by_ranges``)."""
        self.blocks: Optional[BlockCache] = None
        self._sources: dict[tuple[str, bool], RangeSource] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_sources": {}}  # made again where needed: not sent to each worker

    def read_by_ranges(self, blocks: Optional[BlockCache]) -> None:
        """Read the URL output's files by byte ranges from now on (``readers.remote.ranges``), their
        blocks kept in ``blocks`` too when given: ``rows`` of a large file come as they are asked for,
        ``array`` of a small one whole, checked against the manifest's SHA-256."""
        if not is_url(self.root) or str(self.root).startswith("pipe:"):
            raise ValueError(f"{self.root} is not a URL of a store that answers range requests")
        self.ranged, self.blocks, self._sources = True, blocks, {}
        import_backend(str(self.root))

    def where(self, relpath: str) -> str:
        """The file ``relpath`` of the output as a message names it: its path, or its URL."""
        return file_url(str(self.root), relpath) if is_url(self.root) else str(Path(self.root) / relpath)

    def rows(self, relpath: str) -> Any:
        """The array of the large ``.npy`` file ``relpath``, never read whole: memory-mapped (a plain
        ndarray over the map: indexing a np.memmap costs more), or a RemoteArray read by ranges."""
        if self.ranged:
            return RemoteArray(self.source(relpath))
        return np.asarray(np.load(self.path(relpath), mmap_mode="r", allow_pickle=False))

    def source(self, relpath: str, whole: bool = False) -> RangeSource:
        """The file ``relpath`` of an output read by ranges (``read_by_ranges``), as a RangeSource;
        ``whole``: one read whole and checked against the manifest's SHA-256 (``array``)."""
        known = self._sources.get((relpath, whole))
        if known is None:  # one per file, so that a process asks for its size once (RangeSource._open)
            known = RangeSource(file_url(str(self.root), relpath), self.entries[relpath], self.blocks, whole=whole)
            self._sources[relpath, whole] = known
        return known

    def prefetch(self, shards: list[ShardEntry]) -> None:
        """Read the small files of ``shards`` (under one block each: an npy shard's labels, keys,
        offsets and checksums) whole, and the first block of the others (an npy file's header, an
        HDF5 file's superblock), in one round of concurrent requests, where the output is read by
        ranges: opening each shard then finds them in memory, where it would ask for each in turn.
        Each small file is checked against the manifest's SHA-256 as ``array`` checks it."""
        if not self.ranged:
            return
        files = [f for shard in shards for f in shard.files]
        small = [f for f in files if f.bytes <= ranges.BLOCK]  # BLOCK read at each call (tests change it)
        fetch_all(
            [(self.source(f.path, whole=True), [(0, f.bytes)]) for f in small]
            + [(self.source(f.path), [(0, 1)]) for f in files if f.bytes > ranges.BLOCK]
        )
        for f in small:
            self.array_bytes(f.path)

    def array(self, relpath: str, mapped: bool = False) -> np.ndarray:
        """The array of the ``.npy`` file ``relpath`` (labels, keys, offsets), read whole, or memory-
        mapped with ``mapped`` (shared by every worker through the page cache); from a URL read by
        ranges, read whole through the block caches and checked against the manifest's SHA-256."""
        if self.ranged:
            return np.load(io.BytesIO(self.array_bytes(relpath)), allow_pickle=False)
        if mapped:
            return np.asarray(np.load(self.path(relpath), mmap_mode="r", allow_pickle=False))
        return np.load(self.path(relpath), allow_pickle=False)

    def array_bytes(self, relpath: str) -> Any:
        """The bytes of the file ``relpath`` of an output read by ranges, read whole through the block
        caches and checked against the manifest's SHA-256 (ManifestError where they differ)."""
        entry = self.entries[relpath]
        source = self.source(relpath, whole=True)
        data = source.read(0, entry.bytes)
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            source.forget([(0, entry.bytes)])  # read again next time, not the cached copy
            raise ManifestError(
                f"{self.where(relpath)} is of another SHA-256 than the manifest records: the object was "
                "changed or damaged after the manifest was written; run packer verify on the output"
            )
        return data

    def through_cache(self, cache_dir: Any) -> Path:
        """Read the URL output through a local cache from now on: ``path`` downloads each file once into
        a folder of ``cache_dir`` named by the output's files (checked against the manifest's size and
        SHA-256 as it streams, kept only once whole) and gives the local copy. Returns that folder."""
        if not is_url(self.root):
            raise ValueError(f"{self.root} is a local folder: it needs no cache")
        files = "".join(f.sha256 for shard in self.manifest.shards for f in shard.files)
        self.url = str(self.root)
        self.root = Path(cache_dir) / f"{self.manifest.format}-{hashlib.sha256(files.encode()).hexdigest()[:16]}"
        return self.root

    @classmethod
    def open(cls, root: Any, format_name: Optional[str] = None, verify: bool = False) -> OutputFiles:
        """The output at ``root`` (a Path, or a URL: ``readers.remote.urls``): its manifest and the identity
        of the output it was read from, read again if the output was replaced while it was being read.
        ``format_name``: the format a reader of one format expects; ``verify``: check every shard
        file's SHA-256 before its first read."""
        for _ in range(3):
            before = output_identity(root)
            manifest = open_manifest(root, expect_format=format_name)
            digest = manifest_sha256(root)
            if before == output_identity(root):
                return cls(root, manifest, before, digest, verify)
        raise ManifestError(f"{root} keeps changing while it is opened (is a conversion writing it?)")

    def check_unchanged(self) -> None:
        """ManifestError when the output is no longer the one this dataset opened (replaced by a new
        conversion, or removed): its files must not be mixed with the ones already read.

        The manifest's inode, size and time are compared; when they differ, its bytes: a remount
        (NFS, FUSE) can change the first without any change to the output."""
        if self.identity is None:
            return
        now = output_identity(self.root)
        if now == self.identity:
            return
        if now != ("missing",) and manifest_sha256(self.root) == self.manifest_sha256:
            self.identity = now  # the same manifest, so the same shard files (their SHA-256s are in it)
            return
        if now != ("missing",) and self._still_listed():
            self.identity = now  # appended to (packer convert --append): this version's files are all still there
            return
        raise ManifestError(
            f"{self.root} was replaced or removed after this dataset was opened: its shard files "
            "are no longer the ones its manifest lists. Open the dataset again to read the new output"
        )

    def _still_listed(self) -> bool:
        """Whether the output's manifest now lists every shard this dataset reads with the very same
        files (names, sizes, SHA-256s): true after an append, which adds shards and rewrites none. The
        dataset then goes on reading the version it opened."""
        try:
            newer = {s.name: s.files for s in read_manifest(Path(self.root)).shards}
        except (PackerError, OSError):
            return False
        return all(newer.get(s.name) == s.files for s in self.manifest.shards)

    def path(self, relpath: str) -> Path:
        """Path of a shard file named in the manifest, checked before its first use in a process:
        a regular file inside the output, of the recorded size, of the output this dataset opened;
        the structure checksum the manifest records (LMDB), or with ``verify=True`` the SHA-256.

        The size and structure checks matter: LMDB memory-maps its file, and a read past the end
        of a cut file, or through a damaged page number, kills the process with SIGBUS instead of
        raising an error. Call ``check_unchanged`` again once the file is open.
        """
        if self.ranged:
            raise ValueError(f"{self.where(relpath)} is read by byte ranges: it has no local path")
        if self.url is not None:  # a URL read through a cache: downloaded once, verified, then checked as local
            entry = self.entries[relpath]
            p = cached_copy(self.url, entry, self.root)
            check_file(p, entry, False, FORMATS[self.manifest.format].structure)
            return p
        self.check_unchanged()
        p = self.root / relpath
        unsafe = unsafe_file(p, self.root)
        if unsafe:
            raise ManifestError(f"{p} {unsafe}; the output is damaged: run packer verify {self.root}")
        try:
            size = p.stat().st_size
        except OSError:
            raise ManifestError(f"{p} is listed in the manifest but missing; the output is incomplete") from None
        entry = self.entries.get(relpath)
        if entry is None:
            return p  # not a shard file of the manifest (nothing to compare)
        if size != entry.bytes:
            raise ManifestError(
                f"{p} is {size} bytes but the manifest says {entry.bytes}: the file is damaged; "
                f"run packer verify {self.root}"
            )
        check_file(p, entry, self.verify, FORMATS[self.manifest.format].structure)
        return p
