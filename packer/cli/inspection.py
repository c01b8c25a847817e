"""The read-only commands: ``packer info`` and ``packer verify``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from tqdm import tqdm

from packer.cli.render import describe
from packer.errors import PackerError
from packer.manifest import read_manifest
from packer.verify import verify as verify_output


@click.command()
@click.argument("output", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the whole manifest as JSON.")
def info(output: Path, as_json: bool) -> None:
    """Describe the packed output OUTPUT."""
    try:
        m = read_manifest(output)
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(m.to_dict(), indent=1, ensure_ascii=False))
        return
    click.echo(describe(output, m))


@click.command()
@click.argument("output", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def verify(output: Path, quiet: bool) -> None:
    """Re-read every shard of OUTPUT: sizes, SHA-256 checksums, and that every sample decodes intact.

    Exits 1 and names the shard, file and sample of each problem found.
    """
    try:
        m = read_manifest(output)
        with tqdm(total=m.samples, unit="sample", disable=quiet, desc="verifying", dynamic_ncols=True) as bar:
            problems = verify_output(output, progress=bar.update)
    except KeyboardInterrupt:
        click.echo("packer: verify interrupted", err=True)
        sys.exit(130)
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    if problems:
        for p in problems:
            click.echo(f"  {p}", err=True)
        raise click.ClickException(
            f"{output}: {len(problems)} problem(s) found; convert again, or restore the files named above"
        )
    click.echo(f"packer: {output} is intact: {m.samples} samples in {len(m.shards)} shard(s) verified")
