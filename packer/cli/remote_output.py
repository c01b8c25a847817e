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
from typing import Callable, Iterator, Optional

import click
from tqdm import tqdm

from packer.cli.render import showing
from packer.cli.run_folder import RunFolder
from packer.cli.signals import stop_on_signals
from packer.output.files import staging_dir
from packer.output.prefix_lock import release
from packer.output.prefix_reservation import reserve, reserve_node
from packer.output.shard_uploads import KEPT, ShardUploads, streaming
from packer.output.upload import PARTS, fetch_output, upload_output
from packer.spec.errors import PackerError
from packer.spec.manifest import MANIFEST_NAME
from packer.system import clear_stop_request
from packer.tokens.progress import PROGRESS_NAME


@contextlib.contextmanager
def uploaded(ctx: click.Context, url: str) -> Iterator[Path]:
    """A local folder for the conversion (or ``packer merge``) ``ctx`` runs, uploaded to ``url`` once
    the block ends well (the command's ``output`` and ``overwrite`` are that folder's for the block);
    removed either way. A node of a split conversion (``--num-nodes``) uploads its shards only
    (``node_uploads``)."""
    p = ctx.params
    if p.get("num_nodes"):
        with node_uploads(ctx, url) as local:
            yield local
        return
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

        def stopped() -> str:
            if ctx.command.name == "merge":  # nothing to --resume: the merge is run again
                return f"packer: merge interrupted; nothing was published to {url}, the nodes' shards stay there"
            return _interrupted(url, shards, local)

        with _abandoned_on_failure(shards, local, url, stopped):
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
                    click.echo(stopped(), err=True)
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


@contextlib.contextmanager
def node_uploads(ctx: click.Context, url: str) -> Iterator[Path]:
    """A local folder for one node of a conversion split with ``--num-nodes`` into the bucket ``url``:
    each shard the node writes is uploaded as it finishes, with its record, beside the other nodes'
    (``packer.ops.nodes``); nothing is published (``packer merge URL`` does that, once every node is
    done). The nodes share the plan and the records kept in the store: a node run again keeps its
    shards recorded there. A failure or an interrupt keeps what the node finished."""
    p = ctx.params
    try:
        dest = reserve_node(url, bool(p.get("overwrite")), int(p.get("node_rank") or 0))
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    saved = dict(p)
    folder: Optional[RunFolder] = None
    local = Path()
    try:
        try:
            folder = RunFolder(url, False, node=f"node-{p.get('node_rank')}")
        except PackerError as e:
            raise click.ClickException(str(e)) from None
        local = folder.path / "output"
        p.update(output=local, overwrite=False)
        shards = ShardUploads(dest, local, base=folder.path, shared=True)
        kept = f"packer: interrupted; the shards this node finished are kept in {url}: run the same command again"
        with _abandoned_on_failure(shards, local, url, lambda: kept):
            shards.restore()  # the plan and every node's records: the shards this node finished are kept
            with streaming(shards), showing(local, url):
                yield local
            shards.finish()
    finally:
        release(dest)  # the node's lease
        p.clear()
        p.update(saved)
        if folder is not None:
            folder.close(local, False)


@contextlib.contextmanager
def _abandoned_on_failure(
    shards: ShardUploads, local: Path, url: str, interrupted: Callable[[], str]
) -> Iterator[None]:
    """Around the run of ``shards`` in ``local``: a failure abandons the run's uploads (``abandon``) and
    says what it says of the local folder of the bucket; an interrupt keeps what ``abandon`` keeps for
    ``--resume``, prints ``interrupted()`` and exits 130, as the conversion does on Ctrl-C."""
    try:
        yield
    except PackerError as e:
        shards.abandon()
        raise click.ClickException(_of_bucket(str(e), local, url)) from None
    except click.ClickException as e:  # a usage error too
        shards.abandon()
        e.message = _of_bucket(e.message, local, url)
        raise
    except BaseException as e:
        stopped = isinstance(e, KeyboardInterrupt) or (isinstance(e, SystemExit) and e.code == 130)
        if stopped:  # received, and acted on here: the held block of ``abandon`` must not raise it again
            clear_stop_request()
        shards.abandon(resumable=stopped)
        if stopped:
            click.echo(interrupted(), err=True)
            sys.exit(130)  # what the conversion exits with on Ctrl-C, wherever it came
        raise


def _of_bucket(message: str, local: Path, url: str) -> str:
    """``message`` with what it says of the run's local folder (and its staging folder, which holds
    what a split conversion's nodes share in the store) said of the bucket."""
    url = url.rstrip("/")
    return message.replace(str(staging_dir(local)), f"{url}/{PARTS}").replace(str(local), url)


def _interrupted(url: str, shards: ShardUploads, local: Path) -> str:
    """What an interrupt left of the conversion into ``url`` (after ``shards.abandon``) from ``local``."""
    if (staging_dir(local) / PROGRESS_NAME).is_file() or (shards.base / KEPT).is_dir():
        return (
            f"packer: interrupted; nothing was published to {url}. The documents tokenized so far are kept in "
            f"{shards.base}: run the same command with --resume to continue"
        )
    if shards.records.resumable:
        return (
            f"packer: interrupted; nothing was published to {url}. The shards finished so far are kept there: "
            "run the same command with --resume to continue"
        )
    return f"packer: interrupted; {url} is as it was before, and nothing is kept here"


__all__ = ["uploaded", "node_uploads"]
