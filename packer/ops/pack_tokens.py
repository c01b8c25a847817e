"""``packer convert CORPUS --pack BLOCK``: a text corpus tokenized once and packed into blocks.

The stages: read the corpus's documents (``packer.sources.corpus``), tokenize them into one file in
the staging folder (``packer.tokens.tokenizing``), plan the blocks (``packer.tokens.packing``), write
each shard's stream, blocks and document starts with the format's token writer, then publish the
folder with its manifest through ``Staging``, as every operation does: a reader never sees a half
written output, and a failed run leaves nothing behind but for an interrupt, which keeps what was
tokenized for ``--resume`` (``packer.tokens.progress``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from packer import __version__
from packer.config import PackConfig
from packer.output.files import PLAN_RECORD, STAGING_MARK, check_output
from packer.output.held_files import HeldFiles
from packer.output.placed_shards import place_shard
from packer.records import ShardResult, Skipped
from packer.run.plan import shard_name
from packer.run.staging import Staging
from packer.sources.corpus import CorpusConfig, corpus_files
from packer.spec.errors import ConfigError, InputError, OutputError
from packer.spec.listed_files import file_entry, sha256_of
from packer.spec.manifest import MANIFEST_NAME, Manifest, ShardEntry, read_manifest
from packer.spec.registry import TOKENS_SINCE, get_format
from packer.spec.token_blocks import MAX_SHARD_TOKENS, TokenSection, tokenizer_record
from packer.system import stop_signals_held
from packer.tokens.packing import PackPlan, ShardPlan, best_fit_plan, concat_plan, document_order
from packer.tokens.progress import PROGRESS_NAME, Progress, Tracker, fingerprint
from packer.tokens.tokenizing import CorpusTokenizer, Tokenized, corpus_tokenizer, lengths_path, tokenize

log = logging.getLogger(__name__)

APPEND = "pack-append"
"""The operation a token append's plan records (``--resume`` continues only a run of the same one)."""

SPILL_NAME = "corpus.ids"
"""The tokenized corpus in the staging folder, removed before publishing."""


@dataclass
class PackResult:
    """What a token conversion wrote: its manifest, the documents skipped, and how long it took."""

    output: Path
    manifest: Manifest
    skipped: list[Skipped] = field(default_factory=list)
    seconds: float = 0.0
    tokenize_seconds: float = 0.0


def pack_corpus(
    source: Path,
    output: Path,
    config: PackConfig,
    *,
    overwrite: bool = False,
    progress: Optional[Callable[[int], None]] = None,
    resume: bool = False,
) -> PackResult:
    """Tokenize and pack the corpus ``source`` into the token output ``output`` (see the module).
    ``resume``: go on from the tokenizing an interrupted run left in the staging folder
    (``packer.tokens.progress``), refused where the corpus files or the options that shape the ids
    changed since."""
    started = time.perf_counter()
    source, output = Path(source), Path(output)
    files = corpus_files(source)
    check_output(output, overwrite, source)
    tokenizer = corpus_tokenizer(config.tokenizer, config.eos, config.bos, config.bos_id)
    _blocks_per_shard(config, tokenizer)  # a bad --shard-size refused before any work, kept work included
    records = [corpus_record(f, source) for f in files]  # before any work: --resume compares them
    plan = {"packer": __version__, "operation": "pack", "fingerprint": _fingerprint(records, config, tokenizer)}
    skipped: list[Skipped] = []
    with Staging(output) as staging:
        start = _resumed(staging, plan, tokenizer.dtype.itemsize) if resume else None
        if start is None and staging.plan() is not None:
            log.warning("discarding the unfinished run of %s (pass --resume to continue it)", staging.shown)
        if start is None:
            staging.start(plan)
        tokenized = lambda: (staging.folder / PROGRESS_NAME).is_file()  # noqa: E731 - hours of work: kept on a failure
        with staging.writing(resumable=True, kept=tokenized):
            packed = _pack(staging, source, files, config, tokenizer, skipped, progress, records=records, start=start)
            manifest = Manifest(
                format=config.format,
                format_version=TOKENS_SINCE,
                packer_version=__version__,
                samples=packed.plan.blocks,
                classes=None,
                fields={},
                preprocess={},
                shards=[ShardEntry(r.name, r.samples, r.files) for r in packed.results],
                skipped=[s.to_dict() for s in skipped],
                source={"files": len(files), "corpus": packed.records},
                sharding={"blocks_per_shard": max((s.blocks for s in packed.plan.shards), default=0)},
                tokens=_section(config, tokenizer, packed),
            )
            staging.publish(manifest, overwrite=overwrite, source=source)
    return PackResult(output, manifest, skipped, time.perf_counter() - started, packed.seconds)


def append_corpus(
    source: Path,
    output: Path,
    config: PackConfig,
    *,
    progress: Optional[Callable[[int], None]] = None,
    resume: bool = False,
) -> PackResult:
    """Add the corpus files of ``source`` that the token output ``output`` does not hold yet as new
    shards after its own, tokenized and packed as it was (see ``check_appendable``); its shards stay
    as they are (in a bucket: where they are, ``packer.output.held_files``). InputError when there
    is nothing new, or a file it holds has changed since. ``resume``: as ``pack_corpus``'s, for an
    append to the same output (refused where the output changed since the interrupted run)."""
    started = time.perf_counter()
    source, output = Path(source), Path(output)
    old = read_manifest(output)
    tokenizer = corpus_tokenizer(config.tokenizer, config.eos, config.bos, config.bos_id)
    check_appendable(output, old, config, tokenizer)
    if "corpus" not in old.source:
        raise InputError(
            f"{output} records no corpus files (a packer combine of token outputs), so what it holds of "
            f"{source} is not known: pack the new files into an output of their own and combine the two"
        )
    held = {r[0]: r for r in old.source["corpus"]}
    files, records = [], []
    for path in corpus_files(source):
        record = corpus_record(path, source)
        if record[0] not in held:
            files.append(path)
            records.append(record)
        elif held[record[0]] != record:
            raise InputError(
                f"{path} has changed since it was packed into {output}: its old documents are in the output. "
                "Convert the corpus again, or give its new text a file of its own"
            )
    if not files:
        raise InputError(f"nothing to append: every corpus file of {source} is in {output} already")
    skipped: list[Skipped] = []
    assert old.tokens is not None
    # what the new ids depend on, and the output they are appended to: a resumed append adds to that one
    grown = f"{_fingerprint(records, config, tokenizer)}\0{sha256_of(output / MANIFEST_NAME)}"
    plan = {"packer": __version__, "operation": APPEND, "fingerprint": hashlib.sha256(grown.encode()).hexdigest()}
    in_bucket = HeldFiles.of(output).store is not None
    with Staging(output) as staging:
        start = _resumed(staging, plan, tokenizer.dtype.itemsize) if resume else None
        if start is None and staging.plan() is not None:
            log.warning("discarding the unfinished run of %s (pass --resume to continue it)", staging.shown)
        stage = staging.start(plan) if start is None else staging.folder
        tokenized = lambda: (stage / PROGRESS_NAME).is_file()  # noqa: E731 - hours of work: kept on a failure
        with staging.writing(resumable=True, kept=tokenized):
            if not in_bucket:  # in a bucket they stay where they are, under the names the new manifest lists
                for shard in old.shards:  # linked as they are: the appended output keeps them
                    place_shard(stage, output, shard, shard.name, True)
            packed = _pack(
                staging, source, files, config, tokenizer, skipped, progress, len(old.shards), records, start
            )
            counts = _section(config, tokenizer, packed)
            section = replace(
                old.tokens,
                **{
                    k: getattr(old.tokens, k) + getattr(counts, k) for k in ("documents", "tokens", "stored", "padding")
                },
            )
            manifest = replace(
                old,
                packer_version=__version__,
                samples=old.samples + packed.plan.blocks,
                shards=[*old.shards, *(ShardEntry(r.name, r.samples, r.files) for r in packed.results)],
                skipped=[*old.skipped, *(s.to_dict() for s in skipped)],
                source={"files": int(old.source.get("files", 0)) + len(files), "corpus": [*held.values(), *records]},
                tokens=section,
                history=[
                    *old.history,
                    {
                        "action": "append",
                        "packer_version": __version__,
                        "files": len(files),
                        "blocks": packed.plan.blocks,
                    },
                ],
            )
            staging.publish(manifest, overwrite=True)
    return PackResult(output, manifest, skipped, time.perf_counter() - started, packed.seconds)


def _fingerprint(records: list[list], config: PackConfig, tokenizer: CorpusTokenizer) -> str:
    """The fingerprint of what a tokenizing of the corpus files ``records`` gives (``progress.fingerprint``)."""
    reading = CorpusConfig(config.documents, config.text_key, config.encoding, config.strict)
    record = tokenizer_record(tokenizer.path, tokenizer.vocab_size)
    return fingerprint(records, record, tokenizer.eos, tokenizer.bos, reading)


def _resumed(staging: Staging, plan: dict, itemsize: int) -> Optional[Progress]:
    """The progress an interrupted token conversion left in ``staging``'s folder (an empty one where
    it recorded none yet, or its files hold less than the record: ``itemsize``, the ids'); None, with
    a warning, where there is no interrupted run. OutputError where its corpus or options differ
    from ``plan``'s."""
    previous = staging.plan()
    if previous is None:
        log.warning("--resume: no interrupted run of %s to continue; starting a new one", staging.shown)
        return None
    if previous.get("packer") != plan["packer"]:
        raise OutputError(
            f"the interrupted run of {staging.shown} was started by packer {previous.get('packer')}, which may read "
            f"or tokenize the corpus otherwise than packer {plan['packer']}; run without --resume to start over"
        )
    if previous.get("operation") != plan["operation"] or previous.get("fingerprint") != plan["fingerprint"]:
        what = "the output appended to, " if plan["operation"] == APPEND else ""
        raise OutputError(
            f"{what}the corpus files or the tokenizing options changed since the interrupted run of {staging.shown} "
            f"(or it was not a token {'append' if what else 'conversion'}); run without --resume to start over"
        )
    start = Progress.read(staging.folder) or Progress()
    spill = staging.folder / SPILL_NAME
    if not start.holds(spill, lengths_path(spill), itemsize):
        log.warning("--resume: the files in %s are shorter than their record; tokenizing again", staging.folder)
        start = Progress()
    kept = {PLAN_RECORD, STAGING_MARK, PROGRESS_NAME, spill.name, lengths_path(spill).name}
    for entry in staging.folder.iterdir():  # shards the interrupted run began or named: written again
        if entry.name not in kept and entry.is_file():
            entry.unlink()
    log.info("resuming: %d documents tokenized already", start.documents)
    return start


def check_appendable(output: Path, old: Manifest, config: PackConfig, tokenizer: CorpusTokenizer) -> None:
    """InputError unless ``output`` is a token output whose blocks the new documents can join: the
    same format, tokenizer (by its SHA-256), block size, packing, added ids and dtype."""
    if old.tokens is None:
        raise InputError(f"{output} holds samples, not token blocks: --append with --pack grows a token output")
    s = old.tokens
    record = tokenizer_record(tokenizer.path, tokenizer.vocab_size)
    if record["sha256"] != s.tokenizer.get("sha256"):
        raise InputError(
            f"{tokenizer.path} is not the tokenizer {output} was made with ({s.tokenizer.get('file')}, sha256 "
            f"{str(s.tokenizer.get('sha256'))[:12]}): its ids would mean other tokens"
        )
    given = {
        "format": config.format,
        "block": config.block,
        "packing": config.packing,
        "eos": tokenizer.eos,
        "bos": tokenizer.bos,
        "dtype": tokenizer.dtype.name,
    }
    held = {"format": old.format, **{k: getattr(s, k) for k in ("block", "packing", "eos", "bos", "dtype")}}
    text = {"documents": config.documents, "text_key": config.text_key, "encoding": config.encoding}
    given.update(text)
    held.update({k: s.text.get(k, v) for k, v in text.items()})
    for key, value in given.items():
        if value != held[key]:
            raise InputError(
                f"{output} was packed with {key} {held[key]!r}, not {value!r}: append with the options it was made with"
            )


def corpus_record(path: Path, root: Path) -> list:
    """What the manifest keeps of one corpus file, to tell a new file from one already packed: its path
    relative to the corpus, its size and SHA-256."""
    relative = os.path.relpath(path, root) if Path(root).is_dir() else Path(path).name
    return [relative, path.stat().st_size, sha256_of(path)]


@dataclass
class _Packed:
    """What ``_pack`` wrote: the plan, its shards' results, the tokenized corpus's counts, the files'
    records, and how long tokenizing took."""

    plan: PackPlan
    results: list[ShardResult]
    documents: int
    tokens: int
    dtype: np.dtype
    records: list[list]
    seconds: float


def _pack(
    staging: Staging,
    source: Path,
    files: list[Path],
    config: PackConfig,
    tokenizer: CorpusTokenizer,
    skipped: list[Skipped],
    progress: Optional[Callable[[int], None]],
    first: int = 0,
    records: Optional[list[list]] = None,
    start: Optional[Progress] = None,
) -> _Packed:
    """Read, tokenize, plan and write the shards of ``files`` into ``staging``'s folder, numbered from
    ``first``; ``records``: the files' ``corpus_record`` where known already; ``start``: the progress
    of an interrupted tokenizing to go on from (``--resume``)."""
    started = time.perf_counter()
    stage = staging.folder
    per_shard = _blocks_per_shard(config, tokenizer)
    corpus = CorpusConfig(config.documents, config.text_key, config.encoding, config.strict)
    spill = stage / SPILL_NAME
    track = Tracker(stage, files, corpus, source, skipped.append, start, (spill.name, lengths_path(spill).name))
    begin = (start.documents, start.ids) if start is not None else (0, 0)
    tokenized = tokenize(
        track.documents(), tokenizer, spill, track.report, config.strict, progress, start=begin, written=track.written
    )
    track.finish()  # tokenized whole: an interrupt from here on tokenizes nothing again
    seconds = time.perf_counter() - started
    if not len(tokenized.lengths):
        raise InputError(f"{source} holds no document to tokenize ({len(skipped)} skipped)")
    order = document_order(len(tokenized.lengths), config.shuffle_seed)
    plan_of = concat_plan if config.packing == "concat" else best_fit_plan
    plan = plan_of(tokenized.lengths, order, config.block, per_shard)
    results = _write_shards(staging, plan, tokenized, get_format(config.format), first)
    sink = staging.sink
    with stop_signals_held():  # never published; deleted, the record first; set aside, the data first
        scratches = (stage / PROGRESS_NAME, spill, lengths_path(spill))
        for scratch in scratches if sink is None else scratches[::-1]:
            if sink is None:
                scratch.unlink(missing_ok=True)
            elif scratch.is_file():  # a bucket's: kept until the output is up, for a --resume if the upload fails
                sink.set_aside(scratch)
        if sink is not None:
            for record in (PLAN_RECORD, STAGING_MARK):
                sink.set_aside(stage / record, copy=True)
    records = records if records is not None else [corpus_record(f, source) for f in files]
    return _Packed(plan, results, len(tokenized.lengths), tokenized.tokens, tokenized.dtype, records, seconds)


def _blocks_per_shard(config: PackConfig, tokenizer: CorpusTokenizer) -> int:
    """The blocks a shard holds; ConfigError where a shard of them is more than the format can hold
    (known before any work, not after an hour of tokenizing)."""
    per_shard = config.blocks_per_shard(tokenizer.dtype.itemsize)
    if per_shard * (config.block + 1) > MAX_SHARD_TOKENS:
        raise ConfigError(
            f"--shard-size: {per_shard} blocks of {config.block + 1} ids are more than a shard's uint32 "
            f"positions ({MAX_SHARD_TOKENS}); use a smaller --shard-size"
        )
    most = getattr(get_format(config.format).token_writer_class(), "max_stream_bytes", None)
    if most is not None and per_shard * (config.block + 1) * tokenizer.dtype.itemsize > most:
        raise ConfigError(
            f"--shard-size: {per_shard} blocks of {config.block + 1} ids are more than a {config.format} shard "
            f"holds ({most} bytes); use a smaller --shard-size"
        )
    return per_shard


def _write_shards(staging: Staging, plan: PackPlan, tokenized: Tokenized, spec, first: int = 0) -> list[ShardResult]:
    """Write every shard of ``plan`` from the tokenized corpus into ``staging``'s folder, each handed
    on as it is written (an output in a bucket uploads it then: the local disk holds a few shards
    beside the tokenized corpus, not the output twice); their results under published names,
    numbered from ``first`` (an append's follow the output's)."""
    stage = staging.folder
    ids = tokenized.ids()
    offsets = np.concatenate(([0], np.cumsum(tokenized.lengths)))
    writer_class = spec.token_writer_class()
    structure = spec.structure_checksum()  # LMDB's: readers check it before the library maps the file
    written = []
    for number, shard in enumerate(plan.shards):
        name = shard_name(number)
        writer = writer_class(stage, name, tokenized.dtype, shard.tokens)
        for doc, start, length in shard.pieces.tolist():
            begin = int(offsets[doc]) + start
            writer.write(ids[begin : begin + length])
        names = writer.close(shard.spans, _piece_starts(shard))
        files = [file_entry(stage, n, writer.digests.get(n), structure) for n in names]
        written.append(ShardResult(name, shard.blocks, files))
        staging.take(written[-1])
    return staging.name_shards(written, [r.name for r in written], first)


def _piece_starts(shard: ShardPlan) -> np.ndarray:
    """Where each piece of a shard's stream starts in it: each document's (or its piece's) first id."""
    sizes = shard.pieces[:, 2]
    return np.cumsum(sizes) - sizes


def _section(config: PackConfig, tokenizer: CorpusTokenizer, packed: _Packed) -> TokenSection:
    """The ``tokens`` section of what ``_pack`` wrote."""
    return TokenSection(
        block=config.block,
        dtype=packed.dtype.name,
        packing=config.packing,
        eos=tokenizer.eos,
        bos=tokenizer.bos,
        pad_id=tokenizer.eos,
        vocab_size=tokenizer.vocab_size,
        tokenizer=tokenizer_record(tokenizer.path, tokenizer.vocab_size),
        documents=packed.documents,
        tokens=packed.tokens,
        stored=packed.plan.stored,
        padding=packed.plan.padding,
        dropped=0,
        shuffle_seed=config.shuffle_seed,
        text={"documents": config.documents, "text_key": config.text_key, "encoding": config.encoding},
    )


__all__ = ["pack_corpus", "append_corpus", "check_appendable", "corpus_record", "PackResult", "SPILL_NAME"]
