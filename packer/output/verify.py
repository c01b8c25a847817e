"""``packer verify``: re-read a packed output and report every missing, truncated or damaged part.

Checks, per shard: each file exists with the size and SHA-256 the manifest records; every sample
decodes with the format's stock library (and Pillow for jpeg and png images), has the recorded
dtype and shape, and matches the CRC-32 stored beside it, so a flipped bit is traced to the sample
it hit. The checks of one shard are ``packer.output.shard_checks``'s; this module runs them over the
output, each shard's samples in a child process it stops when a library hangs on damaged data, and
checks what belongs to the whole output (other loaders' shard lists, class counts, stray files).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import shutil
import signal
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Callable, Optional

from packer.output.image_hashes import read_hashes
from packer.output.shard_checks import Problem, check_files, check_samples
from packer.spec.errors import ManifestError
from packer.spec.listed_files import unsafe_file
from packer.spec.manifest import MANIFEST_NAME, Manifest, ShardEntry, read_manifest
from packer.spec.registry import FORMATS
from packer.spec.shard_names import LMDB_SUFFIX
from packer.system import usable_cpus

STALL_SECONDS = 60.0
"""How long a shard's scan may go without finishing a sample before verify stops it and reports the
shard: a sample takes milliseconds; a library looping on damaged data would take forever."""

READ_AT_ONCE = 64
"""Messages read from one checking process before the others are served."""

PROGRESS_SECONDS = 0.1
"""How often a shard's checking process reports its samples done (a message per sample cost the
two processes more than checking a small sample)."""


def verify(
    output: str | os.PathLike, progress: Optional[Callable[[int], None]] = None, workers: Optional[int] = None
) -> list[Problem]:
    """Check a packed output completely; returns the problems found (empty when it is intact), shard
    by shard in the manifest's order.

    Each shard's files are hashed here, one shard after another, while up to ``workers`` shards
    (default: the usable cores) have their samples checked, each in a process of its own
    (``_ShardChecks``). Raises ManifestError when the folder is not a readable packer output at all.
    """
    root = Path(output)
    manifest = read_manifest(root)
    spec = FORMATS[manifest.format]
    spec.import_modules()  # once, not in each shard's child process
    per_shard: list[list[Problem]] = []
    labels_seen: list[int] = []
    with _ShardChecks(manifest, progress, labels_seen, usable_cpus() if workers is None else workers) as checks:
        for shard in manifest.shards:
            file_problems = check_files(root, shard)
            per_shard.append(list(file_problems))
            if any(unsafe_file(root / f.path, root) for f in shard.files):
                continue  # reported by check_files; reading it could block forever or leave the output
            if spec.whole_file and any("truncated" in p.message for p in file_problems):
                # LMDB memory-maps its file (reading past the end of a cut file kills the process with
                # SIGBUS) and HDF5 refuses a cut file outright. Scan a copy padded back to its recorded
                # size instead: lost pages read as zeros, and the samples still intact are told apart.
                checks.start(root, shard, per_shard[-1], padded=True)
            else:
                # Files as recorded: their bytes are the writer's, which a format may then read by its own index.
                checks.start(root, shard, per_shard[-1], intact=not file_problems)
    problems = [p for found in per_shard for p in found]
    problems += check_counts(manifest, labels_seen)
    problems += check_output_files(root, manifest)
    problems += check_image_hashes(root, manifest)
    problems += check_extra_files(root, manifest)
    return problems


def check_image_hashes(root: Path, manifest: Manifest) -> list[Problem]:
    """The output's ``image_hashes.npy`` against its manifest entry (size, SHA-256, one row a sample)."""
    if manifest.image_hashes is None:
        return []
    name = manifest.image_hashes["path"]
    why = unsafe_file(root / name, root)
    if why:
        return [Problem("output", f"{name} {why}")]
    try:
        read_hashes(root, manifest, comparable=False)  # the file as listed; its rule is info's concern
    except ManifestError as e:
        return [Problem("output", f"{e}; packer info and the near-duplicate search read it (convert again)")]
    return []


def check_output_files(root: Path, manifest: Manifest) -> list[Problem]:
    """The files made from the manifest (``wids``' shard list of a tar-shard output) against what the
    manifest makes of them now: other loaders trust them to find the shards and count the samples."""
    problems = []
    for name, expected in FORMATS[manifest.format].files_of_output(manifest).items():
        path = root / name
        why = unsafe_file(path, root)
        if why:
            problems.append(Problem("output", f"{name} {why}"))
        elif not path.is_file():
            problems.append(
                Problem(
                    "output",
                    f"{name} is missing; packer writes it from the manifest for other "
                    "loaders (convert again, or restore it from a copy)",
                )
            )
        elif path.read_bytes() != expected:
            problems.append(
                Problem(
                    "output",
                    f"{name} does not match the manifest; it was changed since packer "
                    "wrote it (other loaders would read the wrong shards or counts)",
                )
            )
    return problems


def check_counts(manifest: Manifest, labels: list[int]) -> list[Problem]:
    """The manifest's class counts against the labels actually stored."""
    if manifest.class_counts is None or manifest.classes is None:
        return []
    stored = [0] * len(manifest.classes)
    for label in labels:
        if 0 <= label < len(stored):
            stored[label] += 1
    if stored != list(manifest.class_counts):
        return [Problem("manifest", f"class_counts {manifest.class_counts} do not match the stored labels ({stored})")]
    return []


def check_extra_files(root: Path, manifest: Manifest) -> list[Problem]:
    """Files in the output that the manifest does not list (a shard dropped from the manifest?). An
    LMDB shard's lock file (``shard-NNNNN.lmdb-lock``) is not one: opening the shard with LMDB's own
    defaults (``mdb_stat``, ``lmdb.open(path, subdir=False)``) makes it, and it holds no data."""
    listed = {f.path for s in manifest.shards for f in s.files} | {MANIFEST_NAME, "report.txt"}
    listed |= set(manifest.side_files)
    listed |= set(FORMATS[manifest.format].files_of_output(manifest))
    listed |= {f"{path}-lock" for path in listed if path.endswith(LMDB_SUFFIX)}
    return [
        Problem("output", f"{p.name} is not listed in the manifest")
        for p in sorted(root.iterdir())
        if p.name not in listed
    ]


class _Child:
    """One shard's checking process, as ``_ShardChecks`` follows it."""

    def __init__(self, shard: ShardEntry, proc, receive, checked, into: list[Problem], scratch) -> None:
        self.shard, self.proc, self.receive, self.checked, self.into, self.scratch = (
            shard,
            proc,
            receive,
            checked,
            into,
            scratch,
        )
        self.heard = time.monotonic()  # when it last sent word
        self.done = 0  # samples its reports counted
        self.result: Optional[tuple] = None
        self.ended = False  # its pipe closed without a result: it died


class _ShardChecks:
    """``check_samples`` of each shard started, at most ``workers`` at once, each in a child process
    where the platform forks: a damaged LMDB or HDF5 file can crash its library (SIGBUS, SIGSEGV) or
    send it into an endless loop (a damaged HDF5 heap), and verify must report either, not die or
    hang with it. A child that sends no word for ``STALL_SECONDS`` (it reports its samples every
    ``PROGRESS_SECONDS``) is killed and its shard reported, naming the sample it was at: each sample
    it finishes is counted in shared memory at once, so that the samples of its last report not yet
    sent are not lost. Each shard's problems go to the list given for it, its labels to ``labels``.
    Leaving the ``with`` block waits for every child; leaving it by an exception kills them."""

    def __init__(
        self, manifest: Manifest, progress: Optional[Callable[[int], None]], labels: list[int], workers: int
    ) -> None:
        self.manifest, self.progress, self.labels = manifest, progress, labels
        self.workers = max(1, workers)
        self.running: list[_Child] = []

    def __enter__(self) -> "_ShardChecks":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        try:
            while kind is None and self.running:
                self._serve()
        finally:
            self._stop()

    def _stop(self) -> None:
        """End every child still running (verify interrupted): none outlives it, no scratch copy is left."""
        for child in self.running:
            child.proc.kill()
            child.proc.join()
            child.receive.close()
            if child.scratch is not None:
                child.scratch.cleanup()
        self.running.clear()

    def start(
        self, root: Path, shard: ShardEntry, into: list[Problem], intact: bool = False, padded: bool = False
    ) -> None:
        """Check the samples of ``shard`` under ``root`` (``intact``: see ``check_samples``) once fewer
        than ``workers`` shards are being checked; ``padded``: in a temporary copy of its files
        padded to their recorded sizes, made only then (no more copies on disk than children at
        work) and removed when its child is done, or at once if none takes it."""
        while len(self.running) >= self.workers:
            self._serve()
        scratch = tempfile.TemporaryDirectory() if padded else None
        child = None
        try:
            where = root if scratch is None else _padded_copy(root, shard, Path(scratch.name))
            if sys.platform != "linux":
                into += check_samples(where, self.manifest, shard, self.progress, self.labels, intact=intact)
                return
            ctx = mp.get_context("fork")
            receive, send = ctx.Pipe(duplex=False)
            checked = ctx.Value("q", 0, lock=False)  # samples finished, written by the child alone
            proc = ctx.Process(
                target=_check_in_child, args=(where, self.manifest, shard, send, checked, intact), daemon=True
            )
            proc.start()
            send.close()
            child = _Child(shard, proc, receive, checked, into, scratch)
            self.running.append(child)
        finally:
            if scratch is not None and child is None:
                scratch.cleanup()

    def _serve(self) -> None:
        """Read what the running children sent, waiting for word at most until the first of them
        stalls, and end those that finished, died or stalled."""
        deadline = min(child.heard for child in self.running) + STALL_SECONDS
        ready = mp_connection.wait(
            [child.receive for child in self.running], timeout=max(0.0, deadline - time.monotonic())
        )
        for child in self.running:
            if child.receive in ready:
                self._read(child)
        for child in list(self.running):
            quiet = child.result is None and not child.ended and time.monotonic() - child.heard >= STALL_SECONDS
            if quiet and child.receive.poll():  # word came while this process was busy: not a stall
                self._read(child)
                quiet = False
            if child.result is not None or child.ended or quiet:
                self._end(child, quiet)

    def _read(self, child: _Child) -> None:
        """What ``child`` has sent, up to ``READ_AT_ONCE`` messages: a child that reports faster
        than the progress callback takes them must not keep the others waiting."""
        try:
            for _ in range(READ_AT_ONCE):
                if child.result is not None or not child.receive.poll():
                    break
                kind, value = child.receive.recv()
                child.heard = time.monotonic()
                if kind == "progress":
                    child.done += value
                    if self.progress is not None:
                        self.progress(value)
                elif kind == "done":
                    child.result = value
        except EOFError:
            child.ended = True

    def _end(self, child: _Child, stalled: bool) -> None:
        self.running.remove(child)
        child.receive.close()
        if child.result is None and child.proc.is_alive():  # stalled
            child.proc.kill()
        child.proc.join()
        if child.scratch is not None:
            child.scratch.cleanup()
        fmt, name = self.manifest.format, child.shard.name
        if child.result is not None:
            found, shard_labels = child.result
            child.into += found
            self.labels += shard_labels
            return
        unsent = max(int(child.checked.value) - child.done, 0)  # finished, but in no report yet
        if unsent and self.progress is not None:
            self.progress(unsent)
        done = child.done + unsent
        if stalled:
            child.into.append(
                Problem(
                    name,
                    f"unreadable: the {fmt} library made no progress for {STALL_SECONDS:g} s "
                    f"after sample {done} (stopped); the shard is damaged, or its disk far too "
                    "slow",
                    done,
                )
            )
            return
        code = child.proc.exitcode or 0
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        child.into.append(Problem(name, f"unreadable: reading it crashed the {fmt} library ({how})"))


def _check_in_child(root: Path, manifest: Manifest, shard: ShardEntry, conn, checked, intact: bool) -> None:
    pending, last = 0, time.monotonic()

    def progress(n: int) -> None:
        nonlocal pending, last
        pending += n
        checked.value += n
        now = time.monotonic()
        if now - last >= PROGRESS_SECONDS:
            conn.send(("progress", pending))
            pending, last = 0, now

    labels: list[int] = []
    found = check_samples(root, manifest, shard, progress, labels, intact=intact)
    if pending:
        conn.send(("progress", pending))
    conn.send(("done", (found, labels)))
    conn.close()


def _padded_copy(root: Path, shard: ShardEntry, tmp: Path) -> Path:
    for f in shard.files:
        target = tmp / f.path
        shutil.copyfile(root / f.path, target)
        if target.stat().st_size < f.bytes:
            os.truncate(target, f.bytes)
    return tmp


class _VerifyModule(types.ModuleType):
    """Once this module is imported, Python binds it as the package's ``packer.verify`` attribute,
    which until then named the function (``from packer import verify``): calling the module calls
    the function, so ``packer.verify(path)`` works either way, and ``import packer.output.verify as v`` still
    gives the module, whose names (``v.STALL_SECONDS``, ``v.check_samples``) stay its own."""

    def __call__(
        self, output: str | os.PathLike, progress: Optional[Callable[[int], None]] = None, workers: Optional[int] = None
    ) -> list[Problem]:
        return self.verify(output, progress, workers)


sys.modules[__name__].__class__ = _VerifyModule
