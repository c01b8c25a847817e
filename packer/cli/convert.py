"""``packer convert``, ``packer merge`` (publishes a conversion split with ``--num-nodes``) and ``packer combine``."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Callable, Iterator, Optional

import click
from click.core import ParameterSource
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from packer.appending import append as append_files
from packer.appending import config_of
from packer.cli.options import decode_options, preprocess_config, preprocess_options
from packer.cli.render import append_summary, node_summary, splits_summary, summary
from packer.cli.signals import stop_on_signals
from packer.codecs import IMAGE_CODECS
from packer.combining import combine as combine_outputs
from packer.config import (
    DEFAULT_MIN_VISIBILITY,
    DEFAULT_QUALITY,
    ConvertConfig,
    DetectionConfig,
    ImageCodec,
    MaskConfig,
    parse_shard_size,
)
from packer.containers import container_kind
from packer.dataset_splits import SplitsResult, convert_splits, parse_split_spec, read_class_map, split_folders
from packer.discover import is_packer_folder
from packer.errors import ConfigError, DecodeError, InputError, PackerError
from packer.executor import DEFAULT_TIMEOUT
from packer.manifest import MANIFEST_NAME, read_manifest
from packer.output import staging_dir
from packer.pipeline import convert as run_convert
from packer.ray_executor import RayExecutor
from packer.registry import FORMAT_NAMES  # the --format choices
from packer.repacking import REPACK_OPTIONS, repack
from packer.run.job import ConvertJob, Selection
from packer.split import NodeResult, NodeSplit, convert_node
from packer.split import merge as merge_output
from packer.text import TextConfig


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
@click.option(
    "--fields",
    "fields_",
    default=None,
    help="What a sample is: image, text, or several of image,text,json (files sharing a stem in one "
    "folder are one sample).  [default: found from the files]",
    show_default=False,
)
@click.option(
    "--allow-missing",
    is_flag=True,
    help="Pack paired samples missing their text or json file, with that field empty (else skipped).",
)
@click.option(
    "--encoding",
    default="utf-8",
    help="Encoding of .txt and .json files (a UTF-8 byte-order mark is dropped; CRLF becomes LF).",
)
@click.option(
    "--tokenizer",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A local tokenizer.json (Hugging Face tokenizers): store int32 token ids instead of text.",
)
@click.option(
    "--max-length",
    type=click.IntRange(min=1),
    default=None,
    help="Truncate token ids to this many (special tokens kept); needs --tokenizer.",
)
@click.option(
    "--annotations",
    "annotations",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Detection boxes for the images: a COCO instances .json, a YOLO labels folder (.txt per image, "
    "names from classes.txt or data.yaml) or a Pascal VOC folder of .xml; boxes follow every resize, "
    "crop and pad, and readers return (image, target).",
)
@click.option(
    "--annotation-format",
    type=click.Choice(["coco", "yolo", "voc"]),
    default=None,
    help="The format of --annotations.  [default: found from the content]",
    show_default=False,
)
@click.option(
    "--min-box-visibility",
    type=click.FloatRange(0, 1),
    default=DEFAULT_MIN_VISIBILITY,
    help="Drop a box that the crop leaves with less than this share of its area (counted and reported).",
)
@click.option(
    "--box-coords",
    type=click.Choice(["auto", "stored", "displayed"]),
    default="auto",
    help="Which pixels the boxes of --annotations are on when EXIF turns an image: the file's grid as "
    "stored, or the turned image (auto: YOLO's are on the turned image; COCO and VOC boxes by the "
    "image size they give; an image nothing decides is skipped and reported).",
)
@click.option(
    "--masks",
    "masks_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Semantic segmentation: a folder of class-index PNGs, REL.png for the image REL.*; resized with "
    "nearest-neighbour, cropped and padded exactly like their image; readers return (image, mask).",
)
@click.option(
    "--mask-sidecar",
    is_flag=True,
    help="Segmentation masks beside their images: 0001.png is the mask of 0001.jpg in the same folder.",
)
@click.option(
    "--mask-ignore",
    type=click.IntRange(0, 255),
    default=255,
    help="The mask value of padding (--resize pad, a --crop larger than the image).",
)
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
        _repack(
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
        _append(
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
        _close(bars)
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
            _close(bars)
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
            _close(bars)
            if splits and names:
                raise click.ClickException(
                    f"stopped at the first bad file (--strict): {e}; the splits in {output} "
                    "are unfinished (readers refuse them)"
                ) from None
            raise click.ClickException(f"stopped at the first bad file (--strict), nothing written: {e}") from None
        except PackerError as e:
            _close(bars)
            raise click.ClickException(str(e)) from None
    _close(bars)
    if isinstance(result, NodeResult):
        node_summary(result)
    elif isinstance(result, SplitsResult):
        splits_summary(result)
    else:
        summary(result)


@contextlib.contextmanager
def _executor(name: str, address: Optional[str], workers: Optional[int]) -> Iterator[Optional[RayExecutor]]:
    """The executor ``--executor`` names: None for local worker processes, or a Ray executor connected
    now (before any progress bar: Ray prints while it starts)."""
    with contextlib.ExitStack() as stack:
        executor = stack.enter_context(RayExecutor(address, workers)) if name == "ray" else None
        if executor is not None:
            executor.connect()
        yield executor


@contextlib.contextmanager
def _reported(bars: list[tqdm], interrupted: Callable[[], str]) -> Iterator[None]:
    """Around a command's work: its progress bars closed whatever happens, a Ctrl-C exit 130 with the
    message ``interrupted()`` gives, a ConfigError a usage error (exit 2), another PackerError exit 1."""
    try:
        yield
    except KeyboardInterrupt:
        _close(bars)
        click.echo(interrupted(), err=True)
        sys.exit(130)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    finally:
        _close(bars)


def _repack(
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
        stage = staging_dir(output)
        kept = (
            f" Finished shards are kept in {stage}: run the same command with --resume to continue."
            if stage.exists()
            else ""
        )
        return f"packer: interrupted; no output was written.{kept}"

    with stop_on_signals(), _reported(bars, interrupted):
        with logging_redirect_tqdm(), _executor(executor_name, address, workers) as executor:
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


def _append(
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
    """``packer convert --append``: the new files of SOURCE converted as OUTPUT was (``packer.appending``).
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

    with stop_on_signals(), _reported(bars, lambda: f"packer: interrupted; {output} is as it was"):
        try:
            with logging_redirect_tqdm(), _executor(executor_name, address, workers) as executor:
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


def _close(bars: list[tqdm]) -> None:
    for bar in bars:
        bar.close()


@click.command()
@click.argument("output", type=click.Path(path_type=Path))
@click.option("--overwrite", is_flag=True, help="Replace an existing packer output at OUTPUT.")
def merge(output: Path, overwrite: bool) -> None:
    """Publish OUTPUT after a conversion split with --num-nodes, once every node is done.

    Checks that every planned shard is there and intact (SHA-256), names the missing ones and their
    nodes otherwise, then writes the manifest and renames the output into place as a single run does.
    """
    with stop_on_signals():
        try:
            result = merge_output(output, overwrite=overwrite)
        except KeyboardInterrupt:
            click.echo("packer: merge interrupted; no output was written", err=True)
            sys.exit(130)
        except PackerError as e:
            raise click.ClickException(str(e)) from None
    summary(result)


@click.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Output folder.")
@click.option(
    "--copy", is_flag=True, help="Copy every shard file instead of hard-linking it where the filesystem allows."
)
@click.option(
    "-j",
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes for shards whose labels are remapped.  [default: usable cores]",
    show_default=False,
)
@click.option("--overwrite", is_flag=True, help="Replace an existing packer output at OUTPUT.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def combine(
    inputs: tuple[Path, ...], output: Path, copy: bool, workers: Optional[int], overwrite: bool, quiet: bool
) -> None:
    """Combine packer OUTPUTS of one format and one preprocessing into one output, decoding nothing.

    Shard files are hard-linked (copied across filesystems, or with --copy). Class maps are unified
    by name: the first input's, then the classes later ones add, sorted, at the end; shards whose
    labels change are written again with their stored bytes. Samples stored in more than one input
    are reported.
    """
    bar = tqdm(total=None, unit="sample", disable=quiet, dynamic_ncols=True, desc="combining")
    with stop_on_signals(), _reported([bar], lambda: "packer: combine interrupted; no output was written"):
        result = combine_outputs(
            list(inputs), output, overwrite=overwrite, link=not copy, workers=workers, progress=bar.update
        )
    summary(result)
