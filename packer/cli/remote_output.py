"""``packer convert ... -o s3://bucket/prefix``: the conversion written to a local temporary folder, its
shards uploaded as they finish (``packer.output.shard_uploads``: the local folder holds a few shards,
not the output), the rest by ``packer.output.upload`` (checked, the manifest last). An interrupt keeps
the finished shards in the bucket, and ``--resume`` continues from them (``ShardUploads.restore``).
With ``--append`` the local folder starts with the output's manifest, and the append reads the rest
from the bucket (``packer.output.held_files``)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator, Optional

import click
from tqdm import tqdm

from packer.cli.render import showing
from packer.cli.run_folder import RunFolder
from packer.cli.signals import stop_on_signals
from packer.output.files import staging_dir
from packer.output.prefix_lock import release
from packer.output.shard_uploads import KEPT, ShardUploads, streaming
from packer.output.upload import fetch_output, reserve, upload_output
from packer.spec.errors import PackerError
from packer.spec.manifest import MANIFEST_NAME
from packer.system import clear_stop_request
from packer.tokens.progress import PROGRESS_NAME

NOT_YET = {"num_nodes": "--num-nodes"}
"""Options a conversion into a bucket does not take yet."""


@contextlib.contextmanager
def uploaded(ctx: click.Context, url: str) -> Iterator[Path]:
    """A local folder for the conversion ``ctx`` runs, uploaded to ``url`` once the block ends well
    (the command's ``output`` and ``overwrite`` are that folder's for the block); removed either way."""
    p = ctx.params
    given = [flag for name, flag in NOT_YET.items() if p.get(name)]
    if given:
        raise click.UsageError(f"{', '.join(given)} with a bucket output is not built yet: convert to a local folder")
    overwrite, resume, append = bool(p.get("overwrite")), bool(p.get("resume")), bool(p.get("append_"))
    if append and overwrite:
        raise click.UsageError("--append with --overwrite: give one of them")
    try:
        dest = reserve(url, overwrite, resume, append)  # before any work: the prefix checked, its lock taken
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    saved = dict(p)
    folder: Optional[RunFolder] = None
    local = Path()
    before = None
    try:
        try:
            folder = RunFolder(url, resume)  # under TMPDIR: a few shards at a time
        except PackerError as e:
            raise click.ClickException(str(e)) from None
        scratch = folder.path
        # an append's folder has the output's name: a split of a set is refused by it, as a local one is
        local = scratch / "append" / url.rstrip("/").rsplit("/", 1)[-1] if append else scratch / "output"
        p.update(output=local, overwrite=False)  # what the run reads of the command's parameters
        shards = ShardUploads(dest, local, base=scratch)
        try:
            if resume:
                shards.restore()  # the interrupted run's records, for the conversion's --resume
            if append:
                before = fetch_output(dest, local, scratch / "packer-before")
            with streaming(shards), showing(local, url):  # the summary names the bucket, not the local folder
                yield local
            shards.finish()
            if before is not None and (local / MANIFEST_NAME).read_bytes() == (before / MANIFEST_NAME).read_bytes():
                shards.abandon()  # nothing appended: the output is as it was, the run's parts go
                return
        except PackerError as e:
            shards.abandon()
            raise click.ClickException(str(e).replace(str(local), url.rstrip("/"))) from None
        except click.ClickException as e:  # a usage error too: what it says of the local folder is of the bucket
            shards.abandon()
            e.message = e.message.replace(str(local), url.rstrip("/"))
            raise
        except BaseException as e:
            interrupted = isinstance(e, KeyboardInterrupt) or (isinstance(e, SystemExit) and e.code == 130)
            if interrupted:  # received, and acted on here: the held block of ``abandon`` must not raise it again
                clear_stop_request()
            shards.abandon(resumable=interrupted)
            if interrupted:
                click.echo(_interrupted(url, shards, local), err=True)
                sys.exit(130)  # what the conversion exits with on Ctrl-C, wherever it came
            raise
        size = sum(f.stat().st_size for f in local.rglob("*") if f.is_file())
        with stop_on_signals():
            try:
                with tqdm(total=size, unit="B", unit_scale=True, disable=bool(p.get("quiet")), desc="uploading") as bar:
                    sent = upload_output(
                        local,
                        dest,
                        progress=bar.update,
                        streamed=frozenset(shards.published),
                        abandon=shards.abandon,
                    )
            except KeyboardInterrupt:
                if dest.published:
                    click.echo(f"packer: interrupted once {url} was published whole", err=True)
                else:
                    click.echo(_interrupted(url, shards, local), err=True)
                sys.exit(130)
            except PackerError as e:
                raise click.ClickException(str(e)) from None
        sent += shards.bytes
        click.echo(f"packer: uploaded {sent / 2**20:.1f} MB to {url}, every file checked, the manifest last")
    finally:
        release(dest)
        p.clear()
        p.update(saved)
        if folder is not None:
            folder.close(local, dest.published)  # a token conversion's tokenizing kept for --resume


def _interrupted(url: str, shards: ShardUploads, local: Path) -> str:
    """What an interrupt left of the conversion into ``url`` (after ``shards.abandon``) from ``local``."""
    if (staging_dir(local) / PROGRESS_NAME).is_file() or (shards.base / KEPT).is_dir():
        return (
            f"packer: interrupted; nothing was published to {url}. The documents tokenized so far are kept in "
            f"{shards.base}: run the same command with --resume to continue"
        )
    if shards.resumable:
        return (
            f"packer: interrupted; nothing was published to {url}. The shards finished so far are kept there: "
            "run the same command with --resume to continue"
        )
    return f"packer: interrupted; {url} is as it was before, and nothing is kept here"


__all__ = ["uploaded"]
