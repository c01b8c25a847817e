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
from typing import Optional

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
from packer.formats import WRITERS
from packer.manifest import Manifest, read_manifest
from packer.output import staging_dir
from packer.pipeline import ConvertResult
from packer.pipeline import convert as run_convert
from packer.ray_executor import RayExecutor
from packer.report import REPORT_NAME, reason_kind, shown
from packer.split import NodeResult, NodeSplit, convert_node
from packer.split import merge as merge_output
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
@click.option("-f", "--format", "fmt", required=True, type=click.Choice(list(WRITERS)), help="Output format.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Output folder.  [default: SOURCE-FORMAT beside the source]", show_default=False)
@click.option("--size", default="224", help="Target size: 224 (square) or WIDTHxHEIGHT such as 256x192.")
@click.option("--resize", type=click.Choice(RESIZE_MODES), default="shorter-crop",
              help="shorter-crop: shorter side to size, centre crop; stretch: ignore aspect; "
                   "pad: letterbox with --fill; none: keep each image's size (lmdb, wds only).")
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
@click.option("--full-decode", is_flag=True,
              help="Decode large JPEGs at full size even when the target is much smaller (slower; by default "
                   "the decoder scales them down by 2, 4 or 8 to no less than the target, pixels within a few levels).")
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
            shuffle_seed: Optional[int], labels_file: Optional[Path], full_decode: bool,
            max_pixels: int, workers: Optional[int], strict: bool, resume: bool, timeout: float, overwrite: bool,
            quiet: bool, executor_name: str, address: Optional[str], num_nodes: Optional[int],
            node_rank: Optional[int]) -> None:
    """Convert the image folder SOURCE into a packed output.

    Top-level subfolders of SOURCE are classes (as torchvision's ImageFolder); a folder without
    subfolders gives unlabelled samples. Unreadable images are skipped and listed at the end and in
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
        config = ConvertConfig(fmt, pre, parse_shard_size(shard_size), shuffle_seed, ImageCodec(codec, quality))
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
    previous = signal.signal(signal.SIGTERM, _interrupt), signal.signal(signal.SIGINT, signal.default_int_handler)
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


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _close(bars: list[tqdm]) -> None:
    for bar in bars:
        bar.close()


def _summary(result: ConvertResult) -> None:
    m = result.manifest
    rate = result.processed / result.seconds if result.seconds else 0.0
    click.echo(
        f"packer: wrote {m.samples} samples in {len(m.shards)} {m.format} shard(s), "
        f"{_human(result.bytes)}, to {result.output} in {result.seconds:.1f} s"
        + (f" ({rate:.0f} images/s)" if result.processed else "")
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
    previous = signal.signal(signal.SIGTERM, _interrupt), signal.signal(signal.SIGINT, signal.default_int_handler)
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
    img = m.fields["image"]
    pre = m.preprocess
    norm = pre.get("normalize")
    size = "x".join(map(str, pre["size"])) if pre.get("size") else "original"
    total = sum(f.bytes for s in m.shards for f in s.files)
    lines = [
        f"{output}: packer {m.format} output (format version {m.format_version}, packer {m.packer_version})",
        f"  samples   {m.samples} in {len(m.shards)} shard(s), {_human(total)}",
        f"  classes   {len(m.classes)}: {_classes(m)}" if m.classes is not None else "  classes   none (unlabelled)",
        f"  image     {img['dtype']} {'x'.join(map(str, img['shape'])) if img['shape'] else 'variable size'} (HWC), "
        f"{pre['mode']}, {_codec(img)}",
        f"  resize    {pre['resize']} to {size}, {pre['interpolation']}" if pre.get("size")
        else "  resize    none (each image keeps its size)",
        f"  normalize {_normalize(norm)}{' (applied by readers)' if img['dtype'] == 'uint8' else ' (stored)'}",
        f"  skipped   {len(m.skipped)} file(s){_kinds(m)}",
    ]
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
