"""The loader advisor: ``packer tune``, ``packer profile`` and ``packer bench``.

They measure the readers, so they import readers (and torch) inside the command; converting,
info and verify need neither, and ``import packer.cli`` stays free of torch.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Iterator, Optional

import click
from tqdm import tqdm

from packer.cli.render import human
from packer.config import PreprocessConfig
from packer.spec.errors import PackerError
from packer.spec.manifest import MANIFEST_NAME, Manifest, read_manifest
from packer.system import usable_cpus


@click.command()
@click.argument("output", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-b", "--batch-size", type=click.IntRange(min=1), default=64, help="Batch size of the training loop.")
@click.option("--seconds", type=click.FloatRange(min=1), default=60.0, help="Time for all trials together.")
@click.option(
    "--max-workers",
    type=click.IntRange(min=1),
    default=None,
    show_default=False,
    help="Most DataLoader workers to try.  [default: twice the usable cores, at most one per batch "
    "of an epoch (tar shards: per shard)]",
)
@click.option(
    "--margin",
    type=click.FloatRange(0, 1),
    default=0.10,
    help="Smallest gain in samples/s that counts (0.1 = 10%): doubling stops below it, and cheaper "
    "settings within it win.",
)
@click.option(
    "--device",
    default="auto",
    help="Where batches go, as in make_loader: cpu, cuda, cuda:1, or auto (cuda when available).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the trials and the recommendation as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def tune(
    output: Path,
    batch_size: int,
    seconds: float,
    max_workers: Optional[int],
    margin: float,
    device: str,
    as_json: bool,
    quiet: bool,
) -> None:
    """Find the DataLoader worker count and prefetch factor that read OUTPUT fastest here.

    Measures the main process alone, then 1, 2, 4, ... workers until doubling stops helping by
    --margin, then a few prefetch factors; samples/s and peak memory (PSS of all processes) for
    each. Prints the make_loader and DataLoader arguments to paste.
    """
    import torch

    from packer.advisor.tune import LoaderMeasure, most_useful_workers, recommended_code
    from packer.advisor.tune import tune as run_tune
    from readers import open_dataset

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        cuda = torch.device(device).type == "cuda"
    except RuntimeError:
        raise click.BadParameter(f"expected cpu, cuda, cuda:N or auto, got {device!r}", param_hint="--device") from None
    if cuda and not torch.cuda.is_available():
        raise click.BadParameter("no CUDA device is available here", param_hint="--device")
    with _advisor_errors():
        refuse_token_output(output, "tune")
        ds = open_dataset(output)
        cpus = usable_cpus()
        most = max_workers or most_useful_workers(ds, batch_size, cpus)
        _busy(cpus)
        with _timer_bar(seconds, "tuning", quiet) as tick:

            def on_trial(trial, share: float) -> None:
                tick.bar.set_description(trial.describe())

            measure = LoaderMeasure(ds, batch_size, device=None if device == "cpu" else device, tick=tick)
            result = run_tune(measure, max_workers=most, seconds=seconds, margin=margin, on_trial=on_trial)
    code = recommended_code(
        output, ds.manifest.format, batch_size, result.best, cuda, bool(ds.text_fields), ds.has_target
    )
    if as_json:
        click.echo(
            json.dumps(_tune_json(output, ds.manifest, batch_size, device, cpus, seconds, result, code), indent=1)
        )
        return
    click.echo(
        f"packer tune: {output} ({ds.manifest.format}, {ds.manifest.samples} samples), batches of "
        f"{batch_size}, {cpus} usable core(s), device {device}; measured for {result.seconds:.0f} of "
        f"{seconds:g} s"
    )
    click.echo(_host().line())
    base = result.baseline
    click.echo(f"  {'setting':<28} {'samples/s':>10} {'vs 0 workers':>13} {'peak memory':>12}")
    for trial, m in result.trials:
        ratio = f"{m.samples_per_s / base.samples_per_s:.2f}x" if base and base.samples_per_s else "-"
        mark = "  <- recommended" if trial == result.best else ""
        click.echo(f"  {trial.describe():<28} {m.samples_per_s:>10,.0f} {ratio:>13} {human(m.peak_memory):>12}{mark}")
    best = result.measured(result.best)
    click.echo(f"stopped: {result.stopped}")
    click.echo(
        f"recommended: {result.best.describe()}: {best.samples_per_s:,.0f} samples/s, peak memory "
        f"{human(best.peak_memory)} (all processes)"
    )
    if not result.best.num_workers:
        per_batch = 1000 * batch_size / best.samples_per_s
        click.echo(
            f"note: the main process alone reads fastest here, but without workers loading does not overlap "
            f"the training step: it adds about {per_batch:.1f} ms to each step. If that matters, take the "
            "fastest setting with workers above."
        )
    click.echo()
    click.echo("# with make_loader:")
    click.echo(code["make_loader"])
    click.echo("# or with a plain DataLoader:")
    click.echo(code["DataLoader"], nl=False)


def _tune_json(
    output: Path, m: Manifest, batch_size: int, device: str, cpus: int, seconds: float, result, code: dict
) -> dict:
    best = result.best
    return {
        "output": str(output),
        "format": m.format,
        "samples": m.samples,
        "batch_size": batch_size,
        "device": device,
        "usable_cpus": cpus,
        "host": _host().to_dict(),
        "seconds_budget": seconds,
        "seconds": result.seconds,
        "trials": [
            {
                "num_workers": t.num_workers,
                "prefetch_factor": t.prefetch_factor,
                "samples_per_s": x.samples_per_s,
                "peak_memory_bytes": x.peak_memory,
                "samples": x.samples,
                "seconds": x.seconds,
            }
            for t, x in result.trials
        ],
        "stopped": result.stopped,
        "recommended": {
            "num_workers": best.num_workers,
            "prefetch_factor": best.prefetch_factor,
            "persistent_workers": best.num_workers > 0,
            "pin_memory": device.startswith("cuda"),
            "samples_per_s": result.measured(best).samples_per_s,
        },
        "code": code,
    }


@click.command()
@click.argument("source", metavar="SRC_OR_OUT", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-n", "--samples", type=click.IntRange(min=1), default=200, help="Samples to time.")
@click.option("-b", "--batch-size", type=click.IntRange(min=1), default=64, help="Batch size for the collate stage.")
@click.option(
    "--like",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="For a folder: preprocess as this packer output records.  [default: packer convert's defaults]",
    show_default=False,
)
@click.option("--json", "as_json", is_flag=True, help="Print the stages as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def profile(source: Path, samples: int, batch_size: int, like: Optional[Path], as_json: bool, quiet: bool) -> None:
    """Time each stage of loading a sample from SRC_OR_OUT, a raw image folder or a packer output.

    Folder: open + read, decode, preprocess, to tensor + normalize, collate. Output: read stored
    bytes, decode (jpeg/png), to tensor + normalize, collate. Prints each stage's share of the
    time and what to do about the largest.
    """
    from packer.advisor.profile import profile_folder, profile_output

    with _advisor_errors():
        is_output = (source / MANIFEST_NAME).exists()
        refuse_token_output(source, "profile")
        if is_output and like is not None:
            raise click.UsageError("--like is for a raw folder; an output is profiled with its own settings")
        pre = PreprocessConfig.from_dict(read_manifest(like).preprocess) if like is not None else None
        with tqdm(total=samples, unit="sample", desc="profiling", disable=quiet, dynamic_ncols=True) as bar:
            if is_output:
                result = profile_output(source, samples, batch_size, progress=bar.update)
            else:
                result = profile_folder(source, samples, batch_size, pre, progress=bar.update)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1))
        return
    what = f"{result.format} output, {result.codec} images" if result.kind == "output" else "raw folder"
    click.echo(
        f"packer profile: {source} ({what}), {result.samples} samples, one at a time in this process; "
        f"collate in batches of {batch_size}"
    )
    click.echo(f"  {'stage':<24} {'ms/sample':>10} {'share':>7}")
    for stage in result.seconds:
        click.echo(f"  {result.name(stage):<24} {1000 * result.seconds[stage]:>10.3f} {result.share(stage):>7.1%}")
    click.echo(
        f"  {'total':<24} {1000 * result.total:>10.3f} {1:>7.1%}   ({1 / result.total:,.0f} samples/s in one process)"
    )
    if result.skipped:
        click.echo(f"  ({result.skipped} file(s) could not be decoded and were left out)")
    click.echo(result.advice())


@click.command()
@click.argument("output", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--compare",
    "source",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The raw image folder OUTPUT was converted from.",
)
@click.option("-b", "--batch-size", type=click.IntRange(min=1), default=64, help="Batch size of both loaders.")
@click.option(
    "-j",
    "--workers",
    type=click.IntRange(min=0),
    default=None,
    show_default=False,
    help="DataLoader workers of both loaders.  [default: what make_loader picks for OUTPUT]",
)
@click.option(
    "--seconds", type=click.FloatRange(min=0.5), default=10.0, help="Timed seconds per loader, after its warm-up."
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also draw a bar chart to this PNG file (needs matplotlib).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def bench(
    output: Path,
    source: Path,
    batch_size: int,
    workers: Optional[int],
    seconds: float,
    plot_path: Optional[Path],
    as_json: bool,
    quiet: bool,
) -> None:
    """Read OUTPUT and the raw folder it came from (--compare) with the same preprocessing, batch
    size and workers, and print samples/s of both and the speed-up."""
    from packer.advisor.compare import compare, plot, require_matplotlib
    from readers import open_dataset

    with _advisor_errors():
        refuse_token_output(output, "bench")
        if plot_path is not None:
            require_matplotlib()  # before minutes of measuring, not after
        ds = open_dataset(output)
        _busy(usable_cpus())
        with _timer_bar(2 * seconds, "benchmarking", quiet) as tick:
            result = compare(ds, source, batch_size=batch_size, num_workers=workers, seconds=seconds, tick=tick)
        if plot_path is not None:
            plot(result, plot_path)
    if as_json:
        data = result.to_dict()
        data["plot"] = str(plot_path) if plot_path is not None else None
        data["host"] = _host().to_dict()
        click.echo(json.dumps(data, indent=1))
        return
    pre = ds.manifest.preprocess
    size = "x".join(map(str, pre["size"])) + f" {pre['resize']}" if pre.get("size") else "original sizes"
    click.echo(
        f"packer bench: {output} against {source}: batches of {batch_size}, {result.num_workers} worker(s) "
        f"each, the same preprocessing ({size}, {pre['mode']}) and float32 batches as the readers give"
    )
    click.echo(_host().line())
    for name, rate in (("raw folder", result.folder), (f"packed {ds.manifest.format}", result.packed)):
        click.echo(
            f"  {name:<12} {rate.samples_per_s:>10,.0f} samples/s  ({rate.samples:,} samples in "
            f"{rate.seconds:.1f} s after a {rate.warmup_seconds:.1f} s warm-up)"
        )
    click.echo(f"  speed-up     {result.speedup:>10.1f}x")
    if result.folder_images != result.output_samples:
        click.echo(
            f"note: {source} holds {result.folder_images} usable image(s), {output} {result.output_samples} "
            f"sample(s): is it the folder {output} was converted from?",
            err=True,
        )
    if plot_path is not None:
        click.echo(f"wrote {plot_path}")


def _host():
    """This machine, named beside figures (``packer.advisor.host``; imported when measuring, as the
    advisor imports torch)."""
    from packer.advisor.host import describe_host

    return describe_host()


def _busy(cpus: int) -> None:
    """Warn (stderr) when other processes keep the machine busy: measurements will be noisy."""
    from packer.advisor.timing import busy_note

    note = busy_note(cpus)
    if note:
        click.echo(f"note: {note}", err=True)


class _Tick:
    """Moves a time progress bar by the seconds it is given, never past its end."""

    def __init__(self, bar: tqdm) -> None:
        self.bar = bar

    def __call__(self, seconds: float) -> None:
        self.bar.update(max(0.0, min(seconds, self.bar.total - self.bar.n)))


@contextlib.contextmanager
def _timer_bar(seconds: float, desc: str, quiet: bool) -> Iterator[_Tick]:
    with tqdm(
        total=seconds, desc=desc, disable=quiet, dynamic_ncols=True, bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s"
    ) as bar:
        yield _Tick(bar)


def refuse_token_output(output: Path, command: str) -> None:
    """A ClickException when ``output`` is a token output, which ``command`` does not measure."""
    if (output / MANIFEST_NAME).is_file() and read_manifest(output).tokens is not None:
        raise click.ClickException(
            f"{output} holds token blocks: packer {command} measures outputs of images and text samples; "
            "scripts/bench_tokens.py measures token conversion and block reads"
        )


@contextlib.contextmanager
def _advisor_errors() -> Iterator[None]:
    """Errors a user can cause become messages (exit 1); Ctrl-C exits 130 as convert does."""
    try:
        yield
    except KeyboardInterrupt:
        click.echo("packer: interrupted", err=True)
        sys.exit(130)
    except PackerError as e:
        raise click.ClickException(str(e)) from None
