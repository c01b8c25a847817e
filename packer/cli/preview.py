"""``packer preview``: a contact sheet (or, with ``--text``, a line a sample) of what the readers
return from an output, crops and flips of an epoch included with ``--train``; of a source folder's
images before conversion (``packer.sources.preview``); or of each source image beside its stored
sample (``--compare``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from packer.spec.errors import PackerError
from packer.spec.manifest import MANIFEST_NAME, read_manifest


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
@click.option(
    "--compare",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="The SOURCE folder OUTPUT was converted from: each source image drawn left of its stored sample "
    "(with --annotations, the same boxes on both).",
)
@click.option(
    "--annotations",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="With a SOURCE folder: its COCO json, YOLO or VOC folder of boxes, drawn on the images as a "
    "conversion would place them.",
)
@click.option(
    "--box-coords",
    type=click.Choice(["auto", "stored", "displayed"]),
    default="auto",
    show_default=True,
    help="With --annotations: which pixels the boxes are on when EXIF turns an image.",
)
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
    compare: Optional[Path],
    annotations: Optional[Path],
    box_coords: str,
) -> None:
    """Draw a contact sheet of OUTPUT's samples as the readers return them.

    Each image with its class name under it; detection boxes with their category names, segmentation
    masks laid over in colour. --train draws the crops and flips epoch --epoch would give. OUTPUT
    may also be a SOURCE folder of images, drawn before any conversion (with --annotations, its boxes).
    """
    import numpy as np

    from readers import RandomResizedCrop, open_dataset
    from readers.preview.sheet import read_samples

    if sheet is None and not as_text:
        raise click.UsageError("give -o SHEET.png for the picture, or --text for a line a sample")
    columns, rows = _grid(grid)
    if not (output / MANIFEST_NAME).is_file():
        if train:
            raise click.UsageError("--train draws the crops of a packed output; SOURCE is a folder of images")
        picked = (chosen, random_count, class_name, seed)
        return _preview_source(output, sheet, columns, rows, tile, picked, as_text, annotations, box_coords)
    if annotations is not None and compare is None:
        raise click.UsageError(
            f"--annotations draws a source folder's boxes; {output} is an output, which holds its own "
            "(with --compare SOURCE, they are drawn on SOURCE's images)"
        )
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
            wanted = _class_index(class_name, ds.classes, output)
            if not hasattr(ds, "targets"):
                raise click.ClickException(
                    f"--class reads the labels' index of npy, lmdb or hdf5 outputs; {output} is tar shards"
                )
            pool = np.flatnonzero(np.asarray(ds.targets) == wanted)
        indices = _chosen_indices(pool, count, chosen, random_count, seed, columns * rows, output)
        shown = read_samples(ds, indices)
        if compare is not None:  # each source image, then its stored sample
            shown = [s for pair in zip(_sources_of(shown, compare, annotations, box_coords), shown) for s in pair]
            columns = 2 * max(1, columns // 2)
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    _draw(shown, sheet, as_text, columns, tile, (ds.classes, ds.categories, ds.ignore_index), output)


def _preview_source(
    folder: Path,
    sheet: Optional[Path],
    columns: int,
    rows: int,
    tile: int,
    picked: tuple[Optional[str], Optional[int], Optional[str], int],
    as_text: bool,
    annotations: Optional[Path],
    box_coords: str,
) -> None:
    """``packer preview SOURCE``: the images of a source folder, upright, with their class names and
    (``annotations``) their boxes, as a conversion would see them. ``picked``: ``--samples``,
    ``--random``, ``--class`` and ``--seed``."""
    import numpy as np

    from packer.sources.preview import open_source, read_source_samples

    chosen, random_count, class_name, seed = picked
    try:
        view = open_source(folder, annotations, box_coords)
        found = view.found
        count = len(found.items)
        if not count:
            raise click.ClickException(
                f"{folder} is neither a packer output (it has no {MANIFEST_NAME}) nor a folder of images"
            )
        pool = np.arange(count)
        if class_name is not None:
            wanted = _class_index(class_name, found.classes, folder)
            pool = np.flatnonzero(np.array([item.label for item in found.items]) == wanted)
        indices = _chosen_indices(pool, count, chosen, random_count, seed, columns * rows, folder)
        shown = _tiles(read_source_samples(view, indices))
    except PackerError as e:
        raise click.ClickException(str(e)) from None
    _draw(shown, sheet, as_text, columns, tile, (found.classes, view.categories, None), folder)


def _draw(
    shown: list, sheet: Optional[Path], as_text: bool, columns: int, tile: int, names: tuple, where: Path
) -> None:
    """Report the tiles that could not be read, then print their lines (``as_text``) and write the
    ``sheet``; ``names``: the classes, categories and ignore index the tiles are captioned and painted with."""
    from readers.preview.sheet import contact_sheet, sample_lines

    classes, categories, ignore_index = names
    for s in shown:
        if s.error is not None:
            named = f" ({s.key})" if s.key else ""
            click.echo(f"sample {s.index}{named} could not be read: {s.error}", err=True)
    if as_text:
        click.echo("\n".join(sample_lines(shown, classes, categories)))
    if sheet is not None:
        picture = contact_sheet(shown, min(columns, max(1, len(shown))), tile, classes, categories, ignore_index)
        # zlib's fastest level: a sheet is looked at, not kept; level 6 took 0.64 s of a 2.8 s
        # preview (64 tiles) for a file 9% smaller
        picture.save(sheet, format="PNG", compress_level=1)
        click.echo(f"wrote {sheet}: {len(shown)} sample(s) of {where}")


def _sources_of(shown: list, folder: Path, annotations: Optional[Path], box_coords: str) -> list:
    """The source images of the samples ``shown`` (by key) in ``folder``, as ``Shown`` tiles; a key
    the folder lacks becomes a tile that says so."""
    from packer.sources.preview import open_source, read_source_samples
    from readers.preview.sheet import Shown

    view = open_source(folder, annotations, box_coords)
    where = {item.relpath: i for i, item in enumerate(view.found.items)}
    read = iter(_tiles(read_source_samples(view, [where[s.key] for s in shown if s.key in where])))
    tiles = []
    for s in shown:
        tile = next(read) if s.key in where else Shown(s.index, s.key, error=f"{s.key} is not in {folder}")
        tile.index = s.index  # the stored sample's position, which the pair is captioned with
        tiles.append(tile)
    return tiles


def _tiles(samples: list) -> list:
    """``packer.sources.preview``'s samples as the sheet's ``Shown`` tiles (the same fields)."""
    from readers.preview.sheet import Shown

    return [Shown(**vars(s)) for s in samples]


def _class_index(name: str, classes: Optional[list[str]], where: Path) -> int:
    """The label of class ``name`` of ``where``; a clear error naming its classes where it has none such."""
    if name not in (classes or []):
        raise click.ClickException(
            f"no class {name!r} in {where}; its classes: {', '.join(classes or []) or 'none (unlabelled)'}"
        )
    return (classes or []).index(name)


def _chosen_indices(
    pool, count: int, chosen: Optional[str], random_count: Optional[int], seed: int, shown: int, where: Path
) -> list[int]:
    """The positions ``--samples`` names, ``--random`` draws from ``pool``, or ``pool``'s first ``shown``."""
    import numpy as np

    if chosen is not None:
        indices = _indices(chosen)
        bad = [i for i in indices if not 0 <= i < count]
        if bad:
            raise click.BadParameter(f"{bad}: {where} holds samples 0 to {count - 1}", param_hint="--samples")
        return indices
    if random_count is not None:
        rng = np.random.default_rng(seed)
        return sorted(rng.choice(pool, size=min(random_count, len(pool)), replace=False).tolist())
    return pool[:shown].tolist()


__all__ = ["preview"]
