"""Running a checked ``packer convert``: one conversion, its splits or one node's part, with progress
bars, Ctrl-C and errors said as the command says them, and the summary at the end."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Optional

import click
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from packer.cli.render import node_summary, splits_summary, summary
from packer.cli.running import close_bars
from packer.cli.signals import stop_on_signals
from packer.config import ConvertConfig
from packer.ops.convert import convert as run_convert
from packer.ops.nodes import NodeResult, NodeSplit, convert_node
from packer.ops.splits import SplitsResult, convert_splits
from packer.output.files import staging_dir
from packer.output.shard_uploads import sink_for
from packer.run.ray_executor import RayExecutor
from packer.spec.errors import DecodeError, PackerError


def run_conversion(
    source: Path,
    output: Path,
    config: ConvertConfig,
    *,
    splits: bool,
    fractions: Optional[list[tuple[str, float]]],
    split_seed: int,
    node: Optional[NodeSplit],
    classes: Optional[list[str]],
    add_classes: bool,
    labels_file: Optional[Path],
    workers: Optional[int],
    overwrite: bool,
    strict: bool,
    resume: bool,
    timeout: float,
    quiet: bool,
    executor_name: str,
    address: Optional[str],
) -> None:
    """Convert ``source`` into ``output`` as ``packer convert`` checked it (``splits``: into one output a
    split, ``fractions`` of ``--split`` or the split folders; ``node``: this machine's part), with a
    progress bar a plan, and print the summary; click exceptions and exit status 130 on Ctrl-C."""
    bars: list[tqdm] = []

    names: list[str] = []  # the split being written, when there are splits

    def on_plan(found, tasks) -> None:
        close_bars(bars)
        where = f"{names[-1]}: " if names else ""
        bars.append(
            tqdm(
                total=sum(len(t.items) for t in tasks),
                unit="img",
                disable=quiet,
                dynamic_ncols=True,
                desc=f"{where}packing {len(tasks)} shard(s)",
            )
        )

    def on_progress(n: int) -> None:
        bars[-1].update(n)

    with stop_on_signals():
        try:
            with logging_redirect_tqdm(), contextlib.ExitStack() as stack:  # log lines (-v) go above the bar
                executor = stack.enter_context(RayExecutor(address, workers)) if executor_name == "ray" else None
                if executor is not None:
                    executor.connect()  # before the progress bar: Ray prints while it starts
                common = dict(  # what every kind of conversion takes alike
                    labels_file=labels_file,
                    workers=workers,
                    overwrite=overwrite,
                    strict=strict,
                    timeout=timeout,
                    progress=on_progress,
                    on_plan=on_plan,
                    classes=classes,
                    add_classes=add_classes,
                )
                if splits:
                    result = convert_splits(
                        source,
                        output,
                        config,
                        fractions=fractions,
                        seed=split_seed,
                        resume=resume,
                        on_split=names.append,
                        executor=executor,
                        **common,
                    )
                elif node is not None:
                    result = convert_node(source, output, config, node, **common)
                else:
                    result = run_convert(source, output, config, resume=resume, executor=executor, **common)
        except KeyboardInterrupt:
            close_bars(bars)
            if sink_for(output) is not None:  # a bucket output: packer.cli.remote_output says what was kept
                sys.exit(130)
            again = "the same command again" if node is not None else "the same command with --resume"
            if splits:
                done = names[:-1]
                click.echo(
                    f"packer: interrupted; the splits in {output} are unfinished (readers refuse them)"
                    + (f"; finished: {', '.join(done)}" if done else "")
                    + f". Run {again} to continue.",
                    err=True,
                )
                sys.exit(130)
            stage = staging_dir(output)
            kept = f" Finished shards are kept in {stage}: run {again} to continue." if stage.exists() else ""
            click.echo(f"packer: interrupted; no output was written.{kept}", err=True)
            sys.exit(130)
        except DecodeError as e:
            close_bars(bars)
            if splits and names:
                raise click.ClickException(
                    f"stopped at the first bad file (--strict): {e}; the splits in {output} "
                    "are unfinished (readers refuse them)"
                ) from None
            raise click.ClickException(f"stopped at the first bad file (--strict), nothing written: {e}") from None
        except PackerError as e:
            close_bars(bars)
            raise click.ClickException(str(e)) from None
    close_bars(bars)
    if isinstance(result, NodeResult):
        node_summary(result)
    elif isinstance(result, SplitsResult):
        splits_summary(result)
    else:
        summary(result)
