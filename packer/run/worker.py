"""The work of one shard, run inside a worker process: read, decode, preprocess, write, hash.

A worker gets a plain ``ShardJob`` (``packer.run.shard_job``) and never any open object, so the same
function serves the local executor's processes and, later, tasks on other machines. What it records
of the source files (digests, stamps) is ``packer.sources.source_stamps``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import deque
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import xxhash

from packer.config import PreprocessConfig
from packer.output.files import record_shard
from packer.pixels import preprocess, read, source_codec
from packer.pixels.geometry import image_geometry
from packer.pixels.looks import HASH_KIND, LooksBatch
from packer.pixels.prefetch import Prefetcher, reads_are_slow
from packer.records import Sample, ShardResult, Skipped, SourceItem
from packer.run.shard_job import ShardJob
from packer.sources.containers import container_bytes
from packer.sources.repack_shard import stored_samples
from packer.sources.source_stamps import item_stamp, source_digest, source_stamp
from packer.spec import text
from packer.spec.codecs import encode_image, image_extension
from packer.spec.errors import DecodeError, OutputError
from packer.spec.file_stamp import stat_or_none as source_stat
from packer.spec.listed_files import file_entry
from packer.spec.registry import get_format
from packer.system import as_child_process
from packer.targets.detection import TARGET_FIELD, target_bytes
from packer.targets.segmentation import MASK_FIELD, mask_bytes

log = logging.getLogger(__name__)

ProgressFn = Callable[[int], None]
"""``progress(n)``: n more source files are finished (negative: taken back when a shard is redone)."""

FINISHING = -1
"""Position reported while a shard's files are closed and hashed: not decoding, so no hang timeout."""

PROGRESS_SECONDS = 0.1
"""Least time between a worker's progress messages: ten a second keep a bar live. Counting items
instead (one message per 16) woke the parent so often on small images that it took a noticeable
share of a core on a 2-core machine."""


READ_AHEAD_FILES = 16
READ_AHEAD_BYTES = 16 * 1024**2
"""A worker stats and reads the source files of up to READ_AHEAD_FILES image-only samples in a row
(fewer once READ_AHEAD_BYTES are held) before decoding them. Between two decodes the kernel's
caches have gone cold: a stat and a read there cost several times what they cost back to back,
so a run of them costs much less a file in all."""


def run_shard_process(job: ShardJob, conn, slot, parent: int, log_level: int) -> None:
    """Body of a shard's worker process: write the shard, reporting through ``conn``.

    Messages are ``("progress", n)``, and last ``("result", ShardResult)`` or ``("error",
    exception)``. Before each file its 1-based position goes into ``slot[0]``, a lock-free
    shared one-element array the parent reads to name the file of a crash or hang. The process
    ignores Ctrl-C (the parent decides how to stop), ends quietly on SIGTERM (which
    multiprocessing sends the daemonic children still running when their parent exits), and
    exits at once if its converter, ``parent``, is gone.
    """
    as_child_process()
    logging.basicConfig(level=log_level, format="%(levelname)s %(message)s")
    preprocess.keep_image_memory()

    def at(position: int) -> None:
        try:
            os.kill(parent, 0)  # signal 0 only asks whether the converter still exists
        except ProcessLookupError:
            os._exit(1)
        slot[0] = position

    try:
        result = write_shard(job, progress=lambda n: conn.send(("progress", n)), at=at)
    except BaseException as e:  # noqa: BLE001 - everything goes to the parent, which decides
        conn.send(("error", e))
    else:
        conn.send(("result", result))
    conn.close()


def read_sample(
    item: SourceItem, job: ShardJob, st: Optional[os.stat_result] = None, data: Optional[bytes] = None
) -> tuple[Sample, str, Optional[preprocess.Decoded]]:
    """Read and preprocess one source item: ``(sample, digest of its source bytes, decoded image or
    None)``; ``st`` is an image-only item's os.stat if the caller took it, ``data`` its bytes if
    the caller read them (``read_ahead``). DecodeError for a file that cannot be used (naming the
    file within a paired sample)."""
    if not item.parts:  # an image-only sample: the hot path, kept free of anything else
        data, decoded, image, encoded = read_image(item.path, job, st, data)
        return Sample(item.index, item.relpath, image, item.label, encoded), source_digest(data), decoded
    digest = xxhash.xxh3_128()
    files = dict(item.parts)
    image = encoded = decoded = None
    fields: dict[str, bytes] = {}
    try:
        if job.layout.has_image:
            data, decoded, image, encoded = read_image(files["image"], job)
            digest.update(b"image\0%d\0" % len(data) + data)
        for f in job.layout.text:
            if f.kind_of.made_by_converter:  # the geometry: where the image's pixels went, for the json's coordinates
                fields[f.name] = geometry_bytes(decoded, job.preprocess)
                continue
            path = files.get(f.name)
            if path is None:  # --allow-missing: stored empty
                fields[f.name] = b""
                continue
            data = read.read_source(path, text.MAX_TEXT_BYTES, "more than a text or json file may have")
            digest.update(f"{f.name}\0{len(data)}\0".encode() + data)
            fields[f.name] = f.kind_of.stored(data, path, job.text)
    except DecodeError as e:
        if len(item.parts) > 1:  # say which file of the sample (after the reason: its kind is before the colon)
            raise DecodeError(item.relpath, f"{e.reason} [{os.path.basename(e.path)}]") from None
        raise
    sample = Sample(item.index, item.relpath, image, item.label, encoded, fields)
    return sample, digest.hexdigest(), decoded


def geometry_bytes(decoded: Optional[preprocess.Decoded], cfg: PreprocessConfig) -> bytes:
    """The stored ``geometry`` field of one image: ``packer.pixels.geometry.Geometry`` as UTF-8 JSON."""
    assert decoded is not None
    geometry = image_geometry(decoded.stored_size, decoded.orientation, cfg)
    return json.dumps(geometry.to_dict(), separators=(",", ":")).encode("utf-8")


def detection_target(item: SourceItem, job: ShardJob, decoded: preprocess.Decoded) -> tuple[bytes, int, int]:
    """``(stored target, boxes kept, boxes dropped)`` of one image of a detection output."""
    assert job.detection is not None
    return target_bytes(
        job.detection.targets.get(item.index),
        decoded,
        job.preprocess,
        job.detection.min_visibility,
        item.relpath,
        job.detection.coords,
    )


def read_image(
    path: str, job: ShardJob, st: Optional[os.stat_result] = None, data: Optional[bytes] = None
) -> tuple[bytes, preprocess.Decoded, np.ndarray, Optional[bytes]]:
    """``(source bytes, decoded, stored pixels, encoded bytes or None)`` of one image file (``st``:
    its os.stat, if the caller took it; ``data``: its bytes, if the caller read them)."""
    if data is None:
        data = read_source(path, job, st)
    codec = job.layout.codec
    if codec.name == "source":
        kept = source_codec.keep(data, job.preprocess, path, full=job.preprocess.auto_normalize, looks=job.looks)
        if kept is not None:  # stored as it is: no pixels made, only the shape the writers check
            (w, h), channels = kept.original_size, job.layout.channels
            shape = np.broadcast_to(np.zeros((1, 1, 1), np.uint8), (h, w, channels))
            decoded = preprocess.Decoded(
                shape, kept.original_size, kept.histogram, kept.orientation, True, kept.scaled, kept.upright
            )
            return data, decoded, shape, data
    decoded = preprocess.decode(data, job.preprocess, path, histogram=True)
    image = preprocess.finish_pixels(decoded.pixels, job.preprocess)
    if codec.name == "source":
        return data, decoded, image, encode_image(image, source_codec.reencode_codec(data), codec.quality)
    return data, decoded, image, encode_image(image, codec.name, codec.quality) if codec.encoded else None


def read_source(path: str, job: ShardJob, st: Optional[os.stat_result] = None) -> bytes:
    """The bytes of one image file, within the job's ``--max-file-bytes`` (DecodeError otherwise)."""
    return read.read_source(path, max_bytes=job.preprocess.max_file_bytes, st=st)


def read_ahead(
    job: ShardJob, start: int, at: Optional[Callable[[int], None]] = None, prefetch: Optional[Prefetcher] = None
) -> list[tuple[Optional[os.stat_result], bytes | DecodeError]]:
    """Stat and read the files of the image-only samples of ``job`` from position ``start`` on, in a
    row (``READ_AHEAD_FILES``, ``READ_AHEAD_BYTES``), up to the first sample with several files or
    known to crash the decoder (``job.poisoned``): ``(os.stat or None, bytes or the DecodeError
    reading gave)`` of each, in order. ``at(position)`` is told of each file before it is opened,
    so that a read that hangs or kills the worker is blamed on its own file. When these reads were
    slow (``prefetch.reads_are_slow``: from the storage, not the page cache), ``prefetch`` is
    started after them."""
    items, found, held = job.task.items, [], 0
    began = time.perf_counter()
    for position in range(start, min(len(items), start + READ_AHEAD_FILES)):
        item = items[position]
        if item.parts or item.index in job.poisoned or held >= READ_AHEAD_BYTES:
            break
        if at is not None:
            at(position + 1)
        st = source_stat(item.path)  # before reading: a file changed after this is noticed on --resume
        try:
            data: bytes | DecodeError = read_source(item.path, job, st)
            held += len(data)
        except DecodeError as e:
            data = e
        found.append((st, data))
    if prefetch is not None and not prefetch.started and reads_are_slow(len(found), held, time.perf_counter() - began):
        prefetch.start(start + len(found))
    return found


def write_shard(
    job: ShardJob, progress: Optional[ProgressFn] = None, at: Optional[Callable[[int], None]] = None
) -> ShardResult:
    """Write one shard; return its files with checksums, the files it skipped, per-sample facts, the
    counts behind the dataset statistics and the stamps of its source files.

    ``progress(n)`` is told of finished files every few files; ``at(position)`` before each.
    """
    if job.repack is not None:
        return write_repacked(job, progress, at)
    counted = _Counted(progress)
    directory = Path(job.directory)
    writer = get_format(job.format).writer_class()(directory, job.task.name, job.layout, len(job.task.items))
    result = ShardResult(job.task.name, 0, [])
    sources = hashlib.sha256()
    ahead: deque[tuple[Optional[os.stat_result], bytes | DecodeError]] = deque()  # read, for the next items
    looks: Optional[LooksBatch] = LooksBatch() if job.looks else None
    # A row's image kept as a file beside the container (the datasets Image feature before embedding)
    # is stamped too: the parent's stamps cover the container alone, so --resume writes such a shard
    # again rather than keep pixels of a file that changed since.
    fetched = (
        container_bytes(
            job.container,
            job.preprocess.max_file_bytes,
            lambda path: sources.update(f"\0file\0{path}\0{source_stamp(str(path))}".encode()),
        )
        if job.container is not None
        else None
    )
    paths = [None if item.index in job.poisoned or fetched is not None else item.paths for item in job.task.items]
    # Started by read_ahead once reads turn out to come from the storage, not the page cache (only
    # runs of image-only samples are timed); once started it asks for every sample's files.
    with Prefetcher(paths, job.preprocess.max_file_bytes) as prefetch:
        for position, item in enumerate(job.task.items):
            prefetch.advance(position)
            if fetched is not None:  # the image's bytes from inside its container, in order
                ahead.append((None, next(fetched)))
            elif not ahead and not item.parts and item.index not in job.poisoned:
                ahead.extend(read_ahead(job, position, at, prefetch))
            if at is not None:
                at(position + 1)
            # Stamped before reading, so that a file changed after this is noticed on --resume; an
            # image-only sample's stat also serves read_source's check.
            st, data = ahead.popleft() if ahead else (None if item.parts else source_stat(item.path), None)
            sources.update(item_stamp(item, st))
            try:
                if item.index in job.poisoned:
                    raise DecodeError(item.path, job.poisoned[item.index])
                if isinstance(data, DecodeError):
                    raise data
                sample, digest, decoded = read_sample(item, job, st, data)
                if job.detection is not None:
                    sample.fields[TARGET_FIELD], kept, dropped = detection_target(item, job, decoded)
                if job.segmentation is not None:
                    seg = job.segmentation
                    sample.fields[MASK_FIELD] = mask_bytes(
                        seg.masks[item.index], decoded, job.preprocess, seg.ignore_index, seg.coords, item.relpath
                    )
            except DecodeError as e:
                if job.strict:
                    raise DecodeError(item.relpath, e.reason) from None
                result.skipped.append(Skipped(item.relpath, e.reason))
            else:
                try:
                    writer.add(sample)
                except Exception as e:  # noqa: BLE001 - disk full, I/O errors: name the shard, not a library trace
                    raise OutputError(f"cannot write {job.task.name} in {directory}: {e}") from None
                if job.layout.has_image and job.layout.codec.name == "source":
                    result.add_image_source(
                        result.samples,
                        bool(decoded and decoded.kept),
                        image_extension("source", sample.encoded).replace("jpg", "jpeg"),
                    )
                    result.scaled_counts += bool(decoded and decoded.scaled_counts)
                result.samples += 1
                if job.detection is not None:
                    counts = result.boxes
                    counts["kept"] = counts.get("kept", 0) + kept
                    counts["dropped"] = counts.get("dropped", 0) + dropped
                    counts["without_boxes"] = counts.get("without_boxes", 0) + (kept == 0)
                result.keys.append(item.relpath)
                result.labels.append(item.label)
                result.digests.append(digest)
                if decoded is not None:
                    result.stats.add(decoded.histogram, decoded.original_size)  # type: ignore[arg-type]
                if looks is not None and decoded is None:
                    looks = None  # a sample without pixels (none in image outputs) leaves the shard unhashed
                elif looks is not None:
                    looks.add(decoded.hashed_pixels)
            counted.one()
    counted.flush()
    if looks is not None:
        result.looks, result.looks_kind = looks.table(), HASH_KIND
    return closed(job, writer, result, sources, at)


def write_repacked(
    job: ShardJob, progress: Optional[ProgressFn] = None, at: Optional[Callable[[int], None]] = None
) -> ShardResult:
    """Write one shard of a repack (``job.repack``): the source output's samples, each stored again
    as the target layout stores it (``packer.sources.repack_shard``); no statistics (the source's hold)."""
    assert job.repack is not None
    directory = Path(job.directory)
    writer = get_format(job.format).writer_class()(directory, job.task.name, job.layout, len(job.task.items))
    result = ShardResult(job.task.name, 0, [])
    sources = hashlib.sha256()
    counted = _Counted(progress)
    source_image = job.layout.has_image and job.layout.codec.name == "source"
    for position, (item, sample, kept) in enumerate(stored_samples(job.repack, job.task.items, job.layout)):
        if at is not None:
            at(position + 1)
        sources.update(item_stamp(item))
        try:
            writer.add(sample)
        except Exception as e:  # noqa: BLE001 - disk full, I/O errors: name the shard, not a library trace
            raise OutputError(f"cannot write {job.task.name} in {directory}: {e}") from None
        if source_image:
            result.add_image_source(
                result.samples, kept, image_extension("source", sample.encoded).replace("jpg", "jpeg")
            )
        result.samples += 1
        result.keys.append(sample.key)
        result.labels.append(sample.label)
        counted.one()
    counted.flush()
    return closed(job, writer, result, sources, at)


class _Counted:
    """Finished items told to ``progress`` at most every ``PROGRESS_SECONDS`` (see there), the rest by ``flush``."""

    def __init__(self, progress: Optional[ProgressFn]) -> None:
        self.progress, self.pending = progress, 0
        self.next = time.monotonic() + PROGRESS_SECONDS

    def one(self) -> None:
        """One more item finished."""
        self.pending += 1
        if self.progress is not None and (now := time.monotonic()) >= self.next:
            self.progress(self.pending)
            self.pending, self.next = 0, now + PROGRESS_SECONDS

    def flush(self) -> None:
        """Tell the items not told yet."""
        if self.progress is not None and self.pending:
            self.progress(self.pending)
        self.pending = 0


def closed(job: ShardJob, writer, result: ShardResult, sources, at: Optional[Callable[[int], None]]) -> ShardResult:
    """Close the shard's writer after its last sample and complete ``result`` with its files (hashed),
    format version and the digest of its sources' stamps (``sources``, a hashlib object)."""
    directory = Path(job.directory)
    if at is not None:
        at(FINISHING)
    # Closed only after the last item: a shard cut short by an error never looks finished.
    try:
        files = writer.close()
    except Exception as e:  # noqa: BLE001 - disk full, I/O errors: name the shard, not a library trace
        raise OutputError(f"cannot write {job.task.name} in {directory}: {e}") from None
    spec = get_format(job.format)
    structure = spec.structure_checksum()
    result.files = [file_entry(directory, name, writer.digests.get(name), structure) for name in files]
    result.format_version = spec.version(job.layout)
    result.sources = sources.hexdigest()
    result.packed()
    if not job.record:
        return result
    try:
        return record_shard(directory, result, fingerprint=job.plan_fingerprint or None)
    except OSError as e:  # disk full: name the shard, as for its files
        raise OutputError(f"cannot write {job.task.name}'s record in {directory}: {e}") from None
