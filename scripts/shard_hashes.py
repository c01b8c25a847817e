"""Record, then check, the SHA-256 of every file of a fixed set of conversions: a guard for refactors.

A refactor that moves code between modules must change no byte of any output. This script runs a
broad, fixed set of conversions (every format, image codec, resize mode, splits, text fields with
and without a tokenizer, COCO/YOLO/VOC boxes, segmentation masks, shuffle, append, combine, repack,
a node split and its merge, container sources) on small inputs it writes itself with fixed seeds,
and hashes every file of every output:

    python scripts/shard_hashes.py record [--out tests/data/shard_hashes.json]
    python scripts/shard_hashes.py check [--record tests/data/shard_hashes.json]

``record`` writes the hashes, with the versions of the libraries that shape the bytes; ``check``
runs the same conversions again and prints each difference (conversion, file, recorded, now), files
missing or new, and exits 1 on any. Record before a move, check after each one (and
``tests/test_shard_hashes.py`` checks in the test suite). With other library versions (Pillow's
encoders, HDF5, LMDB, ...) the bytes may legitimately differ: ``check`` says so; re-record then.

JSON side files (``manifest.json``, ``splits.json``, ``shardindex.json``) and ``report.txt`` are
hashed with the values that may differ between equal conversions replaced by ``<stripped>`` in their
text (the rest byte for byte): ``packer_version`` (and the version in report.txt's first line), an
append's time stamp (``history[].at``), and ``manifest_sha256``, the SHA-256 of another output's
manifest (a combine's inputs, a repack's source, each split of a set), which changes with the
version it holds; each such manifest is recorded on its own. Every other byte is as written: two
records made one after the other, in other temporary folders, are equal.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import platform
import re
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Sequence, Union

import numpy as np
from PIL import Image, ImageOps

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RECORD = ROOT / "tests" / "data" / "shard_hashes.json"
FORMATS = ("npy", "lmdb", "hdf5", "wds")
STRIPPED = "<stripped>"

DISTRIBUTIONS = (
    "Pillow",
    "numpy",
    "simplejpeg",
    "opencv-python-headless",
    "h5py",
    "lmdb",
    "webdataset",
    "zlib-ng",
    "pycocotools",
    "tokenizers",
)
"""Distributions whose versions are recorded: the libraries that encode, decode, resize or write the
bytes, of the inputs (Pillow's PNGs and JPEGs, the tokenizer.json) or of the outputs. (The converter
writes its tar files itself and opencv and webdataset serve the readers: recorded all the same.)"""

Step = Union[tuple[str, ...], Callable[[Path], None]]
"""A CLI command line (``{w}`` stands for the work folder), or a function of the work folder."""


@dataclass(frozen=True)
class Conversion:
    """One recorded conversion: its steps, run in order, and the output folder hashed after them."""

    name: str
    output: str
    steps: tuple[Step, ...]


# Inputs ------------------------------------------------------------------------------------------
# Copies of the tests' helpers, not imports: the recorded inputs must not change when a test helper does.


def write_image(path: Path, size: tuple[int, int], mode: str = "RGB", seed: int = 0, **save: object) -> Path:
    """A smooth random image of ``size`` (w, h) and ``mode`` (as tests/conftest.py's ``write_image``)."""
    rng = np.random.default_rng(seed)
    w, h = size
    channels = {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2}.get(mode, 3)
    base = rng.integers(0, 256, size=(max(1, h // 8), max(1, w // 8), channels), dtype=np.uint8)
    pixels = base.squeeze(-1) if channels == 1 else base
    small = Image.fromarray(pixels, mode if mode in ("RGB", "RGBA", "L", "LA") else "RGB")
    img = small.resize((w, h), Image.BILINEAR)
    if img.mode != mode:
        img = img.convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, **save)
    return path


def make_tree(root: Path, classes: dict[str, int], size: tuple[int, int] = (40, 30), ext: str = "png") -> list[Path]:
    """Class folders of ``count`` images each, sizes varying a little per file (as conftest's ``make_tree``)."""
    paths = []
    for ci, (name, count) in enumerate(sorted(classes.items())):
        for i in range(count):
            w, h = size[0] + 7 * i, size[1] + 3 * ci
            paths.append(write_image(root / name / f"img_{i:03d}.{ext}", (w, h), seed=100 * ci + i))
    return paths


def write_images(root: Path) -> None:
    """The main source: PNG, JPEG (one EXIF-turned), RGBA, grayscale and palette files in three
    classes, a duplicate, a file that fails to decode and litter the walk ignores."""
    make_tree(root, {"ant": 4}, (40, 30))
    make_tree(root, {"bee": 3}, (48, 36), ext="jpg")
    write_image(root / "cat" / "rgba.png", (44, 33), "RGBA", seed=7)
    write_image(root / "cat" / "gray.png", (36, 44), "L", seed=8)
    write_image(root / "cat" / "palette.png", (50, 30), "P", seed=9)
    exif = Image.Exif()
    exif[0x0112] = 6
    write_image(root / "cat" / "turned.jpg", (56, 40), seed=10, exif=exif, quality=92)
    write_image(root / "cat" / "wide.png", (90, 20), seed=11)
    write_image(root / "ant" / "copy.png", (40, 30), seed=0)  # ant/img_000.png's bytes: a duplicate
    (root / "bee" / "bad.png").write_bytes(b"not an image")
    (root / "ant" / ".DS_Store").write_bytes(b"\0\1")
    (root / "cat" / "notes.txt").write_text("not an image\n")


def write_pairs(root: Path, per_class: int = 3) -> None:
    """Samples of an image, a text and a JSON file sharing a stem; dogs/0002 lacks its JSON."""
    for c, cls in enumerate(("cats", "dogs")):
        for i in range(per_class):
            write_image(root / cls / f"{i:04d}.png", (20 + i, 16), seed=10 * c + i)
            (root / cls / f"{i:04d}.txt").write_text(f"a {cls[:-1]} number {i}", encoding="utf-8")
            if not (cls == "dogs" and i == 2):
                (root / cls / f"{i:04d}.json").write_text(json.dumps({"n": i, "cls": cls}), encoding="utf-8")


TEXTS = {
    "pos/a.txt": "good film\nreally good",
    "pos/b.txt": "\u00e9t\u00e9 caf\u00e9 \u2014 \u65e5\u672c",
    "pos/c.txt": "good " * 40,
    "pos/d.txt": "really really good film",
    "neg/a.txt": "bad",
    "neg/b.txt": "  leading and trailing spaces kept  ",
    "neg/c.txt": "bad film and bad spaces",
}


def write_texts(root: Path) -> None:
    """A text-only class tree (as tests/test_text.py's), with a CRLF file, a BOM and one that is not UTF-8."""
    for rel, text in TEXTS.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    (root / "neg" / "crlf.txt").write_bytes(b"\xef\xbb\xbfone\r\ntwo")
    (root / "neg" / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))


def write_tokenizer(path: Path) -> None:
    """A small word-level tokenizer with [CLS] ... [SEP] around every text (as tests/test_text.py's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = "good film really bad leading and trailing spaces kept".split()
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.save(str(path))


COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
CATEGORIES = ["circle", "square", "star"]
BOXED = [  # stored size, EXIF orientation, rectangles (x0, y0, x1, y1) on the stored grid
    ((60, 40), 1, [(5, 5, 20, 25), (25, 10, 55, 35), (1, 30, 6, 39)]),
    ((80, 30), 3, [(0, 2, 6, 28), (30, 5, 50, 25), (70, 10, 79, 20)]),
    ((45, 75), 6, [(10, 15, 35, 40), (2, 1, 15, 7), (20, 60, 42, 74)]),
    ((50, 50), 1, []),  # no boxes: a negative
]


def _region(pixels: np.ndarray, colour: tuple[int, ...]) -> tuple[float, float, float, float]:
    """The box (pixel edges) of the pixels of ``colour`` in ``pixels``."""
    ys, xs = np.nonzero((pixels[..., :3] == np.array(colour)).all(axis=-1))
    return (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))


def write_detection(root: Path) -> None:
    """PNG images with EXIF orientations and their boxes as COCO (with polygon and RLE segmentations),
    YOLO (on the turned images, as Ultralytics reads them) and Pascal VOC (1-based, inclusive)."""
    from pycocotools import mask as cocomask

    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    (root / "voc").mkdir()
    (root / "labels" / "classes.txt").write_text("\n".join(CATEGORIES) + "\n")
    entries, anns = [], []
    for i, ((w, h), orientation, rects) in enumerate(BOXED):
        pixels = np.full((h, w, 3), 40, np.uint8)
        for n, (x0, y0, x1, y1) in enumerate(rects):
            pixels[y0:y1, x0:x1] = COLOURS[n]
        exif = Image.Exif()
        exif[0x0112] = orientation
        name = f"img{i}.png"
        Image.fromarray(pixels).save(root / "images" / name, exif=exif)
        shown = np.asarray(ImageOps.exif_transpose(Image.open(root / "images" / name)))
        entries.append({"id": i + 1, "file_name": name, "width": w, "height": h})
        voc = ElementTree.Element("annotation")
        ElementTree.SubElement(voc, "filename").text = name
        size = ElementTree.SubElement(voc, "size")
        ElementTree.SubElement(size, "width").text = str(w)
        ElementTree.SubElement(size, "height").text = str(h)
        rows = []
        for n, (x0, y0, x1, y1) in enumerate(rects):
            ann: dict = {"id": len(anns) + 1, "image_id": i + 1, "category_id": 10 + n, "iscrowd": 0}
            ann.update(bbox=[x0, y0, x1 - x0, y1 - y0], area=(x1 - x0) * (y1 - y0))
            if n % 2:  # a polygon: the rectangle's outline
                ann["segmentation"] = [[x0, y0, x1, y0, x1, y1, x0, y1]]
            else:  # a compressed RLE of the rectangle
                m = np.zeros((h, w), np.uint8)
                m[y0:y1, x0:x1] = 1
                rle = cocomask.encode(np.asfortranarray(m))
                ann["segmentation"] = {"size": [h, w], "counts": rle["counts"].decode("ascii")}
            anns.append(ann)
            obj = ElementTree.SubElement(voc, "object")
            ElementTree.SubElement(obj, "name").text = CATEGORIES[n]
            box = ElementTree.SubElement(obj, "bndbox")
            for key, value in zip(("xmin", "ymin", "xmax", "ymax"), (x0 + 1, y0 + 1, x1, y1)):
                ElementTree.SubElement(box, key).text = str(value)
            a0, b0, a1, b1 = _region(shown, COLOURS[n])
            sw, sh = shown.shape[1], shown.shape[0]
            rows.append(
                f"{n} {(a0 + a1) / 2 / sw:.6f} {(b0 + b1) / 2 / sh:.6f} {(a1 - a0) / sw:.6f} {(b1 - b0) / sh:.6f}"
            )
        ElementTree.ElementTree(voc).write(root / "voc" / f"img{i}.xml")
        if rows:  # an image without a label file is a negative
            (root / "labels" / f"img{i}.txt").write_text("\n".join(rows) + "\n")
    cats = [{"id": 10 + k, "name": name} for k, name in enumerate(CATEGORIES)]
    (root / "coco.json").write_text(json.dumps({"images": entries, "annotations": anns, "categories": cats}))


SEGMENTED = [  # stored size, EXIF orientation, rectangles -> class on the stored grid
    ((60, 40), 1, {1: (5, 5, 25, 30), 2: (30, 10, 55, 35)}),
    ((45, 75), 6, {3: (10, 15, 35, 45), 1: (2, 50, 20, 70)}),
    ((80, 30), 1, {2: (0, 0, 15, 30), 3: (50, 5, 75, 25)}),
]


def write_segmentation(root: Path) -> None:
    """Images with class-index palette-PNG masks: in a masks folder (``root/images``, ``root/masks``),
    and as JPEGs with their masks beside them (``root/sidecar``)."""
    for folder in ("images", "masks", "sidecar"):
        (root / folder).mkdir(parents=True)
    for i, ((w, h), orientation, rects) in enumerate(SEGMENTED):
        pixels = np.full((h, w, 3), 30, np.uint8)
        mask = np.zeros((h, w), np.uint8)
        for cls, (x0, y0, x1, y1) in rects.items():
            pixels[y0:y1, x0:x1] = COLOURS[cls - 1]
            mask[y0:y1, x0:x1] = cls
        exif = Image.Exif()
        exif[0x0112] = orientation
        Image.fromarray(pixels).save(root / "images" / f"{i}.png", exif=exif)
        Image.fromarray(pixels).save(root / "sidecar" / f"{i}.jpg", quality=95)
        palette = Image.fromarray(mask, "L").convert("P")
        palette.putpalette([0, 0, 0, 200, 0, 0, 0, 200, 0, 0, 0, 200] + [0] * 756)
        palette.save(root / "masks" / f"{i}.png")
        palette.save(root / "sidecar" / f"{i}.png")


def write_containers(root: Path, images: Path) -> None:
    """The ``ant`` and ``cat`` PNGs of ``images`` as a Parquet file of image structs with class names,
    and as two WebDataset tar shards of ``KEY.png`` and ``KEY.cls`` members."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(p for p in images.glob("*/*.png") if p.parent.name in ("ant", "cat") and p.name != "copy.png")
    rows = [{"bytes": p.read_bytes(), "path": f"{p.parent.name}/{p.name}"} for p in reversed(files)]
    table = pa.table({"image": rows, "label": [p.parent.name for p in reversed(files)]})
    pq.write_table(table, root / "images.parquet", row_group_size=3)
    (root / "tars").mkdir()
    for n, part in enumerate((files[:4], files[4:])):
        with tarfile.open(root / "tars" / f"part-{n}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i, p in enumerate(part):
                for name, data in ((f"s{n}{i:04d}.png", p.read_bytes()), (f"s{n}{i:04d}.cls", str(i % 2).encode())):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime = len(data), 0
                    tar.addfile(info, io.BytesIO(data))


def write_inputs(w: Path) -> None:
    """Every input of every conversion, under the work folder ``w``."""
    write_images(w / "images")
    for i in range(6):  # a folder without class folders
        write_image(w / "flat-src" / f"img_{i:03d}.png", (36 + 5 * i, 28), seed=300 + i)
    (w / "labels.csv").write_text("".join(f"img_{i:03d}.png,{'odd' if i % 2 else 'even'}\n" for i in range(5)))
    (w / "classes.txt").write_text("cat\nbee\nant\n")
    for split, counts in (
        ("train", {"ant": 3, "bee": 3}),
        ("val", {"ant": 2, "bee": 1}),
        ("test", {"ant": 1, "bee": 2}),
    ):
        make_tree(w / "split-folders" / split, counts, (30 + len(split), 24))
    make_tree(w / "split-src", {"ant": 5, "bee": 4, "cat": 3}, (32, 24))
    write_pairs(w / "pairs")
    write_texts(w / "texts")
    write_tokenizer(w / "tokenizer.json")
    write_detection(w / "det")
    write_segmentation(w / "seg")
    write_containers(w, w / "images")
    make_tree(w / "combine-a", {"cat": 3, "dog": 2}, (24, 18))
    make_tree(w / "combine-b", {"cat": 2, "emu": 3}, (24, 18))
    write_image(w / "combine-b" / "emu" / "img_009.png", (24, 18), seed=0)  # combine-a's cat/img_000.png


def _append_files(fmt: str) -> Callable[[Path], None]:
    """A step adding new files (and a new class) to ``append-src-FMT`` before the append."""

    def add(w: Path) -> None:
        """Write the new files."""
        src = w / f"append-src-{fmt}"
        for i in range(3):
            write_image(src / "bee" / f"new_{i}.png", (30 + i, 22), seed=500 + i)
        write_image(src / "cow" / "new_0.png", (26, 26), seed=600)
        write_image(src / "ant" / "new_dup.png", (30, 22), seed=500)  # bee/new_0.png's bytes

    return add


def _append_source(fmt: str) -> Callable[[Path], None]:
    """A step writing the source an append output is first converted from."""

    def write(w: Path) -> None:
        """Write the first files."""
        make_tree(w / f"append-src-{fmt}", {"ant": 3, "bee": 2}, (30, 22))

    return write


# Conversions -------------------------------------------------------------------------------------


def convert_args(src: str, fmt: str, out: str, options: str, workers: int = 2) -> tuple[str, ...]:
    """``packer convert`` of ``{w}/src`` into ``{w}/out`` with ``options`` (split at spaces), quiet, with a
    fixed worker count."""
    return ("convert", f"{{w}}/{src}", "-f", fmt, "-o", f"{{w}}/{out}", "-j", str(workers), "-q", *options.split())


SMALL = "--size 16x12 --shard-size 4"
COCO = "--annotations {w}/det/coco.json --box-coords stored"


def conversions() -> list[Conversion]:
    """The fixed set of conversions, in the order they run (later ones read earlier outputs)."""
    runs: list[Conversion] = []

    def add(name: str, *steps: Step) -> None:
        """A conversion of ``steps`` whose output folder is its name."""
        runs.append(Conversion(name, name, tuple(steps)))

    def simple(name: str, src: str, fmt: str, options: str, workers: int = 2) -> None:
        """A conversion of one ``packer convert``."""
        add(name, convert_args(src, fmt, name, options, workers))

    for fmt in FORMATS:
        simple(f"{fmt}-raw", "images", fmt, SMALL)
        simple(f"{fmt}-png", "images", fmt, f"{SMALL} --codec png")
        simple(f"{fmt}-jpeg", "images", fmt, f"{SMALL} --codec jpeg --quality 85")
        simple(f"{fmt}-source", "images", fmt, "--resize max --size 48 --shard-size 4 --codec source")
        simple(f"{fmt}-none", "images", fmt, "--resize none --shard-size 3")
        simple(f"{fmt}-shuffle", "images", fmt, f"{SMALL} --shuffle 7", workers=1)
        simple(f"{fmt}-pairs", "pairs", fmt, SMALL)
        simple(f"{fmt}-text", "texts", fmt, "--shard-size 3")
        simple(f"{fmt}-tokens", "texts", fmt, "--shard-size 3 --tokenizer {w}/tokenizer.json --max-length 6")
        simple(f"{fmt}-coco", "det/images", fmt, f"--size 24x20 --shard-size 2 {COCO}")
        simple(f"{fmt}-masks", "seg/images", fmt, "--size 24x20 --shard-size 2 --masks {w}/seg/masks")
        add(
            f"{fmt}-append",
            _append_source(fmt),
            convert_args(f"append-src-{fmt}", fmt, f"{fmt}-append", "--size 16x12 --shard-size 2"),
            _append_files(fmt),
            convert_args(f"append-src-{fmt}", fmt, f"{fmt}-append", "--append --add-classes --shard-size 2"),
        )
        simple(f"{fmt}-combine-a", "combine-a", fmt, "--size 16x12 --shard-size 2", workers=1)
        simple(f"{fmt}-combine-b", "combine-b", fmt, "--size 16x12 --shard-size 2", workers=1)
        a, b = f"{{w}}/{fmt}-combine-a", f"{{w}}/{fmt}-combine-b"
        add(f"{fmt}-combine", ("combine", a, b, "-o", f"{{w}}/{fmt}-combine", "-j", "2", "-q"))
        simple(f"{fmt}-repack-png", "npy-raw", fmt, "--codec png --shard-size 5")
    # Repacks between formats: stored JPEG and source bytes kept, shuffled order, text, boxes
    simple("repack-wds-to-lmdb", "wds-jpeg", "lmdb", "--shard-size 3")
    simple("repack-lmdb-to-hdf5", "lmdb-shuffle", "hdf5", "--shard-size 5")
    simple("repack-hdf5-to-npy", "hdf5-source", "npy", "--shard-size auto")
    simple("repack-npy-none-to-wds-jpeg", "npy-none", "wds", "--codec jpeg --shard-size 4")
    simple("repack-wds-text-to-npy", "wds-tokens", "npy", "--shard-size 2")
    simple("repack-npy-coco-to-wds", "npy-coco", "wds", "--shard-size 3")
    # Resize modes, crops, geometry, colour modes, filters, dtypes, normalization
    simple("npy-stretch", "images", "npy", f"{SMALL} --resize stretch --interpolation bicubic")
    simple("npy-pad", "images", "npy", f"{SMALL} --resize pad --fill 10,20,30")
    simple("npy-shorter", "images", "npy", "--resize shorter --size 20 --shard-size 4")
    simple("npy-max", "images", "npy", "--resize max --size 40 --shard-size 4")
    simple("npy-crop", "images", "npy", "--resize shorter --size 20 --crop 24x16 --shard-size 4")
    simple("npy-fractional", "images", "npy", f"{SMALL} --geometry fractional --interpolation lanczos")
    simple("npy-full-decode", "images", "npy", f"{SMALL} --full-decode --interpolation box")
    simple("npy-gray", "images", "npy", f"{SMALL} --mode L --interpolation hamming --background 0")
    simple("npy-gray-png-nearest", "images", "npy", f"{SMALL} --mode L --codec png --interpolation nearest")
    simple("hdf5-float16", "images", "hdf5", f"{SMALL} --dtype float16")
    simple("wds-float32", "images", "wds", f"{SMALL} --dtype float32 --normalize 0.5,0.25")
    simple("lmdb-auto-normalize", "images", "lmdb", f"{SMALL} --normalize auto")
    simple("npy-none-normalize", "images", "npy", f"{SMALL} --normalize none --dtype float32")
    # Shard sizes in bytes and auto
    simple("npy-shard-bytes", "images", "npy", "--size 16x12 --shard-size 1200b")
    simple("npy-shard-bytes-unit", "images", "npy", "--size 16x12 --shard-size 3KiB")
    simple("wds-shard-auto", "images", "wds", "--size 16x12 --shard-size auto")
    # Labels, classes, unlabelled, splits, nodes
    simple("npy-unlabelled", "flat-src", "npy", SMALL)
    simple("lmdb-labels-file", "flat-src", "lmdb", f"{SMALL} --labels {{w}}/labels.csv")
    simple("npy-classes-file", "images", "npy", f"{SMALL} --classes {{w}}/classes.txt")
    simple("wds-split-folders", "split-folders", "wds", SMALL)
    simple("npy-no-splits", "split-folders", "npy", f"{SMALL} --no-splits")
    simple("hdf5-split", "split-src", "hdf5", f"{SMALL} --split train=0.6,val=0.2,test=0.2 --split-seed 3")
    simple("npy-split-shuffle", "split-src", "npy", f"{SMALL} --split train=0.5,val=0.5 --shuffle 2")
    nodes = "--size 16x12 --shard-size 3 --num-nodes 2 --node-rank"
    add(
        "npy-nodes",
        convert_args("images", "npy", "npy-nodes", f"{nodes} 1", workers=1),
        convert_args("images", "npy", "npy-nodes", f"{nodes} 0", workers=1),
        ("merge", "{w}/npy-nodes"),
    )
    # Text options, detection formats and options, masks, container sources
    simple("npy-pairs-allow-missing", "pairs", "npy", f"{SMALL} --allow-missing")
    simple("hdf5-pairs-fields", "pairs", "hdf5", f"{SMALL} --fields image,text --codec png")
    simple("lmdb-text-latin1", "texts", "lmdb", "--shard-size 4 --encoding latin-1")
    simple("npy-yolo", "det/images", "npy", "--size 24x20 --shard-size 2 --annotations {w}/det/labels")
    voc = "--annotations {w}/det/voc --box-coords stored"
    simple("hdf5-voc-pad", "det/images", "hdf5", f"--size 24 --resize pad {voc}")
    simple(
        "lmdb-coco-crop", "det/images", "lmdb", f"--resize shorter --size 30 --crop 20 {COCO} --min-box-visibility 0.5"
    )
    simple("wds-masks-sidecar", "seg/sidecar", "wds", "--size 24x20 --shard-size 2 --mask-sidecar")
    simple("npy-masks-pad", "seg/images", "npy", "--size 24 --resize pad --masks {w}/seg/masks --mask-ignore 250")
    simple("npy-parquet", "images.parquet", "npy", SMALL)
    simple("wds-tar-source", "tars", "wds", SMALL)
    return runs


# Running and hashing -----------------------------------------------------------------------------

_VARYING = re.compile(r'("(?:packer_version|at|manifest_sha256)": )"[^"]*"')
"""JSON values that differ between equal runs (see the module), replaced by ``<stripped>``."""


def normalized(relpath: str, data: bytes) -> bytes:
    """``data`` with the values that vary between equal runs replaced by ``<stripped>``: in JSON side
    files, the keys of ``_VARYING``; in ``report.txt``, the packer version. Other files as they are."""
    if relpath.endswith(".json"):
        return _VARYING.sub(rf'\1"{STRIPPED}"', data.decode("utf-8")).encode("utf-8")
    if relpath.rsplit("/", 1)[-1] == "report.txt":
        from packer import __version__

        return data.replace(f"packer {__version__}".encode(), f"packer {STRIPPED}".encode())
    return data


def hash_output(folder: Path) -> dict[str, str]:
    """Relative path (posix) -> SHA-256 of every file under ``folder``, side files ``normalized``."""
    found = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            rel = p.relative_to(folder).as_posix()
            found[rel] = hashlib.sha256(normalized(rel, p.read_bytes())).hexdigest()
    return found


def run_step(step: Step, w: Path) -> None:
    """Run one step in the work folder ``w``: a CLI command (in this process) or a function."""
    if callable(step):
        step(w)
        return
    from click.testing import CliRunner

    from packer.cli import cli

    args = [a.replace("{w}", str(w)) for a in step]
    result = CliRunner().invoke(cli, args, catch_exceptions=True)
    if result.exit_code != 0:
        detail = f"{result.output}\n{result.exception!r}" if result.exception else result.output
        raise RuntimeError(f"packer {' '.join(step)} exited with {result.exit_code}:\n{detail}")


def run_all(log: Callable[[str], None] = lambda _: None) -> dict[str, dict[str, str]]:
    """Run every conversion in a new temporary folder: conversion name -> ``hash_output`` of its output."""
    runs = conversions()
    hashes: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="shard-hashes-") as tmp:
        w = Path(tmp)
        write_inputs(w)
        for run in runs:
            started = time.perf_counter()
            for step in run.steps:
                run_step(step, w)
            hashes[run.name] = hash_output(w / run.output)
            log(f"{run.name}: {len(hashes[run.name])} files, {time.perf_counter() - started:.2f} s")
    return hashes


def installed_versions() -> dict[str, str]:
    """Versions of what shapes the bytes: Python (major.minor: json, tarfile), the ``DISTRIBUTIONS``, and the
    C libraries inside them (Pillow's libjpeg-turbo and zlib, HDF5, LMDB)."""
    import h5py
    import lmdb
    from PIL import features

    versions = {"python": ".".join(platform.python_version_tuple()[:2])}
    for name in DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    versions["libjpeg-turbo (Pillow)"] = str(features.version("libjpeg_turbo"))
    versions["zlib (Pillow)"] = str(features.version("zlib"))
    versions["HDF5"] = h5py.version.hdf5_version
    versions["liblmdb"] = ".".join(map(str, lmdb.version()))
    return versions


def differing_versions(recorded: dict[str, str], installed: dict[str, str]) -> list[str]:
    """``name recorded -> installed`` for each version that differs."""
    names = sorted(set(recorded) | set(installed))
    return [f"{n} {recorded.get(n)} -> {installed.get(n)}" for n in names if recorded.get(n) != installed.get(n)]


def compare(old: dict[str, dict[str, str]], new: dict[str, dict[str, str]]) -> list[str]:
    """One line per difference between two ``run_all`` results: conversion, file, recorded, now."""
    lines = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            lines.append(f"{name}: conversion recorded but not run")
            continue
        if name not in old:
            lines.append(f"{name}: conversion not in the record")
            continue
        a, b = old[name], new[name]
        for rel in sorted(set(a) | set(b)):
            if rel not in b:
                lines.append(f"{name}  {rel}: missing (recorded {a[rel]})")
            elif rel not in a:
                lines.append(f"{name}  {rel}: new file ({b[rel]})")
            elif a[rel] != b[rel]:
                lines.append(f"{name}  {rel}: recorded {a[rel]}, now {b[rel]}")
    return lines


def load_record(path: Path) -> dict:
    """The JSON ``record`` wrote."""
    return json.loads(path.read_text(encoding="utf-8"))


def record(out: Path, log: Callable[[str], None] = print) -> None:
    """Run every conversion and write the hashes, with the versions, to ``out``."""
    data = {
        "about": "SHA-256 of every output file of scripts/shard_hashes.py's conversions (JSON side files and "
        "report.txt normalized: see the script). Check with: python scripts/shard_hashes.py check",
        "versions": installed_versions(),
        "conversions": run_all(log=log),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    log(f"recorded {len(data['conversions'])} conversions in {out}")


def check(path: Path, log: Callable[[str], None] = print) -> int:
    """Run every conversion again and print each difference from the record at ``path``; 1 on any."""
    saved = load_record(path)
    versions = differing_versions(saved["versions"], installed_versions())
    if versions:
        log("library versions differ from the record's (bytes may legitimately differ): " + "; ".join(versions))
    started = time.perf_counter()
    lines = compare(saved["conversions"], run_all())
    for line in lines:
        log(line)
    took = time.perf_counter() - started
    if lines:
        log(f"{len(lines)} difference(s) in {took:.1f} s; compare against the commit that recorded {path}")
        return 1
    log(f"all {len(saved['conversions'])} conversions as recorded ({took:.1f} s)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``record`` or ``check``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the conversions and write their hashes")
    rec.add_argument("--out", type=Path, default=DEFAULT_RECORD)
    chk = sub.add_parser("check", help="run the conversions and compare with the record")
    chk.add_argument("--record", type=Path, default=DEFAULT_RECORD)
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.out)
        return 0
    return check(args.record)


if __name__ == "__main__":
    sys.exit(main())
