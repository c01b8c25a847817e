"""``packer convert``: the command, and the checks of what its options ask for (through
``ConvertJob.validate``). The options are declared in ``packer.cli.convert_options``, the run with
progress bars is ``packer.cli.convert_run``; ``packer.cli.grow`` when the source is a packer output
or with ``--append``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import click

from packer.cli.convert_options import convert_options
from packer.cli.convert_run import run_conversion
from packer.cli.grow import append_to, repack_output
from packer.cli.option_values import parse_shard_size
from packer.cli.options import preprocess_config
from packer.cli.pack import run_pack
from packer.cli.remote_output import uploaded
from packer.config import ConvertConfig, DetectionConfig, ImageCodec, MaskConfig
from packer.ops.nodes import NodeSplit
from packer.ops.split_plans import parse_split_spec, split_folders
from packer.ops.splits import read_class_map
from packer.run.job import ConvertJob, Selection
from packer.sources.containers import container_kind
from packer.sources.walk import is_packer_folder
from packer.spec.errors import ConfigError, InputError, PackerError
from packer.spec.manifest import MANIFEST_NAME
from packer.spec.text import TextConfig


@click.command()
@convert_options
def convert(**params: Any) -> None:
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

    With --pack BLOCK, SOURCE is a text corpus for language-model pretraining, tokenized with
    --tokenizer once and packed into blocks of BLOCK tokens (docs/TOKENS.md).

    OUTPUT may be a bucket (s3://bucket/prefix, gs://, any fsspec URL): each shard is uploaded as it
    is finished (a few at a time on the local disk, under TMPDIR), each file checked, the manifest last.
    """
    if isinstance(params["output"], str):  # a URL: shards uploaded as they finish
        with uploaded(click.get_current_context(), params["output"]) as local:
            _convert(**{**params, "output": local, "overwrite": False})
        return
    _convert(**params)


def _convert(
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
    pack: Optional[int],
    pack_mode: str,
    documents: str,
    text_key: str,
    eos: Optional[int],
    bos: bool,
    bos_id: Optional[int],
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
    dup_distance: int,
    drop_duplicates: bool,
    no_image_hashes: bool,
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
    """The conversion itself (see ``convert``), into a local folder."""
    if drop_duplicates and (pack is not None or append_ or (source / MANIFEST_NAME).is_file()):
        what = "--pack" if pack is not None else "--append" if append_ else "a repack (SOURCE is an output)"
        raise click.UsageError(f"--drop-duplicates with {what} is not built yet: it drops images of a conversion")
    if pack is not None:
        run_pack(click.get_current_context())
        return
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
            fmt,
            pre,
            parse_shard_size(shard_size),
            shuffle_seed,
            ImageCodec(codec, quality),
            text,
            detection,
            masks,
            image_hashes=not no_image_hashes,
            dup_distance=dup_distance,
            drop_duplicates=drop_duplicates,
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
    run_conversion(
        source,
        output,
        config,
        splits=splits,
        fractions=fractions,
        split_seed=split_seed,
        node=node,
        classes=classes,
        add_classes=add_classes,
        labels_file=labels_file,
        workers=workers,
        overwrite=overwrite,
        strict=strict,
        resume=resume,
        timeout=timeout,
        quiet=quiet,
        executor_name=executor_name,
        address=address,
    )


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
