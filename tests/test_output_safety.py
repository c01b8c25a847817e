"""Nothing is lost: an existing output and what --overwrite may replace, staging folders, failed runs,
concurrent runs, interrupted publishes, damage."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from compare import check_files
from conftest import FORMATS, make_tree
from helpers import no_staging, shard_file

import packer.ops.convert
from packer import ConvertConfig, PreprocessConfig, convert
from packer.output.files import STAGING_MARK, _old_dir, lock_output, recover, release_output, staging_dir
from packer.output.verify import verify
from packer.spec.errors import InputError, ManifestError, OutputError
from packer.spec.manifest import read_manifest
from readers import open_dataset

PRE = PreprocessConfig(size=(16, 12))


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    make_tree(root, {"a": 3, "b": 3})
    return root


def test_overwrite_never_replaces_a_folder_that_only_has_a_manifest_json(tmp_path, src):
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"description": "a browser extension"}))
    (data / "background.js").write_text("precious")
    with pytest.raises(OutputError, match="not a packer output"):
        convert(src, data, ConvertConfig("npy", PRE), overwrite=True)
    assert (data / "background.js").read_text() == "precious"


@pytest.mark.parametrize("url", ["s3://data/wds", "gs://bucket/out", "https://host/out", "pipe:cat {}"])
def test_a_url_destination_is_refused_never_made_a_local_folder(tmp_path, src, monkeypatch, url):
    """packer writes outputs to local folders: `-o s3://data/wds` once wrote a folder named `s3:` here
    and said "wrote 40 samples", with nothing in the bucket."""
    from click.testing import CliRunner

    from packer import repack
    from packer.cli import cli
    from packer.ops.combine import combine

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["combine", str(src), "-o", url])
    assert result.exit_code == 2 and "is not a local folder" in result.output and url in result.output
    if url.startswith(("https:", "pipe:")):  # packer convert uploads to s3:// and gs:// (tests/test_remote_s3.py)
        result = CliRunner().invoke(cli, ["convert", str(src), "-f", "wds", "-o", url])
        assert result.exit_code == 2 and "packer cannot write" in result.output and url in result.output
    for call in (
        lambda: convert(src, url, ConvertConfig("npy", PRE)),
        lambda: repack(src, url, "npy"),
        lambda: combine([src], url),
    ):
        with pytest.raises(ValueError, match="not a local folder: packer writes outputs to a local folder"):
            call()
    with pytest.raises(ValueError, match="not a local folder"):  # what pathlib makes of s3://data/wds
        convert(src, Path("s3://data/wds"), ConvertConfig("npy", PRE))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no folder named s3:, gs:, https:, pipe:...


def test_an_output_holding_the_source_is_refused(tmp_path, src):
    convert(src, tmp_path / "o", ConvertConfig("npy", PRE))
    with pytest.raises(OutputError, match="holds the source"):
        convert(src, src.parent, ConvertConfig("npy", PRE), overwrite=True)
    with pytest.raises(OutputError, match="holds the source"):
        convert(src, src, ConvertConfig("npy", PRE), overwrite=True)
    assert sorted(p.name for p in src.iterdir()) == ["a", "b"]


def test_a_second_run_on_the_same_output_is_refused(tmp_path, src):
    out = tmp_path / "out"
    held = lock_output(out)
    try:
        with pytest.raises(OutputError, match="another packer run"):
            convert(src, out, ConvertConfig("npy", PRE))
    finally:
        release_output(out, held)
    convert(src, out, ConvertConfig("npy", PRE))
    assert not (tmp_path / ".out.packer-lock").exists()


def test_an_old_output_left_by_a_killed_publish_comes_back(tmp_path, src):
    out = tmp_path / "out"
    convert(src, out, ConvertConfig("npy", PRE))
    os.rename(out, _old_dir(out))  # killed between the two renames of publish
    recover(out)
    assert open_dataset(out)[0][0].shape == (3, 12, 16) and not _old_dir(out).exists()


def test_verify_reports_a_garbage_lmdb_file_instead_of_crashing(tmp_path, src):
    out = tmp_path / "lmdb"
    convert(src, out, ConvertConfig("lmdb", PRE))
    shard = shard_file(out, 0, ".lmdb")
    size = shard.stat().st_size
    shard.write_bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
    problems = verify(out)
    assert problems and problems[0].message.endswith("its SHA-256 does not match the manifest")
    assert len(problems) >= 2  # the scan reports the shard unreadable (or crashed) too
    with pytest.raises(ManifestError, match=shard.name):
        open_dataset(out)[0]


def test_object_arrays_are_refused_not_mapped(tmp_path, src):
    out = tmp_path / "npy"
    convert(src, out, ConvertConfig("npy", PRE))
    images = shard_file(out, 0, ".images.npy")
    np.save(images, np.array([object()] * 3, dtype=object), allow_pickle=True)
    problems = verify(out)
    assert any("not a packer image array" in p.message for p in problems)
    with pytest.raises(ManifestError, match=images.name):
        open_dataset(out)[0]


def test_manifest_paths_outside_the_output_are_refused(tmp_path, src):
    out = tmp_path / "wds"
    convert(src, out, ConvertConfig("wds", PRE))
    m = json.loads((out / "manifest.json").read_text())
    m["shards"][0]["files"][0]["path"] = "../../etc/passwd"
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="not a plain name"):
        open_dataset(out)


def test_file_names_that_are_not_utf8_are_reported(tmp_path):
    root = tmp_path / "src"
    make_tree(root, {"a": 2})
    bad = os.path.join(os.fsencode(root / "a"), b"bad\xff\xfename.png")
    shutil.copy(root / "a" / "img_000.png", bad)
    result = convert(root, tmp_path / "out", ConvertConfig("lmdb", PRE))
    assert result.manifest.samples == 2
    assert [s.reason for s in result.skipped] == ["file name is not valid UTF-8; rename it"]
    assert result.skipped[0].path == "a/bad\\xff\\xfename.png"


# --------------------------------------------------------------------------- existing outputs, staging, failed runs


def test_existing_output_without_overwrite(image_tree, tmp_path):
    out = tmp_path / "out"
    convert(image_tree, out, ConvertConfig("npy", PRE), workers=1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(OutputError, match="overwrite"):
        convert(image_tree, out, ConvertConfig("wds", PRE), workers=1)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert no_staging(out)


def test_existing_output_with_overwrite_replaced(image_tree, tmp_path):
    out = tmp_path / "out"
    convert(image_tree, out, ConvertConfig("npy", PRE), workers=1)
    convert(image_tree, out, ConvertConfig("wds", PRE), workers=1, overwrite=True)
    m = read_manifest(out)
    assert m.format == "wds"
    check_files(out, m)  # no npy file left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "out"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_non_packer_folder_refused(image_tree, tmp_path, overwrite):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(OutputError, match="not a packer output"):
        convert(image_tree, out, ConvertConfig("npy", PRE), workers=1, overwrite=overwrite)
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]
    assert (out / "thesis.tex").read_text() == "years of work"
    assert no_staging(out)


def test_output_is_a_file_refused(image_tree, tmp_path):
    out = tmp_path / "file"
    out.write_text("x")
    with pytest.raises(OutputError):
        convert(image_tree, out, ConvertConfig("npy", PRE), workers=1, overwrite=True)
    assert out.read_text() == "x"


def test_empty_existing_folder_used(image_tree, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    convert(image_tree, out, ConvertConfig("npy", PRE), workers=1)
    assert read_manifest(out).samples == 15


def test_stale_staging_folder_replaced(image_tree, tmp_path):
    out = tmp_path / "out"
    stage = staging_dir(out)
    stage.mkdir()
    (stage / STAGING_MARK).write_text("old")
    (stage / "shard-00000.tar").write_bytes(b"half")
    convert(image_tree, out, ConvertConfig("wds", PRE), workers=1)
    assert no_staging(out)
    check_files(out, read_manifest(out))


def test_foreign_staging_folder_refused(image_tree, tmp_path):
    out = tmp_path / "out"
    stage = staging_dir(out)
    stage.mkdir()
    (stage / "mine.txt").write_text("keep")
    with pytest.raises(OutputError):
        convert(image_tree, out, ConvertConfig("wds", PRE), workers=1)
    assert (stage / "mine.txt").read_text() == "keep"
    assert not out.exists()


def _boom(*args, **kwargs):
    raise RuntimeError("merge failed")


@pytest.mark.parametrize("fmt", FORMATS)
def test_failure_leaves_no_output_and_no_staging(image_tree, tmp_path, monkeypatch, fmt):
    monkeypatch.setattr(packer.ops.convert, "build_manifest", _boom)  # fails after every shard is written
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="merge failed"):
        convert(image_tree, out, ConvertConfig(fmt, PRE), workers=1)
    assert not out.exists()
    assert no_staging(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


def test_failure_keeps_old_output(image_tree, tmp_path, monkeypatch):
    out = tmp_path / "out"
    convert(image_tree, out, ConvertConfig("npy", PRE), workers=1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(packer.ops.convert, "build_manifest", _boom)
    with pytest.raises(RuntimeError):
        convert(image_tree, out, ConvertConfig("wds", PRE), workers=1, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert no_staging(out)


def test_output_inside_the_source_is_not_read_as_a_class(image_tree):
    first = convert(image_tree, image_tree / "packed", ConvertConfig("npy", PRE), workers=1)
    again = convert(image_tree, image_tree / "packed", ConvertConfig("npy", PRE), workers=1, overwrite=True)
    assert again.manifest.classes == first.manifest.classes == ["ant", "bee", "cat"]
    assert again.manifest.samples == first.manifest.samples == 15


def test_empty_source_is_an_error(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(InputError, match="no images or texts found"):
        convert(tmp_path / "src", tmp_path / "out", ConvertConfig("npy", PRE))
    assert not (tmp_path / "out").exists()
