"""``packer convert ... -o s3://bucket/prefix``: the conversion written to a local temporary folder,
then uploaded by ``packer.output.upload`` (checked, the manifest last), the local copy removed."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import click
from tqdm import tqdm

from packer.output.upload import check_destination, upload_output
from packer.spec.errors import PackerError

NOT_YET = {"resume": "--resume", "append_": "--append", "num_nodes": "--num-nodes"}
"""Options a conversion into a bucket does not take yet."""


@contextlib.contextmanager
def uploaded(ctx: click.Context, url: str) -> Iterator[Path]:
    """A local folder for the conversion ``ctx`` runs, uploaded to ``url`` once the block ends well
    (the command's ``output`` and ``overwrite`` are that folder's for the block); removed either way."""
    p = ctx.params
    given = [flag for name, flag in NOT_YET.items() if p.get(name)]
    if given:
        raise click.UsageError(f"{', '.join(given)} with a bucket output is not built yet: convert to a local folder")
    overwrite = bool(p.get("overwrite"))
    try:
        check_destination(url, overwrite)  # before any work
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    scratch = Path(tempfile.mkdtemp(prefix="packer-upload-"))
    local = scratch / "output"
    saved = dict(p)
    p.update(output=local, overwrite=False)  # what the run reads of the command's parameters
    try:
        yield local
        size = sum(f.stat().st_size for f in local.rglob("*") if f.is_file())
        with tqdm(total=size, unit="B", unit_scale=True, disable=bool(p.get("quiet")), desc="uploading") as bar:
            try:
                sent = upload_output(local, url, overwrite, progress=bar.update)
            except PackerError as e:
                raise click.ClickException(str(e)) from None
        click.echo(f"packer: uploaded {sent / 2**20:.1f} MB to {url}, every file checked, the manifest last")
    finally:
        p.clear()
        p.update(saved)
        shutil.rmtree(scratch, ignore_errors=True)


__all__ = ["uploaded"]
