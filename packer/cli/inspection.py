"""The read-only commands: ``packer info`` and ``packer verify``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import click
from tqdm import tqdm

from packer.cli.options import OutputLocation
from packer.cli.render import compare_class_maps, describe, describe_splits
from packer.output.image_hashes import leaks_between
from packer.output.verify import verify as verify_output
from packer.spec.errors import ManifestError, PackerError
from packer.spec.manifest import MANIFEST_NAME, read_manifest
from packer.spec.splits_record import is_splits_folder, read_splits, splits_problems


@click.command()
@click.argument("outputs", nargs=-1, required=True, type=OutputLocation())
@click.option("--json", "as_json", is_flag=True, help="Print the whole manifest as JSON.")
def info(outputs: tuple[Path, ...], as_json: bool) -> None:
    """Describe the packed output OUTPUT (several: each, then whether their class maps agree).

    A folder of splits (written from train/val/... folders or with --split) is described split by split.
    OUTPUT may be a URL (s3://bucket/out, gs://, https://): its manifest is read from there.
    """
    if as_json and len(outputs) > 1:
        raise click.UsageError("--json prints one manifest: give one output")
    maps: list[tuple[str, Optional[list[str]]]] = []
    hashed: list[Path] = []  # local outputs with image hashes, compared for leakage
    try:
        for n, output in enumerate(outputs):
            if n:
                click.echo("")
            if isinstance(output, str):  # a URL: an output, or a split set's outputs
                for url, m in _remote_outputs(output):
                    click.echo(json.dumps(m.to_dict(), indent=1, ensure_ascii=False) if as_json else describe(url, m))
                    maps.append((url, m.classes))
                    if as_json:
                        return
                continue
            if is_splits_folder(output) and not (output / MANIFEST_NAME).exists():
                record = read_splits(output)
                if as_json:
                    click.echo(json.dumps(record.to_dict(), indent=1, ensure_ascii=False))
                    return
                click.echo(describe_splits(output, record))
                maps += [
                    (str(output / name), read_manifest(output / name).classes)
                    for name in record.splits
                    if (output / name / MANIFEST_NAME).is_file() and name not in record.unlabelled
                ]
                hashed += [output / name for name in record.splits if _hashed(output / name)]
                continue
            m = read_manifest(output)
            if as_json:
                click.echo(json.dumps(m.to_dict(), indent=1, ensure_ascii=False))
                return
            click.echo(describe(output, m))
            maps.append((str(output), m.classes))
            hashed += [output] if m.image_hashes is not None else []
        if len(outputs) > 1 or len(maps) > 1:
            click.echo(compare_class_maps(maps))
        for line in _leak_lines(hashed):
            click.echo(line)
    except PackerError as e:
        raise click.ClickException(str(e)) from None


LEAKS_SHOWN = 100
"""Pairs of near-duplicates across outputs ``packer info`` lists for each two outputs."""


def _hashed(output: Path) -> bool:
    """Whether ``output`` is an output with image hashes."""
    return (output / MANIFEST_NAME).is_file() and read_manifest(output).image_hashes is not None


def _leak_lines(outputs: list[Path]) -> list[str]:
    """For each two of ``outputs`` (with image hashes), the images of the later that nearly duplicate
    images of the earlier (leakage between train and val)."""
    lines = []
    for n, later in enumerate(outputs):
        for earlier in outputs[:n]:
            try:
                pairs = leaks_between(later, earlier)
            except ManifestError as e:  # hashes of another rule, a damaged file: the rest is still worth listing
                lines.append(f"not compared: {e}")
                continue
            if not pairs:
                lines.append(f"no image of {later} nearly duplicates one of {earlier}")
                continue
            lines.append(
                f"leakage: {len({a for a, _ in pairs})} image(s) of {later} nearly duplicate images of {earlier}:"
            )
            lines += [f"  {a}  ~  {b}" for a, b in pairs[:LEAKS_SHOWN]]
            if len(pairs) > LEAKS_SHOWN:
                lines.append(f"  ... and {len(pairs) - LEAKS_SHOWN} more pair(s)")
    return lines


@click.command()
@click.argument("output", type=OutputLocation())
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@click.option(
    "-j",
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Shards checked at once, each in a process of its own.  [default: usable cores]",
)
def verify(output: Path, quiet: bool, workers: Optional[int]) -> None:
    """Re-read every shard of OUTPUT: sizes, SHA-256 checksums, and that every sample decodes intact.

    Exits 1 and names the shard, file and sample of each problem found. OUTPUT may be a URL
    (s3://bucket/out, gs://, https://): every file is then streamed once and checked against the
    manifest's size and SHA-256 (a local copy's verify also decodes every sample).
    """
    if isinstance(output, str):
        return _verify_url(output, quiet)
    if is_splits_folder(output) and not (output / MANIFEST_NAME).exists():
        return _verify_splits(output, quiet, workers)
    try:
        m = read_manifest(output)
        with tqdm(total=m.samples, unit="sample", disable=quiet, desc="verifying", dynamic_ncols=True) as bar:
            problems = verify_output(output, progress=bar.update, workers=workers)
    except KeyboardInterrupt:
        click.echo("packer: verify interrupted", err=True)
        sys.exit(130)
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    _fail_on(problems, output, "convert again, or restore the files named above")
    click.echo(f"packer: {output} is intact: {m.samples} samples in {len(m.shards)} shard(s) verified")


def _remote_outputs(url: str) -> list:
    """``(url, manifest)`` of the output at ``url``, or of each output of the split set there."""
    from readers.remote.urls import open_manifest, remote_splits

    try:
        return [(url, open_manifest(url))]
    except PackerError:
        names = remote_splits(url)
        if not names:
            raise
        return [(f"{url.rstrip('/')}/{name}", open_manifest(f"{url.rstrip('/')}/{name}")) for name in names]


def _verify_url(url: str, quiet: bool) -> None:
    """``packer verify URL``: every file of the output (or of each of a split set's outputs) streamed
    and checked (``readers.remote.urls.check_remote_output``)."""
    from readers.remote.urls import check_remote_output

    try:
        outputs = _remote_outputs(url)
        samples = sum(m.samples for _, m in outputs)
        found = []
        with tqdm(total=samples, unit="sample", disable=quiet, desc="verifying", dynamic_ncols=True) as bar:
            for where, m in outputs:
                found += check_remote_output(where, m, progress=bar.update)
    except KeyboardInterrupt:
        click.echo("packer: verify interrupted", err=True)
        sys.exit(130)
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    if found:
        for where, what in found:
            click.echo(f"{where}: {what}", err=True)
        raise click.ClickException(f"{url} is damaged: {len(found)} problem(s); upload the files named above again")
    shards = sum(len(m.shards) for _, m in outputs)
    click.echo(f"packer: {url} is intact: {samples} samples in {shards} shard(s), every file's SHA-256 checked")


def _fail_on(problems: list, output: Path, what_to_do: str) -> None:
    """Print each problem on stderr and exit 1 naming ``what_to_do``; nothing when there are none."""
    if problems:
        for p in problems:
            click.echo(f"  {p}", err=True)
        raise click.ClickException(f"{output}: {len(problems)} problem(s) found; {what_to_do}")


def _verify_splits(output: Path, quiet: bool, workers: Optional[int] = None) -> None:
    """``packer verify`` of a folder of splits: the record against the splits, then each split in full."""
    try:
        record = read_splits(output)
        problems = [f"{output}: {p}" for p in splits_problems(output, record)]
        total = 0
        for name in record.splits:
            if not (output / name / MANIFEST_NAME).is_file():
                continue
            m = read_manifest(output / name)
            total += m.samples
            with tqdm(
                total=m.samples, unit="sample", disable=quiet, desc=f"verifying {name}", dynamic_ncols=True
            ) as bar:
                problems += [f"{name}: {p}" for p in verify_output(output / name, progress=bar.update, workers=workers)]
    except KeyboardInterrupt:
        click.echo("packer: verify interrupted", err=True)
        sys.exit(130)
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    _fail_on(problems, output, "convert the splits again")
    maps = (
        "unlabelled"
        if record.classes is None
        else "one class map" + (f" ({', '.join(record.unlabelled)} unlabelled)" if record.unlabelled else "")
    )
    click.echo(
        f"packer: {output} is intact: {len(record.splits)} splits ({', '.join(record.splits)}), {total} "
        f"samples verified, {maps}"
    )
