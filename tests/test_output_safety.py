"""Nothing is lost: what --overwrite may replace, concurrent runs, interrupted publishes, damage."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from conftest import make_tree

from packer import ConvertConfig, PreprocessConfig, convert
from packer.errors import ManifestError, OutputError
from packer.output import _old_dir, lock_output, recover, release_output
from packer.verify import verify
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
    shard = out / "shard-00000.lmdb"
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
    images = out / "shard-00000.images.npy"
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
