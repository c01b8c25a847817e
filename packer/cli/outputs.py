"""``packer merge`` (publishes a conversion split with ``--num-nodes``) and ``packer combine``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Union

import click
from tqdm import tqdm

from packer.cli.options import ConvertDestination, OutputFolder
from packer.cli.remote_output import uploaded
from packer.cli.render import summary
from packer.cli.running import reported
from packer.cli.signals import stop_on_signals
from packer.ops.combine import combine as combine_outputs
from packer.ops.nodes import merge as merge_output
from packer.spec.errors import PackerError


@click.command()
@click.argument("output", type=ConvertDestination())
@click.option("--overwrite", is_flag=True, help="Replace an existing packer output at OUTPUT.")
def merge(output: Union[Path, str], overwrite: bool) -> None:
    """Publish OUTPUT after a conversion split with --num-nodes, once every node is done.

    Checks that every planned shard is there and intact (SHA-256), names the missing ones and their
    nodes otherwise, then writes the manifest and renames the output into place as a single run does.
    OUTPUT may be a bucket (s3://bucket/prefix) the nodes converted into: the shards are given their
    names inside the store, and the manifest goes up last.
    """
    if isinstance(output, str):  # a bucket: the nodes' records and shards are read from the store
        ctx = click.get_current_context()
        ctx.params["resume"] = True  # the records the nodes kept there are the run to finish
        with uploaded(ctx, output) as local:
            _merge(local, overwrite=False)  # a replaced output is the bucket's: ``uploaded`` replaces it
        return
    _merge(output, overwrite)


def _merge(output: Path, overwrite: bool) -> None:
    with stop_on_signals():
        try:
            result = merge_output(output, overwrite=overwrite)
        except KeyboardInterrupt:
            click.echo("packer: merge interrupted; no output was written", err=True)
            sys.exit(130)
        except PackerError as e:
            raise click.ClickException(str(e)) from None
    summary(result)


@click.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=OutputFolder(), required=True, help="Output folder.")
@click.option(
    "--copy", is_flag=True, help="Copy every shard file instead of hard-linking it where the filesystem allows."
)
@click.option(
    "-j",
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes for shards whose labels are remapped.  [default: usable cores]",
    show_default=False,
)
@click.option("--overwrite", is_flag=True, help="Replace an existing packer output at OUTPUT.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def combine(
    inputs: tuple[Path, ...], output: Path, copy: bool, workers: Optional[int], overwrite: bool, quiet: bool
) -> None:
    """Combine packer OUTPUTS of one format and one preprocessing into one output, decoding nothing.

    Shard files are hard-linked (copied across filesystems, or with --copy). Class maps are unified
    by name: the first input's, then the classes later ones add, sorted, at the end; shards whose
    labels change are written again with their stored bytes. Samples stored in more than one input
    are reported.
    """
    bar = tqdm(total=None, unit="sample", disable=quiet, dynamic_ncols=True, desc="combining")
    with stop_on_signals(), reported([bar], lambda: "packer: combine interrupted; no output was written"):
        result = combine_outputs(
            list(inputs), output, overwrite=overwrite, link=not copy, workers=workers, progress=bar.update
        )
    summary(result)
