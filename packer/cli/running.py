"""What the commands that run a job share: the executor ``--executor`` names, and a command's
progress bars and errors around its work."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator, Optional

import click
from tqdm import tqdm

from packer.run.ray_executor import RayExecutor
from packer.spec.errors import ConfigError, PackerError


@contextlib.contextmanager
def executor_for(name: str, address: Optional[str], workers: Optional[int]) -> Iterator[Optional[RayExecutor]]:
    """The executor ``--executor`` names: None for local worker processes, or a Ray executor connected
    now (before any progress bar: Ray prints while it starts)."""
    with contextlib.ExitStack() as stack:
        executor = stack.enter_context(RayExecutor(address, workers)) if name == "ray" else None
        if executor is not None:
            executor.connect()
        yield executor


@contextlib.contextmanager
def reported(bars: list[tqdm], interrupted: Callable[[], str]) -> Iterator[None]:
    """Around a command's work: its progress bars closed whatever happens, a Ctrl-C exit 130 with the
    message ``interrupted()`` gives (none when it is empty), a ConfigError a usage error (exit 2),
    another PackerError exit 1."""
    try:
        yield
    except KeyboardInterrupt:
        close_bars(bars)
        message = interrupted()
        if message:
            click.echo(message, err=True)
        sys.exit(130)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    finally:
        close_bars(bars)


def close_bars(bars: list[tqdm]) -> None:
    """Close every progress bar of ``bars``."""
    for bar in bars:
        bar.close()
