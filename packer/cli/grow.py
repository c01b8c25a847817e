"""What ``packer convert`` does when its source is a packer output (a repack) or with ``--append``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click
from click.core import ParameterSource
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from packer.cli.option_values import parse_shard_size
from packer.cli.render import append_summary, summary
from packer.cli.running import executor_for, reported
from packer.cli.signals import stop_on_signals
from packer.config import ImageCodec
from packer.ops.append import append as append_files
from packer.ops.append import config_of
from packer.ops.repack import REPACK_OPTIONS, repack
from packer.output.files import staging_dir
from packer.output.shard_uploads import sink_for
from packer.spec.errors import ConfigError, DecodeError, PackerError
from packer.spec.manifest import MANIFEST_NAME, read_manifest
from packer.spec.text import TextConfig


def repack_output(
    source: Path,
    fmt: str,
    output: Optional[Path],
    codec: str,
    quality: int,
    shard_size: str,
    workers: Optional[int],
    overwrite: bool,
    resume: bool,
    timeout: float,
    quiet: bool,
    executor_name: str,
    address: Optional[str],
) -> None:
    """``packer convert`` of a packer output: ``packer.repack``, refusing the options it cannot honour."""
    ctx = click.get_current_context()

    def given(name: str) -> bool:
        return ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)

    refused = [
        max(p.opts, key=len)
        for p in ctx.command.params
        if p.name not in REPACK_OPTIONS and p.name is not None and given(p.name)
    ]
    if address is not None and executor_name != "ray":
        raise click.UsageError("--address is for --executor ray")
    if refused:
        raise click.UsageError(
            f"{source} is a packer output, repacked from its own shards: its samples, order, labels "
            f"and preprocessing stay as they are, so {', '.join(refused)} cannot be given here "
            "(convert the source folder to change them)"
        )
    if output is None:
        resolved = source.resolve()
        output = resolved.parent / f"{resolved.name}-{fmt}"
    bars: list[tqdm] = []

    def on_plan(samples: int, tasks) -> None:
        bars.append(
            tqdm(
                total=samples,
                unit="sample",
                disable=quiet,
                dynamic_ncols=True,
                desc=f"repacking into {len(tasks)} shard(s)",
            )
        )

    def interrupted() -> str:
        if sink_for(output) is not None:  # a bucket output: packer.cli.remote_output says what was kept
            return ""
        stage = staging_dir(output)
        kept = (
            f" Finished shards are kept in {stage}: run the same command with --resume to continue."
            if stage.exists()
            else ""
        )
        return f"packer: interrupted; no output was written.{kept}"

    with stop_on_signals(), reported(bars, interrupted):
        with logging_redirect_tqdm(), executor_for(executor_name, address, workers) as executor:
            result = repack(
                source,
                output,
                fmt,
                codec=codec if given("codec") else None,
                quality=quality if given("quality") else None,
                shard_size=parse_shard_size(shard_size),
                workers=workers,
                overwrite=overwrite,
                resume=resume,
                timeout=timeout,
                progress=lambda n: bars[-1].update(n),
                on_plan=on_plan,
                executor=executor,
            )
    summary(result)


APPEND_REFUSED = (
    "annotations",
    "annotation_format",
    "masks_dir",
    "mask_sidecar",
    "classes_from",
    "split_spec",
    "split_seed",
    "no_splits",
    "resume",
    "overwrite",
    "num_nodes",
    "node_rank",
    "shuffle_seed",
)
"""Options that ``--append`` cannot take: the output decides them, or they make other outputs."""

PREPROCESS_PARAMS = {
    "size": "size",
    "resize": "resize",
    "crop": "crop",
    "geometry": "geometry",
    "mode": "mode",
    "interpolation": "interpolation",
    "fill": "fill",
    "background": "background",
    "dtype": "dtype",
    "max_pixels": "max_pixels",
    "full_decode": "reduced_decode",
    "normalize": "normalize",
}
"""``packer convert`` parameters of the preprocessing, and the PreprocessConfig field each sets."""


def append_to(
    source: Path,
    fmt: str,
    output: Optional[Path],
    shard_size: str,
    labels_file: Optional[Path],
    fields_: Optional[str],
    encoding: str,
    tokenizer: Optional[str],
    max_length: Optional[int],
    allow_missing: bool,
    add_classes: bool,
    workers: Optional[int],
    strict: bool,
    timeout: float,
    quiet: bool,
    executor_name: str,
    address: Optional[str],
    given_preprocess,
    given_codec: ImageCodec,
) -> None:
    """``packer convert --append``: the new files of SOURCE converted as OUTPUT was (``packer.ops.append``).
    Preprocessing options left out are OUTPUT's; one given with another value is refused."""
    ctx = click.get_current_context()

    def given(name: str) -> bool:
        return ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)

    try:
        refused = [max(p.opts, key=len) for p in ctx.command.params if p.name in APPEND_REFUSED and given(p.name)]
        if refused:
            raise ConfigError(f"--append adds to an output as it is: {', '.join(refused)} cannot be given with it")
        if output is None or not (output / MANIFEST_NAME).is_file():
            raise ConfigError("--append needs -o OUTPUT, an existing packer output to add to")
        if address is not None and executor_name != "ray":
            raise ConfigError("--address is for --executor ray")
        old = read_manifest(output)
        if fmt != old.format:
            raise ConfigError(f"{output} is a {old.format} output: append to it with --format {old.format}")
        fields = tuple(f.strip() for f in fields_.split(",")) if fields_ else None
        text = TextConfig(encoding, tokenizer, max_length, allow_missing, fields)
        config = config_of(old, parse_shard_size(shard_size), text)
        if any(given(name) for name in PREPROCESS_PARAMS) or given("codec") or given("quality"):
            pre = given_preprocess()
            for name, attr in PREPROCESS_PARAMS.items():
                if not given(name):
                    continue
                attrs = ("mean", "std", "auto_normalize") if attr == "normalize" else (attr,)
                mine = tuple(getattr(pre, a) for a in attrs)
                theirs = tuple(getattr(config.preprocess, a) for a in attrs)
                if mine != theirs and not (
                    attr == "normalize"
                    and pre.auto_normalize
                    and isinstance(old.preprocess.get("normalize"), dict)
                    and old.preprocess["normalize"].get("auto")
                ):
                    raise ConfigError(
                        f"--{name.replace('_', '-')} differs from how {output} was converted "
                        f"({mine if len(mine) > 1 else mine[0]} where it has "
                        f"{theirs if len(theirs) > 1 else theirs[0]}): leave it out to take the output's"
                    )
            for name, value, theirs in (
                ("codec", given_codec.name, config.codec.name),
                ("quality", given_codec.quality, config.codec.quality),
            ):
                if given(name) and value != theirs and (name == "codec" or config.codec.name in ("jpeg", "source")):
                    raise ConfigError(f"--{name} {value} differs from {output}'s {theirs}: leave it out")
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    bars: list[tqdm] = []

    def on_plan(found, tasks) -> None:
        bars.append(
            tqdm(
                total=len(found.items),
                unit="img",
                disable=quiet,
                dynamic_ncols=True,
                desc=f"appending {len(tasks)} shard(s)",
            )
        )

    with stop_on_signals(), reported(bars, lambda: _interrupted(output)):
        try:
            with logging_redirect_tqdm(), executor_for(executor_name, address, workers) as executor:
                result = append_files(
                    source,
                    output,
                    config,
                    labels_file=labels_file,
                    add_classes=add_classes,
                    workers=workers,
                    strict=strict,
                    timeout=timeout,
                    progress=lambda n: bars[-1].update(n),
                    on_plan=on_plan,
                    executor=executor,
                )
        except DecodeError as e:
            raise click.ClickException(f"stopped at the first bad file (--strict), {output} unchanged: {e}") from None
    append_summary(result, source)


def _interrupted(output: Path) -> str:
    """What an interrupted append says: that the output is as it was (for a bucket output,
    ``packer.cli.remote_output`` says it, once the run's objects are gone)."""
    return "" if sink_for(output) is not None else f"packer: interrupted; {output} is as it was"
