"""``packer convert CORPUS --pack BLOCK``: a text corpus tokenized once and packed into blocks.

The stages: read the corpus's documents (``packer.sources.corpus``), tokenize them into one file in
the staging folder (``packer.tokens.tokenizing``), plan the blocks (``packer.tokens.packing``), write
each shard's stream, blocks and document starts with the format's token writer, then publish the
folder with its manifest through ``Staging``, as every operation does: a reader never sees a half
written output, and a failed run leaves nothing behind.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from packer import __version__
from packer.config import PackConfig
from packer.output.files import check_output
from packer.output.finish import content_tag, published_name
from packer.records import ShardResult, Skipped
from packer.run.staging import Staging
from packer.sources.corpus import CorpusConfig, corpus_files, read_documents
from packer.spec.entries import FileEntry
from packer.spec.errors import InputError
from packer.spec.listed_files import file_entry
from packer.spec.manifest import Manifest, ShardEntry
from packer.spec.registry import TOKENS_SINCE, get_format
from packer.spec.token_blocks import TokenSection, tokenizer_record
from packer.tokens.packing import PackPlan, ShardPlan, best_fit_plan, concat_plan, document_order
from packer.tokens.tokenizing import CorpusTokenizer, Tokenized, corpus_tokenizer, tokenize

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
) -> PackResult:
    """Tokenize and pack the corpus ``source`` into the token output ``output`` (see the module)."""
    started = time.perf_counter()
    source, output = Path(source), Path(output)
    files = corpus_files(source)
    check_output(output, overwrite, source)
    tokenizer = corpus_tokenizer(config.tokenizer, config.eos, config.bos, config.bos_id)
    corpus = CorpusConfig(config.documents, config.text_key, config.encoding, config.strict)
    skipped: list[Skipped] = []
    with Staging(output) as staging:
        stage = staging.start({"packer": __version__, "operation": "pack"})
        with staging.writing(resumable=False):
            documents = read_documents(files, corpus, skipped.append, source)
            tokenized = tokenize(documents, tokenizer, stage / SPILL_NAME, skipped.append, config.strict, progress)
            tokenize_seconds = time.perf_counter() - started
            if not len(tokenized.lengths):
                raise InputError(f"{source} holds no document to tokenize ({len(skipped)} skipped)")
            order = document_order(len(tokenized.lengths), config.shuffle_seed)
            spec = get_format(config.format)
            plan_of = concat_plan if config.packing == "concat" else best_fit_plan
            plan = plan_of(tokenized.lengths, order, config.block, config.blocks_per_shard(tokenizer.dtype.itemsize))
            results = _write_shards(stage, plan, tokenized, spec)
            os.unlink(stage / SPILL_NAME)
            manifest = _manifest(config, tokenizer, tokenized, plan, results, skipped, source, len(files))
            staging.publish(manifest, overwrite=overwrite, source=source)
    return PackResult(output, manifest, skipped, time.perf_counter() - started, tokenize_seconds)


def _write_shards(stage: Path, plan: PackPlan, tokenized: Tokenized, spec) -> list[ShardResult]:
    """Write every shard of ``plan`` from the tokenized corpus; their results under published names."""
    ids = tokenized.ids()
    offsets = np.concatenate(([0], np.cumsum(tokenized.lengths)))
    writer_class = spec.token_writer_class()
    structure = spec.structure_checksum()  # LMDB's: readers check it before the library maps the file
    written = []
    for number, shard in enumerate(plan.shards):
        name = f"shard-{number:05d}"
        writer = writer_class(stage, name, tokenized.dtype, shard.tokens)
        for doc, start, length in shard.pieces.tolist():
            begin = int(offsets[doc]) + start
            writer.write(ids[begin : begin + length])
        names = writer.close(shard.spans, _piece_starts(shard))
        files = [file_entry(stage, n, writer.digests.get(n), structure) for n in names]
        written.append(ShardResult(name, shard.blocks, files))
    tag = content_tag(written)
    renamed = []
    for position, result in enumerate(written):
        new = published_name(position, tag)
        files = []
        for f in result.files:
            path = new + f.path[len(result.name) :]
            os.replace(stage / f.path, stage / path)
            files.append(FileEntry(path, f.bytes, f.sha256, f.structure_crc32))
        renamed.append(ShardResult(new, result.samples, files))
    return renamed


def _piece_starts(shard: ShardPlan) -> np.ndarray:
    """Where each piece of a shard's stream starts in it: each document's (or its piece's) first id."""
    sizes = shard.pieces[:, 2]
    return np.cumsum(sizes) - sizes


def _manifest(
    config: PackConfig,
    tokenizer: CorpusTokenizer,
    tokenized: Tokenized,
    plan: PackPlan,
    results: list[ShardResult],
    skipped: list[Skipped],
    source: Path,
    files: int,
) -> Manifest:
    section = TokenSection(
        block=config.block,
        dtype=tokenized.dtype.name,
        packing=config.packing,
        eos=tokenizer.eos,
        bos=tokenizer.bos,
        pad_id=tokenizer.eos,
        vocab_size=tokenizer.vocab_size,
        tokenizer=tokenizer_record(tokenizer.path, tokenizer.vocab_size),
        documents=len(tokenized.lengths),
        tokens=tokenized.tokens,
        stored=plan.stored,
        padding=plan.padding,
        dropped=0,
        shuffle_seed=config.shuffle_seed,
        text={"documents": config.documents, "text_key": config.text_key, "encoding": config.encoding},
    )
    return Manifest(
        format=config.format,
        format_version=TOKENS_SINCE,
        packer_version=__version__,
        samples=plan.blocks,
        classes=None,
        fields={},
        preprocess={},
        shards=[ShardEntry(r.name, r.samples, r.files) for r in results],
        skipped=[s.to_dict() for s in skipped],
        source={"path": str(source), "files": files},
        sharding={"blocks_per_shard": max((s.blocks for s in plan.shards), default=0)},
        tokens=section,
    )


__all__ = ["pack_corpus", "PackResult", "SPILL_NAME"]
