"""``packer convert``: its options, their checks, and the run with progress bars (``packer.cli.grow``
when the source is a packer output or with ``--append``)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Optional

import click
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from packer.cli.grow import append_to, repack_output
from packer.cli.options import decode_options, preprocess_config, preprocess_options, target_options, text_options
from packer.cli.render import node_summary, splits_summary, summary
from packer.cli.running import close_bars
from packer.cli.signals import stop_on_signals
from packer.config import (
    DEFAULT_QUALITY,
    ConvertConfig,
    DetectionConfig,
    ImageCodec,
    MaskConfig,
    parse_shard_size,
)
from packer.ops.convert import convert as run_convert
from packer.ops.nodes import NodeResult, NodeSplit, convert_node
from packer.ops.splits import SplitsResult, convert_splits, parse_split_spec, read_class_map, split_folders
from packer.output.files import staging_dir
from packer.run.executor import DEFAULT_TIMEOUT
from packer.run.job import ConvertJob, Selection
from packer.run.ray_executor import RayExecutor
from packer.sources.containers import container_kind
from packer.sources.walk import is_packer_folder
from packer.spec.codecs import IMAGE_CODECS
from packer.spec.errors import ConfigError, DecodeError, InputError, PackerError
from packer.spec.manifest import MANIFEST_NAME
from packer.spec.registry import FORMAT_NAMES  # the --format choices
from packer.spec.text import TextConfig


@click.command()
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option("-f", "--format", "fmt", required=True, type=click.Choice(list(FORMAT_NAMES)), help="Output format.")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Output folder.  [default: SOURCE-FORMAT beside the source]",
    show_default=False,
)
@preprocess_options
@click.option(
    "--codec",
    type=click.Choice(IMAGE_CODECS),
    default="raw",
    help="How images are stored: raw pixels, jpeg (lossy, several times smaller), png (lossless), or "
    "source: each JPEG/PNG file's own bytes where the preprocessing keeps its pixels (--resize none, "
    "or max within --size), the others re-encoded (JPEG, or PNG for lossless sources); readers "
    "decode them all. Needs --dtype uint8.",
)
@click.option(
    "--quality",
    type=click.IntRange(1, 95),
    default=DEFAULT_QUALITY,
    help="JPEG quality for --codec jpeg, and for the JPEGs --codec source re-encodes.",
)
@click.option(
    "--shard-size",
    default="auto",
    help="auto (<=256 MiB, balanced over workers; a large fixed-shape source: one count, <=20000), a "
    "sample count (1000), or bytes (256MB, 1GiB).",
)
@click.option(
    "--shuffle",
    "shuffle_seed",
    type=click.IntRange(min=0),
    default=None,
    help="Store samples in a permutation seeded by this number instead of sorted order (good for "
    "wds, whose readers then need only a small shuffle buffer).  [default: sorted order]",
    show_default=False,
)
@click.option(
    "--labels",
    "labels_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="CSV of 'relative path,label' rows: only the files it lists are packed (the others are "
    "skipped and reported); labels are class names, or class indices if all are integers >= 0.",
)
@text_options
@target_options
@click.option(
    "--classes",
    "classes_from",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Take the class map (label indices) from this file (one class name per line) or packer output, "
    "so that another conversion of the same classes gets the same labels. With --annotations: the "
    "order of the categories (a detection output gives its categories).",
)
@click.option(
    "--add-classes",
    is_flag=True,
    help="With --classes: append classes the map lacks at its end instead of refusing them.",
)
@click.option(
    "--split",
    "split_spec",
    default=None,
    help="Cut the class folders into several outputs, e.g. train=0.9,val=0.1: a stratified random split "
    "(seeded by --split-seed), one class map for all, OUTPUT/train, OUTPUT/val.",
)
@click.option("--split-seed", type=click.IntRange(min=0), default=0, help="Seed of --split.")
@click.option(
    "--no-splits",
    is_flag=True,
    help="Top-level folders named train, val, valid, validation or test are classes, not splits.",
)
@decode_options
@click.option(
    "-j",
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes.  [default: usable cores]",
    show_default=False,
)
@click.option(
    "--strict", is_flag=True, help="Stop at the first bad file (exit 1, nothing written) instead of skipping it."
)
@click.option("--resume", is_flag=True, help="Continue an interrupted run from its finished shards.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=DEFAULT_TIMEOUT,
    help="Seconds one file may take to decode before it is skipped as hanging.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing packer output at OUTPUT.")
@click.option(
    "--append",
    "append_",
    is_flag=True,
    help="Add the files of SOURCE that the existing output OUTPUT does not hold yet, as new shards: its "
    "shards stay as they are, its preprocessing and class map are used (a new class needs "
    "--add-classes).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@click.option(
    "--executor",
    "executor_name",
    type=click.Choice(["local", "ray"]),
    default="local",
    help="local: worker processes on this machine; ray: one Ray task per shard on a Ray cluster, the "
    "output on a filesystem every node sees (pip install 'packer-datasets[ray]'). The output is the "
    "same.",
)
@click.option(
    "--address",
    default=None,
    show_default=False,
    help="With --executor ray: the cluster, auto (the one `ray start` runs here) or ray://HOST:10001.  "
    "[default: a Ray instance on this machine for this run]",
)
@click.option(
    "--num-nodes",
    type=click.IntRange(min=1),
    default=None,
    help="Split the conversion over N machines without Ray (e.g. a SLURM array): this run writes the "
    "shards of --node-rank; `packer merge OUTPUT` publishes the output once every node is done.",
)
@click.option(
    "--node-rank",
    type=click.IntRange(min=0),
    default=None,
    help="This machine's number, 0 to N-1, with --num-nodes (e.g. $SLURM_ARRAY_TASK_ID).",
)
def convert(
    source: Path,
    fmt: str,
    output: Optional[Path],
    size: str,
    resize: str,
    crop: Optional[str],
    geometry: str,
    mode: str,
    interpolation: str,
    fill: str,
    background: str,
    normalize: str,
    dtype: str,
    codec: str,
    quality: int,
    shard_size: str,
    shuffle_seed: Optional[int],
    labels_file: Optional[Path],
    fields_: Optional[str],
    allow_missing: bool,
    encoding: str,
    tokenizer: Optional[str],
    max_length: Optional[int],
    annotations: Optional[Path],
    annotation_format: Optional[str],
    min_box_visibility: float,
    box_coords: str,
    masks_dir: Optional[Path],
    mask_sidecar: bool,
    mask_ignore: int,
    classes_from: Optional[Path],
    add_classes: bool,
    split_spec: Optional[str],
    split_seed: int,
    no_splits: bool,
    full_decode: bool,
    max_pixels: int,
    workers: Optional[int],
    strict: bool,
    resume: bool,
    timeout: float,
    overwrite: bool,
    append_: bool,
    quiet: bool,
    executor_name: str,
    address: Optional[str],
    num_nodes: Optional[int],
    node_rank: Optional[int],
) -> None:
    """Convert the image (or text) folder SOURCE into a packed output.

    Top-level subfolders of SOURCE are classes (as torchvision's ImageFolder); a folder without
    subfolders gives unlabelled samples. When every top-level folder is a split (train, val, valid,
    validation, test) holding class folders, each split becomes an output of its own (OUTPUT/train,
    ...) and all share one class map. Files that share a stem (0001.jpg, 0001.txt, 0001.json)
    are one sample with several fields. Unreadable files are skipped and listed at the end and in
    the output's manifest.json and report.txt (`packer -v convert ...` logs each as it happens).
    With --mode L, three-value settings (the imagenet statistics, --fill, --background) are
    averaged to one.

    SOURCE may also be a packer output: it is then repacked from its own shards into another
    --format, --codec or --shard-size, keeping its samples, order, labels and preprocessing. Or a
    container of images: a .parquet file (or a folder of them), a Hugging Face dataset saved with
    save_to_disk, or WebDataset .tar shards (a file, or a folder of them).
    """
    if (source / MANIFEST_NAME).is_file() and is_packer_folder(source) and not append_:
        repack_output(
            source,
            fmt,
            output,
            codec,
            quality,
            shard_size,
            workers,
            overwrite,
            resume,
            timeout,
            quiet,
            executor_name,
            address,
        )
        return
    if append_:
        append_to(
            source,
            fmt,
            output,
            shard_size,
            labels_file,
            fields_,
            encoding,
            tokenizer,
            max_length,
            allow_missing,
            add_classes,
            workers,
            strict,
            timeout,
            quiet,
            executor_name,
            address,
            lambda: preprocess_config(
                size,
                resize,
                mode,
                interpolation,
                fill,
                background,
                normalize,
                dtype,
                max_pixels,
                full_decode,
                geometry,
                crop,
            ),
            ImageCodec(codec, quality),
        )
        return
    try:
        pre = preprocess_config(
            size,
            resize,
            mode,
            interpolation,
            fill,
            background,
            normalize,
            dtype,
            max_pixels,
            full_decode,
            geometry,
            crop,
        )
        fields = tuple(f.strip() for f in fields_.split(",")) if fields_ else None
        text = TextConfig(encoding, tokenizer, max_length, allow_missing, fields)
        detection = (
            DetectionConfig(str(annotations), annotation_format, min_box_visibility, box_coords)
            if annotations is not None
            else None
        )
        if masks_dir is not None and mask_sidecar:
            raise ConfigError("--masks DIR and --mask-sidecar say two places for the masks: give one")
        masks = (
            MaskConfig(str(masks_dir or ""), mask_ignore, box_coords, sidecar=mask_sidecar)
            if masks_dir is not None or mask_sidecar
            else None
        )
        config = ConvertConfig(
            fmt, pre, parse_shard_size(shard_size), shuffle_seed, ImageCodec(codec, quality), text, detection, masks
        )
        node = _node_split(num_nodes, node_rank, executor_name, address)
        fractions = parse_split_spec(split_spec) if split_spec is not None else None
        found_splits = None
        if not no_splits and labels_file is None and source.is_dir() and container_kind(source) is None:
            try:
                found_splits = split_folders(source)
            except InputError:
                if fractions is None:
                    raise  # with --split, a class folder named like a split is only a class
        splits = fractions is not None or found_splits is not None
        ConvertJob(  # the one place that says which options go together
            source,
            output if output is not None else source,
            config,
            Selection(labels_file, () if classes_from is not None else None, add_classes),
            resume=resume,
            splits=splits,
            nodes=node.nodes if node is not None else None,
            ray=executor_name == "ray",
        ).validate()
        if fractions is not None and found_splits is not None:
            raise ConfigError(
                f"{source} is already split into folders ({', '.join(found_splits)}); leave out "
                "--split, or give one split's folder"
            )
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    try:
        classes = read_class_map(classes_from) if classes_from is not None else None
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    if output is None:
        resolved = source.resolve()
        output = resolved.parent / f"{resolved.name}-{fmt}"
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
                if splits:
                    result = convert_splits(
                        source,
                        output,
                        config,
                        fractions=fractions,
                        seed=split_seed,
                        classes=classes,
                        add_classes=add_classes,
                        labels_file=labels_file,
                        workers=workers,
                        overwrite=overwrite,
                        strict=strict,
                        resume=resume,
                        timeout=timeout,
                        progress=on_progress,
                        on_plan=on_plan,
                        on_split=names.append,
                        executor=executor,
                    )
                elif node is not None:
                    result = convert_node(
                        source,
                        output,
                        config,
                        node,
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
                else:
                    result = run_convert(
                        source,
                        output,
                        config,
                        labels_file=labels_file,
                        workers=workers,
                        overwrite=overwrite,
                        strict=strict,
                        resume=resume,
                        timeout=timeout,
                        progress=on_progress,
                        on_plan=on_plan,
                        executor=executor,
                        classes=classes,
                        add_classes=add_classes,
                    )
        except KeyboardInterrupt:
            close_bars(bars)
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


def _node_split(
    num_nodes: Optional[int], node_rank: Optional[int], executor: str, address: Optional[str]
) -> Optional[NodeSplit]:
    """The static split asked for, if any (ConvertJob.validate says what it cannot go with); ConfigError
    for flags given without the one they belong to."""
    if address is not None and executor != "ray":
        raise ConfigError("--address is for --executor ray")
    if (num_nodes is None) != (node_rank is None):
        raise ConfigError("--num-nodes and --node-rank go together: give both, or neither")
    if num_nodes is None or node_rank is None:
        return None
    return NodeSplit(num_nodes, node_rank)
