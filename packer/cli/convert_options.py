"""The options of ``packer convert``, declared once (``convert_options``); the command itself and
the checks of what they ask for are in ``packer.cli.convert``."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import click

from packer.cli.options import (
    ConvertDestination,
    decode_options,
    pack_options,
    preprocess_options,
    target_options,
    text_options,
)
from packer.config import DEFAULT_QUALITY, DUP_DISTANCE, MAX_DUP_DISTANCE
from packer.run.executor import DEFAULT_TIMEOUT
from packer.spec.codecs import IMAGE_CODECS
from packer.spec.registry import FORMAT_NAMES  # the --format choices

_OPTIONS: list[Callable] = [
    click.argument("source", type=click.Path(exists=True, path_type=Path)),
    click.option("-f", "--format", "fmt", required=True, type=click.Choice(list(FORMAT_NAMES)), help="Output format."),
    click.option(
        "-o",
        "--output",
        type=ConvertDestination(),
        default=None,
        help="Output folder, or a bucket (s3://bucket/prefix: each shard uploaded as it is finished).  "
        "[default: SOURCE-FORMAT beside the source]",
        show_default=False,
    ),
    preprocess_options,
    click.option(
        "--codec",
        type=click.Choice(IMAGE_CODECS),
        default="raw",
        help="How images are stored: raw pixels, jpeg (lossy, several times smaller), png (lossless), or "
        "source: each JPEG/PNG file's own bytes where the preprocessing keeps its pixels (--resize none, "
        "or max within --size), the others re-encoded (JPEG, or PNG for lossless sources); readers "
        "decode them all. Needs --dtype uint8.",
    ),
    click.option(
        "--quality",
        type=click.IntRange(1, 95),
        default=DEFAULT_QUALITY,
        help="JPEG quality for --codec jpeg, and for the JPEGs --codec source re-encodes.",
    ),
    click.option(
        "--shard-size",
        default="auto",
        help="auto (<=256 MiB, balanced over workers; a large fixed-shape source: one count, <=20000), a "
        "sample count (1000), or bytes (256MB, 1GiB).",
    ),
    click.option(
        "--shuffle",
        "shuffle_seed",
        type=click.IntRange(min=0),
        default=None,
        help="Store samples in a permutation seeded by this number instead of sorted order (good for "
        "wds, whose readers then need only a small shuffle buffer).  [default: sorted order]",
        show_default=False,
    ),
    click.option(
        "--labels",
        "labels_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="CSV of 'relative path,label' rows: only the files it lists are packed (the others are "
        "skipped and reported); labels are class names, or class indices if all are integers >= 0.",
    ),
    text_options,
    pack_options,
    target_options,
    click.option(
        "--classes",
        "classes_from",
        type=click.Path(exists=True, path_type=Path),
        default=None,
        help="Take the class map (label indices) from this file (one class name per line) or packer output, "
        "so that another conversion of the same classes gets the same labels. With --annotations: the "
        "order of the categories (a detection output gives its categories).",
    ),
    click.option(
        "--add-classes",
        is_flag=True,
        help="With --classes: append classes the map lacks at its end instead of refusing them.",
    ),
    click.option(
        "--split",
        "split_spec",
        default=None,
        help="Cut the class folders into several outputs, e.g. train=0.9,val=0.1: a stratified random split "
        "(seeded by --split-seed), one class map for all, OUTPUT/train, OUTPUT/val.",
    ),
    click.option("--split-seed", type=click.IntRange(min=0), default=0, help="Seed of --split."),
    click.option(
        "--no-splits",
        is_flag=True,
        help="Top-level folders named train, val, valid, validation or test are classes, not splits.",
    ),
    click.option(
        "--dup-distance",
        type=click.IntRange(0, MAX_DUP_DISTANCE),
        default=DUP_DISTANCE,
        show_default=True,
        help="Report images whose perceptual hashes differ by at most this many bits (of 64) as "
        "near-duplicates: resized, re-encoded, brightened or slightly cropped copies (report.txt; "
        "leakage between splits).",
    ),
    click.option(
        "--drop-duplicates",
        is_flag=True,
        help="Keep the first image (by path) of each group of near-duplicates and skip the others, listed "
        "with the image they repeat; in splits, also the images of a later split that repeat one of an "
        "earlier split. The shards holding them are written twice.",
    ),
    click.option(
        "--no-image-hashes",
        is_flag=True,
        help="Do not hash the images (no image_hashes.npy, no near-duplicate report).",
    ),
    decode_options,
    click.option(
        "-j",
        "--workers",
        type=click.IntRange(min=1),
        default=None,
        help="Worker processes.  [default: usable cores]",
        show_default=False,
    ),
    click.option(
        "--strict", is_flag=True, help="Stop at the first bad file (exit 1, nothing written) instead of skipping it."
    ),
    click.option("--resume", is_flag=True, help="Continue an interrupted run from its finished shards."),
    click.option(
        "--timeout",
        type=click.FloatRange(min=1),
        default=DEFAULT_TIMEOUT,
        help="Seconds one file may take to decode before it is skipped as hanging.",
    ),
    click.option("--overwrite", is_flag=True, help="Replace an existing packer output at OUTPUT."),
    click.option(
        "--append",
        "append_",
        is_flag=True,
        help="Add the files of SOURCE that the existing output OUTPUT does not hold yet, as new shards: its "
        "shards stay as they are, its preprocessing and class map are used (a new class needs "
        "--add-classes). OUTPUT may be a bucket: only what the append reads of it is fetched.",
    ),
    click.option("-q", "--quiet", is_flag=True, help="No progress bar."),
    click.option(
        "--executor",
        "executor_name",
        type=click.Choice(["local", "ray"]),
        default="local",
        help="local: worker processes on this machine; ray: one Ray task per shard on a Ray cluster, the "
        "output on a filesystem every node sees (pip install 'packer-datasets[ray]'). The output is the "
        "same.",
    ),
    click.option(
        "--address",
        default=None,
        show_default=False,
        help="With --executor ray: the cluster, auto (the one `ray start` runs here) or ray://HOST:10001.  "
        "[default: a Ray instance on this machine for this run]",
    ),
    click.option(
        "--num-nodes",
        type=click.IntRange(min=1),
        default=None,
        help="Split the conversion over N machines without Ray (e.g. a SLURM array): this run writes the "
        "shards of --node-rank; `packer merge OUTPUT` publishes the output once every node is done.",
    ),
    click.option(
        "--node-rank",
        type=click.IntRange(min=0),
        default=None,
        help="This machine's number, 0 to N-1, with --num-nodes (e.g. $SLURM_ARRAY_TASK_ID).",
    ),
]
"""The argument and options in the order ``packer convert --help`` lists them."""


def convert_options(command: Callable) -> Callable:
    """``command`` with every argument and option of ``packer convert`` (as stacked decorators would add them)."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command
