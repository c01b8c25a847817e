"""The files of an output that an operation adds to, wherever they are: in its folder, or in a bucket.

``packer convert SRC -o s3://bucket/prefix --append`` adds to an output in a bucket without
downloading it: the local folder holds its manifest only (``packer.cli.remote_output``), and
``HeldFiles`` fetches what the append reads as it reads it: the files a shard's index is read from
(an npy shard's keys and checksums; the whole shard file of the other formats, ``FETCHES`` shards at
a time), a shard whose samples are compared byte for byte, the image hashes. Each file is checked
against the size and SHA-256 its manifest lists (an object changed since is an error, never read),
kept in a temporary folder while it is read, and removed after. An output in a local folder is read
in place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from packer.output.shard_uploads import sink_for
from packer.spec.errors import DAMAGED_IN_STORE, ManifestError, OutputError, damaged_in_store
from packer.spec.listed_files import sha256_of
from packer.spec.manifest import Manifest, ShardEntry
from packer.spec.registry import get_format
from packer.spec.sample_layout import SampleLayout

FETCHES = 4
"""Shards whose index files are fetched from a bucket at once (each on the local disk while it is read)."""

Listed = tuple[str, int, str]
"""A file as a manifest lists it: its path in the output, its bytes and its SHA-256."""


@dataclass(frozen=True)
class StoreFiles:
    """The files of an output in a store: its fsspec filesystem, the output's path there, and the URL
    that messages name."""

    fs: Any
    prefix: str
    url: str

    def fetch(self, listed: Listed, into: Path) -> None:
        """Download one file of the output into the folder ``into`` (under its path), checked against
        the size and SHA-256 the manifest lists; ManifestError naming it otherwise."""
        relpath, size, sha256 = listed
        target = into / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        url = f"{self.url.rstrip('/')}/{relpath}"
        try:
            self.fs.get_file(f"{self.prefix}/{relpath}", str(target))
        except FileNotFoundError:
            raise ManifestError(f"{url} is missing: the output is not whole; run packer verify on it") from None
        except Exception as e:  # noqa: BLE001 - each backend raises its own (botocore's, aiohttp's)
            if damaged_in_store(e):  # the output's fault: no second run reads it otherwise
                raise ManifestError(f"{url} {DAMAGED_IN_STORE}; run packer verify on the output") from None
            # not the output's fault: the run stops (never goes on without what it could not read)
            raise OutputError(f"reading {url} failed: {type(e).__name__}: {e}; run the same command again") from None
        if target.stat().st_size != size or sha256_of(target) != sha256:
            raise ManifestError(
                f"{url} is not the file its manifest lists (changed since it was written): "
                "run packer verify on the output"
            )


class HeldFiles:
    """The shard files of the output in the folder ``root`` (see the module). With ``store``, the
    files not in ``root`` are fetched from the output in that store (its manifest alone is in
    ``root``; or ``root`` is a staging folder whose shards were uploaded as they finished), once
    ``ready()`` returns (their uploads are done). Keys and checksums read from a shard's index are
    kept, so that each shard's index is read once."""

    def __init__(
        self, root: Path, store: Optional[StoreFiles] = None, ready: Callable[[], None] = lambda: None
    ) -> None:
        self.root, self.store, self._ready = Path(root), store, ready
        self._indexes: dict[str, tuple[list[str], np.ndarray]] = {}

    @classmethod
    def of(cls, output: Path, folder: Optional[Path] = None) -> HeldFiles:
        """The files of the output ``output`` found in ``folder`` (default: ``output`` itself), and, when
        a conversion into a bucket writes ``output`` (``packer.output.shard_uploads.sink_for``), in
        the bucket: the output there, or the shards of ``folder`` uploaded as they finished."""
        root = Path(folder if folder is not None else output)
        sink = sink_for(output)
        if sink is None:
            return cls(root)
        prefix = f"{sink.dest.root}/{sink.object_name(output, '')}".rstrip("/")
        return cls(root, StoreFiles(sink.dest.fs, prefix, sink.shown(output)), sink.settle)

    @property
    def shown(self) -> str:
        """The output as messages name it."""
        return self.store.url if self.store is not None else str(self.root)

    @contextlib.contextmanager
    def folder(self, files: Sequence[Listed]) -> Iterator[Path]:
        """A folder holding ``files`` under their paths for the block: ``root``, where it holds them
        all, or a temporary one with those it holds linked and the others fetched from the store
        (removed after the block)."""
        away = [listed for listed in files if not (self.root / listed[0]).is_file()]
        if self.store is None or not away:
            yield self.root
            return
        self._ready()
        scratch = Path(tempfile.mkdtemp(prefix="packer-held-"))
        try:
            for listed in files:
                if listed in away:
                    self.store.fetch(listed, scratch)
                else:
                    (scratch / listed[0]).parent.mkdir(parents=True, exist_ok=True)
                    os.link(self.root / listed[0], scratch / listed[0])
            yield scratch
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def shard_folder(self, shard: ShardEntry, wanted: Callable[[str], bool] = lambda path: True) -> Any:
        """``folder`` of the files of ``shard`` whose paths ``wanted`` accepts."""
        return self.folder([(f.path, f.bytes, f.sha256) for f in shard.files if wanted(f.path)])

    def index(self, manifest: Manifest, shard: ShardEntry, layout: SampleLayout) -> tuple[list[str], np.ndarray]:
        """The keys and stored CRC-32s of ``shard``'s samples (``FormatSpec.read_index``), read once."""
        found = self._indexes.get(shard.name)
        if found is None:
            spec = get_format(manifest.format)
            with self.shard_folder(shard, spec.reads_for_index) as folder:
                found = self._indexes[shard.name] = spec.read_index(folder, shard, layout)
        return found

    def indexes(self, manifest: Manifest, layout: SampleLayout) -> list[tuple[list[str], np.ndarray]]:
        """``index`` of every shard of ``manifest``, in order; ``FETCHES`` shards at once from a store."""
        if self.store is None:
            return [self.index(manifest, shard, layout) for shard in manifest.shards]
        with ThreadPoolExecutor(FETCHES, thread_name_prefix="packer-held") as pool:
            return list(pool.map(lambda shard: self.index(manifest, shard, layout), manifest.shards))


__all__ = ["HeldFiles", "StoreFiles", "FETCHES"]
