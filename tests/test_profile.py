"""packer profile: stage times of a raw folder and of packed outputs, the advice, and the command."""

from __future__ import annotations

import importlib
import itertools
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from conftest import make_tree, write_image
from helpers import exited_cleanly

from packer import ConvertConfig, PreprocessConfig, convert
from packer.advisor.profile import FOLDER_STAGES, OUTPUT_STAGES, Profile, profile_folder, profile_output, spread
from packer.cli import cli
from packer.config import ImageCodec, ShardSize

ROOT = Path(__file__).resolve().parent.parent
PRE = PreprocessConfig(size=(32, 24))
# The module itself: packer.advisor may export functions named like its submodules.
PROFILE_MODULE = importlib.import_module("packer.advisor.profile")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """12 JPEGs in 2 classes."""
    root = tmp_path_factory.mktemp("src") / "images"
    make_tree(root, {"a": 6, "b": 6}, size=(80, 60), ext="jpg")
    return root


@pytest.fixture(scope="module")
def outputs(source, tmp_path_factory) -> dict[str, Path]:
    """The source as a raw npy output and a JPEG-coded lmdb output, 3 shards each."""
    out = tmp_path_factory.mktemp("out")
    convert(source, out / "npy", ConvertConfig("npy", PRE, ShardSize(samples=4)), workers=1)
    convert(source, out / "lmdb", ConvertConfig("lmdb", PRE, ShardSize(samples=4), codec=ImageCodec("jpeg")), workers=1)
    return {"npy": out / "npy", "lmdb": out / "lmdb"}


def check_sane(p: Profile, stages: tuple[str, ...], zero: tuple[str, ...] = ()) -> None:
    assert tuple(p.seconds) == stages
    for stage in stages:
        assert (p.seconds[stage] == 0) if stage in zero else (p.seconds[stage] > 0), stage
    assert sum(p.share(s) for s in stages) == pytest.approx(1.0)
    assert p.total == pytest.approx(sum(p.seconds.values()))  # per sample: see the test on a fake clock
    assert p.dominant in stages and f"({p.share(p.dominant):.0%})" in p.advice()


def test_folder_stages(source):
    p = profile_folder(source, samples=50, batch_size=4)
    assert p.kind == "folder" and p.samples == 12 and p.skipped == 0
    check_sane(p, FOLDER_STAGES)
    d = p.to_dict()
    assert [s["stage"] for s in d["stages"]] == list(FOLDER_STAGES) and d["dominant"] == p.dominant
    assert sum(s["share"] for s in d["stages"]) == pytest.approx(1.0) and d["ms_per_sample"] > 0


def test_folder_bad_files_are_counted_not_timed(tmp_path):
    root = tmp_path / "src"
    make_tree(root, {"a": 3})
    (root / "a" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    p = profile_folder(root, samples=10, batch_size=2)
    assert p.samples == 3 and p.skipped == 1


def test_folder_samples_are_spread_over_the_classes(tmp_path):
    assert spread(list(range(10)), 3) == [0, 3, 6] and spread([1, 2], 5) == [1, 2]
    root = tmp_path / "src"
    make_tree(root, {"a": 4, "b": 4})
    p = profile_folder(root, samples=2, batch_size=2, preprocess=PreprocessConfig(size=(8, 8)))
    assert p.samples == 2


def test_raw_output_has_nothing_to_decode(outputs):
    p = profile_output(outputs["npy"], samples=50, batch_size=4)
    assert p.kind == "output" and p.format == "npy" and p.codec == "raw"
    assert p.samples == 9  # 3 shards of 4: the first of each opens it and is not timed
    check_sane(p, OUTPUT_STAGES, zero=("decode",))
    assert p.name("read") == "read stored bytes"


def test_jpeg_output_decodes(outputs):
    p = profile_output(outputs["lmdb"], samples=4, batch_size=2)
    assert p.samples == 4 and p.codec == "jpeg"
    check_sane(p, OUTPUT_STAGES)


def test_figures_are_per_sample_medians_on_a_fake_clock(source, outputs, monkeypatch):
    """Each stage's figure is the seconds one sample spends in it, collate's a batch's seconds shared by
    its samples: on a clock that moves 1 s at each reading, whatever the machine's own speed."""
    ticks = itertools.count()
    monkeypatch.setattr(PROFILE_MODULE, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    folder = profile_folder(source, samples=50, batch_size=4)  # 12 samples: 3 batches of 4
    assert folder.seconds == {"read": 1.0, "decode": 1.0, "preprocess": 1.0, "to_tensor": 1.0, "collate": 0.25}
    assert folder.total == 4.25
    raw = profile_output(outputs["npy"], samples=50, batch_size=3)  # 9 timed samples: 3 batches of 3
    assert raw.seconds == {"read": 1.0, "decode": 0.0, "to_tensor": 1.0, "collate": pytest.approx(1 / 3)}
    jpeg = profile_output(outputs["lmdb"], samples=4, batch_size=2)
    assert jpeg.seconds == {"read": 1.0, "decode": 1.0, "to_tensor": 1.0, "collate": 0.5}


def test_advice_names_the_stage_and_the_fix():
    folder = Profile(
        "imgs", "folder", 10, 4, {"read": 0.1, "decode": 0.78, "preprocess": 0.05, "to_tensor": 0.05, "collate": 0.02}
    )
    assert folder.advice().startswith("decode dominates (78%): convert with packer convert imgs -f npy (raw codec)")
    output = Profile(
        "out",
        "output",
        10,
        4,
        {"read": 0.1, "decode": 0.0, "to_tensor": 0.1, "collate": 0.8},
        format="npy",
        codec="raw",
    )
    assert output.advice().startswith("collate dominates (80%): use make_loader")
    assert "packed_collate" in output.advice()
    decode = {"read": 0.1, "decode": 0.7, "to_tensor": 0.1, "collate": 0.1}
    jpeg = Profile("out", "output", 10, 4, decode, format="lmdb", codec="jpeg")
    assert "--codec raw" in jpeg.advice() and "in_memory=True" in jpeg.advice()
    tar = Profile("out", "output", 10, 4, decode, format="wds", codec="jpeg")
    assert "--codec raw" in tar.advice() and "in_memory" not in tar.advice()  # map-style readers only
    disk = Profile(
        "out",
        "output",
        10,
        4,
        {"read": 0.9, "decode": 0.0, "to_tensor": 0.05, "collate": 0.05},
        format="npy",
        codec="raw",
    )
    assert disk.advice().startswith("read stored bytes dominates (90%)") and "local SSD" in disk.advice()


def test_profile_command_on_a_folder_and_an_output(source, outputs):
    text = CliRunner().invoke(cli, ["profile", str(source), "-n", "6", "-b", "3", "-q"])
    assert text.exit_code == 0, text.output
    for name in ("open + read", "decode", "preprocess (resize)", "to tensor + normalize", "collate", "total"):
        assert f"\n  {name}" in text.stdout
    assert "dominates (" in text.stdout and "samples/s in one process" in text.stdout
    result = CliRunner().invoke(cli, ["profile", str(outputs["lmdb"]), "-n", "4", "--json", "-q"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["kind"] == "output" and data["codec"] == "jpeg" and data["samples"] == 4
    assert [s["stage"] for s in data["stages"]] == list(OUTPUT_STAGES)
    assert all(s["ms_per_sample"] > 0 for s in data["stages"])


def test_like_preprocesses_a_folder_as_an_output_does(source, outputs, tmp_path):
    result = CliRunner().invoke(cli, ["profile", str(source), "-n", "3", "--like", str(outputs["npy"]), "--json", "-q"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["preprocess"]["size"] == [32, 24]
    default = json.loads(CliRunner().invoke(cli, ["profile", str(source), "-n", "2", "--json", "-q"]).stdout)
    assert default["preprocess"]["size"] == [224, 224]  # packer convert's default
    wrong = CliRunner().invoke(cli, ["profile", str(outputs["npy"]), "--like", str(outputs["npy"]), "-q"])
    assert wrong.exit_code == 2 and "--like is for a raw folder" in wrong.output


def test_profile_errors_are_messages(tmp_path):
    (tmp_path / "empty").mkdir()
    empty = CliRunner().invoke(cli, ["profile", str(tmp_path / "empty"), "-q"])
    assert empty.exit_code == 1 and "no usable images" in empty.output and exited_cleanly(empty)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{")
    result = CliRunner().invoke(cli, ["profile", str(broken), "-q"])
    assert result.exit_code == 1 and "cannot be read as JSON" in result.output
    write_image(tmp_path / "one" / "x.png")
    assert CliRunner().invoke(cli, ["profile", str(tmp_path / "one"), "-q"]).exit_code == 0


def test_profile_as_a_real_subprocess(outputs):
    proc = subprocess.run(
        [sys.executable, "-m", "packer", "profile", str(outputs["npy"]), "-n", "5", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["samples"] == 5 and data["dominant"] in OUTPUT_STAGES and data["advice"]
    assert "profiling" in proc.stderr  # the progress bar
