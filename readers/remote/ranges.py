"""Byte ranges of a remote shard file, read on demand: the random access of map-style outputs in a bucket.

``RangeSource(url, entry)`` reads parts of one file of an output at a URL (``s3://``, ``gs://``,
``https://``: any fsspec backend that answers range requests) in aligned blocks of ``BLOCK`` bytes:

- ``fetch_all([(source, spans), ...])`` asks for every block the spans need that no cache holds,
  neighbouring blocks joined into one request, all the requests at once (fsspec's ``cat_ranges``:
  concurrent on the asynchronous backends, s3fs, gcsfs and HTTP), so a batch's latency is one round
  trip, not one a sample. The readers call it with a whole batch's spans before they read its samples,
  with ``exact=True``: where the file has no disk cache, each request is cut to the bytes its
  samples need (to ``PAGE``), not the whole blocks around them, and kept for the batch. Each byte
  received costs the worker's HTTP client CPU (copied and checked as it comes), so a random sample
  smaller than a block no longer brings one or two blocks' worth.
- ``read(start, end)`` gives the bytes, from the caches or fetched then; ``range_file.RangeFile`` is a file
  object over them (for h5py), ``npy_ranges.RemoteArray`` an array.

The requests themselves (the stall rule, retries, a presigned URL's refusal, the errors) are
``range_requests``'. Blocks, and the answers cut to a batch's samples, are kept in this process's
memory (``block_memory.MEMORY``, least recently used dropped past its limit) and, blocks only,
with a ``BlockCache`` (``cache_dir=``), on disk for every process and later runs. Both are keyed by
the file's SHA-256 in the manifest, so a block of one output is never served for another.

What arrives is checked: the file's size against the manifest at the first request a process makes for it
(asked for every file a batch opens at once; not for a file read whole, whose SHA-256 is checked), each
answer's length against the range asked (a server that ignores ranges and sends the whole file
is refused, never sliced at the wrong place); the readers check each sample against the CRC-32 its
shard records for it, so an object changed under a reader is an error, never mixed samples. The
small files of npy shards (labels, keys, offsets, checksums) are read whole and checked against the
manifest's SHA-256; an hdf5 shard's labels, keys and offsets, read through h5py inside the file,
against the checksum of its index the manifest records (``packer.spec.hdf5_index``).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Optional

from packer.spec.entries import FileEntry
from packer.spec.errors import ManifestError
from readers.remote import range_requests, streams
from readers.remote.block_cache import BlockCache
from readers.remote.block_memory import MEMORY, Buffer
from readers.remote.range_requests import CONCURRENT, REFUSED_URL, UNREACHED_URL, Requests
from readers.remote.signed_urls import SignedUrl, can_sign

BLOCK = 256 << 10
"""Bytes per block, the unit of requests and caches: a few samples of 64 KiB, one of 192 KiB (a
256x256 RGB image) in at most two. Smaller blocks waste less of each request; more of them make
more requests where samples are read in order."""
PAGE = 4096
"""The alignment of a batch's requests trimmed to its samples' bytes (``fetch_all(exact=True)``)."""


class RangeSource:
    """One file of an output at a URL, read by byte ranges (see the module). Plain data: it pickles
    to DataLoader workers, each of which opens its own connection on its first request."""

    def __init__(
        self,
        url: str,
        entry: FileEntry,
        cache: Optional[BlockCache] = None,
        block: Optional[int] = None,
        whole: bool = False,
    ) -> None:
        self.url, self.size, self.block = url, entry.bytes, int(block or BLOCK)  # BLOCK read at each open
        self.key = f"{entry.sha256[:32]}-{self.block}"  # the file's identity in every cache
        self.cache = cache
        self.whole = whole
        """The file is read whole and its bytes checked against the manifest's SHA-256 by its reader
        (``OutputFiles.array``): its size is not asked first, which would be one request more, in
        turn, for each such file a process opens (an npy shard has three or more)."""
        self._fs: Optional[tuple[int, Any, str, Optional[SignedUrl]]] = None  # per process: see _open

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fs": None}

    def _open(self) -> tuple[Any, str]:
        """The filesystem and path to ask for this file's ranges in this process (an S3 object's
        presigned URL over HTTP where it can be: ``readers.remote.signed_urls``), its size checked
        once against the manifest."""
        if self._fs is None or self._fs[0] != os.getpid():
            self._fs = (os.getpid(), *self._checked())
        _, fs, path, signed = self._fs
        return signed.target() if signed is not None else (fs, path)

    @property
    def signed(self) -> Optional[SignedUrl]:
        """This process's presigned URL of the file, where it is read by one (after ``_open``)."""
        return self._fs[3] if self._fs is not None and self._fs[0] == os.getpid() else None

    def _checked(self) -> tuple[Any, str, Optional[SignedUrl]]:
        """The file's filesystem, path and presigned URL (None where it is not read by one), once its
        size is the manifest's."""
        fs, path = range_requests.filesystem(self.url)
        if self.whole:  # its SHA-256 is checked instead: what is read is the manifest's bytes, or refused
            return fs, path, SignedUrl(fs, path) if can_sign(fs) else None
        for attempt in range(streams.RETRIES + 1):
            try:
                size = range_requests.bounded(fs, "size", streams.STALL_WINDOW, path)
                break
            except range_requests.timed_out():  # no answer within the window: asked again, then named
                if attempt == streams.RETRIES:
                    raise range_requests.stalled(self.url, streams.STALL_WINDOW, attempt + 1) from None
                time.sleep(streams.backoff(attempt, None))
            except Exception as e:  # noqa: BLE001 - each backend raises its own (botocore's, aiohttp's)
                raise range_requests.failed(self.url, e) from None
        if size is not None and size != self.size:
            raise ManifestError(
                f"{self.url} is {size} bytes, not the {self.size} of the manifest: the object was "
                "changed or damaged after the manifest was written; run packer verify on the output"
            )
        return fs, path, SignedUrl(fs, path) if can_sign(fs) else None

    def _blocks(self, spans: Iterable[tuple[int, int]]) -> list[int]:
        """The block numbers the byte spans ``[start, end)`` touch, in order, each once."""
        needed: set[int] = set()
        for start, end in spans:
            if not 0 <= start <= end <= self.size:
                raise ManifestError(
                    f"{self.url}: bytes {start} to {end} asked of a file of {self.size}; the output's "
                    "index does not match its files, run packer verify on the output"
                )
            if end > start:
                needed.update(range(start // self.block, (end - 1) // self.block + 1))
        return sorted(needed)

    def _cached(self, number: int) -> Optional[Buffer]:
        """Block ``number`` from memory or the disk cache, or None."""
        data = MEMORY.get((self.key, number))
        if data is None and self.cache is not None:
            data = self.cache.get(self.key, number, self._length(number))
            if data is not None:
                MEMORY.put((self.key, number), data)
        return data

    def _length(self, number: int) -> int:
        return min(self.block, self.size - number * self.block)

    def forget(self, spans: Iterable[tuple[int, int]]) -> None:
        """Drop the blocks of the spans from every cache: they did not match a checksum, and are
        fetched again when next asked for."""
        MEMORY.drop_spans(self.key)
        for n in self._blocks(spans):
            MEMORY.drop((self.key, n))
            if self.cache is not None:
                self.cache.drop(self.key, n)

    def read(self, start: int, end: int) -> Buffer:
        """Bytes ``[start, end)`` of the file, read-only: a view of the answer that holds them (a
        batch's request cut to its samples, ``fetch_all``) or of its block (no copy), else copied
        once from its blocks."""
        numbers = self._blocks([(start, end)])
        if not numbers:
            return b""
        fetched = MEMORY.span(self.key, start, end)  # a sample of the batch, asked for by its bytes
        if fetched is not None:
            return fetched
        parts = [self._cached(n) for n in numbers]
        if any(p is None for p in parts):
            got = _request([(self, [n for n, p in zip(numbers, parts) if p is None], None)])
            parts = [p if p is not None else got[self.key, n] for n, p in zip(numbers, parts)]
        first = numbers[0] * self.block
        if len(parts) == 1:
            return memoryview(parts[0])[start - first : end - first]  # type: ignore[arg-type]
        data, at = bytearray(end - start), 0
        for n, part in zip(numbers, parts):
            begin = max(start, n * self.block) - n * self.block
            piece = memoryview(part)[begin : min(end - n * self.block, len(part))]  # type: ignore[arg-type]
            data[at : at + len(piece)] = piece
            at += len(piece)
        return memoryview(data).toreadonly()


def fetch_all(wanted: Iterable[tuple[RangeSource, Iterable[tuple[int, int]]]], exact: bool = False) -> None:
    """The byte spans of several files fetched at once: every missing block of all of them asked for
    in one round of concurrent requests (one per run of neighbouring blocks).

    ``exact`` (a batch's samples): a run of a file with no disk cache is asked for only from the
    first to the last byte its spans need in it (to ``PAGE``), not from its first block's start to
    its last block's end: a random sample then brings its own bytes, not the blocks around it (a
    150 KB sample spans one or two blocks of 256 KiB). The answer is held for the batch
    (``BlockMemory.spans``) and kept in the memory as blocks are (a later batch's sample that it
    holds is not asked for again), the whole blocks inside it as blocks; a run that a span goes on
    past (into a block held already) is asked for whole, so that the span's bytes are all in blocks."""
    missing = []
    cut: dict[str, list[tuple[int, int, bytes]]] = {}
    for source, spans in wanted:
        spans = list(spans)
        trimmed = exact and source.cache is None and not source.whole
        if trimmed:  # the spans a kept cut answer holds: held for the batch, not asked for
            held = [(span, MEMORY.cut_answer(source.key, *span)) for span in spans]
            answers = {found[:2]: found for _, found in held if found is not None}  # each once
            cut.setdefault(source.key, []).extend(answers.values())
            spans = [span for span, found in held if found is None]
        numbers = [n for n in source._blocks(spans) if source._cached(n) is None]
        if numbers:
            missing.append((source, numbers, spans if trimmed else None))
    MEMORY.batch = _request(missing, cut) if missing else {}
    MEMORY.spans = cut


def _request(
    wanted: list[tuple[RangeSource, list[int], Optional[list[tuple[int, int]]]]],
    spans: Optional[dict[str, list[tuple[int, int, bytes]]]] = None,
) -> dict[tuple[str, int], Buffer]:
    """Fetch the blocks (sorted numbers) of each source: one request per run of neighbours, all of a
    filesystem's at once; each answer's length checked; the whole blocks kept in memory and the disk
    cache. Returns them by ``(source.key, number)``. Where a source comes with its spans, each run is
    asked for as far as they need it (``fetch_all``'s ``exact``), the answers of runs cut so put in
    ``spans`` by the source's key, as ``(start, end, bytes)``, and kept in memory. The blocks whose presigned URLs the
    store refused are asked again, signed again, then through s3fs (``SignedUrl.refused``): three
    rounds at most, the blocks that came kept."""
    got: dict[tuple[str, int], Buffer] = {}
    done: set[tuple[str, int]] = set()
    for attempt in range(3):
        refused = _request_round(wanted, got, done, spans if spans is not None else {})
        if not refused:
            break
        for source, by_store in refused:
            source.signed.refused(bucket=by_store)  # type: ignore[union-attr]
            if attempt:
                source.signed.plain = True  # type: ignore[union-attr]  # refused twice: s3fs's answer tells
        again = {id(source) for source, _ in refused}  # their blocks that came are kept, not asked again
        wanted = [
            (s, [n for n in numbers if (s.key, n) not in done], trim) for s, numbers, trim in wanted if id(s) in again
        ]
    if refused:  # a guard: the third round goes through s3fs, which is never refused
        raise ManifestError(f"reading {refused[0][0].url} failed: its presigned URL was refused, and s3fs's read too")
    return got


def _trimmed(start: int, end: int, spans: list[tuple[int, int]]) -> tuple[int, int]:
    """The bytes ``[start, end)`` of a run of blocks cut to those the ``spans`` need in it (to ``PAGE``).

    A run a span goes on past (into a block held already) is not cut: that span is read from blocks,
    so the run's must be whole. Spans side by side (two samples or more read in order, or several in
    one HDF5 chunk) keep the run's end: the next batch's samples are likely the bytes after them,
    which the answer, kept in memory, then holds (samples of a few hundred bytes read in order
    would otherwise ask for the same block again at each batch)."""
    inside = sorted((a, b) for a, b in spans if a < end and b > start and b > a)
    if not inside:
        return start, end
    first, last = inside[0][0], max(b for _, b in inside)
    if first < start or last > end:
        return start, end
    reach, in_order = inside[0][1], len(inside) > 1
    for a, b in inside[1:]:
        in_order = in_order and a <= reach
        reach = max(reach, b)
    return max(start, first - first % PAGE), end if in_order else min(end, last + (-last) % PAGE)


def _request_round(
    wanted: list[tuple[RangeSource, list[int], Optional[list[tuple[int, int]]]]],
    got: dict[tuple[str, int], Buffer],
    done: set[tuple[str, int]],
    spans: dict[str, list[tuple[int, int, bytes]]],
) -> list[tuple[RangeSource, bool]]:
    """One try of ``_request``: the blocks fetched put in ``got`` (whole ones) and ``done`` (every
    block of a run that came, cut or not), the cut runs' answers in ``spans``; returns the sources
    whose presigned URLs were refused, each with whether the store refused it (not a failure to
    connect). A refused source's runs that did come are kept (``_request`` asks for the others only)."""
    _open_all([source for source, _, _ in wanted])
    asks: dict[int, tuple[Any, list[tuple[RangeSource, str, list[int], int, int, bool]]]] = {}  # by filesystem
    for source, numbers, trim in wanted:
        fs, path = source._open()
        runs: list[list[int]] = []
        for n in numbers:
            if runs and n == runs[-1][-1] + 1:
                runs[-1].append(n)
            else:
                runs.append([n])
        for run in runs:
            start, end = run[0] * source.block, run[-1] * source.block + source._length(run[-1])
            cut = _trimmed(start, end, trim) if trim is not None else (start, end)
            asks.setdefault(id(fs), (fs, []))[1].append((source, path, run, *cut, cut != (start, end)))
    refused: list[tuple[RangeSource, bool]] = []
    for fs, runs in asks.values():
        answers = range_requests.answers(fs, runs, [r[3] for r in runs], [r[4] for r in runs])
        for (source, _, run, start, end, cut), data in zip(runs, answers):
            signed = source.signed
            signed = signed if signed is not None and not signed.plain else None  # by a presigned URL
            if data is REFUSED_URL or data is UNREACHED_URL or (signed is not None and len(data) != end - start):
                # by a presigned URL: refused, or answered with something else than the range (a
                # redirect to another region, which fsspec does not raise for), or not reached
                if all(s is not source for s, _ in refused):
                    refused.append((source, data is not UNREACHED_URL))
                continue
            Requests.bytes += len(data)
            if signed is not None:
                signed.worked = True
            if len(data) != end - start and source.whole and start == 0 and end == source.size:
                raise ManifestError(  # the whole file asked: a shorter answer is a shorter object
                    f"{source.url} is not the {source.size} bytes of the manifest (got {len(data)}): the object "
                    "was changed or damaged after the manifest was written; run packer verify on the output"
                )
            if len(data) != end - start:
                raise ManifestError(
                    f"{source.url}: asked for bytes {start} to {end}, got {len(data)} bytes: the server "
                    "does not answer range requests, or the object changed. Read the output with "
                    "download=True and cache_dir= (each shard file downloaded whole, then checked)"
                )
            done.update((source.key, n) for n in run)
            if cut:
                spans.setdefault(source.key, []).append((start, end, data))
                MEMORY.put_span(source.key, start, end, data)  # for later batches, as blocks are kept
            view = memoryview(data)
            for n in run:
                at = n * source.block - start
                if at < 0 or at + source._length(n) > end - start:
                    continue  # a block the cut run holds part of: not a block of the caches
                # a view of the run's answer, not a copy: the answer stays while any of its blocks
                # does, and the memory counts it whole (``_Memory``)
                block = view[at : at + source._length(n)] if len(run) > 1 or cut else data
                got[source.key, n] = block
                MEMORY.put((source.key, n), block)
                if source.cache is not None:
                    source.cache.put(source.key, n, block)
    return refused


def _open_all(sources: list[RangeSource]) -> None:
    """Open the sources not yet open in this process (``RangeSource._open``: a request for the size of
    each file not read whole) at once, on up to ``CONCURRENT`` threads, where they would be asked in
    turn: the first batch of a worker opens every shard it touches. The first failure is raised."""
    here = os.getpid()
    unopened = list({id(s): s for s in sources if not s.whole and (s._fs is None or s._fs[0] != here)}.values())
    if len(unopened) < 2:
        return  # _open asks for it, if any
    pool = ThreadPoolExecutor(min(CONCURRENT, len(unopened)))
    try:
        for done in [pool.submit(s._open) for s in unopened]:
            done.result()
    finally:  # the first failure raised at once: the requests not yet made are not made
        pool.shutdown(wait=False, cancel_futures=True)
