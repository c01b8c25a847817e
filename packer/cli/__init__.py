"""The ``packer`` command line: a thin layer over ``packer.convert``, ``packer.verify`` and the manifest.

Exit codes: 0 done (bad source files skipped and reported), 1 the run failed or ``--strict`` met a
bad file or ``verify`` found damage (the message says why; nothing is written), 2 bad usage,
130 interrupted (Ctrl-C or SIGTERM; finished shards are kept for ``--resume``).

One module per group of commands, each a plain ``click.command`` added to the group here:
``convert`` (convert, merge, combine), ``inspection`` (info, verify), ``advisor`` (tune, profile, bench).
``render`` formats what they print, ``options`` declares the preprocessing options once and
``signals`` holds the one way Ctrl-C and SIGTERM stop a command that writes.
"""

from __future__ import annotations

import logging

import click

from packer import __version__
from packer.cli import advisor, convert, inspection, outputs, preview

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="packer")
@click.option("-v", "--verbose", is_flag=True, help="Log each skipped file as it happens.")
def cli(verbose: bool) -> None:
    """Pack folders of small image files into shards that PyTorch reads fast."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s")


for _command in (
    convert.convert,
    outputs.merge,
    outputs.combine,
    inspection.info,
    inspection.verify,
    preview.preview,
    advisor.tune,
    advisor.profile,
    advisor.bench,
):
    cli.add_command(_command)


def main() -> None:
    """Entry point of the ``packer`` script."""
    cli(prog_name="packer")
