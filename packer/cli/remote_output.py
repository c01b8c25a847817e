"""``packer convert ... -o s3://bucket/prefix``: the conversion written to a local temporary folder, its
shards uploaded as they finish (``packer.output.shard_uploads``: the local folder holds a few shards,
not the output), the rest by ``packer.output.upload`` (checked, the manifest last)."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import click
from tqdm import tqdm

from packer.cli.render import showing
from packer.cli.signals import stop_on_signals
from packer.output.shard_uploads import ShardUploads, streaming
from packer.output.upload import release, reserve, upload_output
from packer.spec.errors import PackerError

NOT_YET = {"resume": "--resume", "append_": "--append", "num_nodes": "--num-nodes"}
"""Options a conversion into a bucket does not take yet."""


@contextlib.contextmanager
def uploaded(ctx: click.Context, url: str) -> Iterator[Path]:
    """A local folder for the conversion ``ctx`` runs, uploaded to ``url`` once the block ends well
    (the command's ``output`` and ``overwrite`` are that folder's for the block); removed either way."""
    p = ctx.params
    given = [flag for name, flag in NOT_YET.items() if p.get(name)]
    if p.get("executor_name") == "ray":
        given.append("--executor ray")  # its tasks write to a folder every node sees, not a private one
    if given:
        raise click.UsageError(f"{', '.join(given)} with a bucket output is not built yet: convert to a local folder")
    overwrite = bool(p.get("overwrite"))
    try:
        dest = reserve(url, overwrite)  # before any work: the prefix checked, its lock taken
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    scratch = Path(tempfile.mkdtemp(prefix="packer-upload-"))  # under TMPDIR: a few shards at a time
    local = scratch / "output"
    saved = dict(p)
    p.update(output=local, overwrite=False)  # what the run reads of the command's parameters
    shards = ShardUploads(dest, local)
    try:
        try:
            with streaming(shards), showing(local, url):  # the summary names the bucket, not the local folder
                yield local
            shards.finish()
        except PackerError as e:
            shards.abandon()
            raise click.ClickException(str(e)) from None
        except BaseException as e:
            shards.abandon()
            if isinstance(e, KeyboardInterrupt) or (isinstance(e, SystemExit) and e.code == 130):
                click.echo(f"packer: interrupted; {url} is as it was before, and nothing is kept here", err=True)
            raise
        size = sum(f.stat().st_size for f in local.rglob("*") if f.is_file())
        with stop_on_signals():
            try:
                with tqdm(total=size, unit="B", unit_scale=True, disable=bool(p.get("quiet")), desc="uploading") as bar:
                    sent = upload_output(local, dest, progress=bar.update, streamed=frozenset(shards.published))
            except KeyboardInterrupt:
                click.echo(f"packer: upload interrupted; {url} is as it was before", err=True)
                sys.exit(130)
            except PackerError as e:
                raise click.ClickException(str(e)) from None
        sent += shards.bytes
        click.echo(f"packer: uploaded {sent / 2**20:.1f} MB to {url}, every file checked, the manifest last")
    finally:
        release(dest)
        p.clear()
        p.update(saved)
        shutil.rmtree(scratch, ignore_errors=True)


__all__ = ["uploaded"]
