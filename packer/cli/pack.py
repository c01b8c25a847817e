"""``packer convert CORPUS --pack BLOCK``: the options a token conversion takes, checked, the run with a
progress bar, and its summary (``packer.ops.pack_tokens`` does the work)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import click
from tqdm import tqdm

from packer.cli.option_values import parse_shard_size
from packer.cli.render import human, shown_as, skipped_summary
from packer.cli.running import reported
from packer.cli.signals import stop_on_signals
from packer.config import PackConfig
from packer.ops.pack_tokens import PackResult, append_corpus, pack_corpus
from packer.output.files import staging_dir
from packer.output.report import REPORT_NAME
from packer.output.shard_uploads import sink_for
from packer.spec.errors import ConfigError, DecodeError
from packer.spec.manifest import read_manifest
from packer.tokens.progress import PROGRESS_NAME

PACK_OPTIONS = frozenset(
    {
        "source",
        "fmt",
        "output",
        "shard_size",
        "shuffle_seed",
        "encoding",
        "tokenizer",
        "workers",
        "strict",
        "overwrite",
        "resume",
        "append_",
        "quiet",
        "pack",
        "pack_mode",
        "documents",
        "text_key",
        "eos",
        "bos",
        "bos_id",
    }
)
"""The parameters of ``packer convert`` a token conversion uses; any other given is refused."""


def run_pack(ctx: click.Context) -> None:
    """Run the token conversion ``ctx``'s parameters ask for (see the module); click errors for options
    that do not apply, a missing tokenizer, bad input with ``--strict``."""
    p = ctx.params
    given = sorted(
        name
        for name in p
        if name not in PACK_OPTIONS and ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
    )
    if given:
        flags = ", ".join("--" + name.removesuffix("_").replace("_", "-") for name in given)
        raise click.UsageError(f"{flags}: not an option of a token conversion (--pack); leave it out")
    if p["tokenizer"] is None:
        raise click.UsageError("--pack tokenizes the corpus: pass --tokenizer tokenizer.json")
    source: Path = p["source"]
    output: Optional[Path] = p["output"]
    if output is None:
        resolved = source.resolve()
        output = resolved.parent / f"{resolved.stem}-{p['fmt']}"
    if p["workers"] is not None:
        # tokenizers' thread pool reads this once, when it first encodes in this process
        os.environ["RAYON_NUM_THREADS"] = str(p["workers"])
    bars: list[tqdm] = []
    with stop_on_signals(), reported(bars, lambda: _interrupted(output, p["append_"])):
        try:
            config = PackConfig(
                p["fmt"],
                p["pack"],
                p["tokenizer"],
                packing=p["pack_mode"],
                eos=p["eos"],
                bos=p["bos"] or p["bos_id"] is not None,
                bos_id=p["bos_id"],
                documents=p["documents"],
                text_key=p["text_key"],
                encoding=p["encoding"],
                shuffle_seed=p["shuffle_seed"],
                shard_size=parse_shard_size(p["shard_size"]),
                strict=p["strict"],
            )
        except ConfigError as e:
            raise click.UsageError(str(e)) from None
        bars.append(tqdm(unit="doc", disable=p["quiet"], dynamic_ncols=True, desc="tokenizing"))
        try:
            if p["append_"]:
                if p["output"] is None:
                    raise click.UsageError("--append adds to an existing token output: give it with -o OUTPUT")
                before = read_manifest(output).samples
                result = append_corpus(source, output, config, progress=bars[-1].update, resume=p["resume"])
                click.echo(f"packer: appended {result.manifest.samples - before:,} blocks to {output}")
            else:
                result = pack_corpus(
                    source, output, config, overwrite=p["overwrite"], progress=bars[-1].update, resume=p["resume"]
                )
        except DecodeError as e:
            raise click.ClickException(f"stopped at the first bad document (--strict), nothing written: {e}") from None
    pack_summary(result, "holds" if p["append_"] else "wrote")


def _interrupted(output: Path, append: bool) -> str:
    """What a Ctrl-C of the token conversion (or ``append``) into ``output`` left (nothing is said of a
    bucket output here: ``packer.cli.remote_output`` says it, once the run's objects are gone)."""
    if sink_for(output) is not None:
        return ""
    stage = staging_dir(output)
    what = f"{output} is as it was" if append else "no output was written"
    if not (stage / PROGRESS_NAME).is_file():
        return f"packer: interrupted; {what}."
    return (
        f"packer: interrupted; {what}. The documents tokenized so far are kept in {stage}: "
        "run the same command with --resume to continue"
    )


def pack_summary(result: PackResult, verb: str = "wrote") -> None:
    """Print a finished token conversion: blocks, tokens, padding, and on stderr what was skipped."""
    m = result.manifest
    s = m.tokens
    assert s is not None
    size = sum(f.bytes for shard in m.shards for f in shard.files)
    rate = s.tokens / result.tokenize_seconds if result.tokenize_seconds else 0.0
    click.echo(
        f"packer: {shown_as(result.output)} {verb} {m.samples:,} blocks of {s.block} tokens ({s.packing}) in "
        f"{len(m.shards)} {m.format} shard(s), {human(size)} ({result.seconds:.1f} s)"
    )
    click.echo(
        f"  {s.documents:,} documents, {s.tokens:,} tokens ({rate:,.0f} tokens/s tokenized), {s.stored:,} stored "
        f"as {s.dtype}, padding {100 * s.padding_share(m.samples):.2f}% of block positions, {s.dropped} dropped"
    )
    skipped_summary(result.skipped, result.output / REPORT_NAME, "document(s) or file(s)")


__all__ = ["run_pack", "pack_summary", "PACK_OPTIONS"]
