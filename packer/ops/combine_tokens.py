"""``packer combine`` of token outputs: corpora tokenized alike as one output of their blocks.

The inputs must hold blocks of one size, from one tokenizer (by its SHA-256), with the same
end-of-text, beginning and padding ids, the same packing and the same stored dtype, in one format
and format version: then a block means the same in each, and the inputs' shards become the
output's, in input order, hard-linked where the filesystem allows (LMDB files copied, as for every
combine). The ``tokens`` section adds up the inputs' counts; the blocks of one input do not continue
into the next (each input's last block keeps its own length).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from packer import __version__
from packer.ops.convert import ConvertResult
from packer.output.finish import name_shards
from packer.output.placed_shards import combine_entry, input_names, place_shard
from packer.records import ShardResult, Skipped
from packer.run.executor import ProgressFn
from packer.run.plan import shard_name
from packer.run.staging import Staging
from packer.spec.errors import InputError
from packer.spec.manifest import Manifest, ShardEntry
from packer.spec.token_blocks import TokenSection

ALIKE = ("block", "dtype", "packing", "eos", "bos", "pad_id", "vocab_size")
"""What two token outputs must share for their blocks to be combined, beside the tokenizer."""

COUNTED = ("documents", "tokens", "stored", "padding", "dropped")
"""The ``tokens`` section's counts, added up over the inputs."""


def check_tokens_alike(roots: list[Path], manifests: list[Manifest]) -> TokenSection:
    """The first input's ``tokens`` section when every input's blocks mean the same; InputError naming
    the first input that differs, and how."""
    first = manifests[0]
    for root, m in zip(roots, manifests):
        if (m.tokens is None) != (first.tokens is None):
            raise InputError(f"{root} and {roots[0]}: only one holds token blocks, the other samples")
    assert first.tokens is not None
    mine = first.tokens
    for root, m in zip(roots[1:], manifests[1:]):
        theirs = m.tokens
        assert theirs is not None
        if m.format != first.format or m.format_version != first.format_version:
            raise InputError(
                f"{root} is {m.format} version {m.format_version} and {roots[0]} {first.format} version "
                f"{first.format_version}: convert its corpus again with -f {first.format}"
            )
        if theirs.tokenizer.get("sha256") != mine.tokenizer.get("sha256"):
            raise InputError(
                f"{root} was tokenized with another tokenizer than {roots[0]} ({theirs.tokenizer.get('file')} "
                f"sha256 {str(theirs.tokenizer.get('sha256'))[:12]} against {mine.tokenizer.get('file')} "
                f"{str(mine.tokenizer.get('sha256'))[:12]}): their ids mean other tokens"
            )
        for key in ALIKE:
            if getattr(theirs, key) != getattr(mine, key):
                raise InputError(
                    f"{root} and {roots[0]} have another {key} ({getattr(theirs, key)!r} against "
                    f"{getattr(mine, key)!r}): convert their corpora with the same options"
                )
    return mine


def combine_tokens(
    roots: list[Path],
    manifests: list[Manifest],
    output: Path,
    *,
    overwrite: bool,
    link: bool,
    progress: Optional[ProgressFn] = None,
) -> ConvertResult:
    """Combine the token outputs ``roots`` (their ``manifests`` read) into ``output`` (see the module)."""
    started = time.perf_counter()
    section = check_tokens_alike(roots, manifests)
    with Staging(output) as staging:
        staging.start()
        with staging.writing(resumable=False) as stage:  # nothing to resume: a combine is run again
            results: list[ShardResult] = []
            for root, m in zip(roots, manifests):
                for shard in m.shards:
                    results.append(place_shard(stage, root, shard, shard_name(len(results)), link))
                    if progress is not None:
                        progress(shard.samples)
            results = name_shards(stage, results, [shard_name(i) for i in range(len(results))])
            manifest = _manifest(roots, manifests, section, results)
            staging.publish(manifest, overwrite=overwrite)
    skipped = [Skipped(s["path"], s["reason"]) for s in manifest.skipped]
    return ConvertResult(output, manifest, time.perf_counter() - started, skipped)


def _manifest(
    roots: list[Path], manifests: list[Manifest], section: TokenSection, results: list[ShardResult]
) -> Manifest:
    first = manifests[0]
    counts = {key: sum(getattr(m.tokens, key) for m in manifests) for key in COUNTED}
    # The inputs' document orders one after another are no seed's order of the whole.
    tokens = TokenSection(**{**section.to_dict(), **counts, "shuffle_seed": None})
    names = input_names(roots)
    blocks = sum(r.samples for r in results)
    return Manifest(
        format=first.format,
        format_version=first.format_version,
        packer_version=__version__,
        samples=blocks,
        classes=None,
        fields={},
        preprocess={},
        shards=[ShardEntry(r.name, r.samples, r.files) for r in results],
        skipped=[{**s, "input": name} for name, m in zip(names, manifests) for s in m.skipped],
        source={"files": sum(int(m.source.get("files", 0)) for m in manifests)},
        sharding={"blocks_per_shard": "as the inputs'"},
        tokens=tokens,
        history=[combine_entry(names, roots, manifests, blocks)],
    )


__all__ = ["combine_tokens", "check_tokens_alike", "ALIKE"]
