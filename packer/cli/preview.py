"""``packer preview``: a contact sheet (or, with ``--text``, a line a sample) of what the readers
return from an output, crops and flips of an epoch included with ``--train``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from packer.spec.errors import PackerError
from packer.spec.manifest import read_manifest


def _grid(text: str) -> tuple[int, int]:
    """``"8x8"`` -> (8 columns, 8 rows)."""
    try:
        columns, rows = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise click.BadParameter(f"{text!r}: give COLUMNSxROWS, e.g. 8x8") from None
    if columns < 1 or rows < 1:
        raise click.BadParameter(f"{text!r}: both counts must be at least 1")
    return columns, rows


def _indices(text: str) -> list[int]:
    """``"0,5,17"`` -> [0, 5, 17]."""
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: give sample indices separated by commas, e.g. 0,5,17") from None


@click.command()
@click.argument("output", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--out", "sheet", type=click.Path(dir_okay=False, path_type=Path), help="PNG to write.")
@click.option("--grid", default="8x8", show_default=True, help="Tiles as COLUMNSxROWS.")
@click.option("--tile", type=click.IntRange(min=32), default=160, show_default=True, help="Tile side in pixels.")
@click.option("--samples", "chosen", default=None, help="Sample indices to show, e.g. 0,5,17.")
@click.option("--random", "random_count", type=click.IntRange(min=1), default=None, help="N samples drawn at random.")
@click.option("--class", "class_name", default=None, help="Only samples of this class.")
@click.option("--train", is_flag=True, help="Show what training gets: a RandomResizedCrop (--crop) and --flip.")
@click.option("--crop", type=click.IntRange(min=1), default=224, show_default=True, help="With --train: the crop size.")
@click.option("--flip", is_flag=True, help="With --train: random horizontal flips.")
@click.option(
    "--epoch", type=click.IntRange(min=0), default=0, show_default=True, help="The epoch whose crops to draw."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --random and of the crops.")
@click.option("--text", "as_text", is_flag=True, help="Print a line a sample (key, class, boxes) instead of a PNG.")
def preview(
    output: Path,
    sheet: Optional[Path],
    grid: str,
    tile: int,
    chosen: Optional[str],
    random_count: Optional[int],
    class_name: Optional[str],
    train: bool,
    crop: int,
    flip: bool,
    epoch: int,
    seed: int,
    as_text: bool,
) -> None:
    """Draw a contact sheet of OUTPUT's samples as the readers return them.

    Each image with its class name under it; detection boxes with their category names, segmentation
    masks laid over in colour. --train draws the crops and flips epoch --epoch would give.
    """
    import numpy as np

    from readers import RandomResizedCrop, open_dataset
    from readers.preview.sheet import contact_sheet, read_samples, sample_lines

    if sheet is None and not as_text:
        raise click.UsageError("give -o SHEET.png for the picture, or --text for a line a sample")
    columns, rows = _grid(grid)
    try:
        manifest = read_manifest(output)
        if manifest.tokens is not None:
            raise click.ClickException(
                f"{output} holds token blocks, not pictures: packer info {output} describes it, and "
                "readers.open_dataset reads its blocks"
            )
        options: dict = {"normalize": False, "return_meta": True, "seed": seed}
        if train:
            options.update(crop=RandomResizedCrop(crop), flip=flip)
        ds = open_dataset(output, **options)
        if not ds.manifest.has_image:
            raise click.ClickException(f"{output} stores no images: read its texts with readers.open_dataset")
        ds.set_epoch(epoch)
        count = len(ds)
        pool = np.arange(count)
        if class_name is not None:
            classes = ds.classes or []
            if class_name not in classes:
                raise click.ClickException(
                    f"no class {class_name!r} in {output}; its classes: {', '.join(classes) or 'none (unlabelled)'}"
                )
            if not hasattr(ds, "targets"):
                raise click.ClickException(
                    f"--class reads the labels' index of npy, lmdb or hdf5 outputs; {output} is tar shards"
                )
            pool = np.flatnonzero(np.asarray(ds.targets) == classes.index(class_name))
        if chosen is not None:
            indices = _indices(chosen)
            bad = [i for i in indices if not 0 <= i < count]
            if bad:
                raise click.BadParameter(f"{bad}: {output} holds samples 0 to {count - 1}", param_hint="--samples")
        elif random_count is not None:
            rng = np.random.default_rng(seed)
            indices = sorted(rng.choice(pool, size=min(random_count, len(pool)), replace=False).tolist())
        else:
            indices = pool[: columns * rows].tolist()
        shown = read_samples(ds, indices)
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    for s in shown:
        if s.error is not None:
            click.echo(f"sample {s.index} could not be read: {s.error}", err=True)
    if as_text:
        click.echo("\n".join(sample_lines(shown, ds.classes, ds.categories)))
    if sheet is not None:
        picture = contact_sheet(
            shown, min(columns, max(1, len(shown))), tile, ds.classes, ds.categories, ds.ignore_index
        )
        picture.save(sheet, format="PNG")
        click.echo(f"wrote {sheet}: {len(shown)} sample(s) of {output}")


__all__ = ["preview"]
