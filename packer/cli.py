"""The ``packer`` command line: a thin layer over ``packer.convert``, ``packer.verify`` and the manifest.

Exit codes: 0 done (bad source files skipped and reported), 1 the run failed or ``--strict`` met a
bad file or ``verify`` found damage (the message says why; nothing is written), 2 bad usage,
130 interrupted (Ctrl-C or SIGTERM; finished shards are kept for ``--resume``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator, Optional

import click
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from packer import __version__
from packer.codecs import IMAGE_CODECS
from packer.config import (
    COLOR_MODES,
    DEFAULT_MAX_PIXELS,
    DEFAULT_QUALITY,
    DTYPES,
    INTERPOLATIONS,
    RESIZE_MODES,
    ConvertConfig,
    ImageCodec,
    PreprocessConfig,
    parse_normalize,
    parse_shard_size,
    parse_size,
)
from packer.errors import ConfigError, DecodeError, PackerError
from packer.executor import DEFAULT_TIMEOUT
from packer.manifest import MANIFEST_NAME, Manifest, read_manifest
from packer.output import staging_dir
from packer.pipeline import ConvertResult
from packer.pipeline import convert as run_convert
from packer.ray_executor import RayExecutor
from packer.registry import FORMAT_NAMES
from packer.report import REPORT_NAME, reason_kind, shown
from packer.split import NodeResult, NodeSplit, convert_node
from packer.split import merge as merge_output
from packer.system import clear_stop_request, request_stop, usable_cpus
from packer.text import TextConfig
from packer.verify import verify as verify_output

SHOW_SKIPPED = 10  # skipped paths printed per reason; the manifest lists them all


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers 0-255, got {text!r}", param_hint=name) from None
    if any(not 0 <= v <= 255 for v in values):
        raise click.BadParameter(f"values must be 0-255, got {text!r}", param_hint=name)
    return values


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="packer")
@click.option("-v", "--verbose", is_flag=True, help="Log each skipped file as it happens.")
def cli(verbose: bool) -> None:
    """Pack folders of small image files into shards that PyTorch reads fast."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s")


@cli.command()
@click.argument("source", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-f", "--format", "fmt", required=True, type=click.Choice(list(FORMAT_NAMES)), help="Output format.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Output folder.  [default: SOURCE-FORMAT beside the source]", show_default=False)
@click.option("--size", default="224", help="Target size: 224 (square) or WIDTHxHEIGHT such as 256x192.")
@click.option("--resize", type=click.Choice(RESIZE_MODES), default="shorter-crop",
              help="shorter-crop: shorter side to size, centre crop; stretch: ignore aspect; "
                   "pad: letterbox with --fill; none: keep each image's size.")
@click.option("--mode", type=click.Choice(COLOR_MODES), default="RGB", help="Colour mode: RGB, or L for grayscale.")
@click.option("--interpolation", type=click.Choice(INTERPOLATIONS), default="bilinear",
              help="Resize filter (antialiased; bilinear matches torchvision's Resize).")
@click.option("--fill", default="0,0,0", help="Padding colour for --resize pad (R,G,B or one gray value).")
@click.option("--background", default="255,255,255",
              help="Colour that transparent pixels are composited on (R,G,B or one gray value).")
@click.option("--normalize", default="imagenet",
              help="imagenet, none (pixels 0..1), auto (this data's own mean and std, computed while "
                   "converting; needs --dtype uint8), or MEAN,STD (2 numbers, or C means then C stds).")
@click.option("--dtype", type=click.Choice(DTYPES), default="uint8",
              help="Stored pixel type. uint8 keeps pixels and readers normalize; float stores normalized values.")
@click.option("--codec", type=click.Choice(IMAGE_CODECS), default="raw",
              help="How images are stored: raw pixels, jpeg (lossy, several times smaller) or png (lossless); "
                   "readers decode jpeg and png. Needs --dtype uint8.")
@click.option("--quality", type=click.IntRange(1, 95), default=DEFAULT_QUALITY, help="JPEG quality for --codec jpeg.")
@click.option("--shard-size", default="auto",
              help="auto (<=256 MiB, balanced over workers), a sample count (1000), or bytes (256MB, 1GiB).")
@click.option("--shuffle", "shuffle_seed", type=click.IntRange(min=0), default=None,
              help="Store samples in a permutation seeded by this number instead of sorted order (good for "
                   "wds, whose readers then need only a small shuffle buffer).  [default: sorted order]",
              show_default=False)
@click.option("--labels", "labels_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="CSV of 'relative path,label' rows: only the files it lists are packed (the others are "
                   "skipped and reported); labels are class names, or class indices if all are integers >= 0.")
@click.option("--fields", "fields_", default=None,
              help="What a sample is: image, text, or several of image,text,json (files sharing a stem in one "
                   "folder are one sample).  [default: found from the files]", show_default=False)
@click.option("--allow-missing", is_flag=True,
              help="Pack paired samples missing their text or json file, with that field empty (else skipped).")
@click.option("--encoding", default="utf-8",
              help="Encoding of .txt and .json files (a UTF-8 byte-order mark is dropped; CRLF becomes LF).")
@click.option("--tokenizer", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A local tokenizer.json (Hugging Face tokenizers): store int32 token ids instead of text.")
@click.option("--max-length", type=click.IntRange(min=1), default=None,
              help="Truncate token ids to this many (special tokens kept); needs --tokenizer.")
@click.option("--full-decode", is_flag=True,
              help="Decode JPEGs at full size even when the target is much smaller (slower; by default the "
                   "decoder scales them by 5/8 or less, never below the target, pixels within a few levels).")
@click.option("--max-pixels", type=click.IntRange(min=1), default=DEFAULT_MAX_PIXELS,
              help="Skip images with more pixels than this (decompression-bomb protection); --size must fit too.")
@click.option("-j", "--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes.  [default: usable cores]", show_default=False)
@click.option("--strict", is_flag=True,
              help="Stop at the first bad file (exit 1, nothing written) instead of skipping it.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run from its finished shards.")
@click.option("--timeout", type=click.FloatRange(min=1), default=DEFAULT_TIMEOUT,
              help="Seconds one file may take to decode before it is skipped as hanging.")
@click.option("--overwrite", is_flag=True, help="Replace an existing packer output at OUTPUT.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@click.option("--executor", "executor_name", type=click.Choice(["local", "ray"]), default="local",
              help="local: worker processes on this machine; ray: one Ray task per shard on a Ray cluster, the "
                   "output on a filesystem every node sees (pip install 'packer[ray]'). The output is the same.")
@click.option("--address", default=None, show_default=False,
              help="With --executor ray: the cluster, auto (the one `ray start` runs here) or ray://HOST:10001.  "
                   "[default: a Ray instance on this machine for this run]")
@click.option("--num-nodes", type=click.IntRange(min=1), default=None,
              help="Split the conversion over N machines without Ray (e.g. a SLURM array): this run writes the "
                   "shards of --node-rank; `packer merge OUTPUT` publishes the output once every node is done.")
@click.option("--node-rank", type=click.IntRange(min=0), default=None,
              help="This machine's number, 0 to N-1, with --num-nodes (e.g. $SLURM_ARRAY_TASK_ID).")
def convert(source: Path, fmt: str, output: Optional[Path], size: str, resize: str, mode: str, interpolation: str,
            fill: str, background: str, normalize: str, dtype: str, codec: str, quality: int, shard_size: str,
            shuffle_seed: Optional[int], labels_file: Optional[Path], fields_: Optional[str], allow_missing: bool,
            encoding: str, tokenizer: Optional[str], max_length: Optional[int], full_decode: bool,
            max_pixels: int, workers: Optional[int], strict: bool, resume: bool, timeout: float, overwrite: bool,
            quiet: bool, executor_name: str, address: Optional[str], num_nodes: Optional[int],
            node_rank: Optional[int]) -> None:
    """Convert the image (or text) folder SOURCE into a packed output.

    Top-level subfolders of SOURCE are classes (as torchvision's ImageFolder); a folder without
    subfolders gives unlabelled samples. Files that share a stem (0001.jpg, 0001.txt, 0001.json)
    are one sample with several fields. Unreadable files are skipped and listed at the end and in
    the output's manifest.json and report.txt (`packer -v convert ...` logs each as it happens).
    With --mode L, three-value settings (the imagenet statistics, --fill, --background) are
    averaged to one.
    """
    try:
        pre = PreprocessConfig(
            size=None if resize == "none" else parse_size(size), resize=resize, mode=mode,
            interpolation=interpolation, fill=_ints(fill, "--fill"), background=_ints(background, "--background"),
            **parse_normalize(normalize), dtype=dtype, max_pixels=max_pixels, reduced_decode=not full_decode,
        )
        fields = tuple(f.strip() for f in fields_.split(",")) if fields_ else None
        text = TextConfig(encoding, tokenizer, max_length, allow_missing, fields)
        config = ConvertConfig(fmt, pre, parse_shard_size(shard_size), shuffle_seed, ImageCodec(codec, quality), text)
        node = _node_split(num_nodes, node_rank, executor_name, address, resume)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    if output is None:
        resolved = source.resolve()
        output = resolved.parent / f"{resolved.name}-{fmt}"
    bars: list[tqdm] = []

    def on_plan(found, tasks) -> None:
        bars.append(tqdm(total=sum(len(t.items) for t in tasks), unit="img", disable=quiet, dynamic_ncols=True,
                         desc=f"packing {len(tasks)} shard(s)"))

    def on_progress(n: int) -> None:
        bars[0].update(n)

    # Ctrl-C and a batch scheduler's SIGTERM stop the run the same way, even when the shell
    # started packer in the background with SIGINT ignored.
    clear_stop_request()
    previous = signal.signal(signal.SIGTERM, request_stop), signal.signal(signal.SIGINT, request_stop)
    try:
        with logging_redirect_tqdm(), contextlib.ExitStack() as stack:  # log lines (-v) go above the bar
            executor = stack.enter_context(RayExecutor(address, workers)) if executor_name == "ray" else None
            if executor is not None:
                executor.connect()  # before the progress bar: Ray prints while it starts
            if node is not None:
                result = convert_node(source, output, config, node, labels_file=labels_file, workers=workers,
                                      overwrite=overwrite, strict=strict, timeout=timeout, progress=on_progress,
                                      on_plan=on_plan)
            else:
                result = run_convert(source, output, config, labels_file=labels_file, workers=workers,
                                     overwrite=overwrite, strict=strict, resume=resume, timeout=timeout,
                                     progress=on_progress, on_plan=on_plan, executor=executor)
    except KeyboardInterrupt:
        _close(bars)
        stage = staging_dir(output)
        again = "the same command again" if node is not None else "the same command with --resume"
        kept = f" Finished shards are kept in {stage}: run {again} to continue." if stage.exists() else ""
        click.echo(f"packer: interrupted; no output was written.{kept}", err=True)
        sys.exit(130)
    except DecodeError as e:
        _close(bars)
        raise click.ClickException(f"stopped at the first bad file (--strict), nothing written: {e}") from None
    except PackerError as e:
        _close(bars)
        raise click.ClickException(str(e)) from None
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    _close(bars)
    if isinstance(result, NodeResult):
        _node_summary(result)
    else:
        _summary(result)


def _node_split(num_nodes: Optional[int], node_rank: Optional[int], executor: str, address: Optional[str],
                resume: bool) -> Optional[NodeSplit]:
    """The static split asked for, if any; ConfigError for options that cannot go together."""
    if address is not None and executor != "ray":
        raise ConfigError("--address is for --executor ray")
    if (num_nodes is None) != (node_rank is None):
        raise ConfigError("--num-nodes and --node-rank go together: give both, or neither")
    if num_nodes is None or node_rank is None:
        return None
    if executor == "ray":
        raise ConfigError("--num-nodes splits a conversion for schedulers without Ray; with --executor ray, "
                          "Ray spreads the shards over the cluster by itself")
    if resume:
        raise ConfigError("--resume is implied with --num-nodes: a node run again redoes only its unfinished shards")
    return NodeSplit(num_nodes, node_rank)


def _node_summary(result: NodeResult) -> None:
    kept = result.shards - result.written
    click.echo(f"packer: node {result.node.rank} of {result.node.nodes} wrote {result.written} shard(s)"
               f"{f' (and kept {kept} from an earlier run)' if kept else ''}, {result.samples} samples in all, "
               f"into {result.stage} in {result.seconds:.1f} s; {result.total_shards} shard(s) in the plan")
    if result.skipped:
        click.echo(f"skipped {len(result.skipped)} file(s) (listed in the report that packer merge writes)", err=True)
    click.echo(f"when every node is done: packer merge {result.output}")


def _close(bars: list[tqdm]) -> None:
    for bar in bars:
        bar.close()


def _summary(result: ConvertResult) -> None:
    m = result.manifest
    rate = result.processed / result.seconds if result.seconds else 0.0
    click.echo(
        f"packer: wrote {m.samples} samples in {len(m.shards)} {m.format} shard(s), "
        f"{_human(result.bytes)}, to {result.output} in {result.seconds:.1f} s"
        + (f" ({rate:.0f} {'images' if m.sample_fields == ('image',) else 'samples'}/s)" if result.processed else "")
    )
    report = result.output / REPORT_NAME
    if result.skipped:
        reasons = Counter(reason_kind(s.reason) for s in result.skipped)
        click.echo(f"skipped {len(result.skipped)} file(s), all listed in {report}:", err=True)
        for kind, count in reasons.most_common():
            click.echo(f"  {count} x {kind}", err=True)
            for s in [s for s in result.skipped if reason_kind(s.reason) == kind][:SHOW_SKIPPED]:
                click.echo(f"      {shown(s.path)}: {s.reason}", err=True)
    if m.classes and m.class_counts:
        empty = [name for name, count in zip(m.classes, m.class_counts) if count == 0]
        if empty:
            click.echo(f"warning: {len(empty)} class(es) have no samples: {', '.join(empty)}", err=True)
    if m.duplicates:
        click.echo(f"note: {sum(len(g) for g in m.duplicates)} files in {len(m.duplicates)} group(s) have identical "
                   f"bytes (all packed; listed in {report})", err=True)
    if result.ignored:
        parts = ", ".join(f"{ext} x{n}" for ext, n in result.ignored.items())
        click.echo(f"ignored {sum(result.ignored.values())} file(s) that are not images ({parts})", err=True)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n} B"


@cli.command()
@click.argument("output", type=click.Path(path_type=Path))
@click.option("--overwrite", is_flag=True, help="Replace an existing packer output at OUTPUT.")
def merge(output: Path, overwrite: bool) -> None:
    """Publish OUTPUT after a conversion split with --num-nodes, once every node is done.

    Checks that every planned shard is there and intact (SHA-256), names the missing ones and their
    nodes otherwise, then writes the manifest and renames the output into place as a single run does.
    """
    clear_stop_request()
    previous = signal.signal(signal.SIGTERM, request_stop), signal.signal(signal.SIGINT, request_stop)
    try:
        result = merge_output(output, overwrite=overwrite)
    except KeyboardInterrupt:
        click.echo("packer: merge interrupted; no output was written", err=True)
        sys.exit(130)
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    _summary(result)


@cli.command()
@click.argument("output", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the whole manifest as JSON.")
def info(output: Path, as_json: bool) -> None:
    """Describe the packed output OUTPUT."""
    try:
        m = read_manifest(output)
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(m.to_dict(), indent=1, ensure_ascii=False))
        return
    click.echo(_describe(output, m))


def _describe(output: Path, m: Manifest) -> str:
    pre = m.preprocess
    norm = pre.get("normalize")
    size = "x".join(map(str, pre["size"])) if pre.get("size") else "original"
    total = sum(f.bytes for s in m.shards for f in s.files)
    lines = [
        f"{output}: packer {m.format} output (format version {m.format_version}, packer {m.packer_version})",
        f"  samples   {m.samples} in {len(m.shards)} shard(s), {_human(total)}",
        f"  classes   {len(m.classes)}: {_classes(m)}" if m.classes is not None else "  classes   none (unlabelled)",
        f"  fields    {', '.join(m.sample_fields)}",
    ]
    if m.has_image:
        img = m.fields["image"]
        lines += [
            f"  image     {img['dtype']} {'x'.join(map(str, img['shape'])) if img['shape'] else 'variable size'} "
            f"(HWC), {pre['mode']}, {_codec(img)}",
            f"  resize    {pre['resize']} to {size}, {pre['interpolation']}" if pre.get("size")
            else "  resize    none (each image keeps its size)",
            f"  normalize {_normalize(norm)}{' (applied by readers)' if img['dtype'] == 'uint8' else ' (stored)'}",
        ]
    for f in m.text_fields:
        if f.kind == "tokens":
            tok = f.tokenizer or {}
            lines.append(f"  {f.name:<9} int32 token ids from {tok.get('file')} (vocabulary {tok.get('vocab_size')}, "
                         f"pad id {tok.get('pad_id')}, max length {tok.get('max_length') or 'none'})")
        else:
            lines.append(f"  {f.name:<9} UTF-8 {'JSON' if f.kind == 'json' else 'text'}, LF line ends")
    lines.append(f"  skipped   {len(m.skipped)} file(s){_kinds(m)}")
    lines += _stats(m.stats)
    if m.duplicates:
        lines.append(f"  identical {sum(len(g) for g in m.duplicates)} files in {len(m.duplicates)} group(s)")
    return "\n".join(lines)


@cli.command()
@click.argument("output", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def verify(output: Path, quiet: bool) -> None:
    """Re-read every shard of OUTPUT: sizes, SHA-256 checksums, and that every sample decodes intact.

    Exits 1 and names the shard, file and sample of each problem found.
    """
    try:
        m = read_manifest(output)
        with tqdm(total=m.samples, unit="sample", disable=quiet, desc="verifying", dynamic_ncols=True) as bar:
            problems = verify_output(output, progress=bar.update)
    except KeyboardInterrupt:
        click.echo("packer: verify interrupted", err=True)
        sys.exit(130)
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    if problems:
        for p in problems:
            click.echo(f"  {p}", err=True)
        raise click.ClickException(
            f"{output}: {len(problems)} problem(s) found; convert again, or restore the files named above"
        )
    click.echo(f"packer: {output} is intact: {m.samples} samples in {len(m.shards)} shard(s) verified")


# The loader advisor: tune, profile and bench measure the readers, so they import readers (and
# torch) inside the command; converting, info and verify need neither.


@cli.command()
@click.argument("output", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-b", "--batch-size", type=click.IntRange(min=1), default=64, help="Batch size of the training loop.")
@click.option("--seconds", type=click.FloatRange(min=1), default=60.0, help="Time for all trials together.")
@click.option("--max-workers", type=click.IntRange(min=1), default=None, show_default=False,
              help="Most DataLoader workers to try.  [default: twice the usable cores, at most one per batch "
                   "of an epoch (tar shards: per shard)]")
@click.option("--margin", type=click.FloatRange(0, 1), default=0.10,
              help="Smallest gain in samples/s that counts (0.1 = 10%): doubling stops below it, and cheaper "
                   "settings within it win.")
@click.option("--device", default="auto",
              help="Where batches go, as in make_loader: cpu, cuda, cuda:1, or auto (cuda when available).")
@click.option("--json", "as_json", is_flag=True, help="Print the trials and the recommendation as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def tune(output: Path, batch_size: int, seconds: float, max_workers: Optional[int], margin: float, device: str,
         as_json: bool, quiet: bool) -> None:
    """Find the DataLoader worker count and prefetch factor that read OUTPUT fastest here.

    Measures the main process alone, then 1, 2, 4, ... workers until doubling stops helping by
    --margin, then a few prefetch factors; samples/s and peak memory (PSS of all processes) for
    each. Prints the make_loader and DataLoader arguments to paste.
    """
    import torch

    from readers import open_dataset
    from readers.advisor.tune import LoaderMeasure, most_useful_workers, recommended_code
    from readers.advisor.tune import tune as run_tune

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        cuda = torch.device(device).type == "cuda"
    except RuntimeError:
        raise click.BadParameter(f"expected cpu, cuda, cuda:N or auto, got {device!r}", param_hint="--device") from None
    if cuda and not torch.cuda.is_available():
        raise click.BadParameter("no CUDA device is available here", param_hint="--device")
    with _advisor_errors():
        ds = open_dataset(output)
        cpus = usable_cpus()
        most = max_workers or most_useful_workers(ds, batch_size, cpus)
        _busy(cpus)
        with _timer_bar(seconds, "tuning", quiet) as tick:
            def on_trial(trial, share: float) -> None:
                tick.bar.set_description(trial.describe())

            measure = LoaderMeasure(ds, batch_size, device=None if device == "cpu" else device, tick=tick)
            result = run_tune(measure, max_workers=most, seconds=seconds, margin=margin, on_trial=on_trial)
    code = recommended_code(output, ds.manifest.format, batch_size, result.best, cuda, bool(ds.text_fields))
    if as_json:
        click.echo(json.dumps(_tune_json(output, ds.manifest, batch_size, device, cpus, seconds, result, code),
                              indent=1))
        return
    click.echo(f"packer tune: {output} ({ds.manifest.format}, {ds.manifest.samples} samples), batches of "
               f"{batch_size}, {cpus} usable core(s), device {device}; measured for {result.seconds:.0f} of "
               f"{seconds:g} s")
    base = result.baseline
    click.echo(f"  {'setting':<28} {'samples/s':>10} {'vs 0 workers':>13} {'peak memory':>12}")
    for trial, m in result.trials:
        ratio = f"{m.samples_per_s / base.samples_per_s:.2f}x" if base and base.samples_per_s else "-"
        mark = "  <- recommended" if trial == result.best else ""
        click.echo(f"  {trial.describe():<28} {m.samples_per_s:>10,.0f} {ratio:>13} {_human(m.peak_memory):>12}{mark}")
    best = result.measured(result.best)
    click.echo(f"stopped: {result.stopped}")
    click.echo(f"recommended: {result.best.describe()}: {best.samples_per_s:,.0f} samples/s, peak memory "
               f"{_human(best.peak_memory)} (all processes)")
    if not result.best.num_workers:
        per_batch = 1000 * batch_size / best.samples_per_s
        click.echo(f"note: the main process alone reads fastest here, but without workers loading does not overlap "
                   f"the training step: it adds about {per_batch:.1f} ms to each step. If that matters, take the "
                   "fastest setting with workers above.")
    click.echo()
    click.echo("# with make_loader:")
    click.echo(code["make_loader"])
    click.echo("# or with a plain DataLoader:")
    click.echo(code["DataLoader"], nl=False)


def _tune_json(output: Path, m: Manifest, batch_size: int, device: str, cpus: int, seconds: float, result,
               code: dict) -> dict:
    best = result.best
    return {
        "output": str(output), "format": m.format, "samples": m.samples, "batch_size": batch_size,
        "device": device, "usable_cpus": cpus, "seconds_budget": seconds, "seconds": result.seconds,
        "trials": [{"num_workers": t.num_workers, "prefetch_factor": t.prefetch_factor,
                    "samples_per_s": x.samples_per_s, "peak_memory_bytes": x.peak_memory, "samples": x.samples,
                    "seconds": x.seconds} for t, x in result.trials],
        "stopped": result.stopped,
        "recommended": {"num_workers": best.num_workers, "prefetch_factor": best.prefetch_factor,
                        "persistent_workers": best.num_workers > 0, "pin_memory": device.startswith("cuda"),
                        "samples_per_s": result.measured(best).samples_per_s},
        "code": code,
    }


@cli.command()
@click.argument("source", metavar="SRC_OR_OUT", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-n", "--samples", type=click.IntRange(min=1), default=200, help="Samples to time.")
@click.option("-b", "--batch-size", type=click.IntRange(min=1), default=64, help="Batch size for the collate stage.")
@click.option("--like", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="For a folder: preprocess as this packer output records.  [default: packer convert's defaults]",
              show_default=False)
@click.option("--json", "as_json", is_flag=True, help="Print the stages as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def profile(source: Path, samples: int, batch_size: int, like: Optional[Path], as_json: bool, quiet: bool) -> None:
    """Time each stage of loading a sample from SRC_OR_OUT, a raw image folder or a packer output.

    Folder: open + read, decode, preprocess, to tensor + normalize, collate. Output: read stored
    bytes, decode (jpeg/png), to tensor + normalize, collate. Prints each stage's share of the
    time and what to do about the largest.
    """
    from packer.config import PreprocessConfig
    from readers.advisor.profile import profile_folder, profile_output

    with _advisor_errors():
        is_output = (source / MANIFEST_NAME).exists()
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
    click.echo(f"packer profile: {source} ({what}), {result.samples} samples, one at a time in this process; "
               f"collate in batches of {batch_size}")
    click.echo(f"  {'stage':<24} {'ms/sample':>10} {'share':>7}")
    for stage in result.seconds:
        click.echo(f"  {result.name(stage):<24} {1000 * result.seconds[stage]:>10.3f} {result.share(stage):>7.1%}")
    click.echo(f"  {'total':<24} {1000 * result.total:>10.3f} {1:>7.1%}   "
               f"({1 / result.total:,.0f} samples/s in one process)")
    if result.skipped:
        click.echo(f"  ({result.skipped} file(s) could not be decoded and were left out)")
    click.echo(result.advice())


@cli.command()
@click.argument("output", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--compare", "source", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="The raw image folder OUTPUT was converted from.")
@click.option("-b", "--batch-size", type=click.IntRange(min=1), default=64, help="Batch size of both loaders.")
@click.option("-j", "--workers", type=click.IntRange(min=0), default=None, show_default=False,
              help="DataLoader workers of both loaders.  [default: what make_loader picks for OUTPUT]")
@click.option("--seconds", type=click.FloatRange(min=0.5), default=10.0,
              help="Timed seconds per loader, after its warm-up.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw a bar chart to this PNG file (needs matplotlib).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def bench(output: Path, source: Path, batch_size: int, workers: Optional[int], seconds: float,
          plot_path: Optional[Path], as_json: bool, quiet: bool) -> None:
    """Read OUTPUT and the raw folder it came from (--compare) with the same preprocessing, batch
    size and workers, and print samples/s of both and the speed-up."""
    from readers import open_dataset
    from readers.advisor.compare import compare, plot, require_matplotlib

    with _advisor_errors():
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
        click.echo(json.dumps(data, indent=1))
        return
    pre = ds.manifest.preprocess
    size = "x".join(map(str, pre["size"])) + f" {pre['resize']}" if pre.get("size") else "original sizes"
    click.echo(f"packer bench: {output} against {source}: batches of {batch_size}, {result.num_workers} worker(s) "
               f"each, the same preprocessing ({size}, {pre['mode']}) and float32 batches as the readers give")
    for name, rate in (("raw folder", result.folder), (f"packed {ds.manifest.format}", result.packed)):
        click.echo(f"  {name:<12} {rate.samples_per_s:>10,.0f} samples/s  ({rate.samples:,} samples in "
                   f"{rate.seconds:.1f} s after a {rate.warmup_seconds:.1f} s warm-up)")
    click.echo(f"  speed-up     {result.speedup:>10.1f}x")
    if result.folder_images != result.output_samples:
        click.echo(f"note: {source} holds {result.folder_images} usable image(s), {output} {result.output_samples} "
                   f"sample(s): is it the folder {output} was converted from?", err=True)
    if plot_path is not None:
        click.echo(f"wrote {plot_path}")


def _busy(cpus: int) -> None:
    """Warn (stderr) when other processes keep the machine busy: measurements will be noisy."""
    from readers.advisor.timing import busy_note

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
    with tqdm(total=seconds, desc=desc, disable=quiet, dynamic_ncols=True,
              bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s") as bar:
        yield _Tick(bar)


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


def _stats(stats: Optional[dict]) -> list[str]:
    """The manifest's ``stats`` in a few lines (none for outputs of packers before they existed)."""
    if not stats:
        return []
    lines = []
    px = stats.get("pixels")
    if px:
        scale = "of pixel/255" if px["scale"] == "0..1" else "of the stored values"
        lines.append(f"  pixels    mean {_floats(px['mean'])}, std {_floats(px['std'])} "
                     f"({scale}, {px['count']:,} per channel)")
    sizes = stats.get("original_sizes")
    if sizes:
        bins = sizes["bins"]
        labels = [f"{a}-{b - 1}" for a, b in zip(bins, bins[1:])] + [f"{bins[-1]}+"]
        for name, side in (("widths", sizes["width"]), ("heights", sizes["height"])):
            if side["min"] is None:
                continue
            shown = ", ".join(f"{label}: {n}" for label, n in zip(labels, side["counts"]) if n)
            lines.append(f"  {name:<9} {side['min']}..{side['max']}, median {side['median']} (original; {shown})")
    return lines


def _normalize(norm: Optional[dict]) -> str:
    if not norm:
        return "none (0..1)"
    if norm.get("auto"):
        return f"mean {_floats(norm['mean'])} std {_floats(norm['std'])} (computed: --normalize auto)"
    return f"mean {norm['mean']} std {norm['std']}"


def _floats(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"


def _codec(image: dict) -> str:
    codec = image.get("codec", "raw")
    return {"raw": "raw pixels", "png": "stored as PNG"}.get(codec, f"stored as JPEG quality {image.get('quality')}")


def _kinds(m: Manifest) -> str:
    kinds = Counter(reason_kind(s["reason"]) for s in m.skipped)
    return f" ({', '.join(f'{n} x {k}' for k, n in kinds.most_common())})" if kinds else ""


def _classes(m: Manifest, most: int = 20) -> str:
    counts = m.class_counts or [None] * len(m.classes or [])
    shown = [f"{name} ({n})" if n is not None else name for name, n in zip(m.classes or [], counts)]
    return ", ".join(shown[:most]) + (" ..." if len(shown) > most else "")


def main() -> None:
    """Entry point of the ``packer`` script."""
    cli(prog_name="packer")
