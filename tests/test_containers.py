"""Sources that are containers: Parquet, a Hugging Face dataset saved to disk, WebDataset tar shards."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner
from conftest import make_tree

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import ShardSize
from packer.output.verify import verify
from packer.spec.errors import InputError
from packer.spec.manifest import read_manifest
from readers import open_dataset

PRE = PreprocessConfig(size=(16, 12))


def samples(root: Path) -> list:
    ds = open_dataset(root, return_meta=True)
    return [(meta["key"], label, image) for image, label, meta in (ds[i] for i in range(len(ds)))]


def same(a: list, b: list, keys: bool = True) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x[1] == y[1] and torch.equal(x[2], y[2]) and (not keys or x[0] == y[0])


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> tuple[Path, Path, list[Path]]:
    """A class-folder tree of PNGs and JPEGs, and its conversion (what every container must equal)."""
    src = tmp_path_factory.mktemp("src") / "images"
    files = make_tree(src, {"ant": 3, "bee": 2}) + make_tree(src, {"cat": 3}, ext="jpg")
    out = tmp_path_factory.mktemp("out") / "folder"
    convert(src, out, ConvertConfig("npy", PRE, ShardSize(samples=3)), workers=1)
    return src, out, sorted(files)


def rel(src: Path, p: Path) -> str:
    return p.relative_to(src).as_posix()


def test_a_parquet_file_of_image_structs_and_class_names(folder, tmp_path):
    src, out, files = folder
    table = pa.table(
        {
            "image": [{"bytes": p.read_bytes(), "path": rel(src, p)} for p in reversed(files)],
            "label": [p.parent.name for p in reversed(files)],
        }
    )
    pq.write_table(table, tmp_path / "train.parquet", row_group_size=3)  # several row groups
    got = tmp_path / "got"
    convert(tmp_path / "train.parquet", got, ConvertConfig("npy", PRE, ShardSize(samples=3)), workers=2)
    m = read_manifest(got)
    assert m.classes == ["ant", "bee", "cat"] and m.samples == 8 and verify(got) == []
    same(samples(got), samples(out))


def test_a_saved_hugging_face_dataset_and_its_class_label_names(folder, tmp_path):
    import datasets  # here, not at collection: its memory would be in every test process, copied by each fork

    src, out, files = folder
    names = ["ant", "bee", "cat"]
    ds = datasets.Dataset.from_dict(
        {"image": [str(p) for p in files], "label": [names.index(p.parent.name) for p in files]},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)}),
    )
    ds.save_to_disk(str(tmp_path / "saved"))
    got = tmp_path / "got"
    convert(tmp_path / "saved", got, ConvertConfig("lmdb", PRE), workers=1)
    assert read_manifest(got).classes == names
    same(samples(got), samples(out), keys=False)  # save_to_disk keeps the file names, not their folders
    ds.to_parquet(str(tmp_path / "hf.parquet"))  # the images' paths, not their bytes: read from the files
    from_parquet = tmp_path / "from-parquet"
    convert(tmp_path / "hf.parquet", from_parquet, ConvertConfig("npy", PRE), workers=1)
    same(samples(from_parquet), samples(out))  # keys: the paths relative to their common folder


def test_webdataset_tar_shards_with_cls_members(folder, tmp_path):
    src, out, files = folder
    names = ["ant", "bee", "cat"]
    shards = tmp_path / "tars"
    shards.mkdir()
    for n, part in enumerate((files[:5], files[5:])):
        with tarfile.open(shards / f"part-{n}.tar", "w") as tar:
            for i, p in enumerate(part):
                key = f"s{n}{i:04d}"
                for name, data in (
                    (f"{key}{p.suffix}", p.read_bytes()),
                    (f"{key}.cls", str(names.index(p.parent.name)).encode()),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    got = tmp_path / "got"
    convert(shards, got, ConvertConfig("wds", PRE), workers=1)
    m = read_manifest(got)
    assert m.classes == ["0", "1", "2"] and m.class_counts == [3, 2, 3]
    mine = samples_wds(got)  # in key order
    assert [k for k, _, _ in mine] == [f"part-{n}/s{n}{i:04d}" for n, c in ((0, 5), (1, 3)) for i in range(c)]
    same(
        [(None, label, image) for _, label, image in mine],
        [(None, label, image) for _, label, image in samples(out)],
        keys=False,
    )


def samples_wds(root: Path) -> list:
    return [(meta["key"], label, image) for image, label, meta in open_dataset(root, return_meta=True)]


def test_a_bad_row_is_skipped_and_reported_like_a_bad_file(folder, tmp_path):
    src, out, files = folder
    rows = [{"bytes": p.read_bytes(), "path": rel(src, p)} for p in files]
    rows[2] = {"bytes": b"not an image", "path": rows[2]["path"]}
    pq.write_table(pa.table({"image": rows, "label": [p.parent.name for p in files]}), tmp_path / "t.parquet")
    got = tmp_path / "got"
    result = convert(tmp_path / "t.parquet", got, ConvertConfig("npy", PRE), workers=1)
    assert [s.path for s in result.skipped] == [rel(src, files[2])] and read_manifest(got).samples == 7
    assert "corrupt" in result.skipped[0].reason or "not an image" in result.skipped[0].reason


def test_sources_that_cannot_be_read_are_refused_with_a_reason(folder, tmp_path):
    src, out, files = folder
    pq.write_table(pa.table({"caption": ["a", "b"]}), tmp_path / "text.parquet")
    with pytest.raises(InputError, match="has no image column"):
        convert(tmp_path / "text.parquet", tmp_path / "x", ConvertConfig("npy", PRE))
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 nothing")
    with pytest.raises(InputError, match="cannot be read as Parquet"):
        convert(tmp_path / "broken.parquet", tmp_path / "y", ConvertConfig("npy", PRE))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(InputError, match="is a file: give a folder of images, a .parquet file or a .tar"):
        convert(tmp_path / "notes.txt", tmp_path / "z", ConvertConfig("npy", PRE))
    pq.write_table(pa.table({"image": [files[0].read_bytes()], "label": ["ant"]}), tmp_path / "one.parquet")
    labels = tmp_path / "labels.csv"
    labels.write_text("x,1\n")
    result = CliRunner().invoke(
        cli, ["convert", str(tmp_path / "one.parquet"), "-f", "npy", "-o", str(tmp_path / "w"), "--labels", str(labels)]
    )
    assert result.exit_code == 1 and "--labels and --fields do not apply" in result.output


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_a_tar_key_that_comes_twice_is_refused_not_merged(folder, tmp_path):
    """webdataset reads a.jpg, b.jpg, a.png as three samples: grouped by key, the second a overwrote
    the first's label and lost its image, unreported."""
    src, out, files = folder
    (tmp_path / "t").mkdir()
    write_tar(
        tmp_path / "t" / "s.tar",
        [
            ("a.png", files[0].read_bytes()),
            ("a.cls", b"0"),
            ("b.png", files[1].read_bytes()),
            ("b.cls", b"0"),
            ("a.jpg", files[-1].read_bytes()),
            ("a.cls", b"1"),
        ],
    )
    with pytest.raises(InputError, match="the key 'a' comes twice"):
        convert(tmp_path / "t", tmp_path / "x", ConvertConfig("npy", PRE))


def test_labels_that_are_not_one_class_are_refused_or_reported(folder, tmp_path):
    src, out, files = folder
    (tmp_path / "mixed").mkdir()
    write_tar(
        tmp_path / "mixed" / "s.tar",
        [
            ("a.png", files[0].read_bytes()),
            ("a.cls", b"0"),
            ("b.png", files[1].read_bytes()),
            ("b.json", b'{"label": "cat"}'),
        ],
    )
    with pytest.raises(InputError, match="by class index and others by class name"):
        convert(tmp_path / "mixed", tmp_path / "x", ConvertConfig("npy", PRE))
    (tmp_path / "odd").mkdir()
    write_tar(
        tmp_path / "odd" / "s.tar",
        [
            ("a.png", files[0].read_bytes()),
            ("a.json", b'{"label": "ant"}'),
            ("b.png", files[1].read_bytes()),
            ("b.json", b'{"label": [1, 2]}'),
            ("c.png", files[2].read_bytes()),
            ("c.json", b'{"caption": "x"}'),
        ],
    )
    with pytest.raises(InputError, match="have no label"):  # c has none, a has one: refused as before
        convert(tmp_path / "odd", tmp_path / "y", ConvertConfig("npy", PRE))
    image = {"bytes": files[0].read_bytes(), "path": "a.png"}
    pq.write_table(pa.table({"image": [image, image], "label": [0.0, 1.0]}), tmp_path / "floats.parquet")
    convert(tmp_path / "floats.parquet", tmp_path / "f", ConvertConfig("npy", PRE))
    assert read_manifest(tmp_path / "f").classes == ["0", "1"] and verify(tmp_path / "f") == []
    pq.write_table(pa.table({"image": [image], "label": [0.5]}), tmp_path / "half.parquet")
    with pytest.raises(InputError, match="holds 0.5, not a class index"):
        convert(tmp_path / "half.parquet", tmp_path / "h", ConvertConfig("npy", PRE))
    for name, values in (("bools", [True, False]), ("lists", [[0, 1], [1]])):
        pq.write_table(pa.table({"image": [image, image], "label": values}), tmp_path / f"{name}.parquet")
        with pytest.raises(InputError, match="neither class indices"):
            convert(tmp_path / f"{name}.parquet", tmp_path / name, ConvertConfig("npy", PRE))


def test_resume_rewrites_a_shard_whose_row_names_a_file_that_changed(folder, tmp_path):
    """Rows holding a path instead of bytes (the datasets Image feature before embedding): a file
    replaced after the interruption is read again, not kept as the finished shard stored it."""
    from helpers import interrupted_after

    src, out, files = folder
    (tmp_path / "s" / "files").mkdir(parents=True)
    cells = []
    for i, p in enumerate(files):
        (tmp_path / "s" / "files" / f"{i}{p.suffix}").write_bytes(p.read_bytes())
        cells.append({"bytes": None, "path": f"files/{i}{p.suffix}"})
    pq.write_table(
        pa.table(
            {
                "image": pa.array(cells, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                "label": [p.parent.name for p in files],
            }
        ),
        tmp_path / "s" / "t.parquet",
    )
    config = ConvertConfig("npy", PRE, ShardSize(samples=3))
    interrupted_after(tmp_path / "s" / "t.parquet", tmp_path / "got", config, 3)
    (tmp_path / "s" / "files" / "0.png").write_bytes(files[1].read_bytes())  # row 0, in the finished shard
    convert(tmp_path / "s" / "t.parquet", tmp_path / "got", config, workers=1, resume=True)
    convert(tmp_path / "s" / "t.parquet", tmp_path / "fresh", config, workers=1)
    same(samples(tmp_path / "got"), samples(tmp_path / "fresh"))
